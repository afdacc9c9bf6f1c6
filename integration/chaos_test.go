package integration

import (
	"context"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/protocol"
)

// chaosSize is how big the chaos run is: small by default (CI), scaled up
// with COUCHQ_CHAOS_JOBS, COUCHQ_CHAOS_WORKERS and COUCHQ_CHAOS_DURATION
// (see `make chaos`).
type chaosSize struct {
	jobs, workers, concurrency int
	duration                   time.Duration
}

func chaosSizeFromEnv(t *testing.T) chaosSize {
	size := chaosSize{jobs: 300, workers: 3, concurrency: 4, duration: 20 * time.Second}
	if v := os.Getenv("COUCHQ_CHAOS_JOBS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("COUCHQ_CHAOS_JOBS=%q: want a positive number", v)
		}
		size.jobs = n
	}
	if v := os.Getenv("COUCHQ_CHAOS_WORKERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 2 {
			t.Fatalf("COUCHQ_CHAOS_WORKERS=%q: want a number >= 2", v)
		}
		size.workers = n
	}
	if v := os.Getenv("COUCHQ_CHAOS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 5*time.Second {
			t.Fatalf("COUCHQ_CHAOS_DURATION=%q: want a duration >= 5s", v)
		}
		size.duration = d
	}
	return size
}

// chaosLease is longer than a PouchDB Server restart takes, so that the
// restart alone never makes a lease run out: every duplicate delivery must
// then come from a killed worker.
const chaosLease = 5 * time.Second

// testChaos: W worker processes work through J webhook jobs while, every
// few seconds, a random worker is killed with SIGKILL and a new one started,
// and once the server itself is stopped and restarted on its data. At the
// end every job is done (none lost, none stuck running), and every job
// delivered more than once had been claimed by a killed worker whose lease
// then expired. Bounded in time and count; it stops by itself.
func testChaos(t *testing.T, bin string) {
	tb := setup(t, protocol.Config{})
	target := chaosTarget{
		tb:          tb,
		env:         func(int) []string { return procEnv(tb.db.Name()) },
		restartWhat: "the server",
	}
	if server.CanRestart() {
		target.restart = server.Restart
	} else {
		t.Logf("chaos: no server restart: %s servers are not ours to restart (%s)", server.Kind(), server.Reason())
	}
	runChaos(t, bin, target)
}

// chaosTarget is where a chaos run works: the jobs' database (tb), each
// worker process's environment (env(n) for the nth started), and what to
// restart once mid-run (nil: nothing).
type chaosTarget struct {
	tb          *testBundle
	env         func(n int) []string
	restart     func(ctx context.Context) error
	restartWhat string
}

// runChaos is the chaos run of testChaos on target.
func runChaos(t *testing.T, bin string, target chaosTarget) {
	size := chaosSizeFromEnv(t)
	tb := target.tb
	// Hold each delivery so that the work spans most of the chaos period
	// and kills land mid-delivery.
	hold := time.Duration(float64(size.duration) * 0.7 * float64(size.workers*size.concurrency) / float64(size.jobs))
	hook := newHookServer(t, func(*http.Request, string, int) (time.Duration, int) {
		return hold/2 + time.Duration(rand.Int64N(int64(hold)+1)), http.StatusOK
	})
	ids := webhookJobs(t, tb, hook, "chaos", size.jobs, func(int) string { return "/hook" })

	args := []string{"worker", "--type", "chaos", "--handler", "webhook",
		"--concurrency", strconv.Itoa(size.concurrency), "--lease", chaosLease.String(), "--heartbeat", "1s",
		"--sweep-interval", "1s", "--feed-timeout", "5s", "--fallback-poll", "2s", "--retry-delay", "200ms",
		"--shutdown-timeout", "5s"}
	start := func(n int) *cliProc {
		return startProcEnv(t, bin, target.env(n), "worker-"+strconv.Itoa(n), args...)
	}
	live := make([]*cliProc, 0, size.workers)
	for i := range size.workers {
		live = append(live, start(i))
	}
	claimants := registered(t, tb, live...)
	killed := map[string]bool{}
	kills, restarted := 0, false
	canRestart := target.restart != nil

	begin := time.Now()
	deadline := begin.Add(size.duration)
	next := size.workers
	for time.Now().Before(deadline) && statusCount(t, tb, "chaos", protocol.StatusDone) < size.jobs {
		time.Sleep(time.Duration(1500+rand.IntN(1500)) * time.Millisecond)
		if canRestart && !restarted && time.Since(begin) > size.duration/2 {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			err := target.restart(ctx)
			cancel()
			if err != nil {
				t.Fatalf("chaos: restarting %s: %v", target.restartWhat, err)
			}
			restarted = true
			t.Logf("chaos: %s restarted at %s", target.restartWhat, time.Since(begin).Round(time.Millisecond))
			continue
		}
		i := rand.IntN(len(live))
		victim := live[i]
		killed[claimants[victim]] = true
		victim.signal(t, syscall.SIGKILL)
		victim.wait(t, 10*time.Second)
		kills++
		fresh := start(next)
		next++
		for p, c := range registered(t, tb, fresh) {
			claimants[p] = c
		}
		live[i] = fresh
	}
	t.Logf("chaos: %d kills, restart %v, %d of %d done after %s", kills, restarted,
		statusCount(t, tb, "chaos", protocol.StatusDone), size.jobs, time.Since(begin).Round(time.Millisecond))

	// The chaos is over; the survivors (and the sweeper) finish the rest.
	// How fast depends on the server (a cluster writes every job to a
	// majority) and the machine's load: the run fails when jobs stop being
	// finished, not when they are slow.
	stall := 2*size.duration + 4*chaosLease
	last, progressed := -1, time.Now()
	for done := 0; done < size.jobs; done = statusCount(t, tb, "chaos", protocol.StatusDone) {
		if done != last {
			last, progressed = done, time.Now()
		}
		if time.Since(progressed) > stall {
			t.Fatalf("chaos: %d of %d jobs done, and none finished in the last %s", done, size.jobs, stall)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, p := range live {
		p.signal(t, syscall.SIGTERM)
	}
	for _, p := range live {
		if code := p.wait(t, 30*time.Second); code != 0 {
			t.Errorf("%s exited %d after SIGTERM", p.name, code)
		}
	}

	duplicates := 0
	for _, id := range ids {
		it, err := tb.client.Get(tb.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if it.Status != protocol.StatusDone || it.Claimed {
			t.Errorf("job %s ended %s (claimed %v): lost or stuck", id, it.Status, it.Claimed)
		}
		n := hook.count(id)
		if n == 0 {
			t.Errorf("job %s is done but was never delivered", id)
		}
		if n <= 1 {
			continue
		}
		duplicates++
		blamed := false
		for c := range killed {
			if claimedThenExpired(it, c) {
				blamed = true
				break
			}
		}
		if !blamed {
			t.Errorf("job %s delivered %d times but no killed worker's expired claim explains it: %+v", id, n, it.History)
		}
	}
	t.Logf("chaos: %d jobs, %d workers, %d kills, %s restarted %v: %d duplicate deliveries (every one a killed worker's), %d deliveries in all",
		size.jobs, size.workers, kills, target.restartWhat, restarted, duplicates, hook.total.Load())
	if kills == 0 {
		t.Error("chaos run ended before any worker was killed: nothing was proven")
	}
}
