package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
)

// retry, cancel and requeue on the script's jobs: what each applies to,
// what it leaves behind, and the errors when it does not apply.
func TestRetryCancelRequeue(t *testing.T) {
	t.Parallel()
	r := runOpsScript(t)
	c := r.c

	// E is running: retry does not apply. Its claimant has no registry
	// document (an agent, say), so it may be alive until its lease (from
	// the claim at 7, a minute) runs out; then requeue applies.
	res := c.run(t, "retry", "E")
	expect(t, res, exitFailure, "couchq retry: retrying job E: job is not in a state this action applies to: status is running; only failed or cancelled jobs are retried")
	res = c.run(t, "requeue", "E")
	expect(t, res, exitFailure, "its claimant host/1/w1 has no worker heartbeat (an agent, say) and its lease runs 47s more", "--force")
	r.At(68)
	res = c.run(t, "requeue", "E")
	expect(t, res, exitOK)
	if strings.TrimSpace(res.stdout) != "requeued E (it was claimed by host/1/w1; attempt 1 stays counted)" {
		t.Errorf("requeue: %q", res.stdout)
	}
	res = c.run(t, "requeue", "E")
	expect(t, res, exitFailure, "status is queued; only running jobs are requeued")

	// A running job whose worker still heartbeats is not requeued without --force.
	r.Claim(t, "E")
	now := protocol.ToUnix(r.Clock.Now())
	w := &protocol.WorkerInfo{ID: protocol.WorkerDocID("host", 1, "w1"), Claimant: opstest.Claimant, Types: []string{"mail"},
		Concurrency: 1, StartedAt: now - 60, LastHeartbeat: now - 2, HeartbeatInterval: 5}
	if err := r.Q.PutWorker(r.Ctx, w); err != nil {
		t.Fatal(err)
	}
	res = c.run(t, "requeue", "E")
	expect(t, res, exitFailure, "its worker host/1/w1 is alive (last heartbeat 2s ago)", "--force")
	res = c.run(t, "requeue", "--force", "E", "--json")
	expect(t, res, exitOK)
	var doc protocol.WorkItem
	if err := json.Unmarshal([]byte(res.stdout), &doc); err != nil || doc.Status != protocol.StatusQueued || doc.Claimed {
		t.Errorf("requeue --force --json: %v %+v", err, doc)
	}
	// Three intervals without a heartbeat and the worker counts as gone,
	// its lease running or not.
	r.Claim(t, "E")
	r.At(68 + 14)
	expect(t, c.run(t, "requeue", "E"), exitOK)

	// C is queued: cancel it with a reason, not twice; then retry it.
	res = c.run(t, "cancel", "C", "--reason", "duplicate of A")
	expect(t, res, exitOK)
	if strings.TrimSpace(res.stdout) != "cancelled C" {
		t.Errorf("cancel: %q", res.stdout)
	}
	res = c.run(t, "cancel", "C")
	expect(t, res, exitFailure, "couchq cancel: cancelling job C: job is not in a state this action applies to: status is already cancelled")
	res = c.run(t, "show", "C")
	for _, want := range []string{"status      cancelled", "last error  duplicate of A", "cancelled  by cli, note: duplicate of A"} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("show C lacks %q", want)
		}
	}
	res = c.run(t, "retry", "C", "--json")
	expect(t, res, exitOK)
	doc = protocol.WorkItem{}
	if err := json.Unmarshal([]byte(res.stdout), &doc); err != nil || doc.Status != protocol.StatusQueued || doc.Attempts != 0 ||
		doc.History[len(doc.History)-1].Event != protocol.EventRequeued {
		t.Errorf("retry --json: %v %+v", err, doc)
	}

	// A running job is cancelled; the message says who runs it.
	r.Claim(t, "C")
	res = c.run(t, "cancel", "C")
	expect(t, res, exitOK)
	if !strings.Contains(res.stdout, "cancelled C (it was running on host/1/w1") {
		t.Errorf("cancel of a running job: %q", res.stdout)
	}

	// Done jobs are neither retried, cancelled nor requeued.
	expect(t, c.run(t, "retry", "A"), exitFailure, "status is done")
	expect(t, c.run(t, "cancel", "A"), exitFailure, "status is already done")
	expect(t, c.run(t, "requeue", "A"), exitFailure, "status is done")

	// Missing jobs: one line each, exit 1.
	for _, cmd := range []string{"retry", "cancel", "requeue"} {
		res := c.run(t, cmd, "nope")
		expect(t, res, exitFailure, "couchq "+cmd+": job nope not found")
		if strings.Count(strings.TrimSpace(res.stderr), "\n") != 0 {
			t.Errorf("%s: want one line, got:\n%s", cmd, res.stderr)
		}
	}
}

// A generated id works without its "job:" prefix, as with show.
func TestJobActionsTakeBareUUID(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	res := c.run(t, "enqueue", "--type", "x")
	expect(t, res, exitOK)
	id := strings.TrimSpace(res.stdout)
	res = c.run(t, "cancel", strings.TrimPrefix(id, "job:"))
	expect(t, res, exitOK)
	if strings.TrimSpace(res.stdout) != "cancelled "+id {
		t.Errorf("cancel by uuid: %q", res.stdout)
	}
	res = c.run(t, "retry", strings.TrimPrefix(id, "job:"))
	expect(t, res, exitOK)
	if !strings.HasPrefix(res.stdout, "retried "+id+": queued, due now") {
		t.Errorf("retry by uuid: %q", res.stdout)
	}
}

// Retrying a job cancelled because a job it waits for was cancelled says
// what became of it: checked at once, cancelled again while that job
// stands cancelled; waiting once that job was retried too.
func TestRetryOfADependentSaysWhatItIs(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	res := c.run(t, "enqueue", "--type", "f", "--in", "1h")
	expect(t, res, exitOK)
	first := strings.TrimSpace(res.stdout)
	res = c.run(t, "enqueue", "--type", "d", "--after", first)
	expect(t, res, exitOK)
	dependent := strings.TrimSpace(res.stdout)
	expect(t, c.run(t, "cancel", first), exitOK)
	res = c.run(t, "retry", dependent)
	expect(t, res, exitOK)
	if !strings.HasPrefix(res.stdout, "retried "+dependent+", which is cancelled again: dependency "+first+" (cancelled)") {
		t.Errorf("retrying the dependent of a cancelled job: %q", res.stdout)
	}
	expect(t, c.run(t, "retry", first), exitOK)
	res = c.run(t, "retry", dependent)
	expect(t, res, exitOK)
	if !strings.HasPrefix(res.stdout, "retried "+dependent+": waiting for the jobs it waits for") {
		t.Errorf("retrying the dependent of a job retried: %q", res.stdout)
	}
	res = c.run(t, "show", "--json", dependent)
	expect(t, res, exitOK)
	if !strings.Contains(res.stdout, `"status": "waiting"`) && !strings.Contains(res.stdout, `"status":"waiting"`) {
		t.Errorf("the retried dependent as shown: %s", res.stdout)
	}
}

// retry --failed brings back every failed job of the type, and only those.
func TestRetryFailedBringsAllBack(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	db := c.env["COUCHQ_DB"]
	var docs []any
	for i := range 550 { // more than one page of protocol.RetryFailed's 500
		doc := map[string]any{"_id": fmt.Sprintf("j-%04d", i), "type": "WorkItem", "worker": "mail",
			"status": "failed", "attempts": 25, "last_error": "smtp timeout", "finished_at": 1.7e9, "created_at": 1.7e9}
		switch {
		case i >= 530:
			doc["worker"] = "sms"
		case i >= 510:
			doc["status"], doc["last_error"] = "done", nil
		}
		docs = append(docs, doc)
	}
	bulkWrite(t, db, docs)
	if got, want := statusTotals(t, db), "mail/done=20 mail/failed=510 sms/failed=20"; got != want {
		t.Fatalf("before: %s, want %s", got, want)
	}
	res := c.run(t, "ls", "--status", "failed", "--type", "mail", "--limit", "1")
	if !strings.Contains(res.stdout, "LAST ERROR") || !strings.Contains(res.stdout, "smtp timeout") {
		t.Errorf("ls --status failed does not show the last error:\n%s", res.stdout)
	}
	res = c.run(t, "retry", "--failed", "--type", "mail")
	expect(t, res, exitOK)
	if strings.TrimSpace(res.stdout) != "retried 510 failed mail jobs" {
		t.Errorf("retry --failed: %q", res.stdout)
	}
	if got, want := statusTotals(t, db), "mail/done=20 mail/queued=510 sms/failed=20"; got != want {
		t.Errorf("after: %s, want %s", got, want)
	}
	res = c.run(t, "show", "j-0007", "--json")
	var doc protocol.WorkItem
	if err := json.Unmarshal([]byte(res.stdout), &doc); err != nil || doc.Status != protocol.StatusQueued || doc.Attempts != 0 ||
		len(doc.History) != 1 || doc.History[0].Event != "requeued" || doc.History[0].By != "cli" {
		t.Errorf("a retried job: %v %+v", err, doc)
	}
	res = c.run(t, "retry", "--failed", "--type", "sms", "--json")
	expect(t, res, exitOK)
	var sum map[string]any
	if err := json.Unmarshal([]byte(res.stdout), &sum); err != nil || sum["retried"] != 20.0 || sum["type"] != "sms" {
		t.Errorf("retry --failed --json: %v %s", err, res.stdout)
	}
	res = c.run(t, "retry", "--failed", "--type", "sms")
	expect(t, res, exitOK)
	if strings.TrimSpace(res.stdout) != "retried 0 failed sms jobs" {
		t.Errorf("nothing left to retry: %q", res.stdout)
	}
}

// purge on a couple of thousand jobs removes only the old jobs of the
// status (and type) asked for.
func TestPurgeLeavesOtherStatusesUntouched(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	c := online(t).mustInit(t)
	db := c.env["COUCHQ_DB"]
	old, recent := protocol.ToUnix(t0), protocol.ToUnix(t0.Add(10*24*time.Hour))
	var docs []any
	for i := range 2400 {
		doc := map[string]any{"_id": fmt.Sprintf("job-%04d", i), "type": "WorkItem", "worker": []string{"p1", "p2"}[i%2],
			"created_at": old, "attempts": 1}
		switch {
		case i < 1200:
			doc["status"], doc["finished_at"] = "done", old
		case i < 1500:
			doc["status"], doc["finished_at"], doc["last_error"] = "failed", old, "x"
		case i < 1700:
			doc["status"], doc["finished_at"] = "done", recent
		case i < 1800:
			doc["status"], doc["finished_at"] = "cancelled", old
		}
		docs = append(docs, doc)
	}
	bulkWrite(t, db, docs)
	before := "p1/cancelled=50 p1/done=700 p1/failed=150 p1/queued=300 p2/cancelled=50 p2/done=700 p2/failed=150 p2/queued=300"
	if got := statusTotals(t, db); got != before {
		t.Fatalf("before: %s\nwant   %s", got, before)
	}
	c.now = func() time.Time { return t0.Add(10*24*time.Hour + time.Hour) }
	c.terminal = true // draws the progress bar on stderr

	res := c.run(t, "purge", "--status", "done", "--older-than", "7d")
	expect(t, res, exitOK, "1200 deleted (of 1400 in that status)")
	if !strings.Contains(res.stdout, "deleted 1200 done jobs that finished before 2026-11-24 13:00:00Z (older than 7d)\nleft 1200 tombstones behind") ||
		!strings.Contains(res.stdout, "hint: compact "+db) || strings.Contains(res.stdout, "[=") {
		t.Errorf("purge output:\n%s", res.stdout)
	}
	if srv.Caps().Vendor == "couchdb" && !strings.Contains(res.stdout, "deleted documents (doc_del_count)") {
		t.Errorf("purge on CouchDB does not report doc_del_count:\n%s", res.stdout)
	}
	after := "p1/cancelled=50 p1/done=100 p1/failed=150 p1/queued=300 p2/cancelled=50 p2/done=100 p2/failed=150 p2/queued=300"
	if got := statusTotals(t, db); got != after {
		t.Errorf("after: %s\nwant  %s", got, after)
	}

	c.terminal = false
	res = c.run(t, "purge", "--status", "failed", "--older-than", "0s", "--type", "p1", "--json")
	expect(t, res, exitOK)
	if res.stderr != "" {
		t.Errorf("progress drawn off a terminal: %q", res.stderr)
	}
	var out map[string]any
	if err := json.Unmarshal([]byte(res.stdout), &out); err != nil || out["deleted"] != 150.0 || out["tombstones_added"] != 150.0 || out["type"] != "p1" {
		t.Errorf("purge --json: %v %s", err, res.stdout)
	}
	after = strings.Replace(after, "p1/failed=150 ", "", 1)
	if got := statusTotals(t, db); got != after {
		t.Errorf("after purging p1 failed: %s\nwant  %s", got, after)
	}
	res = c.run(t, "purge", "--status", "cancelled", "--older-than", "30d")
	expect(t, res, exitOK)
	if strings.TrimSpace(res.stdout) != "deleted 0 cancelled jobs that finished before 2026-11-01 13:00:00Z (older than 30d)" {
		t.Errorf("purge of nothing: %q", res.stdout)
	}

	expect(t, c.run(t, "purge", "--status", "running", "--older-than", "1d"), exitUsage, "only finished jobs are purged")
	expect(t, c.run(t, "purge", "--status", "queued", "--older-than", "1d"), exitUsage, "only finished jobs are purged")
	if got := statusTotals(t, db); got != after {
		t.Errorf("refused purges changed something: %s", got)
	}
}

// doc_del_count is reported when the server has it (CouchDB) and not made
// up when it has not (PouchDB Server), whichever server the tests run on.
func TestDocDelCount(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		`{"db_name":"q","doc_count":3,"doc_del_count":1234,"update_seq":"9-x"}`: "1234 true",
		`{"db_name":"q","doc_count":3,"update_seq":9}`:                          "0 false",
	} {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, body)
		}))
		client, err := protocol.Dial(ts.URL, "", "")
		if err != nil {
			t.Fatal(err)
		}
		q, err := protocol.New(context.Background(), client.DB("q"), protocol.Config{Replicas: 1})
		if err != nil {
			t.Fatal(err)
		}
		n, known, err := q.Tombstones(context.Background())
		if got := fmt.Sprint(n, " ", known); err != nil || got != want {
			t.Errorf("Tombstones on %s = %s, %v; want %s", body, got, err, want)
		}
		ts.Close()
	}
}

// A requeue of a job's last attempt says that it has none left: the worker
// that claims it fails it without running it.
func TestRequeueOfTheLastAttemptSaysSo(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	expect(t, c.run(t, "enqueue", "--type", "once", "--max-attempts", "1", "--id", "job:once"), exitOK)
	expect(t, c.run(t, "claim", "--type", "once", "--as", "agent-1"), exitOK)
	expect(t, c.run(t, "requeue", "--force", "job:once"), exitOK, "note: job job:once has no attempts left (1 of 1)", "couchq retry job:once")
}
