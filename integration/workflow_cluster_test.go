package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// On the cluster, the two parents of each dependent finish at once
// through different nodes, and both finishing workers release the
// dependent: the two releases of one revision may both be stored (a
// conflict) but the dependent runs once, after both parents, and the
// sweepers leave no conflict behind. Then, with a node stopped, a chain
// workflow still runs in order.
func TestClusterDependentsOfParentsFinishingThroughDifferentNodes(t *testing.T) {
	cb := setupCluster(t, protocol.Config{})
	const pairs = 20
	var deps []string
	parents := map[string][2]string{}
	for i := range pairs {
		a, err := cb.clients[0].Enqueue(cb.ctx, protocol.NewJob{Worker: "parent", Payload: i, At: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		b, err := cb.clients[1].Enqueue(cb.ctx, protocol.NewJob{Worker: "parent", Payload: i, At: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		d, err := cb.clients[2].Enqueue(cb.ctx, protocol.NewJob{Worker: "dependent", After: []string{a.ID, b.ID}})
		if err != nil {
			t.Fatal(err)
		}
		deps = append(deps, d.ID)
		parents[d.ID] = [2]string{a.ID, b.ID}
	}
	// Finish each pair's parents together, one through node 1 and one
	// through node 2, each client releasing what waits for it.
	var wg sync.WaitGroup
	ended := sync.Map{}
	for _, d := range deps {
		for k, id := range parents[d] {
			client := cb.clients[k]
			wg.Add(1)
			go func() {
				defer wg.Done()
				it, err := client.Get(cb.ctx, id)
				if err != nil {
					t.Error(err)
					return
				}
				claimed, err := client.Claim(cb.ctx, it, fmt.Sprintf("test/node%d", k+1), time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				if err := client.Complete(cb.ctx, claimed, nil); err != nil {
					t.Error(err)
					return
				}
				ended.Store(id, time.Now())
				if err := client.Finished(cb.ctx, claimed, fmt.Sprintf("test/node%d", k+1)); err != nil {
					t.Logf("release through node %d: %v", k+1, err)
				}
			}()
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	var rc runCounter
	startClusterWorker(t, cb, 1, "w1", &rc, "dependent")
	startClusterWorker(t, cb, 3, "w3", &rc, "dependent")
	waitAllDone(t, cb.clients[0], deps, 2*time.Minute)
	if twice := rc.twice(); len(twice) > 0 {
		t.Fatalf("dependents run more than once: %v", twice)
	}
	rc.mu.Lock()
	for _, d := range deps {
		for _, p := range parents[d] {
			e, _ := ended.Load(p)
			if s := rc.started[d][0]; !s.After(e.(time.Time)) {
				t.Errorf("dependent %s started at %s, before parent %s ended", d, s, p)
			}
		}
	}
	rc.mu.Unlock()
	// The sweepers settle any double release.
	deadline := time.Now().Add(time.Minute)
	for {
		res, err := cb.clients[0].Sweep(cb.ctx, "test/sweeper", 0)
		if err != nil {
			t.Fatal(err)
		}
		conflicted := 0
		for _, d := range deps {
			leaves, err := cb.clients[0].Leaves(cb.ctx, d)
			live := 0
			for _, l := range leaves {
				if !l.Deleted {
					live++
				}
			}
			if err != nil || live != 1 {
				conflicted++
			}
		}
		if conflicted == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d dependents without exactly one live revision after a minute of sweeps (last sweep %+v)", conflicted, res)
		}
		time.Sleep(500 * time.Millisecond)
	}

	// A chain of three through a cluster with node 3 stopped.
	if err := cb.cl.StopNode(cb.ctx, 3); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cb.cl.StartNode(context.Background(), 3) })
	clock := newOutsideClock()
	chain := recording(clock, func(ctx context.Context, job *worker.Job) error {
		time.Sleep(10 * time.Millisecond)
		return nil
	})
	cfg := clusterWorker(cb.log, map[string]worker.Handler{"chain": chain})
	cfg.ID = "chain-w2"
	runWorker(t, cb.ctx, cb.clients[1], cfg)
	var last []string
	for i := range 10 {
		first, err := cb.clients[0].Enqueue(cb.ctx, protocol.NewJob{Worker: "chain", Payload: i})
		if err != nil {
			t.Fatal(err)
		}
		second, err := cb.clients[0].Enqueue(cb.ctx, protocol.NewJob{Worker: "chain", After: []string{first.ID}})
		if err != nil {
			t.Fatal(err)
		}
		third, err := cb.clients[1].Enqueue(cb.ctx, protocol.NewJob{Worker: "chain", After: []string{second.ID, first.ID}})
		if err != nil {
			t.Fatal(err)
		}
		last = append(last, third.ID)
		defer clock.checkAfter(t, second.ID, first.ID)
		defer clock.checkAfter(t, third.ID, second.ID, first.ID)
	}
	waitAllDone(t, cb.clients[0], last, 2*time.Minute)
}

// TestDependentOfAFinishingJobIsReleasedByItsEnqueue on the cluster.
func TestClusterDependentOfAFinishingJobIsReleasedByItsEnqueue(t *testing.T) {
	cb := setupCluster(t, protocol.Config{})
	checkDependentOfAFinishingJob(t, cb.ctx, cb.clients[0])
}

// On the cluster, a big batch run by workers through two nodes, with no
// sweeper anywhere: the callback is released by the workers, although
// the copy a finisher's count reads may not have the last outcomes yet.
func TestClusterBatchCallbackWithoutSweepers(t *testing.T) {
	cb := setupCluster(t, protocol.Config{})
	const n = 400
	jobs := make([]protocol.NewJob, n)
	for i := range jobs {
		jobs[i] = protocol.NewJob{Worker: "part"}
	}
	id, err := cb.clients[0].EnqueueBatch(cb.ctx, jobs, protocol.NewJob{Worker: "collect"})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan string, 2)
	for k, node := range []int{1, 2} {
		cfg := clusterWorker(cb.log, map[string]worker.Handler{
			"part":    worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error { return nil }),
			"collect": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error { ran <- string(job.Payload); return nil }),
		})
		cfg.ID = fmt.Sprintf("batch-w%d", k+1)
		cfg.Concurrency = 8
		cfg.SweepInterval = -1
		runWorker(t, cb.ctx, cb.clients[node-1], cfg)
	}
	select {
	case p := <-ran:
		if !strings.Contains(p, fmt.Sprintf(`"done":%d`, n)) {
			t.Fatalf("callback payload: %s", p)
		}
	case <-time.After(90 * time.Second):
		b, err := cb.clients[0].Batch(cb.ctx, id)
		t.Fatalf("the callback did not run; the batch: %+v (%v)", b, err)
	}
}

// On a cluster, the job at the child's id written through one node, the
// parent run by a worker on another.
func TestClusterFanOutRefusesAJobAtAChildsIDThatIsNotItsChild(t *testing.T) {
	cb := setupCluster(t, protocol.Config{})
	var leafRuns atomic.Int32
	runWorker(t, cb.ctx, cb.clients[1], clusterWorker(cb.log, squatterHandlers(&leafRuns)))
	testFanOutRefusesASquatter(t, cb.ctx, cb.clients[0], &leafRuns, func(id string) *protocol.WorkItem {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			it, err := cb.clients[2].Get(cb.ctx, id)
			if err == nil && it.Status == protocol.StatusFailed {
				return it
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s did not fail within 30 s: %+v %v", id, it, err)
			}
		}
	})
}
