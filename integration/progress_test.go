package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// progressTarget is where TestProgressIsThrottled runs: the worker's
// client, and a reader (on a cluster, through another node).
type progressTarget struct {
	ctx            context.Context
	worker, reader *protocol.Client
	lease          time.Duration
	log            zerolog.Logger
}

// A handler that reports its progress 1,000 times in about 2 s costs the
// job at most one write per ProgressInterval (each renewing the lease
// too), the progress shows while it runs, and the last report is stored
// with the outcome.
func TestProgressIsThrottled(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		tb := setup(t, protocol.Config{})
		testProgressIsThrottled(t, progressTarget{ctx: tb.ctx, worker: tb.client, reader: tb.client, lease: tb.lease, log: tb.log})
	})
	t.Run("cluster", func(t *testing.T) {
		cb := setupCluster(t, protocol.Config{})
		testProgressIsThrottled(t, progressTarget{ctx: cb.ctx, worker: cb.clients[0], reader: cb.clients[1], lease: 15 * time.Second, log: cb.log})
	})
}

func testProgressIsThrottled(t *testing.T, pt progressTarget) {
	const reports, every = 1000, 500 * time.Millisecond
	ran := make(chan time.Duration, 1)
	cfg := worker.Config{
		Handlers: map[string]worker.Handler{"crawl": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			began := time.Now()
			for i := 1; i <= reports; i++ {
				if err := job.Progress(ctx, i, reports, fmt.Sprintf("page %d", i)); err != nil {
					return err
				}
				time.Sleep(2 * time.Millisecond)
			}
			ran <- time.Since(began)
			return job.SetResult("crawled")
		})},
		LeaseDuration:    pt.lease,
		ProgressInterval: every,
		ShutdownTimeout:  5 * time.Second,
		FeedTimeout:      2 * time.Second,
		Logger:           pt.log,
	}
	runWorker(t, pt.ctx, pt.worker, cfg)
	job, err := pt.worker.Enqueue(pt.ctx, protocol.NewJob{Worker: "crawl"})
	if err != nil {
		t.Fatal(err)
	}
	// Shown while it runs: in the document, couchq show and couchq ls.
	var mid *protocol.WorkItem
	waitFor(t, 30*time.Second, "the running job's progress", func() bool {
		it, err := pt.reader.Get(pt.ctx, job.ID)
		if err == nil && it.Status == protocol.StatusRunning && it.Progress != nil && it.Progress.Done < reports {
			mid = it
			return true
		}
		return false
	})
	if mid.Progress.Total != reports || mid.Progress.Note != fmt.Sprintf("page %d", mid.Progress.Done) || mid.Progress.At == 0 {
		t.Errorf("progress while running: %+v", mid.Progress)
	}
	var show, ls bytes.Buffer
	if err := cli.ShowJob(pt.ctx, &show, pt.reader, job.ID, time.Now(), false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(show.String(), fmt.Sprintf("/%d (", reports)) || !strings.Contains(show.String(), "progress") {
		t.Errorf("couchq show of the running job:\n%s", show.String())
	}
	if err := cli.PrintJobs(pt.ctx, &ls, pt.reader, &protocol.Batch{Items: []*protocol.WorkItem{mid}}, 10, time.Now(), false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ls.String(), fmt.Sprintf("running %d/%d", mid.Progress.Done, reports)) {
		t.Errorf("couchq ls of the running job:\n%s", ls.String())
	}

	it := waitStatus2(t, pt, job.ID, protocol.StatusDone, time.Minute)
	took := <-ran
	if it.Progress == nil || it.Progress.Done != reports || it.Progress.Note != fmt.Sprintf("page %d", reports) {
		t.Errorf("the last report was not stored with the outcome: %+v", it.Progress)
	}
	// Enqueue, claim and outcome, and the job's writes while it ran: one
	// per ProgressInterval at most (the first may come at once), and one
	// more for a renewal that was due.
	writes := revGen(it.Rev) - 3
	if limit := int(took/every) + 2; writes > limit || writes < 1 {
		t.Errorf("%d reports in %s cost %d writes while running, want 1 to %d (one per %s); history %s",
			reports, took.Round(time.Millisecond), writes, limit, every, events(it))
	}
	t.Logf("%d reports in %s: %d writes while running", reports, took.Round(time.Millisecond), writes)
}

// waitStatus2 polls through pt's reader until the job has status.
func waitStatus2(t *testing.T, pt progressTarget, id string, status protocol.Status, within time.Duration) *protocol.WorkItem {
	t.Helper()
	var it *protocol.WorkItem
	waitFor(t, within, "job "+id+" "+string(status), func() bool {
		got, err := pt.reader.Get(pt.ctx, id)
		it = got
		return err == nil && got.Status == status
	})
	return it
}

// revGen is the generation of a revision id.
func revGen(rev string) int {
	var n int
	_, _ = fmt.Sscanf(rev, "%d-", &n)
	return n
}

// A progress write refused with 409 (an operator cancelled the job) is
// handled like a refused lease renewal: the handler's context is
// cancelled and the job stays as the operator left it.
func TestProgressWriteRefusedCancelsTheHandler(t *testing.T) {
	tb := setup(t, protocol.Config{})
	started := make(chan string, 1)
	stopped := make(chan error, 1)
	cfg := fastWorker(tb, map[string]worker.Handler{"crawl": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		started <- job.ID
		for i := 0; ; i++ {
			if err := job.Progress(ctx, i, 0, ""); err != nil {
				stopped <- err
				return err
			}
			select {
			case <-ctx.Done():
				stopped <- context.Cause(ctx)
				return ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	})})
	cfg.ProgressInterval = 200 * time.Millisecond
	cfg.HeartbeatInterval = tb.lease / 2 // later than the progress writes
	startWorker(t, tb, cfg)
	job, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "crawl"})
	if err != nil {
		t.Fatal(err)
	}
	id := <-started
	waitFor(t, 10*time.Second, "a progress write", func() bool {
		it, err := tb.client.Get(tb.ctx, id)
		return err == nil && it.Progress != nil
	})
	if _, err := tb.client.CancelJob(tb.ctx, job.ID, "ops", "not needed"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-stopped:
		if err == nil || !strings.Contains(err.Error(), "lease") && !errors.Is(err, context.Canceled) {
			t.Errorf("the handler stopped with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler was not cancelled after its progress write was refused")
	}
	time.Sleep(300 * time.Millisecond)
	it, err := tb.client.Get(tb.ctx, job.ID)
	if err != nil || it.Status != protocol.StatusCancelled || it.Claimed {
		t.Fatalf("after the refused write: %+v %v, want cancelled as the operator left it", it, err)
	}
}

// loseOneAnswer applies the first PUT of a job's document that carries a
// progress report, then reports the connection cut: the answer is lost.
type loseOneAnswer struct {
	next http.RoundTripper
	lost atomic.Bool
}

func (l *loseOneAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodPut || r.Body == nil || l.lost.Load() {
		return l.next.RoundTrip(r)
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	resp, err := l.next.RoundTrip(r)
	if err != nil || !bytes.Contains(body, []byte(`"progress"`)) || !l.lost.CompareAndSwap(false, true) {
		return resp, err
	}
	_ = resp.Body.Close()
	return nil, errors.New("connection reset (the test lost the answer)")
}

// A progress write the server applied but whose answer was lost makes the
// next write stale (409): the worker finds its own write stored and keeps
// the claim, so the job still runs once, to the end.
func TestProgressWriteWhoseAnswerIsLostKeepsTheClaim(t *testing.T) {
	tb := setup(t, protocol.Config{})
	lose := &loseOneAnswer{}
	client := clientThrough(t, tb, protocol.Config{}, func(next http.RoundTripper) http.RoundTripper {
		lose.next = next
		return lose
	})
	var runs atomic.Int32
	cancelled := make(chan error, 1)
	cfg := fastWorker(tb, map[string]worker.Handler{"crawl": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		runs.Add(1)
		for i := 1; i <= 150; i++ {
			if err := job.Progress(ctx, i, 150, ""); err != nil {
				cancelled <- err
				return err
			}
			time.Sleep(10 * time.Millisecond)
		}
		return nil
	})})
	cfg.ProgressInterval = 200 * time.Millisecond
	cfg.HeartbeatInterval = tb.lease / 2
	runWorker(t, tb.ctx, client, cfg)
	job, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "crawl"})
	if err != nil {
		t.Fatal(err)
	}
	it := waitStatus(t, tb, job.ID, protocol.StatusDone, 30*time.Second)
	select {
	case err := <-cancelled:
		t.Fatalf("the handler was cancelled: %v", err)
	default:
	}
	if !lose.lost.Load() {
		t.Fatal("no answer was lost: the test proved nothing")
	}
	if runs.Load() != 1 || it.Attempts != 1 || it.Progress == nil || it.Progress.Done != 150 {
		t.Fatalf("runs %d, attempts %d, progress %+v; history %s", runs.Load(), it.Attempts, it.Progress, events(it))
	}
}
