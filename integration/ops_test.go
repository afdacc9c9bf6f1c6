package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// opsScript runs a known script of jobs on a controlled clock and returns
// the bundle and the clock, now at T0+20s. See TestStatsFromAKnownScript for
// the figures it must produce.
func opsScript(t *testing.T) (*testBundle, *opstest.Clock, time.Time) {
	t.Helper()
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	clk := opstest.NewClock(t0)
	tb := setup(t, protocol.Config{Now: clk.Now})
	c := tb.client
	at := func(sec int) { clk.Set(t0.Add(time.Duration(sec) * time.Second)) }
	enqueue := func(id string, due time.Time) {
		if _, err := c.Enqueue(tb.ctx, protocol.NewJob{ID: id, Worker: "mail", At: due}); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(id string) *protocol.WorkItem {
		it, err := c.Get(tb.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		it, err = c.Claim(tb.ctx, it, "host/1/w1", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return it
	}
	at(0)
	enqueue("A", time.Time{})
	enqueue("B", time.Time{})
	enqueue("C", time.Time{})
	enqueue("E", time.Time{})
	at(2)
	a := claim("A")
	at(3)
	enqueue("D", t0.Add(100*time.Second))
	at(4)
	b := claim("B")
	at(5)
	if err := c.Complete(tb.ctx, a, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Fail(tb.ctx, b, "smtp timeout", protocol.FailOptions{RetryAfter: time.Second}); err != nil {
		t.Fatal(err)
	}
	at(6)
	b = claim("B")
	at(7)
	claim("E")
	at(10)
	if err := c.Complete(tb.ctx, b, nil); err != nil {
		t.Fatal(err)
	}
	at(20)
	return tb, clk, t0
}

// Metrics from a known script: exact counts and times.
func TestStatsFromAKnownScript(t *testing.T) {
	tb, _, t0 := opsScript(t)
	st, err := tb.client.Stats(tb.ctx, protocol.StatsOptions{Since: t0.Add(-time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Types) != 1 || st.Types[0].Type != "mail" {
		t.Fatalf("types: %+v", st.Types)
	}
	m := st.Types[0]
	if m.Added != 5 || m.Started != 4 || m.Finished != 2 || m.Failed != 0 || m.Retried != 1 {
		t.Errorf("events: added %d started %d finished %d failed %d retried %d; want 5 4 2 0 1",
			m.Added, m.Started, m.Finished, m.Failed, m.Retried)
	}
	checkSummary(t, "wait", m.Wait, 3, 2, 13.0/3, 7, 4, 7)
	checkSummary(t, "service", m.Service, 2, 5, 7.5, 10, 5, 10)
	checkSummary(t, "execution", m.Execution, 3, 1, 8.0/3, 4, 3, 4)
	want := protocol.QueueNow{Due: 1, Scheduled: 1, Running: 1, Done: 2, OldestDueAge: 20}
	if m.Queue != want {
		t.Errorf("queue now %+v, want %+v", m.Queue, want)
	}
	// A window that starts after the script saw nothing happen.
	later, err := tb.client.Stats(tb.ctx, protocol.StatsOptions{Worker: "mail", Since: t0.Add(15 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if l := later.Types[0]; l.Added != 0 || l.Finished != 0 || l.Service.Count != 0 || l.Queue.Due != 1 {
		t.Errorf("late window: %+v", l)
	}
}

// The oldest due job's age counts every due job: a job scheduled an hour
// ago is older than one enqueued due now after it, and a job due now
// that came in later does not hide it; jobs due now count from their
// creation, the longest waiting first, whatever their ids.
func TestOldestDueAgeSeesEveryDueJob(t *testing.T) {
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	clk := opstest.NewClock(t0)
	tb := setup(t, protocol.Config{Now: clk.Now})
	age := func() float64 {
		t.Helper()
		st, err := tb.client.Stats(tb.ctx, protocol.StatsOptions{Worker: "report"})
		if err != nil || len(st.Types) != 1 {
			t.Fatalf("stats: %+v, %v", st, err)
		}
		return st.Types[0].Queue.OldestDueAge
	}
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "report", ID: "z-early", At: t0.Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}
	clk.Set(t0.Add(10 * time.Second))
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "report", ID: "a-now"}); err != nil {
		t.Fatal(err)
	}
	if got := age(); got != 3610 {
		t.Errorf("oldest due age %v s, want 3610 (the job scheduled an hour before the start)", got)
	}
	// Two jobs due now: the one created first is the older, though its id
	// sorts after the other's.
	clk.Set(t0.Add(20 * time.Second))
	if _, err := tb.client.CancelJob(tb.ctx, "z-early", "ops", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "report", ID: "0-later"}); err != nil {
		t.Fatal(err)
	}
	if got := age(); got != 10 {
		t.Errorf("oldest due age %v s, want 10 (the job due now created first)", got)
	}
	// A job back in the queue has been due since it came back, not since
	// it was created or first scheduled: retried, or requeued after its
	// lease ran out.
	clk.Set(t0.Add(time.Hour))
	for _, id := range []string{"a-now", "0-later"} {
		if _, err := tb.client.CancelJob(tb.ctx, id, "ops", ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "report", ID: "dated", At: t0}); err != nil {
		t.Fatal(err)
	}
	clk.Set(t0.Add(2 * time.Hour))
	if _, err := tb.client.Retry(tb.ctx, "a-now", "ops"); err != nil {
		t.Fatal(err)
	}
	dated, err := tb.client.Get(tb.ctx, "dated")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tb.client.Claim(tb.ctx, dated, "host/1/w", time.Minute); err != nil {
		t.Fatal(err)
	}
	clk.Set(t0.Add(2*time.Hour + 2*time.Minute))
	if _, err := tb.client.Sweep(tb.ctx, "ops", 0); err != nil {
		t.Fatal(err)
	}
	clk.Set(t0.Add(2*time.Hour + 3*time.Minute))
	// a-now: retried 3 min ago; dated: due since t0, but back in the queue
	// since its lease ran out, a minute ago.
	if got := age(); got != 180 {
		t.Errorf("oldest due age %v s, want 180 (the job retried three minutes ago)", got)
	}
}

func checkSummary(t *testing.T, name string, s protocol.Summary, count int64, lo, mean, hi, p50, p95 float64) {
	t.Helper()
	near := func(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 }
	if s.Count != count || !near(s.Min, lo) || !near(s.Mean, mean) || !near(s.Max, hi) ||
		s.P50 == nil || s.P95 == nil || !near(*s.P50, p50) || !near(*s.P95, p95) {
		t.Errorf("%s: %+v (p50 %v p95 %v), want count %d min %v mean %v max %v p50 %v p95 %v",
			name, s, deref(s.P50), deref(s.P95), count, lo, mean, hi, p50, p95)
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestOperatorRetryCancelRequeue(t *testing.T) {
	tb, _, _ := opsScript(t)
	c := tb.client
	// E is running: it can be requeued, not retried.
	if _, err := c.Retry(tb.ctx, "E", "cli"); !errors.Is(err, protocol.ErrWrongState) {
		t.Fatalf("retrying a running job: %v", err)
	}
	e, err := c.Requeue(tb.ctx, "E", "cli")
	if err != nil {
		t.Fatal(err)
	}
	if e.Status != protocol.StatusQueued || e.Claimed || !strings.Contains(e.History[len(e.History)-1].Error, "host/1/w1") {
		t.Fatalf("requeued: %+v", e)
	}
	// C is queued: cancel it, then retry it.
	cj, err := c.CancelJob(tb.ctx, "C", "cli", "")
	if err != nil || cj.Status != protocol.StatusCancelled {
		t.Fatalf("cancel: %v %+v", err, cj)
	}
	if _, err := c.CancelJob(tb.ctx, "C", "cli", ""); !errors.Is(err, protocol.ErrWrongState) {
		t.Fatalf("cancelling twice: %v", err)
	}
	r, err := c.Retry(tb.ctx, "C", "cli")
	if err != nil || r.Status != protocol.StatusQueued || r.Attempts != 0 || r.History[len(r.History)-1].Event != "requeued" {
		t.Fatalf("retry: %v %+v", err, r)
	}
	if _, err := c.Retry(tb.ctx, "nope", "cli"); !errors.Is(err, protocol.ErrNotFound) {
		t.Fatalf("missing id: %v", err)
	}
}

// History stays bounded under 100 retries, keeping the first "enqueued".
func TestHistoryBoundedUnderManyRetries(t *testing.T) {
	tb := setup(t, protocol.Config{HistoryLimit: 20, MaxAttempts: 1000})
	job, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "h"})
	if err != nil {
		t.Fatal(err)
	}
	it := job
	for i := range 100 {
		if it, err = tb.client.Get(tb.ctx, job.ID); err != nil {
			t.Fatal(err)
		}
		if it, err = tb.client.Claim(tb.ctx, it, "h/1/w", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := tb.client.Fail(tb.ctx, it, fmt.Sprintf("try %d", i), protocol.FailOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	it, _ = tb.client.Get(tb.ctx, job.ID)
	if len(it.History) != 20 || it.History[0].Event != "enqueued" || it.Attempts != 100 {
		t.Fatalf("history %d entries (first %q), attempts %d", len(it.History), it.History[0].Event, it.Attempts)
	}
	if last := it.History[19]; last.Error != "try 99" || last.Attempt != 100 {
		t.Fatalf("newest entry: %+v", last)
	}
}

// Purge leaves the finished jobs that a waiting job still counts on: the
// jobs of a batch whose callback waits (the callback is released when the
// batch's finished jobs number its size) and the jobs a dependent waits
// for. Here they fill more than a page at the start of the range, and the
// purge still reaches the jobs after them.
func TestPurgeLeavesWhatWaitingJobsAwait(t *testing.T) {
	tb := setup(t, protocol.Config{})
	testPurgeLeavesWhatWaitingJobsAwait(t, tb.ctx, tb.client, tb.client, 550, 120)
	// The batch's last job runs; the callback is then released, once.
	var callbacks atomic.Int32
	startWorker(t, tb, fastWorker(tb, map[string]worker.Handler{
		"p":  worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error { return nil }),
		"cb": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error { callbacks.Add(1); return nil }),
	}))
	waitStatus(t, tb, protocol.BatchCallbackID("b1"), protocol.StatusDone, 30*time.Second)
	if n := callbacks.Load(); n != 1 {
		t.Fatalf("the callback ran %d times", n)
	}
}

// On a cluster, written through one node, purged through another.
func TestClusterPurgeLeavesWhatWaitingJobsAwait(t *testing.T) {
	cb := setupCluster(t, protocol.Config{})
	testPurgeLeavesWhatWaitingJobsAwait(t, cb.ctx, cb.clients[0], cb.clients[1], 520, 30)
}

// testPurgeLeavesWhatWaitingJobsAwait writes, through writer, a batch of
// members+1 jobs (members done, one queued) whose callback waits, a
// failed job a waiting one names in after, and others done jobs no one
// waits for, finished after the rest; purger's purges delete only those.
func testPurgeLeavesWhatWaitingJobsAwait(t *testing.T, ctx context.Context, writer, purger *protocol.Client, members, others int) {
	t.Helper()
	var docs []any
	for i := range members {
		docs = append(docs, map[string]any{"_id": fmt.Sprintf("member-%04d", i), "type": "WorkItem", "worker": "p",
			"batch": "b1", "status": "done", "finished_at": 1000 + i})
	}
	docs = append(docs,
		map[string]any{"_id": "member-last", "type": "WorkItem", "worker": "p", "batch": "b1"},
		map[string]any{"_id": protocol.BatchCallbackID("b1"), "type": "WorkItem", "worker": "cb", "status": "waiting",
			"callback_of": "b1", "batch_size": members + 1},
		map[string]any{"_id": "dependency", "type": "WorkItem", "worker": "p", "status": "failed", "finished_at": 1000},
		map[string]any{"_id": "dependent", "type": "WorkItem", "worker": "d", "status": "waiting", "after": []string{"dependency"}})
	for i := range others {
		docs = append(docs, map[string]any{"_id": fmt.Sprintf("other-%04d", i), "type": "WorkItem", "worker": "p",
			"status": "done", "finished_at": 5000 + i})
	}
	for start := 0; start < len(docs); start += 1000 {
		results, err := writer.DB().BulkDocs(ctx, docs[start:min(start+1000, len(docs))])
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range results {
			if r.Error != nil {
				t.Fatal(r.Error)
			}
		}
	}
	// The purger's views have the waiting jobs (on a cluster, another
	// node's copies catch up a moment after the write).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		counts, err := purger.Counts(ctx)
		if err == nil && counts["cb"][protocol.StatusWaiting] == 1 && counts["d"][protocol.StatusWaiting] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the purger's views do not show the waiting jobs: %v %v", counts, err)
		}
	}
	for _, status := range []protocol.Status{protocol.StatusDone, protocol.StatusFailed} {
		want := map[protocol.Status]int{protocol.StatusDone: others, protocol.StatusFailed: 0}[status]
		n, err := purger.Purge(ctx, protocol.PurgeOptions{Status: status, Worker: "p"})
		if err != nil || n != want {
			t.Fatalf("purging %s jobs: deleted %d, %v; want %d", status, n, err, want)
		}
	}
	for _, id := range []string{"member-0000", fmt.Sprintf("member-%04d", members-1), "dependency"} {
		if _, err := writer.Get(ctx, id); err != nil {
			t.Errorf("%s, which a waiting job counts on, after the purge: %v", id, err)
		}
	}
	if _, err := writer.Get(ctx, fmt.Sprintf("other-%04d", others-1)); !errors.Is(err, protocol.ErrNotFound) {
		t.Errorf("a done job no one waits for, after the purge: %v, want it deleted", err)
	}
}

// Purge on a few thousand jobs removes only old jobs of the given status.
func TestPurgeLeavesOtherStatusesUntouched(t *testing.T) {
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	clk := opstest.NewClock(t0)
	tb := setup(t, protocol.Config{Now: clk.Now})
	c := tb.client
	// 3,000 jobs of two types, written in bulk as finished documents would
	// look: 1,500 done long ago, 300 failed, 200 done recently, 1,000 queued.
	old := protocol.ToUnix(t0)
	recent := protocol.ToUnix(t0.Add(10 * 24 * time.Hour))
	var docs []any
	for i := range 3000 {
		doc := map[string]any{"_id": fmt.Sprintf("job-%04d", i), "type": "WorkItem", "worker": []string{"p1", "p2"}[i%2],
			"created_at": old, "attempts": 1}
		switch {
		case i < 1500:
			doc["status"], doc["finished_at"] = "done", old
		case i < 1800:
			doc["status"], doc["finished_at"], doc["last_error"] = "failed", old, "x"
		case i < 2000:
			doc["status"], doc["finished_at"] = "done", recent
		}
		docs = append(docs, doc)
	}
	for start := 0; start < len(docs); start += 1000 {
		results, err := tb.db.BulkDocs(tb.ctx, docs[start:start+1000])
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range results {
			if r.Error != nil {
				t.Fatal(r.Error)
			}
		}
	}
	totals := func() map[protocol.Status]int64 {
		counts, err := c.Counts(tb.ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[protocol.Status]int64{}
		for _, byStatus := range counts {
			for st, k := range byStatus {
				out[st] += k
			}
		}
		return out
	}
	want := map[protocol.Status]int64{protocol.StatusDone: 1700, protocol.StatusFailed: 300, protocol.StatusQueued: 1000}
	if got := totals(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("before purge: %v, want %v", got, want)
	}
	clk.Set(t0.Add(10*24*time.Hour + time.Hour))
	progress := 0
	deleted, err := c.Purge(tb.ctx, protocol.PurgeOptions{Status: protocol.StatusDone, OlderThan: 7 * 24 * time.Hour,
		Progress: func(n int) { progress = n }})
	if err != nil {
		t.Fatal(err)
	}
	if deleted != 1500 || progress != 1500 {
		t.Fatalf("purged %d (progress %d), want 1500", deleted, progress)
	}
	want[protocol.StatusDone] = 200
	if got := totals(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after purge: %v, want %v", got, want)
	}
	// CouchDB counts tombstones in doc_del_count; PouchDB Server reports none.
	ts, known, err := c.Tombstones(tb.ctx)
	if err != nil || known != (server.Caps().Vendor == "couchdb") || (known && ts < 1500) {
		t.Fatalf("tombstones %d (known %v) %v", ts, known, err)
	}
	if _, err := c.Purge(tb.ctx, protocol.PurgeOptions{Status: protocol.StatusRunning}); err == nil {
		t.Fatal("purging running jobs must be refused")
	}
}

// The views people browse in Fauxton carry values worth reading: a failed
// job's error, who holds a lease, which workers are alive.
func TestFauxtonViewsCarryReadableValues(t *testing.T) {
	tb, _, _ := opsScript(t)
	c := tb.client
	it, err := c.Get(tb.ctx, "C")
	if err != nil {
		t.Fatal(err)
	}
	if it, err = c.Claim(tb.ctx, it, "host/1/w1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.Fail(tb.ctx, it, "mailbox full", protocol.FailOptions{Final: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.PutWorker(tb.ctx, &protocol.WorkerInfo{ID: protocol.WorkerDocID("host", 1, "w1"), Claimant: "host/1/w1",
		Types: []string{"mail"}, Concurrency: 4, Running: []string{"E"}, LastHeartbeat: 1}); err != nil {
		t.Fatal(err)
	}
	row := func(view string) map[string]any {
		t.Helper()
		rows := tb.db.Query(tb.ctx, designdocs.DocFor(view), "_view/"+view, kivik.Param("reduce", false), kivik.Param("limit", 1))
		defer rows.Close()
		// limit=1: the first row is the one wanted.
		if !rows.Next() {
			t.Fatalf("%s: no rows (%v)", view, rows.Err())
		}
		var v map[string]any
		if err := rows.ScanValue(&v); err != nil {
			t.Fatalf("%s: %v", view, err)
		}
		return v
	}
	if v := row("failed"); v["last_error"] != "mailbox full" || v["attempts"] != 1.0 {
		t.Errorf("failed view row: %v", v)
	}
	if v := row("leases"); v["claimed_by"] != "host/1/w1" || v["worker"] != "mail" {
		t.Errorf("leases view row: %v", v)
	}
	if v := row("workers"); v["claimant"] != "host/1/w1" || v["running"] != 1.0 {
		t.Errorf("workers view row: %v", v)
	}
	if v := row("by_status"); v["worker"] != "mail" || v["rev"] == nil {
		t.Errorf("by_status view row: %v", v)
	}
	if v := row("due"); v["attempts"] == nil {
		t.Errorf("due view row: %v", v)
	}
}

// Jobs written straight into CouchDB are counted as added, when they were
// created (else when couchq first wrote to them), and are in the queue's
// depth from then; jobs waiting for others are not in the depth until
// those are done.
func TestCountersCountJobsCouchqDidNotEnqueueAndLeaveOutWaitingOnes(t *testing.T) {
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	clk := opstest.NewClock(t0)
	tb := setup(t, protocol.Config{Now: clk.Now})
	c := tb.client
	// Written by hand, as the README's smallest job, with created_at.
	if _, err := tb.db.Put(tb.ctx, "hand-1", map[string]any{
		"type": "WorkItem", "worker": "hand", "created_at": protocol.ToUnix(t0.Add(5 * time.Second)),
	}); err != nil {
		t.Fatal(err)
	}
	// A job and two that wait for it.
	parent, err := c.Enqueue(tb.ctx, protocol.NewJob{Worker: "hold", At: t0.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := c.Enqueue(tb.ctx, protocol.NewJob{Worker: "wt", After: []string{parent.ID}}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Set(t0.Add(time.Minute))
	stats := func(typ string) protocol.TypeStats {
		t.Helper()
		st, err := c.Stats(tb.ctx, protocol.StatsOptions{Worker: typ, Since: t0.Add(-time.Minute)})
		if err != nil || len(st.Types) != 1 {
			t.Fatalf("stats of %s: %+v, %v", typ, st, err)
		}
		return st.Types[0]
	}
	depth := func(typ string) int64 {
		t.Helper()
		s, err := c.Series(tb.ctx, protocol.SeriesOptions{Worker: typ, Window: 10 * time.Minute})
		if err != nil || len(s.Depth) == 0 {
			t.Fatalf("series of %s: %+v, %v", typ, s, err)
		}
		return s.Depth[len(s.Depth)-1]
	}
	if st := stats("hand"); st.Added != 1 {
		t.Errorf("the hand-written job: added %d, want 1", st.Added)
	}
	if d := depth("hand"); d != 1 {
		t.Errorf("the hand-written job: depth %d, want 1", d)
	}
	if d := depth("wt"); d != 0 {
		t.Errorf("two jobs waiting for another: depth %d, want 0", d)
	}
	// Run it: added once, started and finished once, out of the queue.
	it, err := c.Get(tb.ctx, "hand-1")
	if err != nil {
		t.Fatal(err)
	}
	if it, err = c.Claim(tb.ctx, it, "host/1/w", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.Complete(tb.ctx, it, nil); err != nil {
		t.Fatal(err)
	}
	clk.Set(t0.Add(3 * time.Minute)) // the series counts whole minutes
	if st := stats("hand"); st.Added != 1 || st.Started != 1 || st.Finished != 1 {
		t.Errorf("the hand-written job, done: added %d started %d finished %d, want 1 each", st.Added, st.Started, st.Finished)
	}
	if d := depth("hand"); d != 0 {
		t.Errorf("the hand-written job, done: depth %d, want 0", d)
	}
	// The jobs they wait for done, the waiting jobs join the queue.
	if it, err = c.Get(tb.ctx, parent.ID); err != nil {
		t.Fatal(err)
	}
	if it, err = c.Claim(tb.ctx, it, "host/1/w", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.Complete(tb.ctx, it, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Finished(tb.ctx, it, "test"); err != nil {
		t.Fatal(err)
	}
	clk.Set(t0.Add(5 * time.Minute))
	if d := depth("wt"); d != 2 {
		t.Errorf("two jobs released: depth %d, want 2", d)
	}
}

// countingRequests counts the requests that pass through it.
type countingRequests struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (c *countingRequests) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// addStatsTypes writes, through c, jobs of the types type-<from> up to
// type-<to> (excluded): of each, a job done, a job due and a job scheduled
// in an hour.
func addStatsTypes(ctx context.Context, t *testing.T, c *protocol.Client, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		typ := fmt.Sprintf("type-%02d", i)
		for _, id := range []string{"done", "due"} {
			if _, err := c.Enqueue(ctx, protocol.NewJob{ID: typ + "-" + id, Worker: typ}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.Enqueue(ctx, protocol.NewJob{ID: typ + "-later", Worker: typ, At: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		it, err := c.Get(ctx, typ+"-done")
		if err != nil {
			t.Fatal(err)
		}
		if it, err = c.Claim(ctx, it, "host/1/w1", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := c.Complete(ctx, it, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// statsTypesWrong says how st differs from the figures of addStatsTypes'
// types, from type-00 up to type-<types> (excluded); "" when it does not.
func statsTypesWrong(st *protocol.Stats, types int) string {
	if len(st.Types) != types {
		return fmt.Sprintf("%d types in the stats, want %d", len(st.Types), types)
	}
	var wrong []string
	for _, ts := range st.Types {
		q := ts.Queue
		if ts.Added != 3 || ts.Started != 1 || ts.Finished != 1 || ts.Wait.Count != 1 || ts.Service.Count != 1 || ts.Execution.Count != 1 ||
			ts.Wait.P50 == nil || q.Due != 1 || q.Scheduled != 1 || q.Done != 1 || q.OldestDueAge <= 0 {
			wrong = append(wrong, fmt.Sprintf("%s: %+v", ts.Type, ts))
		}
	}
	if len(wrong) > 0 {
		return fmt.Sprintf("want of each type 3 added, 1 started and finished, one of each timing with percentiles, 1 due, 1 scheduled, 1 done, an oldest due age; got\n%s", strings.Join(wrong, "\n"))
	}
	return ""
}

// Stats (a metrics scrape, `couchq stats`) costs as many requests at 40
// job types as at 2 where the server answers several view ranges in one
// request, and gives each type its own figures either way.
func TestStatsRequestsDoNotGrowWithTypes(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var counter *countingRequests
	client := clientThrough(t, tb, protocol.Config{}, func(next http.RoundTripper) http.RoundTripper {
		counter = &countingRequests{next: next}
		return counter
	})
	stats := func(types int) int64 {
		t.Helper()
		if _, err := client.Stats(tb.ctx, protocol.StatsOptions{}); err != nil { // indexes brought up to date
			t.Fatal(err)
		}
		before := counter.n.Load()
		st, err := client.Stats(tb.ctx, protocol.StatsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		requests := counter.n.Load() - before
		if wrong := statsTypesWrong(st, types); wrong != "" {
			t.Fatal(wrong)
		}
		t.Logf("stats of %d types: %d requests", types, requests)
		return requests
	}
	addStatsTypes(tb.ctx, t, tb.client, 0, 2)
	few := stats(2)
	addStatsTypes(tb.ctx, t, tb.client, 2, 40)
	many := stats(40)
	if server.Kind() == couchtest.KindPouchDB {
		t.Logf("%s answers one view range a request: %d requests at 2 types, %d at 40", server.Kind(), few, many)
		return
	}
	if many != few {
		t.Errorf("stats took %d requests at 40 types, %d at 2: want as many", many, few)
	}
}

// A job written without validation with a time no float64 squares
// (created_at -1e300) does not break the ops views: CouchDB's _stats
// reduce squares each duration, and the overflow failed every query of
// the view, stats and the dashboard with it.
func TestOpsViewsSurviveATimeOutOfRange(t *testing.T) {
	tb := setupWithout(t, protocol.Config{})
	now := protocol.ToUnix(time.Now())
	body := fmt.Sprintf(`{"type":"WorkItem","worker":"far","status":"failed","attempts":1,"created_at":-1e300,"started_at":%f,"finished_at":%f,"last_error":"x"}`, now, now)
	if code, resp := tb.raw(t, http.MethodPut, "/far", body); code != http.StatusCreated {
		t.Fatalf("PUT: %d %s", code, resp)
	}
	tb.install(t)
	if _, err := tb.client.Stats(tb.ctx, protocol.StatsOptions{Worker: "far"}); err != nil {
		t.Fatalf("stats: %v", err)
	}
}
