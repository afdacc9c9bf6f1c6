package integration

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// CouchDB out of reach for longer than a lease: no claimant can renew,
// and every lease runs out. Once it is back, a live claimant renews at its
// next heartbeat, and another worker's sweeper must leave it that time:
// sweeping the lease would run the job again beside it. Here the claimant
// gets through half a second after the sweeper does.
func TestOutageLongerThanTheLeaseRunsNoJobTwice(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var downA, downB atomic.Bool
	outage := func(down *atomic.Bool) func(http.RoundTripper) http.RoundTripper {
		return func(next http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if down.Load() {
					return nil, errors.New("connection refused (CouchDB out of reach)")
				}
				return next.RoundTrip(r)
			})
		}
	}
	var runs atomic.Int32
	started := make(chan struct{}, 4)
	long := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		runs.Add(1)
		started <- struct{}{}
		select {
		case <-time.After(2*tb.lease + 4*time.Second):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	a := clientThrough(t, tb, protocol.Config{}, outage(&downA))
	runWorker(t, tb.ctx, a, fastWorker(tb, map[string]worker.Handler{"long": long}))
	job := mustEnqueue(t, tb, protocol.NewJob{Worker: "long"})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the job did not start within 10 s")
	}
	b := clientThrough(t, tb, protocol.Config{}, outage(&downB))
	runWorker(t, tb.ctx, b, fastWorker(tb, map[string]worker.Handler{"long": long}))
	time.Sleep(500 * time.Millisecond) // b has written its registry document
	downA.Store(true)
	downB.Store(true)
	time.Sleep(tb.lease + time.Second) // every lease runs out
	downB.Store(false)
	time.Sleep(500 * time.Millisecond)
	downA.Store(false)
	it := waitStatus(t, tb, job.ID, protocol.StatusDone, 4*tb.lease+20*time.Second)
	if n := runs.Load(); n != 1 || it.Attempts != 1 {
		t.Fatalf("%d runs, attempts %d, history %s: want one run", n, it.Attempts, events(it))
	}
}

// A worker cut off from CouchDB for longer than the lease may find, once
// back, that another worker took its job's fleet-wide run slot (and not
// its job: no sweeper returned it meanwhile). With no other slot free it
// cancels its handler and returns the job to the queue, without charging
// the attempt: no more jobs of the type run at once than the limit.
func TestRunSlotTakenWhileCutOffReturnsTheJob(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var downA atomic.Bool
	a := clientThrough(t, tb, protocol.Config{}, func(next http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if downA.Load() {
				return nil, errors.New("connection refused (CouchDB out of reach)")
			}
			return next.RoundTrip(r)
		})
	})
	started := make(chan string, 4)
	cancelled := make(chan string, 4)
	long := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		started <- job.ID
		select {
		case <-time.After(2 * time.Minute): // longer than the test: stopped at its end
			return nil
		case <-ctx.Done():
			cancelled <- job.ID
			return ctx.Err()
		}
	})
	limited := func() worker.Config {
		cfg := fastWorker(tb, map[string]worker.Handler{"fc": long})
		cfg.FleetConcurrency = map[string]int{"fc": 1}
		cfg.SweepInterval = -1 // the job's lease runs out too, and stays
		// Without owners: a job the second worker would leave to the
		// cut-off first for a while is not what this test is about.
		cfg.StealAfter = -1
		return cfg
	}
	runWorker(t, tb.ctx, a, limited())
	first := mustEnqueue(t, tb, protocol.NewJob{Worker: "fc", ID: "first"})
	if id := nextOf(t, started, 10*time.Second); id != first.ID {
		t.Fatalf("%s started, want %s", id, first.ID)
	}
	mustEnqueue(t, tb, protocol.NewJob{Worker: "fc", ID: "second"})
	startWorker(t, tb, limited())
	downA.Store(true)
	if id := nextOf(t, started, tb.lease+15*time.Second); id != "second" {
		t.Fatalf("%s started while the first held the only run slot, want second once its slot's lease ran out", id)
	}
	downA.Store(false)
	if id := nextOf(t, cancelled, 3*tb.lease+5*time.Second); id != first.ID {
		t.Fatalf("%s cancelled, want %s, whose run slot the second took", id, first.ID)
	}
	it := waitStatus(t, tb, first.ID, protocol.StatusQueued, 10*time.Second)
	if it.Attempts != 0 || !strings.Contains(events(it), "released") {
		t.Fatalf("the first job after its run slot was taken: attempts %d, history %s; want it released, uncharged", it.Attempts, events(it))
	}
}

// nextOf is the next value from ch, failing the test after within.
func nextOf(t *testing.T, ch <-chan string, within time.Duration) string {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(within):
		t.Fatalf("nothing within %s", within)
		return ""
	}
}
