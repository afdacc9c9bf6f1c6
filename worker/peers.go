package worker

import (
	"context"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/couchq/couchq/internal/protocol"
)

// peers is what this worker knows of the other live workers that claim the
// same job types, from the registry: for each type, how many claim it,
// this worker's rank among them and how many jobs each runs at once.
// Workers reading the same due view pick the same first rows; picking at
// random among K (PickAmong) spreads them, but 16 claimants still lost
// about 0.4 claims per job won. With its rank, a worker first takes the
// jobs that hash to it, and others' jobs only as ownFirst allows:
// claimants that agree on who is live take disjoint jobs, whatever rows
// each one's view query returned. Ranks that disagree for a moment (a
// worker started or died) only cost 409s. A worker learns of a newcomer
// from the changes feed (its registration), from a job FetchDue found
// claimed by a claimant it does not know, or from a lost claim; of a
// worker gone, at its next heartbeat.
type peers struct {
	mu        sync.Mutex
	slots     map[string]peerSlot // job type -> slot
	known     map[string]bool     // the live claimants read, any type
	refreshed time.Time           // monotonic; zero before the first refresh
	joined    time.Time           // when this worker registered (monotonic)
}

// joinSettle is how long a worker that just registered leaves its own jobs
// to the peers that owned them before it came, where those would take them
// in their next round. Its peers learn of it from the changes feed and a
// registry read, and until then the peer that owned each of its jobs before
// (its thief now: rendezvous hashing moves a job to a newcomer from the
// peer ranked next) still takes them. With 16 workers starting one after
// another, about half the claims lost were such races.
const joinSettle = time.Second

// peerSlot is a worker's rank among the n live workers claiming a type,
// their claimant names by rank, and how many jobs each rank runs at once
// (its Concurrency: the jobs of its own it takes in one round).
type peerSlot struct {
	rank  int
	names []string
	takes []int
	// joining says that the worker registered less than joinSettle ago:
	// its peers may not know of it yet.
	joining bool
	// spread says that the worker lost claims lately (see
	// runner.widenPick): with no peer it knows of, claimants it does not
	// know take the same rows, and it picks at random among them.
	spread bool
}

// size is how many live workers claim the type (1 when this worker knows
// of no other).
func (s peerSlot) size() int { return max(len(s.names), 1) }

// slot returns the worker's rank among the workers claiming typ, and how
// many they are (1 when it knows of no other).
func (p *peers) slot(typ string) peerSlot {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.slots[typ]; ok {
		s.joining = !p.joined.IsZero() && time.Since(p.joined) < joinSettle
		return s
	}
	return peerSlot{}
}

// peerRefreshAfterLoss bounds how often lost claims make a runner read the
// registry again (a new peer is the likely cause).
const peerRefreshAfterLoss = 200 * time.Millisecond

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
	now := w.cfg.Now()
	slots := peerSlots(infos, w.by, w.cfg.Concurrency, w.Types(), now)
	known := map[string]bool{w.by: true}
	for _, info := range infos {
		if alive, _ := info.Liveness(now); alive {
			known[info.Claimant] = true
		}
	}
	w.peers.mu.Lock()
	w.peers.slots, w.peers.known = slots, known
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

// refreshPeersIfNew refreshes the peers when one of claimants (who claimed
// jobs this worker meant to) is not a live peer it knows of: a worker that
// joined since. A worker that keeps winning its claims never loses one to
// learn of it, and would keep taking the newcomer's jobs from under it.
// At most once per peerRefreshAfterLoss, as refreshPeersAfterLoss.
func (w *Worker) refreshPeersIfNew(ctx context.Context, claimants []string) {
	w.peers.mu.Lock()
	unknown := slices.ContainsFunc(claimants, func(c string) bool { return !w.peers.known[c] })
	w.peers.mu.Unlock()
	if unknown {
		w.refreshPeersAfterLoss(ctx)
	}
}

// peerSlots ranks the live claimants of each type (by claimant name);
// self, running concurrency jobs of each type, counts whether or not its
// registry document was read.
func peerSlots(infos []*protocol.WorkerInfo, self string, concurrency int, types []string, now time.Time) map[string]peerSlot {
	out := make(map[string]peerSlot, len(types))
	for _, typ := range types {
		takes := map[string]int{self: concurrency}
		for _, info := range infos {
			if alive, _ := info.Liveness(now); !alive || info.Claimant == self || info.Claimant == "" {
				continue
			}
			if slices.Contains(info.Types, typ) {
				takes[info.Claimant] = max(info.Concurrency, 1)
			}
		}
		names := slices.Sorted(maps.Keys(takes))
		s := peerSlot{rank: slices.Index(names, self), names: names, takes: make([]int, len(names))}
		for i, name := range names {
			s.takes[i] = takes[name]
		}
		out[typ] = s
	}
	return out
}

// ownFirst orders each run of jobs of one priority in items (which
// DueCandidates returns highest priority first, then oldest first) and says
// how many of the first items the worker may claim now.
//
// Each job has an order of preference among the n live peers: first its
// owner, then one thief (choices), then a third choice, then anyone. The
// worker's own jobs come first, oldest first. Then the others' jobs it is
// the thief of, newest first, but not those the owner takes in its next
// rounds (its oldest, zoneRounds times as many as it runs at once: the
// zone) until they were left there for stealAfter (waited says how long;
// see runner.leftSince), for the owner is busy or gone; with them the
// jobs it is the third choice of that were left in a zone for twice
// stealAfter, when the thief did not take them either. Last (stealOrder)
// the jobs left in a zone for anyoneAfter times stealAfter. The rest go
// after the claimable ones. Workers that agree on who is live thus never race for a
// job while every owner keeps up, even when few are due, and a busy or dead
// owner's jobs still run. With n = 1 every job is the worker's own, oldest
// first, or in random order (the pick among K) when it lost claims lately
// (s.spread); with stealAfter < 0 every other's job is anyone's. A worker
// that joined lately (s.joining) leaves its own jobs that a peer that has
// not heard of it yet takes next to that peer (see joinSettle).
func ownFirst(items []protocol.DueCandidate, s peerSlot, waited func(id string) time.Duration, stealAfter time.Duration) (claimable int) {
	var rest []protocol.DueCandidate
	zone := make([]int, s.size())       // each owner's jobs met so far, in the order it takes them
	zoneBefore := make([]int, s.size()) // the same, as peers that do not know this worker see them
	ordered := make([]protocol.DueCandidate, 0, len(items))
	for start := 0; start < len(items); {
		end := start + 1
		for end < len(items) && items[end].Priority == items[start].Priority {
			end++
		}
		run := items[start:end]
		start = end
		if s.size() <= 1 {
			if s.spread {
				rand.Shuffle(len(run), func(i, j int) { run[i], run[j] = run[j], run[i] })
			}
			ordered = append(ordered, run...)
			continue
		}
		var own, thief []protocol.DueCandidate
		anyone := make([][]protocol.DueCandidate, s.size())
		for _, it := range run {
			o, t := s.choices(it.ID)
			if s.joining && stealAfter >= 0 {
				// Before this worker joined, the job was its thief's
				// (rendezvous hashing): a peer that has not heard of it
				// yet takes it in its next round if it is among that
				// round's jobs.
				before := o
				if o == s.rank {
					before = t
				}
				zoneBefore[before]++
				if o == s.rank && zoneBefore[before] <= s.take(before) {
					rest = append(rest, it)
					continue
				}
			}
			if o == s.rank {
				own = append(own, it)
				continue
			}
			if stealAfter < 0 {
				anyone[o] = append(anyone[o], it) // no job is left to its owner
				continue
			}
			mine := t == s.rank
			zone[o]++
			if zone[o] > zoneRounds*s.take(o) && !s.joining {
				// Past what its owner takes next: its thief's (but a
				// worker that joined lately cannot tell what that is).
				if mine {
					thief = append(thief, it)
				} else {
					rest = append(rest, it)
				}
				continue
			}
			switch w := waited(it.ID); {
			case w >= anyoneAfter*stealAfter:
				anyone[o] = append(anyone[o], it)
			case w >= stealAfter && mine, w >= 2*stealAfter && s.third(it.ID) == s.rank:
				thief = append(thief, it)
			default:
				rest = append(rest, it) // its owner's next round takes it
			}
		}
		slices.Reverse(thief) // newest first: their owners take the oldest
		ordered = append(append(append(ordered, own...), thief...), stealOrder(anyone)...)
	}
	claimable = len(ordered)
	copy(items, append(ordered, rest...))
	return claimable
}

// zoneRounds is how many of an owner's rounds its zone holds, as the
// other workers count it in the rows they read. Working through a backlog
// a worker reads the queue's view as it stands, which may still list the
// jobs an owner claimed in its last round: the owner skips those, so its
// next round takes the jobs after them, which a zone of one round leaves
// to the thief. With 16 workers of 4 slots on one node (the bench's claim
// contention), one round's zone lost 0.095 claims per job on average, most
// of them owners and thieves meeting as the backlog ran out; two rounds'
// 0.080, with the same throughput (docs/design/cluster-claims.md).
const zoneRounds = 2

// take is how many of its own jobs rank o claims in one round.
func (s peerSlot) take(o int) int {
	if o < len(s.takes) {
		return s.takes[o]
	}
	return 1
}

// stealOrder lists other workers' jobs (by owner, each oldest first) in the
// order a worker takes them once its own ran out: newest first from each
// owner, the owners in random order, one job of each in turn. Owners take
// their jobs oldest first, so thief and owner meet only on an owner's last
// jobs — the owner pops one end of a work-stealing deque and thieves the
// other — and thieves spread over the owners instead of racing for the same
// jobs.
func stealOrder(byOwner [][]protocol.DueCandidate) []protocol.DueCandidate {
	var out []protocol.DueCandidate
	owners := rand.Perm(len(byOwner))
	for taken := true; taken; {
		taken = false
		for _, o := range owners {
			if jobs := byOwner[o]; len(jobs) > 0 {
				out = append(out, jobs[len(jobs)-1])
				byOwner[o] = jobs[:len(jobs)-1]
				taken = true
			}
		}
	}
	return out
}

// anyoneAfter is how many times stealAfter a job waits before any worker
// may take it. From twice stealAfter its third choice may (a tier between
// thief and anyone, so that the jobs of a busy owner and thief are not
// raced for by every idle peer at once).
const anyoneAfter = 3

// third is the rank of a job's third choice: the peer with the third
// highest rendezvous score (-1 with fewer than three peers).
func (s peerSlot) third(id string) int {
	if s.size() < 3 {
		return -1
	}
	o, t := s.choices(id)
	best, third := uint64(0), -1
	for i, name := range s.names {
		if i == o || i == t {
			continue
		}
		if w := rendezvous(name, id); third < 0 || w > best {
			best, third = w, i
		}
	}
	return third
}

// choices are the ranks of a job's owner and of its thief: the peers with
// the highest and second highest rendezvous score of the job (highest
// random weight hashing). When a peer joins or leaves, only the jobs it
// owns (or comes to own) change owner, about one in n: workers that have
// not heard of the change yet disagree on those alone, where ranking
// hash mod n reassigned nearly every job at each change.
func (s peerSlot) choices(id string) (owner, thief int) {
	if s.size() <= 1 {
		return 0, 0
	}
	var best, second uint64
	owner, thief = -1, -1
	for i, name := range s.names {
		switch w := rendezvous(name, id); {
		case owner < 0 || w > best:
			second, thief = best, owner
			best, owner = w, i
		case thief < 0 || w > second:
			second, thief = w, i
		}
	}
	return owner, thief
}

// rendezvous is peer's score for job id: FNV-1a over both, then mixed
// (splitmix64's finalizer) so that nearby names and ids spread.
func rendezvous(peer, id string) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(peer); i++ {
		h = (h ^ uint64(peer[i])) * prime
	}
	h *= prime // a zero byte between: ("ab", "c") and ("a", "bc") differ
	for i := 0; i < len(id); i++ {
		h = (h ^ uint64(id[i])) * prime
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}
