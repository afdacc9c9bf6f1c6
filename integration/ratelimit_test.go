package integration

import (
	"fmt"
	"math"
	"syscall"
	"testing"
	"time"

	"github.com/couchq/couchq/couchq"
)

// Four worker processes share a limit of 20 starts per second: over ten
// full windows they start 200 ± 10 % jobs, and never more than 20 in one.
func TestRateLimitAcrossProcesses(t *testing.T) {
	tb := setup(t, couchq.Config{})
	bin := buildCLI(t)
	const limit, windows = 20, 10
	jobs := make([]couchq.NewJob, 600)
	for i := range jobs {
		jobs[i] = couchq.NewJob{Worker: "rl"}
	}
	for start := 0; start < len(jobs); start += 300 {
		if _, err := tb.client.EnqueueMany(tb.ctx, jobs[start:start+300]); err != nil {
			t.Fatal(err)
		}
	}
	var procs []*cliProc
	for i := range 4 {
		procs = append(procs, startProc(t, bin, tb.db.Name(), fmt.Sprintf("worker-%d", i),
			"worker", "--type", "rl", "--handler", "noop", "--concurrency", "8", "--rate", fmt.Sprintf("rl=%d/s", limit),
			"--lease", "10s", "--feed-timeout", "2s"))
	}
	waitFor(t, time.Minute, "every worker process to start jobs", func() bool {
		ws, err := tb.client.Workers(tb.ctx)
		return err == nil && len(ws) == len(procs)
	})
	time.Sleep(2 * time.Second) // let them all get going
	measured := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(measured.Add((windows + 1) * time.Second)))
	for _, p := range procs {
		p.signal(t, syscall.SIGTERM)
	}
	for _, p := range procs {
		if code := p.wait(t, 30*time.Second); code != 0 {
			t.Fatalf("%s exited %d", p.name, code)
		}
	}
	perWindow := map[int64]int{}
	first, last := int64(math.MaxInt64), int64(0)
	for _, it := range allJobs(t, tb, "rl") {
		if it.StartedAt == 0 {
			continue
		}
		w := int64(math.Floor(it.StartedAt))
		perWindow[w]++
		first, last = min(first, w), max(last, w)
	}
	for w, n := range perWindow {
		if n > limit {
			t.Errorf("%d jobs started in the window of %s, over the limit of %d", n, time.Unix(w, 0).UTC().Format(time.TimeOnly), limit)
		}
	}
	// The ten full windows measured, with every process running.
	total := 0
	for w := measured.Unix(); w < measured.Unix()+windows; w++ {
		total += perWindow[w]
	}
	t.Logf("%d jobs started in %d full windows (limit %d/s, 4 processes); %d windows in all", total, windows, limit, last-first+1)
	if want := limit * windows; math.Abs(float64(total-want)) > 0.1*float64(want) {
		t.Fatalf("%d jobs started in %d windows, want %d ± 10%%: %v", total, windows, want, perWindow)
	}
}
