package integration

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// A handler that runs past the worker's JobTimeout has its context
// cancelled; the attempt it then fails is retried as any failure is.
func TestJobTimeoutFailsTheAttempt(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var calls atomic.Int32
	cfg := fastWorker(tb, map[string]worker.Handler{
		"stuck": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			if calls.Add(1) == 1 {
				<-ctx.Done()
				if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
					return errors.New("cancelled, but not by a deadline")
				}
				return ctx.Err()
			}
			return nil
		}),
	})
	cfg.JobTimeout = 300 * time.Millisecond
	startWorker(t, tb, cfg)
	job := mustEnqueue(t, tb, protocol.NewJob{Worker: "stuck"})
	it := waitStatus(t, tb, job.ID, protocol.StatusDone, 15*time.Second)
	if it.Attempts != 2 || calls.Load() != 2 {
		t.Fatalf("attempts %d, handler calls %d; want 2 and 2 (timed out, then done)", it.Attempts, calls.Load())
	}
	var failed *protocol.Event
	for i := range it.History {
		if it.History[i].Error != "" {
			failed = &it.History[i]
		}
	}
	if failed == nil || !strings.Contains(failed.Error, "job timed out after 300ms: context deadline exceeded") {
		t.Fatalf("history %s: want the first attempt failed for its timeout (%+v)", events(it), failed)
	}
}

// A handler that ignores its cancelled context keeps its job: the lease is
// renewed until the handler returns, so that no sweep hands the still
// running job to another worker, and what it returns is the outcome.
func TestJobTimeoutKeepsTheLeaseOfAHandlerThatDoesNotReturn(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var calls atomic.Int32
	cfg := fastWorker(tb, map[string]worker.Handler{
		"deaf": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			calls.Add(1)
			time.Sleep(2*tb.lease + time.Second) // past the timeout and two leases
			return nil
		}),
	})
	cfg.JobTimeout = 200 * time.Millisecond
	w := startWorker(t, tb, cfg)
	// A second worker, whose sweeper would take the job were its lease not
	// renewed, and which would run it.
	startWorker(t, tb, fastWorker(tb, map[string]worker.Handler{"deaf": cfg.Handlers["deaf"]}))
	job := mustEnqueue(t, tb, protocol.NewJob{Worker: "deaf"})
	it := waitStatus(t, tb, job.ID, protocol.StatusDone, 2*tb.lease+15*time.Second)
	if calls.Load() != 1 || it.Attempts != 1 {
		t.Fatalf("handler calls %d, attempts %d: want 1 and 1 (history %s)", calls.Load(), it.Attempts, events(it))
	}
	if st := w.Stats(); st.Lost != 0 {
		t.Errorf("%d claims lost", st.Lost)
	}
}
