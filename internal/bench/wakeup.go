package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// lateGrace is how long the wake-up section waits for the last jobs to
// start: past the runtime's 30 s fallback poll, so that a wake-up the feed
// missed shows up as a 30 s sample instead of a missing one.
const lateGrace = worker.FallbackPollDefault + 5*time.Second

// startRecorder notes when the handler saw each job.
type startRecorder struct {
	mu     sync.Mutex
	starts map[string]time.Time
	seen   chan struct{} // capacity 1: "a job started"
}

func newStartRecorder() *startRecorder {
	return &startRecorder{starts: map[string]time.Time{}, seen: make(chan struct{}, 1)}
}

func (r *startRecorder) handler(next worker.Handler) worker.Handler {
	return worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		now := time.Now()
		r.mu.Lock()
		if _, dup := r.starts[job.ID]; !dup {
			r.starts[job.ID] = now
		}
		r.mu.Unlock()
		select {
		case r.seen <- struct{}{}:
		default:
		}
		return next.Handle(ctx, job)
	})
}

func (r *startRecorder) get(id string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.starts[id]
	return t, ok
}

func (r *startRecorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.starts)
}

// waitFor waits until n jobs started or until d passes.
func (r *startRecorder) waitFor(ctx context.Context, n int, d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for r.count() < n {
		select {
		case <-r.seen:
		case <-deadline.C:
			return r.count() >= n
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// runWakeup starts an idle worker, then enqueues jobs one at a time at a
// steady rate and measures enqueue -> handler start for each.
func (b *run) runWakeup(ctx context.Context, s *Section) error {
	cfg := b.cfg
	db, err := b.newDB(ctx, s, "wakeup")
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
	rec := newStartRecorder()
	b.memory.start()
	defer b.memory.stop()
	p, err := startPool(ctx, b.t, db, rec.handler(h), []int{cfg.Workers}, cfg)
	if err != nil {
		return err
	}
	defer p.stop(ctx)

	// One job first: when it has run, the worker follows the feed and has
	// gone idle, which is the state measured.
	warm := protocol.NewID()
	warmAt := time.Now()
	if _, err := c.Enqueue(ctx, protocol.NewJob{Worker: jobType, ID: warm}); err != nil {
		return err
	}
	if !rec.waitFor(ctx, 1, lateGrace) {
		return fmt.Errorf("the warm-up job did not start within %s", lateGrace)
	}
	warmStart, _ := rec.get(warm)
	if !sleepCtx(ctx, 500*time.Millisecond) {
		return ctx.Err()
	}

	n := max(int(cfg.Rate*cfg.Duration.Seconds()), 1)
	interval := time.Duration(float64(time.Second) / cfg.Rate)
	traffic0 := b.t.stats.snapshot()
	q0 := p.stats().Queries
	cpu0 := b.t.cpu()
	ids := make([]string, 0, n)
	enqueuedAt := make(map[string]time.Time, n)
	var putTimes []time.Duration
	tick := time.NewTicker(interval)
	defer tick.Stop()
	began := time.Now()
	// The loop ends after n enqueues, or at twice the planned time when
	// enqueues are slower than the rate (ticks are then dropped).
	stopAt := began.Add(2*cfg.Duration + 5*time.Second)
	for len(ids) < n && time.Now().Before(stopAt) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		id := protocol.NewID()
		t0 := time.Now()
		if _, err := c.Enqueue(ctx, protocol.NewJob{Worker: jobType, ID: id}); err != nil {
			return err
		}
		putTimes = append(putTimes, time.Since(t0))
		ids = append(ids, id)
		enqueuedAt[id] = t0
	}
	enqueueSpan := time.Since(began)
	rec.waitFor(ctx, len(ids)+1, lateGrace)
	tr := b.t.stats.snapshot().since(traffic0)
	cpu1 := b.t.cpu()
	queries := p.stats().Queries - q0

	var samples []time.Duration
	missing := 0
	for _, id := range ids {
		started, ok := rec.get(id)
		if !ok {
			missing++
			continue
		}
		samples = append(samples, started.Sub(enqueuedAt[id]))
	}
	sum := Summarize(samples)
	s.add(numRow(fmt.Sprintf("jobs enqueued one at a time (target rate %g/s)", cfg.Rate), float64(len(ids)), "", 0))
	s.add(numRow("achieved enqueue rate", rate(int64(len(ids)), enqueueSpan), "jobs/s", 1))
	s.add(durRow("warm-up: first job right after worker start", warmStart.Sub(warmAt)))
	s.add(durRow("enqueue -> handler start p50", sum.P50))
	s.add(durRow("enqueue -> handler start p95", sum.P95))
	row := s.add(durRow("enqueue -> handler start p99", sum.P99))
	row.Key = keyWakeupP99
	row.target(fmt.Sprintf("< %d ms", TargetWakeupP99.Milliseconds()), sum.N > 0 && missing == 0 && sum.P99 < TargetWakeupP99)
	s.add(durRow("enqueue -> handler start max", sum.Max))
	s.add(durRow("  of which the enqueue PUT itself, p50", Summarize(putTimes).P50))
	if missing > 0 {
		s.add(numRow(fmt.Sprintf("jobs not started within %s", lateGrace), float64(missing), "", 0))
	}
	s.add(numRow("due-view queries per job", ratio(float64(queries), float64(len(ids))), "", 2))
	b.requestRows(s, tr, len(ids))
	cpuRows(s, "", cpu0, cpu1, len(ids))
	return nil
}

// sleepCtx sleeps for d; false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
