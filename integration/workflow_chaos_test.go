package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// The fan-out/fan-in chaos tests run their workers as separate processes,
// this test binary again, and kill them with SIGKILL: a killed worker gets
// no chance to write anything, release a claim or finish a request. When
// fanOutWorkerEnv is set TestMain runs fanOutWorkerProcess instead of the
// tests (and starts no test server); the other variables say where to
// work and how.
const (
	fanOutWorkerEnv   = "COUCHQ_FANOUT_WORKER" // the timings: "node" (fastWorker's) or "cluster" (clusterWorker's)
	fanOutURLEnv      = "COUCHQ_FANOUT_URL"    // the server (or cluster node) to attach to
	fanOutUserEnv     = "COUCHQ_FANOUT_USER"
	fanOutPasswordEnv = "COUCHQ_FANOUT_PASSWORD"
	fanOutDBEnv       = "COUCHQ_FANOUT_DB"
	fanOutLeaseEnv    = "COUCHQ_FANOUT_LEASE" // the worker's lease, a time.Duration
	fanOutClockEnv    = "COUCHQ_FANOUT_CLOCK" // the test process's outside clock, which events are POSTed to
)

// fanOutChildren is how many children each parent of the fan-out enqueues.
const fanOutChildren = 10

// clockEvent is what a worker process POSTs to the test's outside clock:
// a handler of job started ("start") or ended ("end"). The test stamps it
// with its own clock on receipt, and the worker waits for the answer: a
// start is stamped before the handler's body runs, an end after it and
// before the outcome is written (and so before any dependent is released).
type clockEvent struct {
	Event string `json:"event"`
	Job   string `json:"job"`
}

// A fan-out/fan-in of 100 parents, each enqueueing 10 children from its
// handler and waiting for them, all parents in one batch with a callback,
// run by worker processes of which the oldest is SIGKILLed every 2 s and a
// new one started (three alive): by the test process's clock no
// continuation starts before its children have finished and no callback
// before every parent; each is released exactly once, the callback runs
// once but for runs whose worker was killed (each shown by an expired
// lease in its history), and nothing is left waiting.
func TestFanOutFanInWithWorkersKilled(t *testing.T) {
	skipUnlessKillable(t)
	tb := setup(t, protocol.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	t.Cleanup(cancel)
	tb.ctx = ctx // longer than setup's: on a loaded machine this runs for minutes
	user, password := server.Credentials()
	fanOutFanIn(t, fanOutFixture{
		ctx: ctx, client: tb.client, parents: 100,
		process: func(n int) (string, []string) {
			return "", fanOutEnv("node", server.URL(), user, password, tb.db.Name(), tb.lease)
		},
	})
}

// The same fan-out/fan-in on the cluster, 100 parents, with worker
// processes attached alternately to nodes 1 and 2, the oldest SIGKILLed
// every 2 s, and node 3 stopped after the first kill.
func TestClusterFanOutFanInWithWorkersKilledAndANodeDown(t *testing.T) {
	skipUnlessKillable(t)
	cb := setupCluster(t, protocol.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	t.Cleanup(cancel)
	cb.ctx = ctx
	t.Cleanup(func() { _ = cb.cl.StartNode(context.Background(), 3) })
	fanOutFanIn(t, fanOutFixture{
		ctx: ctx, client: cb.clients[0], parents: 100,
		process: func(n int) (string, []string) {
			node := 1 + n%2
			user, password := cb.cl.Node(node).Credentials()
			// A killed worker's jobs come back after a lease: 6 s, not
			// clusterWorker's 15.
			return fmt.Sprintf("on node %d", node), fanOutEnv("cluster", cb.cl.Node(node).URL(), user, password, cb.dbName, 6*time.Second)
		},
		midRun: func() {
			if err := cb.cl.StopNode(ctx, 3); err != nil {
				t.Errorf("stopping node 3: %v", err)
			}
		},
	})
}

// fanOutEnv is the environment of a fan-out worker process: timings
// ("node" or "cluster"), where to attach, and the lease.
func fanOutEnv(timings, url, user, password, db string, lease time.Duration) []string {
	return append(os.Environ(), fanOutWorkerEnv+"="+timings, fanOutURLEnv+"="+url, fanOutUserEnv+"="+user,
		fanOutPasswordEnv+"="+password, fanOutDBEnv+"="+db, fanOutLeaseEnv+"="+lease.String())
}

// fanOutFixture is where fanOutFanIn runs: a client to enqueue and check
// through, and the n-th worker process's environment (with, for the
// logs, where it attaches).
type fanOutFixture struct {
	ctx     context.Context
	client  *protocol.Client
	parents int
	process func(n int) (where string, env []string)
	// midRun, when set, is called once after the first kill.
	midRun func()
}

// skipUnlessKillable skips the fan-out chaos tests in -short runs and
// where worker processes cannot be SIGKILLed.
func skipUnlessKillable(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("minutes of killing workers")
	}
	if runtime.GOOS == "windows" {
		t.Skip("the worker processes are killed with SIGKILL")
	}
}

// fanOutStall is how long a fan-out/fan-in run may go without a job
// finishing before it counts as stuck.
const fanOutStall = 2 * time.Minute

// fanOutFanIn runs parents x 10 children and a batch callback over the
// parents on worker processes of which the oldest is SIGKILLed every 2 s
// and a new one started, and checks the order (outside clock), that
// everything is released once and that nothing is left waiting.
func fanOutFanIn(t *testing.T, fx fanOutFixture) {
	const alive, every = 3, 2 * time.Second
	parents := fx.parents
	ctx := fx.ctx
	clock := newOutsideClock()
	clockSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ev clockEvent
		if err := json.NewDecoder(r.Body).Decode(&ev); err != nil || ev.Job == "" {
			http.Error(w, "want {event, job}", http.StatusBadRequest)
			return
		}
		switch ev.Event {
		case "start":
			clock.start(ev.Job)
		case "end":
			clock.end(ev.Job)
		default:
			http.Error(w, "unknown event "+ev.Event, http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(clockSrv.Close) // registered first, so closed after the processes are killed

	type proc struct {
		*cliProc
		started, killed time.Time
	}
	var all, procs []*proc // every process started; those alive, oldest first
	t.Cleanup(func() {
		for _, p := range all {
			p.kill()
		}
		if !t.Failed() {
			return
		}
		for _, p := range all {
			when := "alive at the end"
			if !p.killed.IsZero() {
				when = "killed at " + p.killed.Format(time.StampMilli)
			}
			t.Logf("%s (pid %d, exit %d) started at %s, %s; stderr, last 1 KiB:\n%s", p.name, p.pid(), p.code,
				p.started.Format(time.StampMilli), when, tail(p.stderr.String(), 1<<10))
		}
	})
	start := func() {
		where, env := fx.process(len(all))
		name := strings.TrimSpace(fmt.Sprintf("worker process %d %s", len(all), where))
		p := &proc{cliProc: launchProc(t, os.Args[0], append(env, fanOutClockEnv+"="+clockSrv.URL), name), started: time.Now()}
		all = append(all, p)
		procs = append(procs, p)
	}
	for range alive {
		start()
	}

	var jobs []protocol.NewJob
	for i := range parents {
		jobs = append(jobs, protocol.NewJob{Worker: "parent", Payload: i})
	}
	batch, err := fx.client.EnqueueBatch(ctx, jobs, protocol.NewJob{Worker: "collect"})
	if err != nil {
		t.Fatal(err)
	}
	callback := protocol.BatchCallbackID(batch)

	began := time.Now()
	// The run fails when no job has finished for fanOutStall, not at a
	// fixed time: on a loaded machine (or PouchDB Server) a run that goes
	// on making progress is slow, not stuck.
	finished, progressed := int64(-1), began
	nextKill := began.Add(every)
	lastLog := began
	kills := 0
	for {
		if time.Now().After(nextKill) {
			victim := procs[0]
			procs = procs[1:]
			if victim.hasExited() {
				t.Errorf("%s (pid %d) exited by itself with code %d: %s", victim.name, victim.pid(), victim.code, tail(victim.stderr.String(), 2<<10))
			}
			victim.kill() // SIGKILL: it dies holding what it held
			victim.killed = time.Now()
			kills++
			start()
			if kills == 1 && fx.midRun != nil {
				fx.midRun()
			}
			// Every 2 s, but never two kills at once after a slow start
			// or midRun.
			nextKill = nextKill.Add(every)
			if soonest := time.Now().Add(every / 2); nextKill.Before(soonest) {
				nextKill = soonest
			}
		}
		if time.Since(lastLog) > 15*time.Second {
			lastLog = time.Now()
			counts, err := fx.client.Counts(ctx)
			t.Logf("progress after %s and %d kills: %v", time.Since(began).Round(time.Second), kills, counts)
			if n := counts["parent"][protocol.StatusDone] + counts["child"][protocol.StatusDone]; err == nil && n > finished {
				finished, progressed = n, time.Now()
			}
		}
		it, err := fx.client.Get(ctx, callback)
		if err == nil && it.Status.Terminal() {
			break
		}
		if time.Since(progressed) > fanOutStall || ctx.Err() != nil {
			b, _ := fx.client.Batch(context.Background(), batch)
			counts, _ := fx.client.Counts(context.Background())
			t.Fatalf("stuck: no job finished for %s (%s in all); callback %+v; batch %+v; counts %v",
				time.Since(progressed).Round(time.Second), time.Since(began).Round(time.Second), it, b, counts)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Nothing more is run or stamped once the processes are gone.
	for _, p := range procs {
		if p.hasExited() {
			t.Errorf("%s (pid %d) exited by itself with code %d", p.name, p.pid(), p.code)
		}
		p.kill()
	}
	for _, p := range all {
		if strings.Contains(p.stderr.String(), "WARNING: DATA RACE") {
			t.Errorf("%s (pid %d) reported a data race", p.name, p.pid())
		}
	}
	t.Logf("done after %s, %d kills", time.Since(began).Round(time.Second), kills)

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
	// A run whose worker was killed before it wrote the outcome runs again
	// once its lease has expired, which the history shows. A worker killed
	// after its claim but before the handler began leaves an expired lease
	// and no run, so there may be fewer runs than claims, never more.
	clock.mu.Lock()
	runs := len(clock.starts[callback])
	clock.mu.Unlock()
	if expired := strings.Count(events(cb), protocol.EventLeaseExpired); runs < 1 || runs > 1+expired {
		t.Errorf("callback ran %d times with %d expired leases: %s", runs, expired, events(cb))
	}
	counts, err := fx.client.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if counts["child"][protocol.StatusDone] != int64(parents*fanOutChildren) || counts["parent"][protocol.StatusDone] != int64(parents) ||
		counts["parent"][protocol.StatusWaiting]+counts["child"][protocol.StatusWaiting] != 0 {
		t.Fatalf("counts: %v", counts)
	}
	var parentIDs []string
	listed, err := fx.client.List(ctx, protocol.ListOptions{Worker: "parent", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	// The kills prove something only if they hit jobs in flight.
	children, err := fx.client.List(ctx, protocol.ListOptions{Worker: "child", Limit: 2 * parents * fanOutChildren})
	if err != nil {
		t.Fatal(err)
	}
	expired := 0
	for _, it := range append(children.Items, listed.Items...) {
		expired += strings.Count(events(it), protocol.EventLeaseExpired)
	}
	t.Logf("%d leases of parents and children expired under killed workers", expired)
	if expired == 0 {
		t.Errorf("no kill hit a parent or child in flight: this run proves nothing about killed workers")
	}
	for _, p := range listed.Items {
		parentIDs = append(parentIDs, p.ID)
		var kids []string
		for k := range fanOutChildren {
			kids = append(kids, protocol.ChildID(p.ID, fmt.Sprint(k)))
		}
		clock.checkAfter(t, p.ID+"#continuation", kids...)
		if n := strings.Count(events(p), protocol.EventDependenciesDone); n != 1 {
			t.Errorf("parent %s released %d times: %s", p.ID, n, events(p))
		}
	}
	if len(parentIDs) != parents {
		t.Errorf("%d parents listed, want %d", len(parentIDs), parents)
	}
	clock.checkAfter(t, callback, parentIDs...)
}

// fanOutWorkerProcess is a worker process of the fan-out/fan-in tests (see
// fanOutWorkerEnv): it runs the parents, children and callback until it is
// killed, reporting each handler's start and end to the test's outside
// clock, and returns the process's exit code if it cannot work at all.
func fanOutWorkerProcess(timings string) int {
	log := zerolog.New(os.Stderr).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	if timings == "cluster" {
		log = log.Level(zerolog.WarnLevel) // as the cluster tests log
	}
	lease, err := time.ParseDuration(os.Getenv(fanOutLeaseEnv))
	if err != nil {
		log.Error().Err(err).Msg(fanOutLeaseEnv)
		return 2
	}
	// A worker killed with the test process would go on working on a
	// database nobody reads: it exits once its parent is gone.
	parent := os.Getppid()

	connect, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := protocol.ConnectHTTP(connect, os.Getenv(fanOutURLEnv), os.Getenv(fanOutUserEnv), os.Getenv(fanOutPasswordEnv), protocol.NewHTTPClient())
	if err != nil {
		log.Error().Err(err).Msg("connecting")
		return 2
	}
	client, err := srv.Open(connect, os.Getenv(fanOutDBEnv), protocol.Config{Logger: log})
	if err != nil {
		log.Error().Err(err).Msg("opening the database")
		return 2
	}
	clockURL := os.Getenv(fanOutClockEnv)
	hc := &http.Client{Timeout: 30 * time.Second}
	report := func(ctx context.Context, event, job string) error {
		body, _ := json.Marshal(clockEvent{Event: event, Job: job})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, clockURL, bytes.NewReader(body))
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("outside clock: %w", err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			return fmt.Errorf("outside clock: %s", resp.Status)
		}
		return nil
	}
	// recorded runs body between a start and an end stamped by the outside
	// clock. An attempt whose start could not be stamped fails before the
	// body runs (and is retried): no run goes uncounted.
	recorded := func(body func(context.Context, *worker.Job) error) worker.Handler {
		return worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			if err := report(ctx, "start", job.ID); err != nil {
				return err
			}
			err := body(ctx, job)
			return errors.Join(err, report(ctx, "end", job.ID))
		})
	}
	handlers := map[string]worker.Handler{
		"parent": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			if job.Continuation {
				// The continuation's start is checked against the
				// children; its end is the parent's, which the callback
				// is checked against.
				if err := report(ctx, "start", job.ID+"#continuation"); err != nil {
					return err
				}
				var wrong error
				if len(job.Item.After) != fanOutChildren {
					wrong = worker.JobFail(fmt.Errorf("continuation waited for %d children", len(job.Item.After)))
				}
				return errors.Join(wrong, report(ctx, "end", job.ID))
			}
			for k := range fanOutChildren {
				if _, err := job.EnqueueChild(ctx, fmt.Sprint(k), protocol.NewJob{Worker: "child"}); err != nil {
					return err
				}
			}
			return worker.JobAwaitChildren()
		}),
		"child": recorded(func(ctx context.Context, job *worker.Job) error {
			time.Sleep(10 * time.Millisecond)
			return nil
		}),
		"collect": recorded(func(ctx context.Context, job *worker.Job) error { return nil }),
	}
	// Each type runs 4 jobs at once, as both timings have it. With 8 a
	// kill every 2 s left more claims behind than the sweepers returned
	// on a loaded machine (one page of expired leases, swept in the same
	// order by every worker), and 100 parents stalled for minutes with
	// hundreds of jobs held by dead workers.
	var cfg worker.Config
	switch timings {
	case "node":
		cfg = fastWorker(&testBundle{lease: lease, log: log}, handlers)
	case "cluster":
		cfg = clusterWorker(log, handlers)
		cfg.LeaseDuration = lease
	default:
		log.Error().Str("timings", timings).Msg(fanOutWorkerEnv + ": want node or cluster")
		return 2
	}
	w, err := worker.New((*couchq.Client)(client), cfg)
	if err == nil {
		err = w.Start(context.Background())
	}
	if err != nil {
		log.Error().Err(err).Msg("starting the worker")
		return 2
	}
	for os.Getppid() == parent {
		time.Sleep(500 * time.Millisecond)
	}
	log.Error().Msg("the test process is gone")
	return 3
}
