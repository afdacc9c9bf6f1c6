package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
)

// couchq stats on a known script: the exact counts and times.
func TestStatsFromAKnownScript(t *testing.T) {
	t.Parallel()
	r := runOpsScript(t)

	res := r.c.run(t, "stats", "--json", "--since", r.Since())
	expect(t, res, exitOK)
	var st protocol.Stats
	if err := json.Unmarshal([]byte(res.stdout), &st); err != nil {
		t.Fatalf("stats --json: %v", err)
	}
	opstest.CheckStats(t, &st)
	if !st.Until.Equal(r.T0.Add(20*time.Second)) || !st.Since.Equal(r.T0.Add(-time.Second)) {
		t.Errorf("window %s to %s, want T0-1s to T0+20s (Main.Now)", st.Since, st.Until)
	}

	// The table a person reads.
	res = r.c.run(t, "stats", "--since", "1h")
	expect(t, res, exitOK)
	for _, want := range []string{
		"Window: 2026-11-21 11:00:20Z to 2026-11-21 12:00:20Z (1h0m0s)",
		"TYPE  ADDED  STARTED  FINISHED  FAILED  RETRIED  THROUGHPUT\nmail  5      4        2         0       1        2/h\n",
		"TYPE  TIME       COUNT  MIN  MEAN   P50  P95  MAX\n" +
			"mail  wait       3      2s   4.33s  4s   7s   7s\n" +
			"      service    2      5s   7.5s   5s   10s  10s\n" +
			"      execution  3      1s   2.67s  3s   4s   4s\n",
		"QUEUE NOW  DUE  SCHEDULED  WAITING  RUNNING  FAILED  OLDEST DUE\nmail       1    1          0        1        0       20s\n",
		"no workers registered",
	} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("stats table lacks\n%s", want)
		}
	}

	// A window that runs past now ends now: the future has no activity to
	// spread the throughput over.
	res = r.c.run(t, "stats", "--since", "2026-11-21T11:00:20Z", "--until", "2026-11-21T13:00:20Z")
	expect(t, res, exitOK)
	if !strings.Contains(res.stdout, "Window: 2026-11-21 11:00:20Z to 2026-11-21 12:00:20Z (1h0m0s)") || !strings.Contains(res.stdout, "2/h\n") {
		t.Errorf("stats with --until after now:\n%s", res.stdout)
	}

	// A window after the script saw nothing happen; the queue is the same.
	res = r.c.run(t, "stats", "--json", "--type", "mail", "--since", "5s")
	expect(t, res, exitOK)
	st = protocol.Stats{}
	if err := json.Unmarshal([]byte(res.stdout), &st); err != nil {
		t.Fatal(err)
	}
	if l := st.Types[0]; l.Added != 0 || l.Finished != 0 || l.Service.Count != 0 || l.Queue.Due != 1 || l.Queue.OldestDueAge != 20 {
		t.Errorf("late window: %+v", l)
	}
	// A registered worker shows up with its type; one of another type does not.
	now := protocol.ToUnix(r.Clock.Now())
	for _, w := range []*protocol.WorkerInfo{
		{ID: protocol.WorkerDocID("host", 1, "w1"), Claimant: opstest.Claimant, Types: []string{"mail"}, Concurrency: 2,
			StartedAt: now - 101, LastHeartbeat: now - 1, HeartbeatInterval: 5, BusySeconds: 50, Completed: 20},
		{ID: protocol.WorkerDocID("host", 2, "w1"), Claimant: "host/2/w1", Types: []string{"sms"}, Concurrency: 1,
			StartedAt: now - 1000, LastHeartbeat: now - 600, HeartbeatInterval: 5},
	} {
		if err := r.Q.PutWorker(r.Ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	res = r.c.run(t, "stats", "--type", "mail")
	expect(t, res, exitOK)
	if !strings.Contains(res.stdout, "WORKER     TYPES  RUNNING  THROUGHPUT  UTILIZATION  ALIVE\nhost/1/w1  mail   0/2      12/min      25%          yes\n") ||
		strings.Contains(res.stdout, "host/2/w1") {
		t.Errorf("stats --type mail workers:\n%s", res.stdout)
	}
	res = r.c.run(t, "stats")
	expect(t, res, exitOK)
	if !strings.Contains(res.stdout, "host/2/w1  sms    0/1      0           0%           no, last heartbeat 10m0s ago") {
		t.Errorf("stats: the dead worker:\n%s", res.stdout)
	}
}

// An empty queue is a report with empty lists, not nulls.
func TestStatsEmpty(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	res := c.run(t, "stats", "--json")
	expect(t, res, exitOK)
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(res.stdout), &raw); err != nil {
		t.Fatal(err)
	}
	if string(raw["types"]) != "[]" || string(raw["workers"]) != "[]" {
		t.Errorf("empty stats: %s", res.stdout)
	}
	res = c.run(t, "stats")
	expect(t, res, exitOK)
	if !strings.Contains(res.stdout, "no jobs") || !strings.Contains(res.stdout, "no workers registered") {
		t.Errorf("empty stats table:\n%s", res.stdout)
	}
}

func TestFormatting(t *testing.T) {
	t.Parallel()
	for in, want := range map[float64]string{
		0: "0s", 0.0004: "400µs", 0.34: "340ms", 4.3333: "4.33s", 80: "1m20s", 93784: "26h3m4s",
	} {
		if got := fmtSeconds(in); got != want {
			t.Errorf("fmtSeconds(%v) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[float64]string{
		0: "0", 12.345: "12.35/s", 0.5: "30/min", 2.0 / 21 / 60: "5.71/h",
	} {
		if got := fmtRate(in); got != want {
			t.Errorf("fmtRate(%v) = %q, want %q", in, got, want)
		}
	}
}
