package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// Targets of section 10 (workflows).
const (
	// TargetReleaseP99 bounds the time from a dependency finishing to its
	// dependent starting, on an idle worker of a single node.
	TargetReleaseP99 = 250 * time.Millisecond
	// TargetBatchShare is a batch's throughput, of the same jobs' without
	// a batch.
	TargetBatchShare = 0.80
)

// runRecorder notes when the handler started and ended each job.
type runRecorder struct {
	mu     sync.Mutex
	starts map[string]time.Time
	ends   map[string]time.Time
}

func newRecorder() *runRecorder {
	return &runRecorder{starts: map[string]time.Time{}, ends: map[string]time.Time{}}
}

func (r *runRecorder) handler(next worker.Handler) worker.Handler {
	return worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		r.mu.Lock()
		if _, dup := r.starts[job.ID]; !dup {
			r.starts[job.ID] = time.Now()
		}
		r.mu.Unlock()
		err := next.Handle(ctx, job)
		r.mu.Lock()
		r.ends[job.ID] = time.Now()
		r.mu.Unlock()
		return err
	})
}

func (r *runRecorder) span(parent, child string) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok1 := r.ends[parent]
	s, ok2 := r.starts[child]
	return s.Sub(e), ok1 && ok2
}

// runWorkflows measures release latency (a dependency ending -> its
// dependent starting) on an idle worker, and the throughput of a batch of
// Jobs jobs with a callback against the same jobs without a batch.
func (b *run) runWorkflows(ctx context.Context, s *Section) error {
	if err := b.releaseLatency(ctx, s); err != nil {
		return err
	}
	return b.batchThroughput(ctx, s)
}

func (b *run) releaseLatency(ctx context.Context, s *Section) error {
	cfg := b.cfg
	db, err := b.newDB(ctx, s, "release")
	if err != nil {
		return err
	}
	c, err := b.t.open(ctx, db)
	if err != nil {
		return err
	}
	if _, err := buildViews(ctx, c); err != nil {
		return err
	}
	h, err := noop()
	if err != nil {
		return err
	}
	rec := newRecorder()
	p, err := startPool(ctx, b.t, db, rec.handler(h), []int{cfg.Workers}, cfg)
	if err != nil {
		return err
	}
	defer p.stop(ctx)
	n := max(int(cfg.Rate*cfg.Duration.Seconds()), 1)
	interval := time.Duration(float64(time.Second) / cfg.Rate)
	type pair struct{ parent, child string }
	pairs := make([]pair, 0, n)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for len(pairs) < n {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		parent, err := c.Enqueue(ctx, protocol.NewJob{Worker: jobType})
		if err != nil {
			return err
		}
		child, err := c.Enqueue(ctx, protocol.NewJob{Worker: jobType, After: []string{parent.ID}})
		if err != nil {
			return err
		}
		pairs = append(pairs, pair{parent.ID, child.ID})
	}
	if err := p.waitCompleted(ctx, int64(2*n), lateGrace); err != nil {
		return err
	}
	var samples []time.Duration
	for _, pr := range pairs {
		if d, ok := rec.span(pr.parent, pr.child); ok {
			samples = append(samples, d)
		}
	}
	sum := Summarize(samples)
	s.add(numRow(fmt.Sprintf("pairs (a job and one waiting for it) enqueued at %g/s", cfg.Rate), float64(n), "", 0))
	s.add(durRow("dependency ends -> dependent starts p50", sum.P50))
	row := s.add(durRow("dependency ends -> dependent starts p99", sum.P99))
	row.target(fmt.Sprintf("< %d ms", TargetReleaseP99.Milliseconds()), sum.N == n && sum.P99 < TargetReleaseP99)
	s.add(durRow("dependency ends -> dependent starts max", sum.Max))
	return nil
}

func (b *run) batchThroughput(ctx context.Context, s *Section) error {
	cfg := b.cfg
	n := cfg.Jobs
	h, err := noop()
	if err != nil {
		return err
	}
	// spent is what one timed run used: the wall time, the CPU and the
	// queue clients' requests, for the rows that say where a batch's
	// extra time goes.
	type spent struct {
		wall     time.Duration
		cpu0     cpuUse
		cpu1     cpuUse
		requests traffic
	}
	timed := func(what string, rec *runRecorder, enqueue func(*protocol.Client) (int, error)) (spent, error) {
		var sp spent
		db, err := b.newDB(ctx, s, what)
		if err != nil {
			return sp, err
		}
		c, err := b.t.open(ctx, db)
		if err != nil {
			return sp, err
		}
		total, err := enqueue(c)
		if err != nil {
			return sp, err
		}
		if _, err := buildViews(ctx, c); err != nil {
			return sp, err
		}
		began := time.Now()
		sp.cpu0, sp.requests = b.t.cpu(), b.t.stats.snapshot()
		p, err := startPool(ctx, b.t, db, rec.handler(h), []int{cfg.Workers}, cfg)
		if err != nil {
			return sp, err
		}
		defer p.stop(ctx)
		if err := p.waitCompleted(ctx, int64(total), time.Minute); err != nil {
			return sp, err
		}
		sp.wall = time.Since(began)
		sp.cpu1, sp.requests = b.t.cpu(), b.t.stats.snapshot().since(sp.requests)
		return sp, nil
	}
	// Both runs record their jobs' starts and ends, so that they pay the
	// same for it; the batch's say when its callback started.
	plain, err := timed("plain", newRecorder(), func(c *protocol.Client) (int, error) {
		_, err := enqueueBulk(ctx, c, n)
		return n, err
	})
	if err != nil {
		return err
	}
	rec := newRecorder()
	var callback string
	batched, err := timed("batch", rec, func(c *protocol.Client) (int, error) {
		jobs := make([]protocol.NewJob, n)
		for i := range jobs {
			jobs[i] = protocol.NewJob{Worker: jobType}
		}
		id, err := c.EnqueueBatch(ctx, jobs, protocol.NewJob{Worker: jobType})
		if err != nil {
			return 0, err
		}
		callback = protocol.BatchCallbackID(id)
		// The batches view is built before the clock starts, as the due
		// view is.
		_, err = c.Batch(ctx, id)
		return n + 1, err
	})
	if err != nil {
		return err
	}
	pr, br := rate(int64(n), plain.wall), rate(int64(n), batched.wall)
	s.add(numRow(fmt.Sprintf("%d jobs without a batch, %d workers", n, cfg.Workers), pr, "jobs/s", 1))
	s.add(numRow(fmt.Sprintf("the same %d jobs as one batch with a callback", n), br, "jobs/s", 1))
	row := s.add(numRow("batch throughput, of the same jobs without a batch", 100*ratio(br, pr), "%", 0))
	row.target(fmt.Sprintf(">= %.0f %%", 100*TargetBatchShare), ratio(br, pr) >= TargetBatchShare)
	if last, ok := rec.lastEnd(callback); ok {
		if start, ok := rec.started(callback); ok {
			s.add(durRow("  the batch's last job ends -> its callback starts", start.Sub(last)))
		}
	}
	for _, r := range []struct {
		prefix string
		sp     spent
	}{{"  without a batch: ", plain}, {"  as a batch: ", batched}} {
		cpuRows(s, r.prefix, r.sp.cpu0, r.sp.cpu1, n)
		if cfg.Instrument {
			s.add(numRow(r.prefix+"HTTP requests per job", float64(r.sp.requests.requests())/float64(n), "", 2))
			s.add(numRow(r.prefix+"  of which views other than due", float64(r.sp.requests.reqs[kindView])/float64(n), "", 2))
		}
	}
	return nil
}

// lastEnd is when the last job other than except ended.
func (r *runRecorder) lastEnd(except string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var last time.Time
	for id, e := range r.ends {
		if id != except && e.After(last) {
			last = e
		}
	}
	return last, !last.IsZero()
}

// started is when job first started.
func (r *runRecorder) started(job string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.starts[job]
	return t, ok
}
