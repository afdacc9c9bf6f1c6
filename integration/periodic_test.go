package integration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// Ten worker processes run the same schedule, @every 1s, for ten ticks:
// one job per tick, no tick missed, each run once.
func TestPeriodicTenProcessesOneJobPerTick(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var mu sync.Mutex
	runs := map[string]int{}
	h := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		mu.Lock()
		runs[job.ID]++
		mu.Unlock()
		return nil
	})
	sched := protocol.Periodic{Name: "beat", Schedule: "@every 1s", Job: protocol.NewJob{Worker: "beat"}}
	var workers []*worker.Worker
	for i := range 10 {
		cfg := fastWorker(tb, map[string]worker.Handler{"beat": h})
		cfg.ID, cfg.Periodic = fmt.Sprintf("p%d", i), []protocol.Periodic{sched}
		workers = append(workers, startWorker(t, tb, cfg))
	}
	time.Sleep(10*time.Second + 300*time.Millisecond)
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Stop(tb.ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	jobs := allJobs(t, tb, "beat")
	var ticks []time.Time
	for _, it := range jobs {
		ticks = append(ticks, it.DueAt())
		if it.ID != protocol.PeriodicJobID("beat", it.DueAt()) {
			t.Errorf("job %s is not its tick's (%s)", it.ID, it.DueAt())
		}
	}
	sort.Slice(ticks, func(i, j int) bool { return ticks[i].Before(ticks[j]) })
	if len(ticks) < 9 {
		t.Fatalf("%d jobs in about ten ticks of ten processes: %v", len(ticks), ticks)
	}
	for i := 1; i < len(ticks); i++ {
		if d := ticks[i].Sub(ticks[i-1]); d != time.Second {
			t.Fatalf("ticks %s and %s are %s apart: a tick was missed or doubled", ticks[i-1], ticks[i], d)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for id, n := range runs {
		if n != 1 {
			t.Errorf("job %s ran %d times", id, n)
		}
	}
	st, err := tb.client.PeriodicStates(tb.ctx)
	// Stopping may cut loops off between their enqueue and their state
	// update: the state names one of the last ticks' jobs.
	named := false
	for _, tick := range ticks[max(0, len(ticks)-3):] {
		named = named || st != nil && st[0].LastJob == protocol.PeriodicJobID("beat", tick)
	}
	if err != nil || len(st) != 1 || !named {
		t.Fatalf("schedule state: %+v %v; want one of the last ticks' jobs (%s)", st, err, ticks[len(ticks)-1])
	}
	t.Logf("%d jobs for %d ticks from 10 processes; state %+v", len(jobs), len(ticks), st[0])
}

// Ticks missed while nothing ran the schedule run once by default, or
// once each with CatchUpAll; a schedule seen for the first time starts
// from now.
func TestPeriodicMissedTicks(t *testing.T) {
	clk := opstest.NewClock(time.Date(2026, 11, 23, 12, 0, 30, 0, time.UTC))
	tb := setup(t, protocol.Config{Now: clk.Now})
	for _, tc := range []struct {
		catchUp protocol.CatchUp
		want    int
	}{{protocol.CatchUpOnce, 1}, {protocol.CatchUpAll, 5}} {
		p := protocol.Periodic{Name: fmt.Sprintf("report%d", tc.catchUp), Schedule: "*/1 * * * *",
			Job: protocol.NewJob{Worker: "report"}, CatchUp: tc.catchUp}
		ticks, err := protocol.CheckPeriodic(p)
		if err != nil {
			t.Fatal(err)
		}
		start := clk.Now()
		next, got, err := tb.client.TickPeriodic(tb.ctx, p, ticks, "test")
		if err != nil || len(got) != 0 || !next.Equal(start.Truncate(time.Minute).Add(time.Minute)) {
			t.Fatalf("first tick: next %s, enqueued %v, %v; want nothing before the first tick", next, got, err)
		}
		clk.Add(5 * time.Minute) // five ticks pass with nothing running
		next, got, err = tb.client.TickPeriodic(tb.ctx, p, ticks, "test")
		if err != nil || len(got) != tc.want {
			t.Fatalf("catch-up %d: enqueued %v (%v), want %d", tc.catchUp, got, err, tc.want)
		}
		latest := start.Truncate(time.Minute).Add(5 * time.Minute)
		if got[len(got)-1] != protocol.PeriodicJobID(p.Name, latest) || !next.Equal(latest.Add(time.Minute)) {
			t.Fatalf("catch-up %d: last job %s, next %s", tc.catchUp, got[len(got)-1], next)
		}
		if _, again, err := tb.client.TickPeriodic(tb.ctx, p, ticks, "other"); err != nil || len(again) != 0 {
			t.Fatalf("a second process at the same time enqueued %v (%v)", again, err)
		}
	}
}

// Two processes running one schedule name with different schedules
// enqueue the ticks of both: each says so in its log, once. A second
// process with the same schedule says nothing.
func TestPeriodicOneNameTwoSchedulesWarns(t *testing.T) {
	clk := opstest.NewClock(time.Date(2026, 11, 23, 12, 0, 30, 0, time.UTC))
	tb := setup(t, protocol.Config{Now: clk.Now})
	process := func() (*protocol.Client, *couchtest.SyncBuffer) {
		var logged couchtest.SyncBuffer
		q, err := protocol.New(tb.ctx, tb.db, protocol.Config{Now: clk.Now, Logger: zerolog.New(&logged)})
		if err != nil {
			t.Fatal(err)
		}
		return q, &logged
	}
	tick := func(q *protocol.Client, spec, by string) {
		t.Helper()
		p := protocol.Periodic{Name: "report", Schedule: spec, Job: protocol.NewJob{Worker: "report"}}
		ticks, err := protocol.CheckPeriodic(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := q.TickPeriodic(tb.ctx, p, ticks, by); err != nil {
			t.Fatal(err)
		}
	}
	const warning = "another process with another schedule"
	hourly, hourlyLog := process()
	same, sameLog := process()
	daily, dailyLog := process()
	for range 3 {
		tick(hourly, "@every 1h", "a")
		tick(same, "@every 1h", "b")
		tick(daily, "@every 24h", "c")
		clk.Add(time.Hour)
	}
	if n := strings.Count(dailyLog.String(), warning); n != 1 {
		t.Errorf("the process with the other schedule warned %d times, want once:\n%s", n, dailyLog)
	}
	if n := strings.Count(hourlyLog.String(), warning); n != 1 {
		t.Errorf("a process with the first schedule, after the other ticked, warned %d times, want once:\n%s", n, hourlyLog)
	}
	if strings.Contains(sameLog.String(), warning) && !strings.Contains(sameLog.String(), `"theirs":"@every 24h"`) {
		t.Errorf("a process warned of another with its own schedule:\n%s", sameLog)
	}
}

// A drain-mode worker (cron running couchq worker --drain) with a schedule
// whose ticks were missed enqueues them all and runs them before it ends:
// it does not find nothing due before its schedule's catch-up is written.
func TestPeriodicCatchUpRunsBeforeADrainEnds(t *testing.T) {
	clk := opstest.NewClock(time.Now().Add(-30 * time.Minute).Truncate(time.Minute).Add(30 * time.Second))
	tb := setup(t, protocol.Config{Now: clk.Now})
	p := protocol.Periodic{Name: "pong", Schedule: "*/1 * * * *", Job: protocol.NewJob{Worker: "pong"}, CatchUp: protocol.CatchUpAll}
	ticks, err := protocol.CheckPeriodic(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := tb.client.TickPeriodic(tb.ctx, p, ticks, "test"); err != nil {
		t.Fatal(err)
	}
	clk.Add(12 * time.Minute) // twelve ticks pass with nothing running
	// Its writes slow, the catch-up takes longer than the drain's first
	// look for due work.
	hc := protocol.NewHTTPClient()
	slow := &slowWrites{next: hc.Transport, delay: 150 * time.Millisecond}
	slow.on.Store(true)
	hc.Transport = slow
	user, password := server.Credentials()
	srv, err := protocol.ConnectHTTP(tb.ctx, server.URL(), user, password, hc)
	if err != nil {
		t.Fatal(err)
	}
	client, err := srv.Open(tb.ctx, tb.db.Name(), protocol.Config{Now: clk.Now, Logger: tb.log})
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	cfg := fastWorker(tb, map[string]worker.Handler{
		"pong": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error { ran.Add(1); return nil }),
	})
	cfg.Periodic, cfg.Now = []protocol.Periodic{p}, clk.Now
	drain(t, tb.ctx, client, cfg)
	if n := ran.Load(); n != 12 {
		t.Errorf("the drain ran %d of the 12 missed ticks' jobs", n)
	}
	if left := allJobs(t, tb, "pong"); len(left) != 12 || slices.ContainsFunc(left, func(it *protocol.WorkItem) bool { return it.Status != protocol.StatusDone }) {
		t.Errorf("after the drain: %d pong jobs, %v", len(left), ids(left))
	}
}

// Bad schedules are refused with the reason.
func TestPeriodicRefused(t *testing.T) {
	for _, p := range []protocol.Periodic{
		{Name: "a", Schedule: "every day", Job: protocol.NewJob{Worker: "a"}},
		{Name: "a", Schedule: "@every 10ms", Job: protocol.NewJob{Worker: "a"}},
		{Name: "a:b", Schedule: "@daily", Job: protocol.NewJob{Worker: "a"}},
		{Name: "a", Schedule: "@daily"},
		{Name: "a", Schedule: "@daily", Job: protocol.NewJob{Worker: "a", ID: "x"}},
		// Parsed, but no time matches it.
		{Name: "a", Schedule: "0 0 30 2 *", Job: protocol.NewJob{Worker: "a"}},
	} {
		if _, err := protocol.CheckPeriodic(p); err == nil {
			t.Errorf("%+v accepted", p)
		}
	}
	// A schedule whose job every tick's enqueue would refuse is refused
	// when the worker is made, not skipped at each tick in a log line.
	tb := setup(t, protocol.Config{})
	noop := worker.HandlerFunc(func(context.Context, *worker.Job) error { return nil })
	for _, job := range []protocol.NewJob{
		{Worker: "r", Priority: 9}, {Worker: "r", MaxAttempts: -1}, {Worker: "r", Payload: func() {}},
		{Worker: "r", Extra: map[string]any{"status": "x"}},
	} {
		cfg := worker.Config{Handlers: map[string]worker.Handler{"r": noop}, Logger: tb.log,
			Periodic: []protocol.Periodic{{Name: "bad", Schedule: "@every 1s", Job: job}}}
		if _, err := worker.New((*couchq.Client)(tb.client), cfg); !errors.Is(err, protocol.ErrInvalidJob) || !strings.Contains(err.Error(), `periodic schedule "bad"`) {
			t.Errorf("a schedule of %+v: %v", job, err)
		}
	}
}
