package integration

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/handlers"
	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// fastWorker is a worker config with short, test-sized timings.
func fastWorker(tb *testBundle, handlers map[string]worker.Handler) worker.Config {
	return worker.Config{
		Handlers:        handlers,
		Concurrency:     4,
		LeaseDuration:   tb.lease,
		SweepInterval:   200 * time.Millisecond,
		Retry:           func(int) time.Duration { return 20 * time.Millisecond },
		ShutdownTimeout: 2 * time.Second,
		FeedTimeout:     2 * time.Second,
		FallbackPoll:    time.Minute, // a test that passes proves the feed, not the poll
		Logger:          tb.log,
	}
}

// startWorker starts a worker and stops it when the test ends.
func startWorker(t *testing.T, tb *testBundle, cfg worker.Config) *worker.Worker {
	t.Helper()
	return runWorker(t, tb.ctx, tb.client, cfg)
}

// runWorker starts a worker on client and stops it when the test ends.
func runWorker(t *testing.T, ctx context.Context, client *protocol.Client, cfg worker.Config) *worker.Worker {
	t.Helper()
	w, err := worker.New((*couchq.Client)(client), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	return w
}

// waitStatus polls a job until it reaches status or the deadline passes.
func waitStatus(t *testing.T, tb *testBundle, id string, status protocol.Status, within time.Duration) *protocol.WorkItem {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		it, err := tb.client.Get(tb.ctx, id)
		if err == nil && it.Status == status {
			return it
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s did not reach %s within %s: %+v (err %v)", id, status, within, it, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func events(it *protocol.WorkItem) string {
	var out []string
	for _, e := range it.History {
		out = append(out, e.Event)
	}
	return strings.Join(out, " ")
}

func TestRetryThenSuccess(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var calls atomic.Int32
	startWorker(t, tb, fastWorker(tb, map[string]worker.Handler{
		"flaky": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			if calls.Add(1) < 3 {
				return errors.New("temporary trouble")
			}
			return job.SetResult(map[string]int{"attempt": job.Attempt})
		}),
	}))
	job, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "flaky"})
	if err != nil {
		t.Fatal(err)
	}
	it := waitStatus(t, tb, job.ID, protocol.StatusDone, 10*time.Second)
	if it.Attempts != 3 || string(it.Result) != `{"attempt":3}` || it.LastError != "temporary trouble" {
		t.Fatalf("done job: attempts %d result %s last_error %q", it.Attempts, it.Result, it.LastError)
	}
	if got := events(it); got != "enqueued claimed retry-scheduled claimed retry-scheduled claimed done" {
		t.Fatalf("history: %s", got)
	}
}

// A receiver that answers 503 with Retry-After is not asked again before
// then, however short the worker's own backoff; the wait is capped at a
// day.
func TestRetryWaitsForRetryAfter(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var hits atomic.Int32
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Retry-After", r.URL.Query().Get("after"))
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(receiver.Close)
	startWorker(t, tb, fastWorker(tb, map[string]worker.Handler{"hook": &handlers.Webhook{}}))
	for _, c := range []struct {
		after string
		wait  time.Duration
	}{{"3600", time.Hour}, {"9999999", worker.RetryCapDefault}} {
		before := time.Now()
		job, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "hook", Payload: map[string]string{"url": receiver.URL + "/?after=" + c.after}})
		if err != nil {
			t.Fatal(err)
		}
		it := waitStatus(t, tb, job.ID, protocol.StatusQueued, 10*time.Second)
		for it.Attempts == 0 {
			time.Sleep(20 * time.Millisecond)
			it = waitStatus(t, tb, job.ID, protocol.StatusQueued, 10*time.Second)
		}
		due := time.Unix(0, int64(it.Date*1e9))
		if due.Before(before.Add(c.wait)) || due.After(time.Now().Add(c.wait)) {
			t.Fatalf("Retry-After %s: the retry is due in %s, want %s", c.after, time.Until(due).Round(time.Second), c.wait)
		}
		if events(it) != "enqueued claimed retry-scheduled" {
			t.Fatalf("history: %s", events(it))
		}
	}
	time.Sleep(500 * time.Millisecond)
	if n := hits.Load(); n != 2 {
		t.Fatalf("the receiver was asked %d times, want once per job", n)
	}
}

func TestErrorsUntilFailed(t *testing.T) {
	tb := setup(t, protocol.Config{})
	startWorker(t, tb, fastWorker(tb, map[string]worker.Handler{
		"doomed": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			return errors.New("still broken")
		}),
	}))
	job, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "doomed", MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	it := waitStatus(t, tb, job.ID, protocol.StatusFailed, 10*time.Second)
	if it.Attempts != 3 || it.LastError != "still broken" || it.Claimed {
		t.Fatalf("failed job: %+v", it)
	}
	// A job without max_attempts fails after the worker's default, and
	// says so: a reader of another default reads the worker's.
	two := setup(t, protocol.Config{MaxAttempts: 2})
	startWorker(t, two, fastWorker(two, map[string]worker.Handler{
		"doomed": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error { return errors.New("still broken") }),
	}))
	job, err = two.client.Enqueue(two.ctx, protocol.NewJob{Worker: "doomed"})
	if err != nil {
		t.Fatal(err)
	}
	it = waitStatus(t, two, job.ID, protocol.StatusFailed, 10*time.Second)
	if it.Attempts != 2 || it.MaxAttempts != 2 || tb.client.MaxAttempts(it) != 2 {
		t.Fatalf("failed after the worker's default of 2: attempts %d, max_attempts %d, read as %d", it.Attempts, it.MaxAttempts, tb.client.MaxAttempts(it))
	}
}

func TestSnoozeCancelFailNowAndPanic(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var snoozed atomic.Bool
	startWorker(t, tb, fastWorker(tb, map[string]worker.Handler{
		"snooze": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			if !snoozed.Swap(true) {
				return worker.JobSnooze(100 * time.Millisecond)
			}
			return nil
		}),
		"cancel": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			return worker.JobCancel(errors.New("customer closed the account"))
		}),
		"failnow": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			return worker.JobFail(errors.New("bad input, no retry"))
		}),
		"panic": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			if job.Attempt == 1 {
				panic("nil map somewhere")
			}
			return nil
		}),
		// JobFail(err) and JobCancel(err) of an err that happened to be nil:
		// the job still fails or is cancelled, and the worker lives on.
		"failnil": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			return worker.JobFail(nil)
		}),
		"cancelnil": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			return worker.JobCancel(nil)
		}),
	}))
	ids := map[string]string{}
	for _, typ := range []string{"snooze", "cancel", "failnow", "panic", "failnil", "cancelnil"} {
		job, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: typ})
		if err != nil {
			t.Fatal(err)
		}
		ids[typ] = job.ID
	}
	it := waitStatus(t, tb, ids["snooze"], protocol.StatusDone, 10*time.Second)
	if it.Attempts != 1 || events(it) != "enqueued claimed snoozed claimed done" {
		t.Fatalf("snooze must not count an attempt: attempts %d, history %s", it.Attempts, events(it))
	}
	it = waitStatus(t, tb, ids["cancel"], protocol.StatusCancelled, 10*time.Second)
	if !strings.Contains(it.LastError, "customer closed the account") {
		t.Fatalf("cancel reason lost: %q", it.LastError)
	}
	it = waitStatus(t, tb, ids["failnow"], protocol.StatusFailed, 10*time.Second)
	if it.Attempts != 1 || it.LastError != "bad input, no retry" {
		t.Fatalf("fail-now: attempts %d last_error %q", it.Attempts, it.LastError)
	}
	it = waitStatus(t, tb, ids["panic"], protocol.StatusDone, 10*time.Second)
	if it.Attempts != 2 || !strings.Contains(it.History[2].Error, "nil map somewhere") {
		t.Fatalf("panic: attempts %d, history %+v", it.Attempts, it.History)
	}
	it = waitStatus(t, tb, ids["failnil"], protocol.StatusFailed, 10*time.Second)
	if it.Attempts != 1 || it.LastError != "failed for good (no error given)" {
		t.Fatalf("JobFail(nil): attempts %d last_error %q", it.Attempts, it.LastError)
	}
	it = waitStatus(t, tb, ids["cancelnil"], protocol.StatusCancelled, 10*time.Second)
	if it.LastError != "cancelled" {
		t.Fatalf("JobCancel(nil): last_error %q", it.LastError)
	}
}

// A job scheduled 2 s ahead does not start early and starts within 500 ms
// after its time, with no poll interval involved (FallbackPoll is a minute).
func TestScheduledJobStartsOnTime(t *testing.T) {
	tb := setup(t, protocol.Config{})
	started := make(chan time.Time, 1)
	startWorker(t, tb, fastWorker(tb, map[string]worker.Handler{
		"later": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			started <- time.Now()
			return nil
		}),
	}))
	time.Sleep(200 * time.Millisecond) // the worker is idle, waiting on the feed
	at := time.Now().Add(2 * time.Second)
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "later", At: at}); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-started:
		if s.Before(at) {
			t.Fatalf("started %s early", at.Sub(s))
		}
		if late := s.Sub(at); late > 500*time.Millisecond {
			t.Fatalf("started %s late", late)
		}
		t.Logf("started %s after its time", s.Sub(at))
	case <-time.After(5 * time.Second):
		t.Fatal("scheduled job never started")
	}
}

// A job that comes due while every slot is taken starts when one frees,
// not at the fallback poll (a minute): with its slots taken a worker sets
// no timer for the next scheduled job, so the freed slot must wake it.
func TestScheduledJobDueWhileEverySlotIsTakenStartsWhenOneFrees(t *testing.T) {
	tb := setup(t, protocol.Config{})
	const busyFor = time.Second
	started := make(chan time.Time, 2)
	cfg := fastWorker(tb, map[string]worker.Handler{
		"slot": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			started <- time.Now()
			if job.ID == "long" {
				select {
				case <-time.After(busyFor):
				case <-ctx.Done():
				}
			}
			return nil
		}),
	})
	cfg.Concurrency = 1
	startWorker(t, tb, cfg)
	time.Sleep(200 * time.Millisecond) // the worker is idle, waiting on the feed
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "slot", ID: "scheduled", At: time.Now().Add(busyFor / 2)}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the worker has a timer for it
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "slot", ID: "long"}); err != nil {
		t.Fatal(err)
	}
	var freed time.Time
	select {
	case s := <-started:
		freed = s.Add(busyFor)
	case <-time.After(5 * time.Second):
		t.Fatal("the long job never started")
	}
	select {
	case s := <-started:
		if late := s.Sub(freed); late > 2*time.Second {
			t.Fatalf("the scheduled job started %s after the slot freed", late)
		}
		t.Logf("the scheduled job started %s after the slot freed", s.Sub(freed))
	case <-time.After(10 * time.Second):
		t.Fatal("the scheduled job did not start within 10 s of its time; its worker's only slot freed after 1 s")
	}
}

// An idle worker wakes on the changes feed: a new job starts at once.
func TestIdleWorkerWakesOnChanges(t *testing.T) {
	tb := setup(t, protocol.Config{})
	started := make(chan time.Time, 1)
	w := startWorker(t, tb, fastWorker(tb, map[string]worker.Handler{
		"ping": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			started <- time.Now()
			return nil
		}),
	}))
	time.Sleep(300 * time.Millisecond)
	before := w.Stats().Queries
	time.Sleep(time.Second)
	if idle := w.Stats().Queries - before; idle > 1 {
		t.Fatalf("idle worker made %d due queries in a second: busy polling", idle)
	}
	enq := time.Now()
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "ping"}); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-started:
		t.Logf("wake-up latency %s", s.Sub(enq))
		if s.Sub(enq) > time.Second {
			t.Fatalf("wake-up took %s", s.Sub(enq))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("job never started: the worker did not wake on the feed")
	}
}

// A job whose handler runs three times the lease is not swept while its
// worker lives: heartbeats renew the lease.
func TestLongJobKeepsItsLease(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var runs atomic.Int32
	cfg := fastWorker(tb, map[string]worker.Handler{
		"long": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			runs.Add(1)
			select {
			case <-time.After(3 * time.Second):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}),
	})
	cfg.LeaseDuration = time.Second
	cfg.HeartbeatInterval = 250 * time.Millisecond
	cfg.SweepInterval = 100 * time.Millisecond
	startWorker(t, tb, cfg)
	// A second worker process's sweeper, eager to sweep.
	sweeper := cfg
	sweeper.Handlers = map[string]worker.Handler{"other": worker.HandlerFunc(func(context.Context, *worker.Job) error { return nil })}
	startWorker(t, tb, sweeper)
	job, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "long"})
	if err != nil {
		t.Fatal(err)
	}
	it := waitStatus(t, tb, job.ID, protocol.StatusDone, 10*time.Second)
	if runs.Load() != 1 || it.Attempts != 1 || strings.Contains(events(it), "lease-expired") {
		t.Fatalf("long job swept while alive: runs %d, attempts %d, history %s", runs.Load(), it.Attempts, events(it))
	}
}

// Graceful shutdown with jobs in flight: one finishes within the timeout;
// one that outlives it is cancelled and released, not failed, not lost.
func TestGracefulShutdownFinishesOrReleases(t *testing.T) {
	tb := setup(t, protocol.Config{})
	running := make(chan string, 2)
	cfg := fastWorker(tb, map[string]worker.Handler{
		"quick": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			running <- job.ID
			time.Sleep(300 * time.Millisecond)
			return nil
		}),
		"slow": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			running <- job.ID
			<-ctx.Done()
			return ctx.Err()
		}),
	})
	cfg.ShutdownTimeout = time.Second
	w, err := worker.New((*couchq.Client)(tb.client), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(tb.ctx); err != nil {
		t.Fatal(err)
	}
	quick, _ := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "quick"})
	slow, _ := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "slow"})
	for range 2 {
		select {
		case <-running:
		case <-time.After(5 * time.Second):
			t.Fatal("jobs did not start")
		}
	}
	if err := w.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if it, _ := tb.client.Get(tb.ctx, quick.ID); it.Status != protocol.StatusDone {
		t.Fatalf("quick job: %s", it.Status)
	}
	it, _ := tb.client.Get(tb.ctx, slow.ID)
	if it.Status != protocol.StatusQueued || it.Claimed || it.Attempts != 0 || !strings.HasSuffix(events(it), "released") {
		t.Fatalf("slow job must be released without charging an attempt: %+v", it)
	}
	// Its entry names the attempt released, the first.
	if e := it.History[len(it.History)-1]; e.Attempt != 1 {
		t.Fatalf("the released entry names attempt %d, want 1 (the attempt released)", e.Attempt)
	}
	workers, err := tb.client.Workers(tb.ctx)
	if err != nil || len(workers) != 0 {
		t.Fatalf("registry after a clean exit: %v %d", err, len(workers))
	}
}

// Drain mode exits once no due work remains and leaves nothing claimed.
func TestDrainModeExitsWhenEmpty(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var jobs []protocol.NewJob
	for i := range 40 {
		jobs = append(jobs, protocol.NewJob{Worker: "cron", Payload: i})
	}
	if _, err := tb.client.EnqueueMany(tb.ctx, jobs); err != nil {
		t.Fatal(err)
	}
	var done atomic.Int32
	cfg := fastWorker(tb, map[string]worker.Handler{
		"cron": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			done.Add(1)
			return nil
		}),
	})
	cfg.Drain = true
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 { // overlapping runs share the work
		w, err := worker.New((*couchq.Client)(tb.client), cfg)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(tb.ctx, 20*time.Second)
			defer cancel()
			errs <- w.Run(ctx)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if done.Load() != 40 {
		t.Fatalf("%d jobs ran, want 40", done.Load())
	}
	batch, err := tb.client.List(tb.ctx, protocol.ListOptions{Worker: "cron", Status: protocol.StatusRunning})
	if err != nil || len(batch.Items) != 0 {
		t.Fatalf("left claimed: %v %d", err, len(batch.Items))
	}
}

// Drain mode runs what its own handlers enqueue before it exits: a job of
// another of its types, and the children of a fan-out with the
// continuation that waits for them, though the types they are of found
// nothing due when the worker started.
func TestDrainRunsWhatItsHandlersEnqueue(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var ran sync.Map
	count := func(job *worker.Job) {
		n, _ := ran.LoadOrStore(job.ID, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
	}
	cfg := fastWorker(tb, map[string]worker.Handler{
		"upload": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			count(job)
			if job.Continuation {
				return nil
			}
			time.Sleep(300 * time.Millisecond) // the other types have looked and found nothing by now
			if _, err := tb.client.Enqueue(ctx, protocol.NewJob{Worker: "email", ID: "email-of-" + job.ID}); err != nil {
				return err
			}
			for i := range 3 {
				if _, err := job.EnqueueChild(ctx, fmt.Sprint(i), protocol.NewJob{Worker: "thumbnail"}); err != nil {
					return err
				}
			}
			return worker.JobAwaitChildren()
		}),
		"thumbnail": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error { count(job); return nil }),
		"email":     worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error { count(job); return nil }),
	})
	up, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "upload", ID: "upload"})
	if err != nil {
		t.Fatal(err)
	}
	drain(t, tb.ctx, tb.client, cfg)
	for _, typ := range []string{"upload", "thumbnail", "email"} {
		for _, it := range allJobs(t, tb, typ) {
			n, _ := ran.Load(it.ID)
			if it.Status != protocol.StatusDone || n == nil {
				t.Errorf("%s job %s is %s after the drain, ran %v times", typ, it.ID, it.Status, n)
			}
		}
	}
	if n, _ := ran.Load(up.ID); n == nil || n.(*atomic.Int32).Load() != 2 {
		t.Errorf("upload ran %v times, want 2 (the job and its continuation)", n)
	}
	if n, _ := ran.Load("email-of-upload"); n == nil {
		t.Error("the email job the upload enqueued did not run")
	}
}

// A drain sweeps before it ends: the job a killed worker held, its lease
// run out, is returned and run, though the drain ends long before a sweep
// interval (cron runs of --drain may be every worker there is).
func TestDrainSweepsFirst(t *testing.T) {
	tb := setup(t, protocol.Config{})
	job, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "cron"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tb.client.Claim(tb.ctx, job, "killed/1/w", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // its lease runs out; its worker is gone
	var ran atomic.Int32
	cfg := fastWorker(tb, map[string]worker.Handler{
		"cron": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error { ran.Add(1); return nil }),
	})
	cfg.SweepInterval = time.Hour
	drain(t, tb.ctx, tb.client, cfg)
	if it, err := tb.client.Get(tb.ctx, job.ID); err != nil || it.Status != protocol.StatusDone || ran.Load() != 1 {
		t.Errorf("the killed worker's job after a drain: %+v (%v), ran %d times", it, err, ran.Load())
	}
}

// drain runs a worker of cfg in Drain mode on client until it returns
// (30 s at most).
func drain(t *testing.T, ctx context.Context, client *protocol.Client, cfg worker.Config) {
	t.Helper()
	cfg.Drain = true
	w, err := worker.New((*couchq.Client)(client), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// Stop returns soon after its context ends even when a handler ignores
// its own, releasing that job's claim for it; a worker never started
// stops at once.
func TestStopHonoursItsContext(t *testing.T) {
	tb := setup(t, protocol.Config{})
	running := make(chan struct{}, 1)
	release := make(chan struct{})
	defer close(release)
	cfg := fastWorker(tb, map[string]worker.Handler{
		"stubborn": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			running <- struct{}{}
			<-release // ignores ctx
			return nil
		}),
	})
	cfg.ShutdownTimeout = time.Minute
	cfg.LeaseDuration = time.Minute
	cfg.HeartbeatInterval = 20 * time.Second
	idle, err := worker.New((*couchq.Client)(tb.client), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := idle.Stop(tb.ctx); err != nil {
		t.Fatalf("stopping a worker never started: %v", err)
	}
	// A Worker runs once: a Start after Stop would claim nothing (or, after
	// a run, panic in a goroutine of its own), so it is refused.
	if err := idle.Start(tb.ctx); err == nil || !strings.Contains(err.Error(), "it was stopped") {
		t.Errorf("Start after Stop: %v", err)
	}
	if nothing, err := worker.New(nil, cfg); err != nil || nothing.Start(tb.ctx) == nil {
		t.Fatalf("a worker of no queue client started (New: %v)", err)
	}
	w, err := worker.New((*couchq.Client)(tb.client), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(tb.ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(tb.ctx); err == nil || !strings.Contains(err.Error(), "started already") {
		t.Errorf("a second Start: %v", err)
	}
	job, _ := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "stubborn"})
	select {
	case <-running:
	case <-time.After(10 * time.Second):
		t.Fatal("the job did not start")
	}
	ctx, cancel := context.WithTimeout(tb.ctx, time.Second)
	defer cancel()
	began := time.Now()
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// Far below the shutdown timeout and the heartbeat interval that a
	// stubborn handler gets when Stop's own context has not ended.
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("Stop with a context of 1 s took %s", took)
	}
	if it, _ := tb.client.Get(tb.ctx, job.ID); it.Status != protocol.StatusQueued || it.Claimed {
		t.Errorf("the stubborn job after Stop: %+v", it)
	}
	if err := w.Start(tb.ctx); err == nil || !strings.Contains(err.Error(), "it was stopped") {
		t.Errorf("Start after a run and Stop: %v", err)
	}
	time.Sleep(200 * time.Millisecond) // a panic of a restarted run would show by now
}

// Finished jobs are kept as done by default; DeleteDone deletes them, per
// job type.
func TestDeleteDoneIsPerType(t *testing.T) {
	tb := setup(t, protocol.Config{})
	noop := worker.HandlerFunc(func(context.Context, *worker.Job) error { return nil })
	cfg := fastWorker(tb, map[string]worker.Handler{"keep": noop, "purge": noop})
	cfg.DeleteDone = map[string]bool{"purge": true}
	cfg.Drain = true
	kept, _ := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "keep"})
	gone, _ := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "purge"})
	w, err := worker.New((*couchq.Client)(tb.client), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(tb.ctx); err != nil {
		t.Fatal(err)
	}
	if it, err := tb.client.Get(tb.ctx, kept.ID); err != nil || it.Status != protocol.StatusDone {
		t.Fatalf("kept job: %v %+v", err, it)
	}
	if _, err := tb.client.Get(tb.ctx, gone.ID); !errors.Is(err, protocol.ErrNotFound) {
		t.Fatalf("a finished job of a DeleteDone type must be deleted: %v", err)
	}
}

// slowWrites delays every document write (PUT, _bulk_docs) to the real
// server by delay while on is set: a loaded cluster, as a worker sees it.
type slowWrites struct {
	next  http.RoundTripper
	delay time.Duration
	on    atomic.Bool
}

func (s *slowWrites) RoundTrip(r *http.Request) (*http.Response, error) {
	if s.on.Load() && (r.Method == http.MethodPut || strings.HasSuffix(r.URL.Path, "/_bulk_docs")) {
		time.Sleep(s.delay)
	}
	return s.next.RoundTrip(r)
}

// A lease renewal that takes over a third of the lease is a warning, once a minute however many renewals are slow, naming a lease
// that would fit; the job still runs once and finishes.
func TestSlowLeaseRenewalsWarnOnce(t *testing.T) {
	tb := setup(t, protocol.Config{})
	hc := protocol.NewHTTPClient()
	slow := &slowWrites{next: hc.Transport, delay: 350 * time.Millisecond}
	hc.Transport = slow
	user, password := server.Credentials()
	srv, err := protocol.ConnectHTTP(tb.ctx, server.URL(), user, password, hc)
	if err != nil {
		t.Fatal(err)
	}
	warnings := &lineCounter{phrase: "lease renewal slow", t: t}
	log := zerolog.New(warnings).Level(zerolog.WarnLevel)
	client, err := srv.Open(tb.ctx, tb.db.Name(), protocol.Config{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	cfg := fastWorker(tb, map[string]worker.Handler{"slow": worker.HandlerFunc(func(ctx context.Context, j *worker.Job) error {
		runs.Add(1)
		slow.on.Store(true) // from now on, writes are slow
		select {
		case <-time.After(2 * time.Second):
		case <-ctx.Done():
		}
		return nil
	})})
	cfg.Logger = log
	// Renewals take 350 ms of a 900 ms lease: over a third, yet in time.
	cfg.LeaseDuration, cfg.HeartbeatInterval = 900*time.Millisecond, 200*time.Millisecond
	w, err := worker.New((*couchq.Client)(client), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(tb.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	job, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "slow"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the slow job done", func() bool {
		it, err := tb.client.Get(tb.ctx, job.ID)
		return err == nil && it.Status == protocol.StatusDone
	})
	if n := warnings.n.Load(); n != 1 {
		t.Fatalf("%d slow-renewal warnings, want exactly 1", n)
	}
	if st := w.Stats(); st.SlowRenewals < 2 || runs.Load() != 1 {
		t.Fatalf("slow renewals %d (want several), runs %d", st.SlowRenewals, runs.Load())
	}
}

// A producer's Config.MaxAttempts is stored in the jobs it enqueues
// without their own, so that a worker of another default keeps it.
func TestProducerMaxAttemptsIsStoredInItsJobs(t *testing.T) {
	tb := setup(t, protocol.Config{}) // tb.client, a worker's, has the default 25
	user, password := server.Credentials()
	srv, err := couchq.Connect(tb.ctx, server.URL(), user, password)
	if err != nil {
		t.Fatal(err)
	}
	producer, err := srv.Open(tb.ctx, tb.db.Name(), couchq.Config{MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := srv.Open(tb.ctx, tb.db.Name(), couchq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	limited, err := producer.Enqueue(tb.ctx, couchq.NewJob{Worker: "flaky"})
	if err != nil || limited.MaxAttempts != 2 {
		t.Fatalf("a job of a producer with MaxAttempts 2: %+v %v", limited, err)
	}
	if own, err := producer.Enqueue(tb.ctx, couchq.NewJob{Worker: "other", MaxAttempts: 7}); err != nil || own.MaxAttempts != 7 {
		t.Errorf("a job with its own max attempts: %+v %v", own, err)
	}
	if dflt, err := plain.Enqueue(tb.ctx, couchq.NewJob{Worker: "other"}); err != nil || dflt.MaxAttempts != 0 {
		t.Errorf("a job of a producer without MaxAttempts: %+v %v, want none stored", dflt, err)
	}
	if _, err := srv.Open(tb.ctx, tb.db.Name(), couchq.Config{MaxAttempts: math.MaxInt32 + 1}); !errors.Is(err, couchq.ErrInvalidJob) {
		t.Errorf("MaxAttempts above 2^31-1: %v", err)
	}
	var runs atomic.Int32
	cfg := fastWorker(tb, map[string]worker.Handler{"flaky": worker.HandlerFunc(func(context.Context, *worker.Job) error {
		runs.Add(1)
		return errors.New("always")
	})})
	startWorker(t, tb, cfg)
	deadline := time.Now().Add(time.Minute)
	for {
		it, err := tb.client.Get(tb.ctx, limited.ID)
		if err == nil && it.Status == protocol.StatusFailed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job did not fail for good: %+v %v", it, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	if n := runs.Load(); n != 2 {
		t.Errorf("the job of a producer with MaxAttempts 2 ran %d times", n)
	}
}

// A job whose handler succeeds while CouchDB is down, for longer than a
// lease and than the write of an outcome used to be tried, runs once: the
// worker keeps its outcome and writes it when CouchDB answers again, and
// its own sweep does not return the job it holds to the queue as a dead
// claimant's.
func TestAnOutcomeOutlivesAnOutage(t *testing.T) {
	site := server.NewSite(t)
	if site.Caps().Vendor != "couchdb" {
		couchtest.Skip(t, "stopping a server mid-test needs a local Apache CouchDB release")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	user, password := site.Credentials()
	conn, err := protocol.Connect(ctx, site.URL(), user, password)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := protocol.Init(ctx, conn.Client, "outage", zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	client, err := conn.Open(ctx, "outage", protocol.Config{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}, 4), make(chan struct{})
	var runs atomic.Int32
	w, err := worker.New((*couchq.Client)(client), worker.Config{
		Handlers: map[string]worker.Handler{"slow": worker.HandlerFunc(func(context.Context, *worker.Job) error {
			runs.Add(1)
			started <- struct{}{}
			<-release
			return nil
		})},
		LeaseDuration: 3 * time.Second, HeartbeatInterval: time.Second, SweepInterval: 500 * time.Millisecond,
		QueryTimeout: 2 * time.Second, FeedTimeout: 2 * time.Second, FallbackPoll: time.Second, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()
	job, err := client.Enqueue(ctx, protocol.NewJob{Worker: "slow"})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	if err := site.StopSite(ctx); err != nil {
		t.Fatal(err)
	}
	close(release)               // the handler succeeds while CouchDB is down
	time.Sleep(35 * time.Second) // past the lease, and the 30 s an outcome used to be tried
	if err := site.StartSite(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		it, err := client.Get(ctx, job.ID)
		if err == nil && it.Status == protocol.StatusDone {
			for _, e := range it.History {
				if e.Event == protocol.EventLeaseExpired {
					t.Errorf("the job's lease was swept while its worker held it: %+v", it.History)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job is not done after the outage: %+v %v", it, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // a second run, if any, would have started
	if n := runs.Load(); n != 1 {
		t.Errorf("the job ran %d times across the outage, want once", n)
	}
}
