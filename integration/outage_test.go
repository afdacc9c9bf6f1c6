package integration

import (
	"context"
	"errors"
	"net/http"
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
