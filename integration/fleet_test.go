package integration

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// fleetProbe counts jobs running at once across every worker of a test.
type fleetProbe struct {
	running, peak, done atomic.Int64
}

func (p *fleetProbe) handler() worker.Handler {
	return worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		n := p.running.Add(1)
		for {
			old := p.peak.Load()
			if n <= old || p.peak.CompareAndSwap(old, n) {
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
		p.running.Add(-1)
		p.done.Add(1)
		return nil
	})
}

// Three workers of four slots each share a fleet-wide limit of three
// running jobs: never more run at once, and every job runs.
func TestFleetConcurrencyLimit(t *testing.T) {
	tb := setup(t, protocol.Config{})
	const limit, n = 3, 40
	var p fleetProbe
	jobs := make([]protocol.NewJob, n)
	for i := range jobs {
		jobs[i] = protocol.NewJob{Worker: "heavy"}
	}
	if _, err := tb.client.EnqueueMany(tb.ctx, jobs); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		cfg := fastWorker(tb, map[string]worker.Handler{"heavy": p.handler()})
		cfg.ID, cfg.FleetConcurrency = fmt.Sprintf("f%d", i), map[string]int{"heavy": limit}
		startWorker(t, tb, cfg)
	}
	waitFor(t, 2*time.Minute, "every job to run", func() bool { return p.done.Load() == n })
	t.Logf("peak %d running at once under a fleet limit of %d (3 workers × 4 slots)", p.peak.Load(), limit)
	if p.peak.Load() > limit {
		t.Fatalf("%d jobs ran at once, over the fleet limit of %d", p.peak.Load(), limit)
	}
	if p.peak.Load() < 2 {
		t.Fatalf("peak %d: the limit, not the workers, should bound it", p.peak.Load())
	}
}
