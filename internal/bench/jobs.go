package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/handlers"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// jobType is the job type every section enqueues.
const jobType = "bench"

// enqueueBatch is how many jobs one _bulk_docs request carries.
const enqueueBatch = 500

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// enqueueBulk stores n due jobs with EnqueueMany and returns how long it
// took. Any job refused is an error: the figures would be wrong.
func enqueueBulk(ctx context.Context, c *protocol.Client, n int) (time.Duration, error) {
	return enqueueBulkFor(ctx, c, n, "")
}

// enqueueBulkFor is enqueueBulk of jobs owned by site (empty: none named).
func enqueueBulkFor(ctx context.Context, c *protocol.Client, n int, site string) (time.Duration, error) {
	start := time.Now()
	for done := 0; done < n; {
		size := min(enqueueBatch, n-done)
		jobs := make([]protocol.NewJob, size)
		for i := range jobs {
			jobs[i] = protocol.NewJob{Worker: jobType, Site: site}
		}
		res, err := c.EnqueueMany(ctx, jobs)
		if err != nil {
			return 0, err
		}
		for _, r := range res {
			if r.Err != nil {
				return 0, fmt.Errorf("enqueueing: %w", r.Err)
			}
		}
		done += size
	}
	return time.Since(start), nil
}

// buildViews makes the server index the backlog in the claim view
// (due_priority) before anything is timed: the first query of a view
// indexes every document written since the last one, which would otherwise
// land on the first timed claim.
func buildViews(ctx context.Context, c *protocol.Client) (time.Duration, error) {
	start := time.Now()
	err := askWhileBuilding(ctx, start, func() error {
		_, _, err := c.DueCandidates(ctx, jobType, 1, false)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("building the claim view: %w", err)
	}
	return time.Since(start), nil
}

// buildOtherIndexes brings the sweeper's and the operators' design
// documents' indexes up to date too, and waits until the server builds no
// index of db: a query returns once one copy of each shard is indexed,
// while a cluster's other copies go on building theirs. Otherwise the
// server builds them in the background (CouchDB's auto-indexer) while
// claims are timed: with 100,000 new jobs on this machine's cluster that
// took minutes and tripled the claim latency, a cost the backlog pays
// once, not per claim.
func (b *run) buildOtherIndexes(ctx context.Context, name string) (time.Duration, error) {
	return b.bringIndexesUpToDate(ctx, name, designdocs.SweepID, designdocs.OpsID)
}

// indexRead is a view whose query brings its design document's indexes up
// to date.
var indexRead = map[string]string{designdocs.ID: "due_priority", designdocs.SweepID: "leases", designdocs.OpsID: "by_status"}

// bringIndexesUpToDate queries a view of each design document (ids of
// couchq's, a key of indexRead) and waits until the server builds no index
// of db, and returns how long that took.
func (b *run) bringIndexesUpToDate(ctx context.Context, name string, ddocs ...string) (time.Duration, error) {
	return b.t.bringIndexesUpToDate(ctx, name, ddocs...)
}

// bringIndexesUpToDate is run.bringIndexesUpToDate on this server: section
// 9 builds the indexes of every site's.
func (t *target) bringIndexesUpToDate(ctx context.Context, name string, ddocs ...string) (time.Duration, error) {
	db := t.srv.Client.DB(name)
	start := time.Now()
	for _, ddoc := range ddocs {
		err := askWhileBuilding(ctx, start, func() error {
			rows := db.Query(ctx, ddoc, indexRead[ddoc], kivik.Params(map[string]any{"limit": 0, "reduce": false}))
			defer rows.Close()
			for rows.Next() {
			}
			return rows.Err()
		})
		if err != nil {
			return 0, fmt.Errorf("building %s's indexes: %w", ddoc, err)
		}
	}
	for time.Since(start) < viewBuildLimit {
		if n, ok := t.indexing(ctx, name); !ok || n == 0 {
			break
		}
		if !sleepCtx(ctx, 250*time.Millisecond) {
			return 0, ctx.Err()
		}
	}
	return time.Since(start), nil
}

// askWhileBuilding calls query until it answers, while it fails as a
// cluster fails a query that waited longer than its fabric timeout for an
// index to build (500 "timeout"; 100,000 jobs on this machine): the build
// goes on, so it asks again, a second apart, for at most viewBuildLimit
// since start. Any other failure is returned at once.
func askWhileBuilding(ctx context.Context, start time.Time, query func() error) error {
	for {
		err := query()
		if err == nil || !buildTimedOut(err) || time.Since(start) > viewBuildLimit {
			return err
		}
		if !sleepCtx(ctx, time.Second) {
			return ctx.Err()
		}
	}
}

// buildTimedOut reports CouchDB's answer to a request that outlasted its
// fabric timeout: 500 with the reason below (the error is "timeout").
func buildTimedOut(err error) bool {
	return kivik.HTTPStatus(err) == http.StatusInternalServerError &&
		strings.Contains(err.Error(), "could not be processed in a reasonable amount of time")
}

// viewBuildLimit bounds how long the bench asks again for an index still
// building.
const viewBuildLimit = 30 * time.Minute

// noop is the built-in noop handler, so the bench measures what
// `couchq worker --handler noop` would run.
func noop() (worker.Handler, error) {
	return handlers.New(handlers.NameNoop, handlers.Options{})
}

// workerConfig is a worker running h for the bench's job type, with the
// runtime's defaults for everything else: the bench measures the product.
func workerConfig(h worker.Handler, concurrency int, cfg Config) worker.Config {
	return worker.Config{
		Handlers:    map[string]worker.Handler{jobType: h},
		Concurrency: concurrency,
		Logger:      cfg.Logger.Level(max(cfg.Logger.GetLevel(), warnLevel)),
	}
}

// pool is a set of running workers.
type pool struct {
	workers []*worker.Worker
}

// startPool starts one worker per entry of concurrencies, each with its
// own client (as separate processes would have).
func startPool(ctx context.Context, t *target, db string, h worker.Handler, concurrencies []int, cfg Config) (*pool, error) {
	return startPoolWith(ctx, func(ctx context.Context) (*protocol.Client, error) { return t.open(ctx, db) }, h, concurrencies, cfg)
}

// startPoolWith is startPool with the workers' clients from open (a
// site's, in section 9).
func startPoolWith(ctx context.Context, open func(context.Context) (*protocol.Client, error), h worker.Handler, concurrencies []int, cfg Config) (*pool, error) {
	p := &pool{}
	for _, conc := range concurrencies {
		c, err := open(ctx)
		if err != nil {
			p.stop(ctx)
			return nil, err
		}
		w, err := worker.New((*couchq.Client)(c), workerConfig(h, conc, cfg))
		if err != nil {
			p.stop(ctx)
			return nil, err
		}
		if err := w.Start(ctx); err != nil {
			p.stop(ctx)
			return nil, fmt.Errorf("starting worker: %w", err)
		}
		p.workers = append(p.workers, w)
	}
	return p, nil
}

// stats sums the workers' counters.
func (p *pool) stats() worker.Stats {
	var s worker.Stats
	for _, w := range p.workers {
		ws := w.Stats()
		s.Claimed += ws.Claimed
		s.Conflicts += ws.Conflicts
		s.Completed += ws.Completed
		s.Failed += ws.Failed
		s.Lost += ws.Lost
		s.Queries += ws.Queries
	}
	return s
}

// stopTimeout bounds a pool's graceful stop; no-op jobs finish at once.
const stopTimeout = 30 * time.Second

func (p *pool) stop(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	for _, w := range p.workers {
		_ = w.Stop(ctx)
	}
}

// waitCompleted polls until the pool has completed n jobs. It gives up
// when ctx ends or when nothing completed for stall (a stuck queue must
// not hang the bench).
func (p *pool) waitCompleted(ctx context.Context, n int64, stall time.Duration) error {
	return waitProgress(ctx, n, stall, 20*time.Millisecond, "jobs completed", func() (int64, error) { return p.stats().Completed, nil })
}

// waitProgress reads a count every tick until it reaches n. It gives up
// when ctx ends, when the count did not move for stall, or when read
// fails; what says what is counted, for the error.
func waitProgress(ctx context.Context, n int64, stall, tick time.Duration, what string, read func() (int64, error)) error {
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	last, lastAt := int64(-1), time.Now()
	for {
		got, err := read()
		if err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		if got != last {
			last, lastAt = got, time.Now()
		}
		if time.Since(lastAt) > stall {
			return fmt.Errorf("only %d of %d %s: none for %s", got, n, what, stall)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("only %d of %d %s: %w", got, n, what, ctx.Err())
		case <-ticker.C:
		}
	}
}

// jobTimes are what the stored documents say about a finished backlog.
type jobTimes struct {
	done, other int
	// conflicted counts the jobs not done whose documents have stored
	// conflicts (a cluster).
	conflicted int
	// reruns counts attempts beyond the first (a job run twice).
	reruns int
	// firstStart is the earliest started_at, lastFinish the latest finished_at.
	firstStart, lastFinish time.Time
	// waits are each done job's created_at -> started_at (enqueue ->
	// first claim).
	waits []time.Duration
}

// settleTimeout bounds readDone's wait for a cluster's copies to agree.
const settleTimeout = 15 * time.Second

// readDone reads the jobs of a backlog the workers reported done, and
// checks that all n are. On a cluster a read may reach a shard copy that
// has not yet applied the last outcomes (acknowledged by two copies of
// three), so a short count is read again until the copies catch up. And a
// job can still carry a claim its claimant conceded beside the branch that
// ran it, which CouchDB may pick as the document's winner: the workers'
// sweepers settle such a job once every lease on it ran out, but the pool
// was stopped, so the bench sweeps as they would before reading again.
func readDone(ctx context.Context, c *protocol.Client, n int) (jobTimes, error) {
	deadline := time.Now().Add(settleTimeout)
	for {
		jt, err := readJobs(ctx, c)
		if err != nil {
			return jt, err
		}
		if jt.done == n && jt.other == 0 {
			return jt, nil
		}
		if jt.conflicted > 0 {
			if _, err := c.Sweep(ctx, "couchq-bench", 0); err != nil {
				return jt, fmt.Errorf("settling jobs with stored conflicts: %w", err)
			}
		}
		if time.Now().After(deadline) || !sleepCtx(ctx, 250*time.Millisecond) {
			return jt, fmt.Errorf("after the run %d jobs are done and %d are not (%d of them with stored conflicts), of %d (read again for %s)",
				jt.done, jt.other, jt.conflicted, n, settleTimeout)
		}
	}
}

// readJobs reads every job document, a page at a time.
func readJobs(ctx context.Context, c *protocol.Client) (jobTimes, error) {
	var jt jobTimes
	const page = 1000
	startKey := "job:"
	for range maxJobs/page + 1 {
		rows := c.DB().AllDocs(ctx, kivik.Params(map[string]any{
			"startkey": startKey, "endkey": "job:\ufff0", "include_docs": true, "conflicts": true, "limit": page + 1,
		}))
		n := 0
		next := ""
		for rows.Next() {
			id, _ := rows.ID()
			if n == page {
				next = id
				break
			}
			n++
			var raw json.RawMessage
			if err := rows.ScanDoc(&raw); err != nil {
				_ = rows.Close()
				return jt, fmt.Errorf("reading job %s: %w", id, err)
			}
			var it protocol.WorkItem
			if err := json.Unmarshal(raw, &it); err != nil {
				_ = rows.Close()
				return jt, fmt.Errorf("decoding job %s: %w", id, err)
			}
			jt.add(&it)
		}
		err := rows.Err()
		_ = rows.Close()
		if err != nil {
			return jt, fmt.Errorf("listing jobs: %w", err)
		}
		if next == "" {
			return jt, nil
		}
		startKey = next
	}
	return jt, fmt.Errorf("listing jobs: more than %d", maxJobs)
}

func (jt *jobTimes) add(it *protocol.WorkItem) {
	if it.Status != protocol.StatusDone {
		jt.other++
		if len(it.Conflicts) > 0 {
			jt.conflicted++
		}
		return
	}
	jt.done++
	jt.reruns += max(it.Attempts-1, 0)
	if s := protocol.FromUnix(it.StartedAt); it.StartedAt > 0 && (jt.firstStart.IsZero() || s.Before(jt.firstStart)) {
		jt.firstStart = s
	}
	if it.StartedAt > 0 && it.CreatedAt > 0 {
		jt.waits = append(jt.waits, protocol.FromUnix(it.StartedAt).Sub(protocol.FromUnix(it.CreatedAt)))
	}
	if f := protocol.FromUnix(it.FinishedAt); f.After(jt.lastFinish) {
		jt.lastFinish = f
	}
}

// span is first claim to last done.
func (jt jobTimes) span() time.Duration { return jt.lastFinish.Sub(jt.firstStart) }
