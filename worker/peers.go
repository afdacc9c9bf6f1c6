package worker

import (
	"context"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/couchq/couchq/couchq"
)

// peers is what this worker knows of the other live workers that claim the
// same job types, from the registry: for each type, how many claim it and
// this worker's rank among them. Workers reading the same due view pick the
// same first rows; picking at random among K (PickAmong) spreads them, but
// 16 claimants still lost about 0.4 claims per job won. With its rank, a
// worker first takes the jobs that hash to it (ownFirst): claimants that
// agree on who is live take disjoint jobs, whatever rows each one's view
// query returned, and fall back to the others' jobs only when theirs run
// out. Ranks that disagree for a moment (a worker started or died) only
// cost 409s, as before.
type peers struct {
	mu        sync.Mutex
	slots     map[string]peerSlot // job type -> slot
	refreshed time.Time           // monotonic; zero before the first refresh
}

// peerSlot is a worker's rank among the n live workers claiming a type.
type peerSlot struct{ rank, n int }

// slot returns the worker's rank among the workers claiming typ, and how
// many they are (1 when it knows of no other).
func (p *peers) slot(typ string) (rank, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.slots[typ]; ok {
		return s.rank, s.n
	}
	return 0, 1
}

// peerRefreshAfterLoss bounds how often lost claims make a runner read the
// registry again (a new peer is the likely cause).
const peerRefreshAfterLoss = time.Second

// refreshPeers reads the registry and works out this worker's slot for each
// of its types. On failure it keeps what it knew.
func (w *Worker) refreshPeers(ctx context.Context) {
	w.peers.mu.Lock()
	w.peers.refreshed = time.Now()
	w.peers.mu.Unlock()
	qctx, cancel := context.WithTimeout(ctx, w.cfg.QueryTimeout)
	infos, err := w.client.Workers(qctx)
	cancel()
	if err != nil {
		w.log.Debug().Err(err).Msg("reading the worker registry for peers failed")
		return
	}
	slots := peerSlots(infos, w.by, w.Types(), w.cfg.Now())
	w.peers.mu.Lock()
	w.peers.slots = slots
	w.peers.mu.Unlock()
}

// refreshPeersAfterLoss refreshes the peers after a round that lost claims,
// at most once per peerRefreshAfterLoss.
func (w *Worker) refreshPeersAfterLoss(ctx context.Context) {
	w.peers.mu.Lock()
	due := time.Since(w.peers.refreshed) >= peerRefreshAfterLoss
	w.peers.mu.Unlock()
	if due {
		w.refreshPeers(ctx)
	}
}

// peerSlots ranks the live claimants of each type (by claimant name);
// self counts whether or not its registry document was read.
func peerSlots(infos []*couchq.WorkerInfo, self string, types []string, now time.Time) map[string]peerSlot {
	out := make(map[string]peerSlot, len(types))
	for _, typ := range types {
		names := []string{self}
		for _, info := range infos {
			if alive, _ := info.Liveness(now); !alive || info.Claimant == self || info.Claimant == "" {
				continue
			}
			if slices.Contains(info.Types, typ) {
				names = append(names, info.Claimant)
			}
		}
		slices.Sort(names)
		names = slices.Compact(names)
		out[typ] = peerSlot{rank: slices.Index(names, self), n: len(names)}
	}
	return out
}

// ownFirst orders each run of jobs of one priority in items (which
// DueCandidates returns highest priority first, then oldest first): the jobs
// that hash to rank of n come first, oldest first, then the others in
// random order. With n = 1 every job is the worker's own, in random order
// (the pick among K).
func ownFirst(items []couchq.DueCandidate, rank, n int) {
	for start := 0; start < len(items); {
		end := start + 1
		for end < len(items) && items[end].Priority == items[start].Priority {
			end++
		}
		run := items[start:end]
		start = end
		if n <= 1 {
			rand.Shuffle(len(run), func(i, j int) { run[i], run[j] = run[j], run[i] })
			continue
		}
		var own, rest []couchq.DueCandidate
		for _, it := range run {
			if jobSlot(it.ID, n) == rank {
				own = append(own, it)
			} else {
				rest = append(rest, it)
			}
		}
		rand.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
		copy(run, append(own, rest...))
	}
}

// jobSlot is the rank of n a job belongs to.
func jobSlot(id string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % uint32(n))
}
