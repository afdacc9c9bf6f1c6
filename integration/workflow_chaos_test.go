package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// killableTransport fails every request once killed: to the database the
// worker behind it is dead (SIGKILL, a pulled cable), while its goroutines
// wind down in the test process without writing anything.
type killableTransport struct {
	next http.RoundTripper
	dead atomic.Bool
}

func (k *killableTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if k.dead.Load() {
		return nil, errors.New("killed")
	}
	return k.next.RoundTrip(r)
}

// A fan-out/fan-in of 100 parents, each enqueueing 10 children from its
// handler and waiting for them, all parents in one batch with a callback,
// while a worker is killed every 2 s and a new one started: no
// continuation starts before its children have finished and no callback
// before every parent (outside clock), each is released exactly once, and
// nothing is left waiting.
func TestFanOutFanInWithWorkersKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("minutes of killing workers")
	}
	tb := setup(t, protocol.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	t.Cleanup(cancel)
	tb.ctx = ctx // longer than setup's: on a loaded machine this runs for minutes
	fanOutFanIn(t, fanOutFixture{
		ctx: ctx, client: tb.client, parents: 100,
		open: func(n int, wrap func(http.RoundTripper) http.RoundTripper) *protocol.Client {
			return clientThrough(t, tb, protocol.Config{}, wrap)
		},
		worker: func(handlers map[string]worker.Handler) worker.Config { return fastWorker(tb, handlers) },
	})
}

// fanOutFixture is where fanOutFanIn runs: a client to enqueue and check
// through, and how to open a worker's client (the n-th started).
type fanOutFixture struct {
	ctx     context.Context
	client  *protocol.Client
	parents int
	open    func(n int, wrap func(http.RoundTripper) http.RoundTripper) *protocol.Client
	worker  func(map[string]worker.Handler) worker.Config
	// midRun, when set, is called once after the first kill.
	midRun func()
}

// fanOutFanIn runs parents x 10 children and a batch callback over the
// parents while a worker is killed every 2 s and a new one started, and
// checks the order (outside clock), that everything is released once and
// that nothing is left waiting.
func fanOutFanIn(t *testing.T, fx fanOutFixture) {
	const children = 10
	parents := fx.parents
	ctx := fx.ctx
	clock := newOutsideClock()
	var callbackRuns atomic.Int32
	handlers := map[string]worker.Handler{
		"parent": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			if job.Continuation {
				clock.start(job.ID + "#continuation")
				defer clock.end(job.ID)
				if len(job.Item.After) != children {
					return worker.JobFail(fmt.Errorf("continuation waited for %d children", len(job.Item.After)))
				}
				return nil
			}
			for k := range children {
				if _, err := job.EnqueueChild(ctx, fmt.Sprint(k), protocol.NewJob{Worker: "child"}); err != nil {
					return err
				}
			}
			return worker.JobAwaitChildren()
		}),
		"child": recording(clock, func(ctx context.Context, job *worker.Job) error {
			time.Sleep(10 * time.Millisecond)
			return nil
		}),
		"collect": recording(clock, func(ctx context.Context, job *worker.Job) error {
			callbackRuns.Add(1)
			return nil
		}),
	}
	type live struct {
		w  *worker.Worker
		tr *killableTransport
	}
	started := 0
	start := func() live {
		tr := &killableTransport{}
		client := fx.open(started, func(next http.RoundTripper) http.RoundTripper {
			tr.next = next
			return tr
		})
		started++
		cfg := fx.worker(handlers)
		cfg.Concurrency = 8
		ctx, cancel := context.WithCancel(ctx)
		t.Cleanup(cancel)
		w, err := worker.New((*couchq.Client)(client), cfg)
		if err == nil {
			err = w.Start(ctx)
		}
		if err != nil {
			t.Error(err) // not Fatal: the killer calls start from its goroutine
			return live{}
		}
		t.Cleanup(func() { _ = w.Stop(context.Background()) })
		return live{w: w, tr: tr}
	}
	workers := []live{start(), start(), start()}

	var jobs []protocol.NewJob
	for i := range parents {
		jobs = append(jobs, protocol.NewJob{Worker: "parent", Payload: i})
	}
	batch, err := fx.client.EnqueueBatch(ctx, jobs, protocol.NewJob{Worker: "collect"})
	if err != nil {
		t.Fatal(err)
	}
	callback := protocol.BatchCallbackID(batch)

	stop := make(chan struct{})
	var killer sync.WaitGroup
	kills := 0
	killer.Add(1)
	go func() {
		defer killer.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Second):
			}
			victim := workers[0]
			if victim.w == nil {
				return
			}
			victim.tr.dead.Store(true)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				_ = victim.w.Stop(ctx) // its writes all fail: it dies holding what it held
			}()
			workers = append(workers[1:], start())
			kills++
			if kills == 1 && fx.midRun != nil {
				fx.midRun()
			}
		}
	}()
	deadline := time.Now().Add(5 * time.Minute)
	lastLog := time.Now()
	for {
		if time.Since(lastLog) > 15*time.Second {
			lastLog = time.Now()
			counts, _ := fx.client.Counts(ctx)
			t.Logf("progress: %v", counts)
		}
		it, err := fx.client.Get(ctx, callback)
		if err == nil && it.Status.Terminal() {
			break
		}
		if time.Now().After(deadline) {
			b, _ := fx.client.Batch(ctx, batch)
			counts, _ := fx.client.Counts(ctx)
			t.Fatalf("the callback did not finish: %+v; batch %+v; counts %v", it, b, counts)
		}
		time.Sleep(200 * time.Millisecond)
	}
	close(stop)
	killer.Wait()
	t.Logf("done after %d kills", kills)

	cb, err := fx.client.Get(ctx, callback)
	if err != nil || cb.Status != protocol.StatusDone {
		t.Fatalf("callback: %+v (%v)", cb, err)
	}
	if !strings.Contains(string(cb.Payload), fmt.Sprintf(`"done":%d`, parents)) {
		t.Errorf("callback payload: %s", cb.Payload)
	}
	if n := strings.Count(events(cb), protocol.EventDependenciesDone); n != 1 {
		t.Errorf("callback released %d times: %s", n, events(cb))
	}
	// A run whose worker was killed before it wrote the outcome runs again:
	// the history shows each such lease that expired.
	if runs, expired := int(callbackRuns.Load()), strings.Count(events(cb), protocol.EventLeaseExpired); runs != 1+expired {
		t.Errorf("callback ran %d times with %d expired leases: %s", runs, expired, events(cb))
	}
	counts, err := fx.client.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if counts["child"][protocol.StatusDone] != int64(parents*children) || counts["parent"][protocol.StatusDone] != int64(parents) ||
		counts["parent"][protocol.StatusWaiting]+counts["child"][protocol.StatusWaiting] != 0 {
		t.Fatalf("counts: %v", counts)
	}
	var parentIDs []string
	listed, err := fx.client.List(ctx, protocol.ListOptions{Worker: "parent", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range listed.Items {
		parentIDs = append(parentIDs, p.ID)
		var kids []string
		for k := range children {
			kids = append(kids, protocol.ChildID(p.ID, fmt.Sprint(k)))
		}
		clock.checkAfter(t, p.ID+"#continuation", kids...)
		if n := strings.Count(events(p), protocol.EventDependenciesDone); n != 1 {
			t.Errorf("parent %s released %d times: %s", p.ID, n, events(p))
		}
	}
	clock.checkAfter(t, callback, parentIDs...)
}

// The same fan-out/fan-in on the cluster, smaller (30 parents), with
// workers attached to nodes 1 and 2 killed every 2 s and node 3 stopped
// after the first kill.
func TestClusterFanOutFanInWithWorkersKilledAndANodeDown(t *testing.T) {
	if testing.Short() {
		t.Skip("minutes of killing workers")
	}
	cb := setupCluster(t, protocol.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	cb.ctx = ctx
	t.Cleanup(func() { _ = cb.cl.StartNode(context.Background(), 3) })
	fanOutFanIn(t, fanOutFixture{
		ctx: ctx, client: cb.clients[0], parents: 30,
		open: func(n int, wrap func(http.RoundTripper) http.RoundTripper) *protocol.Client {
			return cb.openThrough(t, 1+n%2, protocol.Config{}, wrap)
		},
		worker: func(handlers map[string]worker.Handler) worker.Config {
			cfg := clusterWorker(cb.log, handlers)
			cfg.LeaseDuration = 6 * time.Second // a killed worker's jobs come back sooner
			return cfg
		},
		midRun: func() {
			if err := cb.cl.StopNode(ctx, 3); err != nil {
				t.Errorf("stopping node 3: %v", err)
			}
		},
	})
}
