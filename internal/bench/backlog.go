package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"time"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// runBacklog times claim rounds, as a worker with one free slot makes
// them (list due jobs from the claim view, read the picked one's document,
// claim it), with a small and a large backlog of due jobs. Every index is
// built before timing; each claim then leaves the index one document
// behind, which the next query catches up on, as in production. It times
// two kinds of round: one that reads the view brought up to date (an idle
// worker's) and one that reads it as it stands (a worker behind a backlog,
// which is what a worker meets with 100,000 jobs due).
//
// Both backlogs are built first and their rounds are timed in turn,
// roundsInTurn of each, the order flipped every pair, and so is the
// server's own read and update (one at a time). Timed one backlog after the other, a change in the
// machine's load between the two (the server's own background work, or
// other work on a shared machine) went wholly into the ratio: in one full
// run the small backlog's rounds came out 25 % faster than in any run of
// the section alone, and the ratio missed its target.
func (b *run) runBacklog(ctx context.Context, s *Section) error {
	cfg := b.cfg
	sizes := [2]int{cfg.BacklogSmall, cfg.BacklogLarge}
	kinds := []bool{false, true}
	if b.t.info.Vendor != "couchdb" {
		// PouchDB Server has no update=lazy, and couchq asks for it of
		// Apache CouchDB only: every read indexes first, the local server
		// or one given with --url.
		kinds = kinds[:1]
	}
	var rounds [2]*claimRounds
	var dbs []string
	for i, size := range sizes {
		db, err := b.newDB(ctx, s, fmt.Sprintf("backlog%d", size))
		if err != nil {
			return err
		}
		dbs = append(dbs, db)
		c, err := b.t.open(ctx, db)
		if err != nil {
			return err
		}
		took, err := enqueueBulk(ctx, c, size)
		if err != nil {
			return err
		}
		built, err := buildViews(ctx, c)
		if err != nil {
			return err
		}
		others, err := b.buildOtherIndexes(ctx, db)
		if err != nil {
			return err
		}
		s.add(textRow(fmt.Sprintf("%d due jobs: enqueue, claim view build, every index on every copy built", size),
			fmt.Sprintf("%.1f s, %.1f s, %.1f s", took.Seconds(), built.Seconds(), others.Seconds())))
		if i == 1 {
			b.enqueueRows(s, size, took)
		}
		if idle, ok := b.idleServerCPU(ctx); ok {
			s.add(textRow(fmt.Sprintf("%d due jobs: server CPU while nobody asks, before claims", size),
				fmt.Sprintf("%s per second", formatDuration(idle))))
		}
		rounds[i] = newClaimRounds(c)
	}
	var means [2][2]time.Duration // [size][stale]
	for j, stale := range kinds {
		var times [2]claimTimes
		var used [2]cpuSpans
		err := inTurn((cfg.Claims+roundsInTurn-1)/roundsInTurn, func(i int) error {
			cpu0 := b.t.cpu()
			defer func() { used[i].add(cpu0, b.t.cpu()) }()
			for range min(roundsInTurn, cfg.Claims-len(times[i].total)) {
				if err := rounds[i].claim(ctx, stale, &times[i]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s: %w", roundKind(stale), err)
		}
		for i, size := range sizes {
			what := fmt.Sprintf("%d due jobs, %s", size, roundKind(stale))
			sum := Summarize(times[i].total)
			means[i][j] = sum.Mean
			s.add(textRow(fmt.Sprintf("%s: claim round mean / p95 (%d claims)", what, sum.N),
				fmt.Sprintf("%s / %s", formatDuration(sum.Mean), formatDuration(sum.P95))))
			s.add(textRow(fmt.Sprintf("%s: of the mean, list / read / claim", what),
				fmt.Sprintf("%s / %s / %s", formatDuration(Summarize(times[i].list).Mean),
					formatDuration(Summarize(times[i].read).Mean), formatDuration(Summarize(times[i].claim).Mean))))
			used[i].rows(s, what+": ", sum.N)
		}
	}
	if !cfg.Keep {
		for _, db := range dbs {
			if err := b.t.dropDB(ctx, db); err != nil {
				return err
			}
		}
	}
	bare, err := b.timeBareUpdates(ctx, s, sizes, cfg.Claims)
	if err != nil {
		return err
	}
	for i, size := range sizes {
		s.add(durRow(fmt.Sprintf("%d documents in a bare database: the server's own read and update of one, mean", size), bare[i]))
	}
	s.add(numRow(fmt.Sprintf("ratio %d / %d, the server's own read and update (a yardstick for the rounds)", cfg.BacklogLarge, cfg.BacklogSmall),
		ratio(float64(bare[1]), float64(bare[0])), "x", 2))
	for j, stale := range kinds {
		r := ratio(float64(means[1][j]), float64(means[0][j]))
		row := numRow(fmt.Sprintf("ratio %d / %d, %s", cfg.BacklogLarge, cfg.BacklogSmall, roundKind(stale)), r, "x", 2)
		row.target(fmt.Sprintf("<= %.1f", TargetBacklogRatio), r <= TargetBacklogRatio)
		row.Key = keyBacklogRatio
		if stale {
			row.Key = keyBacklogRatioStale
		}
		s.add(row)
	}
	return nil
}

// roundsInTurn is how many claim rounds section 5 times on one backlog
// before it turns to the other. Each turn reads the server's CPU twice,
// which walks /proc (a few milliseconds of the bench's CPU, once per node
// on a cluster): after every round, that was a fifth of a round's time.
const roundsInTurn = 10

// inTurn calls step n times for each of two backlogs, 0 and 1, in turn:
// 0 1, 1 0, 0 1, … so that neither always goes first (the first of a pair
// may find the server's caches holding the other database).
func inTurn(n int, step func(i int) error) error {
	for r := range n {
		for k := range 2 {
			if err := step(k ^ r&1); err != nil {
				return err
			}
		}
	}
	return nil
}

// enqueueRows judges the enqueue of the large backlog (EnqueueMany) against
// section 1's bulk ceiling: the bare database's (the yardstick) and,
// for what couchq's design document costs, the one with the design
// document as this run installs it (validation on or off).
func (b *run) enqueueRows(s *Section, size int, took time.Duration) {
	r := rate(int64(size), took)
	row := s.add(numRow(fmt.Sprintf("%d due jobs: enqueue rate (EnqueueMany, %d per request)", size, enqueueBatch), r, "jobs/s", 0))
	row.Key = keyEnqueue
	if b.ceiling == nil {
		row.Target = "vs the bulk ceiling: run section 1"
		return
	}
	bare := b.ceiling.bulkBare
	row.target(fmt.Sprintf(">= %.0f%% of %.0f docs/s (bulk, bare)", TargetEnqueueShare*100, bare), r >= TargetEnqueueShare*bare)
	design, what := b.ceiling.bulkDesign, "with couchq's design doc"
	if b.cfg.Validation == designdocs.ValidationOff {
		design, what = b.ceiling.bulkNoValidation, "design doc with validation off"
	}
	share := s.add(textRow(fmt.Sprintf("%d due jobs: enqueue, share of the bulk ceiling, bare / %s", size, what),
		fmt.Sprintf("%.1f %% / %.1f %%", 100*ratio(r, bare), 100*ratio(r, design))))
	share.Value, share.Unit, share.Key = 100*ratio(r, bare), "%", keyEnqueueShare
}

// timeBareUpdates times what a claim round asks of the server at its
// simplest, without couchq: read one document and write it back changed,
// in a database of size job documents with no design document, n times,
// for each of the two sizes in turn (inTurn). How this grows from the small
// backlog to the large one is the server's own: a claim round cannot grow
// less.
func (b *run) timeBareUpdates(ctx context.Context, s *Section, sizes [2]int, n int) ([2]time.Duration, error) {
	var means [2]time.Duration
	var writers [2]*docWriter
	var picks [2][]int
	for i, size := range sizes {
		db, err := b.newBareDB(ctx, s, fmt.Sprintf("backlogbare%d", size))
		if err != nil {
			return means, err
		}
		writers[i] = &docWriter{t: b.t, db: db}
		if err := writers[i].fill(ctx, size, enqueueBatch); err != nil {
			return means, fmt.Errorf("%d documents in a bare database: %w", size, err)
		}
		picks[i] = rand.Perm(size)[:min(n, size)]
	}
	// Let the server settle after the writes (a cluster's copies catching
	// up), as the claims wait for their indexes.
	if !sleepCtx(ctx, idleWindow) {
		return means, ctx.Err()
	}
	var total [2]time.Duration
	var done [2]int
	err := inTurn(n, func(i int) error {
		if done[i] == len(picks[i]) {
			return nil
		}
		id := bulkID(int64(picks[i][done[i]] + 1))
		done[i]++
		took, err := writers[i].readAndUpdate(ctx, id)
		total[i] += took
		return err
	})
	if err != nil {
		return means, fmt.Errorf("the server's own read and update: %w", err)
	}
	for i, w := range writers {
		means[i] = total[i] / time.Duration(done[i])
		if !b.cfg.Keep {
			if err := b.t.dropDB(ctx, w.db); err != nil {
				return means, err
			}
		}
	}
	return means, nil
}

// readAndUpdate reads document id and writes it back changed, and says how
// long the two requests took.
func (w *docWriter) readAndUpdate(ctx context.Context, id string) (time.Duration, error) {
	start := time.Now()
	var doc struct {
		Rev string `json:"_rev"`
	}
	if err := w.do(ctx, http.MethodGet, w.docURL(id), nil, &doc); err != nil {
		return 0, fmt.Errorf("reading %s: %w", id, err)
	}
	body, err := w.jobDoc(id, doc.Rev, 1)
	if err != nil {
		return 0, err
	}
	if err := w.do(ctx, http.MethodPut, w.docURL(id), body, nil); err != nil {
		return 0, fmt.Errorf("updating %s: %w", id, err)
	}
	return time.Since(start), nil
}

func roundKind(stale bool) string {
	if stale {
		return "view as it stands"
	}
	return "view brought up to date"
}

// idleWindow is how long idleServerCPU watches the server.
const idleWindow = 2 * time.Second

// idleServerCPU is the server's CPU per second while the bench sends it
// nothing: work the server does on its own (an index build, compaction)
// that timed claims would share the machine with. ok is false where the
// bench cannot read the server's CPU.
func (b *run) idleServerCPU(ctx context.Context) (perSecond time.Duration, ok bool) {
	before, start := b.t.cpu(), time.Now()
	if !sleepCtx(ctx, idleWindow) {
		return 0, false
	}
	after, took := b.t.cpu(), time.Since(start)
	if !before.serverOK || !after.serverOK {
		return 0, false
	}
	return time.Duration(float64(after.server-before.server) / took.Seconds()), true
}

// claimTimes holds one sample per timed claim: its whole time, and the
// parts of it spent listing due jobs, reading the picked job's document
// and claiming it (summed over the claim's tries), so a backlog that slows
// claims shows which step grew.
type claimTimes struct {
	total, list, read, claim []time.Duration
}

// claimRounds makes a worker's claim rounds on one database, one timed
// claim at a time, as a worker's runner with one free slot does: list the
// first PickAmong due jobs (DueCandidates, with stale as the runner reads
// it behind a backlog), pick one at random among those it did not claim
// itself in the last recentClaims, read its document (FetchCandidates) and
// claim it. The view may still list a job it claimed (read as it stands,
// or on a cluster from a copy that has not caught up): reading it then
// leaves it out, or the claim conflicts, and the round tries again, as a
// runner's would; the sample includes the retries.
type claimRounds struct {
	c         *protocol.Client
	claimedAt map[string]time.Time
}

func newClaimRounds(c *protocol.Client) *claimRounds {
	return &claimRounds{c: c, claimedAt: map[string]time.Time{}}
}

// timeClaims claims n jobs, one round at a time.
func timeClaims(ctx context.Context, c *protocol.Client, n int, stale bool) (claimTimes, error) {
	var times claimTimes
	r := newClaimRounds(c)
	for range n {
		if err := r.claim(ctx, stale, &times); err != nil {
			return times, err
		}
	}
	return times, nil
}

// claim claims one job and adds its samples to times.
func (r *claimRounds) claim(ctx context.Context, stale bool, times *claimTimes) error {
	var list, read, claim time.Duration
	for tries := 1; ; tries++ {
		if tries > maxClaimTries {
			return fmt.Errorf("no claim after %d rounds", maxClaimTries)
		}
		t0 := time.Now()
		cands, _, err := r.c.DueCandidates(ctx, jobType, worker.PickAmongDefault, stale)
		list += time.Since(t0)
		if err != nil {
			return err
		}
		maps.DeleteFunc(r.claimedAt, func(_ string, at time.Time) bool { return time.Since(at) > recentClaims })
		cands = slices.DeleteFunc(cands, func(cand protocol.DueCandidate) bool { _, mine := r.claimedAt[cand.ID]; return mine })
		if len(cands) == 0 {
			if stale {
				continue // the view as it stands lists only our claims
			}
			return errors.New("the due view ran dry")
		}
		pick := cands[rand.IntN(len(cands))]
		t1 := time.Now()
		batch, err := r.c.FetchCandidates(ctx, []protocol.DueCandidate{pick})
		read += time.Since(t1)
		if err != nil {
			return err
		}
		if len(batch.Items) == 0 {
			continue // claimed since it was listed
		}
		t2 := time.Now()
		_, err = r.c.Claim(ctx, batch.Items[0], "bench/backlog", time.Hour)
		claim += time.Since(t2)
		if err == nil {
			r.claimedAt[pick.ID] = time.Now()
			break
		}
		if !errors.Is(err, protocol.ErrClaimConflict) {
			return fmt.Errorf("claiming %s (try %d): %w", pick.ID, tries, err)
		}
	}
	times.total = append(times.total, list+read+claim)
	times.list = append(times.list, list)
	times.read = append(times.read, read)
	times.claim = append(times.claim, claim)
	return nil
}

// recentClaims is how long claimRounds skips a job it claimed, as a
// worker's runner does (a view read as it stands may still list it).
const recentClaims = 2 * time.Second

// maxClaimTries bounds the rounds of one timed claim: a view that lists
// only jobs already claimed for this long is a failure, not lag.
const maxClaimTries = 100
