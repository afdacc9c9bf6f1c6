package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
)

// 32 goroutines race to claim 200 jobs: every job is claimed exactly once
// and every loser is told so with ErrClaimConflict.
func TestClaimRaceEveryJobClaimedOnce(t *testing.T) {
	tb := setup(t, protocol.Config{})
	ctx := tb.ctx
	const jobs, claimants = 200, 32
	newJobs := make([]protocol.NewJob, jobs)
	for i := range newJobs {
		newJobs[i] = protocol.NewJob{Worker: "race", Payload: map[string]int{"n": i}}
	}
	res, err := tb.client.EnqueueMany(ctx, newJobs)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}

	var mu sync.Mutex
	winner := map[string]string{}
	var conflicts atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, claimants)
	for c := range claimants {
		by := fmt.Sprintf("test/%d/c%d", c, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				batch, err := tb.client.Due(ctx, "race", 20)
				if err != nil {
					errs <- err
					return
				}
				if len(batch.Items) == 0 {
					return
				}
				it := batch.Items[rand.IntN(len(batch.Items))]
				claimed, err := tb.client.Claim(ctx, it, by, time.Minute)
				switch {
				case err == nil:
					mu.Lock()
					if prev, ok := winner[it.ID]; ok {
						errs <- fmt.Errorf("job %s claimed twice: by %s and %s", it.ID, prev, by)
					}
					winner[it.ID] = by
					mu.Unlock()
					if claimed.ClaimedBy != by || !claimed.Claimed || claimed.Status != protocol.StatusRunning {
						errs <- fmt.Errorf("claim result wrong: %+v", claimed)
					}
				case errors.Is(err, protocol.ErrClaimConflict):
					conflicts.Add(1)
					if kivik.HTTPStatus(err) != http.StatusConflict && !strings.Contains(err.Error(), "status") {
						errs <- fmt.Errorf("a claim conflict should carry CouchDB's 409: %v", err)
					}
				default:
					errs <- fmt.Errorf("loser not told with ErrClaimConflict: %w", err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if len(winner) != jobs {
		t.Fatalf("%d jobs claimed, want %d", len(winner), jobs)
	}
	for id, by := range winner {
		it, err := tb.client.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if it.ClaimedBy != by || it.Attempts != 1 {
			t.Errorf("job %s: stored claimant %q attempts %d, want %q and 1", id, it.ClaimedBy, it.Attempts, by)
		}
	}
	t.Logf("%d claims, %d conflicts among %d claimants", jobs, conflicts.Load(), claimants)
}

// A document written by hand over raw HTTP, with no couchq code, is listed
// due and claimed.
func TestHandWrittenMinimalDocumentIsClaimed(t *testing.T) {
	tb := setup(t, protocol.Config{})
	for id, body := range map[string]string{
		"by-hand-1": `{"type":"WorkItem","worker":"email","date":0}`,
		"by-hand-2": `{"type":"WorkItem","worker":"email"}`,
	} {
		if code, resp := tb.raw(t, http.MethodPut, "/"+id, body); code != http.StatusCreated {
			t.Fatalf("PUT %s: %d %s", id, code, resp)
		}
	}
	batch, err := tb.client.Due(tb.ctx, "email", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(batch.Items) != 2 || len(batch.Malformed) != 0 {
		t.Fatalf("due: %d items, %d malformed; want 2, 0", len(batch.Items), len(batch.Malformed))
	}
	for _, it := range batch.Items {
		claimed, err := tb.client.Claim(tb.ctx, it, "test/1/w", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := tb.client.Complete(tb.ctx, claimed, json.RawMessage(`{"sent":true}`)); err != nil {
			t.Fatal(err)
		}
	}
	// The application's own fields survive couchq's writes.
	code, body := tb.raw(t, http.MethodGet, "/by-hand-1", "")
	if code != http.StatusOK || !strings.Contains(body, `"status":"done"`) || !strings.Contains(body, `"sent":true`) {
		t.Fatalf("after completion: %d %s", code, body)
	}
}

// Scheduled jobs are not due before their date and are found as "next".
func TestScheduledJobsWaitForTheirDate(t *testing.T) {
	clock := opstest.NewClock(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
	tb := setup(t, protocol.Config{Now: clock.Now})
	at := clock.Now().Add(10 * time.Second)
	job, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "report", At: at})
	if err != nil {
		t.Fatal(err)
	}
	if due := tb.due(t, "report"); len(due) != 0 {
		t.Fatalf("job due before its date: %v", due)
	}
	next, ok, err := tb.client.Next(tb.ctx, "report", clock.Now())
	if err != nil || !ok || !next.Equal(at) {
		t.Fatalf("next = %v %v %v, want %v", next, ok, err, at)
	}
	clock.Add(9 * time.Second)
	if due := tb.due(t, "report"); len(due) != 0 {
		t.Fatalf("job due a second early: %v", due)
	}
	clock.Add(time.Second)
	if due := tb.due(t, "report"); len(due) != 1 || due[0] != job.ID {
		t.Fatalf("job not due at its date: %v", due)
	}
	if due := tb.due(t, "other-type"); len(due) != 0 {
		t.Fatalf("another type sees the job: %v", due)
	}
	// The next scheduled job is the earliest, whatever its priority.
	soon, later := clock.Now().Add(4*time.Second), clock.Now().Add(6*time.Second)
	for _, j := range []protocol.NewJob{
		{Worker: "digest", At: later, Priority: protocol.PriorityHighest},
		{Worker: "digest", At: soon, Priority: protocol.PriorityLowest},
		{Worker: "digest", At: clock.Now().Add(8 * time.Second)},
	} {
		if _, err := tb.client.Enqueue(tb.ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	if next, ok, err := tb.client.Next(tb.ctx, "digest", clock.Now()); err != nil || !ok || !next.Equal(soon) {
		t.Fatalf("next digest = %v %v %v, want the lowest priority's %v", next, ok, err, soon)
	}
	if _, ok, err := tb.client.Next(tb.ctx, "digest", clock.Now().Add(9*time.Second)); err != nil || ok {
		t.Fatalf("next digest after every date: ok %v, %v", ok, err)
	}
}

// Eight installers race on a database that does not exist yet: all
// succeed, one design document results; an edited function is upgraded and
// an older schema never downgrades a newer one.
func TestDesignDocInstallRaceAndUpgrade(t *testing.T) {
	tb := setup(t, protocol.Config{})
	ctx := tb.ctx
	name := tb.freshName(t)
	var wg sync.WaitGroup
	outcomes := make(chan designdocs.Outcome, 8)
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, err := protocol.Init(ctx, tb.kivik, name, tb.log)
			if err != nil {
				errs <- err
				return
			}
			outcomes <- o
		}()
	}
	wg.Wait()
	close(errs)
	close(outcomes)
	for err := range errs {
		t.Fatalf("installer failed: %v", err)
	}
	counts := map[designdocs.Outcome]int{}
	for o := range outcomes {
		counts[o]++
	}
	if counts[designdocs.Created] != 1 || counts[designdocs.Unchanged] != 7 {
		t.Fatalf("outcomes %v, want one created and seven unchanged", counts)
	}
	db := tb.kivik.DB(name)
	ddocs := db.AllDocs(ctx, kivik.Params(map[string]any{"startkey": "_design/", "endkey": "_design0"}))
	n := 0
	for ddocs.Next() {
		n++
	}
	if err := ddocs.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("%d design documents, want 3 (claims, sweeps and ops)", n)
	}
	for _, id := range []string{designdocs.ID, designdocs.SweepID, designdocs.OpsID} {
		var stored map[string]any
		if err := db.Get(ctx, id, kivik.Param("conflicts", true)).ScanDoc(&stored); err != nil {
			t.Fatal(err)
		}
		if _, ok := stored["_conflicts"]; ok {
			t.Fatalf("design document %s has conflicts: %v", id, stored["_conflicts"])
		}
	}

	// An edited function (as a newer couchq would ship) is upgraded.
	edited := copyFS(t, designdocs.Source())
	edited["views/due_priority/map.js"].Data = []byte(strings.Replace(string(edited["views/due_priority/map.js"].Data),
		"emit([queue, p, date], null);", "emit([queue, p, date], 'v2');", 1))
	newer, err := designdocs.Build(edited, designdocs.SchemaVersion+1)
	if err != nil {
		t.Fatal(err)
	}
	if o, err := designdocs.Install(ctx, db, newer, designdocs.ValidationKept, tb.log); err != nil || o != designdocs.Upgraded {
		t.Fatalf("upgrade: %v %v", o, err)
	}
	if o, err := designdocs.Install(ctx, db, newer, designdocs.ValidationKept, tb.log); err != nil || o != designdocs.Unchanged {
		t.Fatalf("re-install: %v %v", o, err)
	}
	// This build's (older) document must not replace the newer one.
	if o, err := protocol.Init(ctx, tb.kivik, name, tb.log); err != nil || o != designdocs.KeptNewer {
		t.Fatalf("older install over newer: %v %v", o, err)
	}
	client, err := protocol.New(ctx, db, protocol.Config{Logger: tb.log})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Enqueue(ctx, protocol.NewJob{Worker: "x"}); err != nil {
		t.Fatal(err)
	}
	rows := db.Query(ctx, designdocs.ID, "_view/due_priority")
	defer rows.Close()
	var value string
	for rows.Next() {
		if err := rows.ScanValue(&value); err != nil {
			t.Fatal(err)
		}
	}
	if value != "v2" {
		t.Fatalf("upgraded view not in use: value %q", value)
	}
}

// validate_doc_update rejects each malformed shape with a message naming
// the field; other documents and valid jobs pass.
func TestValidateDocUpdateRejectsMalformedJobs(t *testing.T) {
	inEachLanguage(t, testValidateDocUpdateRejectsMalformedJobs)
}

func testValidateDocUpdateRejectsMalformedJobs(t *testing.T, tb *testBundle) {
	cases := []struct{ body, want string }{
		{`{"type":"WorkItem"}`, "worker is required"},
		{`{"type":"WorkItem","worker":5}`, "worker must be a string"},
		{`{"type":"WorkItem","worker":""}`, "worker must not be empty"},
		{`{"type":"WorkItem","worker":"nl\nx"}`, "worker must not contain control characters"},
		{`{"type":"WorkItem","worker":"esc\u001b[31m"}`, "worker must not contain control characters"},
		{`{"type":"WorkItem","worker":"a","date":"tomorrow"}`, "date must be a number"},
		{`{"type":"WorkItem","worker":"a","status":"paused"}`, "status must be one of"},
		{`{"type":"WorkItem","worker":"a","claimed":"yes"}`, "claimed must be a boolean"},
		{`{"type":"WorkItem","worker":"a","status":"running"}`, "but the job is not claimed"},
		{`{"type":"WorkItem","worker":"a","status":"running","claimed":false}`, "but the job is not claimed"},
		{`{"type":"WorkItem","worker":"a","attempts":-1}`, "attempts must be a whole number"},
		{`{"type":"WorkItem","worker":"a","lease_until":"soon"}`, "lease_until must be a number"},
		{`{"type":"WorkItem","worker":"a","created_at":-1e300}`, "created_at must be a number of Unix seconds, less than 1e11 either way"},
		{`{"type":"WorkItem","worker":"a","finished_at":1e11}`, "finished_at must be a number of Unix seconds, less than 1e11 either way"},
		{`{"type":"WorkItem","worker":"a","history":{}}`, "history must be an array"},
		{`{"type":"WorkItem","worker":"a","unique_key":7}`, "unique_key must be a string"},
		{`{"type":"WorkItem","worker":"a","priority":0}`, "priority must be a whole number from 1"},
		{`{"type":"WorkItem","worker":"a","priority":2.5}`, "priority must be a whole number from 1"},
		{`{"type":"WorkItem","worker":"a","unique_key":"k"}`, "unique_key needs the id job:unique:a:k"},
		{`{"type":"WorkItem","worker":"a","progress":5}`, "progress must be an object {done, total, note, at}"},
		{`{"type":"WorkItem","worker":"a","progress":[1,2]}`, "progress must be an object"},
		{`{"type":"WorkItem","worker":"a","progress":{"done":-1,"total":2}}`, "progress must be an object"},
		{`{"type":"WorkItem","worker":"a","progress":{"done":1.5}}`, "progress must be an object"},
		{`{"type":"WorkItem","worker":"a","progress":{"done":3,"total":2}}`, "progress must be an object"},
		{`{"type":"WorkItem","worker":"a","progress":{"done":1,"note":7}}`, "progress must be an object"},
		{`{"type":"WorkItem","worker":"a","progress":{"done":1,"at":"now"}}`, "progress must be an object"},
	}
	// Nested deeper than the engines' stacks allow: refused at 1,001 levels
	// (the document itself is the first), kept at 1,000.
	nested := func(levels int) string {
		return `{"type":"WorkItem","worker":"a","payload":` + strings.Repeat("[", levels-1) + strings.Repeat("]", levels-1) + `}`
	}
	cases = append(cases, struct{ body, want string }{nested(protocol.MaxNesting + 1), "document nests objects and arrays more than 1000 levels deep"},
		struct{ body, want string }{nested(20000), "document nests objects and arrays more than 1000 levels deep"})
	for i, c := range cases {
		code, body := tb.raw(t, http.MethodPut, fmt.Sprintf("/bad-%d", i), c.body)
		if code != http.StatusForbidden || !strings.Contains(body, "forbidden") || !strings.Contains(body, c.want) {
			t.Errorf("%.200s: got %d %s, want 403 forbidden mentioning %q", c.body, code, body, c.want)
		}
	}
	for i, ok := range []string{
		`{"type":"WorkItem","worker":"a"}`,
		`{"type":"WorkItem","worker":"a","date":null,"status":"queued","attempts":0,"claimed":false}`,
		`{"type":"WorkItem","worker":"a","priority":1}`,
		`{"type":"WorkItem","worker":"a","progress":{"done":40,"total":120,"note":"page 40","at":1764100000.5}}`,
		`{"type":"WorkItem","worker":"a","progress":{"done":7}}`,
		`{"type":"WorkItem","worker":"a","progress":null}`,
		`{"type":"SomethingElse","worker":5}`,
		nested(protocol.MaxNesting),
	} {
		if code, body := tb.raw(t, http.MethodPut, fmt.Sprintf("/good-%d", i), ok); code != http.StatusCreated {
			t.Errorf("%s: got %d %s, want 201", ok, code, body)
		}
	}
	// An id with a terminal's escape would reach the operator's terminal
	// in every listing.
	if code, body := tb.raw(t, http.MethodPut, "/"+url.PathEscape("job:x\x1b[2J\x1b[HALL GOOD"), `{"type":"WorkItem","worker":"a"}`); code != http.StatusForbidden ||
		!strings.Contains(body, "_id must not contain control characters") {
		t.Errorf("a job whose id holds control characters: got %d %s, want 403", code, body)
	}
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{ID: "job:x\x1b[2J", Worker: "a"}); !errors.Is(err, protocol.ErrInvalidJob) ||
		!strings.Contains(err.Error(), "contains control characters") {
		t.Errorf("enqueueing a job whose id holds control characters: %v, want ErrInvalidJob", err)
	}
	// A unique job written by hand, under the id couchq would derive.
	if code, body := tb.raw(t, http.MethodPut, "/"+url.PathEscape("job:unique:a:k@2026-11-23T00:00:00Z"),
		`{"type":"WorkItem","worker":"a","unique_key":"k"}`); code != http.StatusCreated {
		t.Errorf("hand-written unique job: got %d %s, want 201", code, body)
	}
}

// Malformed documents written before validation existed are skipped with a
// logged reason (never a crash), then quarantined as failed with their
// offending values kept; good jobs beside them are unaffected.
func TestMalformedDocumentsAreSkippedAndQuarantined(t *testing.T) {
	tb := setupWithout(t, protocol.Config{}) // no design document yet: nothing validates
	bad := map[string]string{
		"bad-date":     `{"type":"WorkItem","worker":"mail","date":"tomorrow","tenant":"acme"}`,
		"bad-status":   `{"type":"WorkItem","worker":"mail","status":"paused"}`,
		"bad-attempts": `{"type":"WorkItem","worker":"mail","attempts":"three","date":"x"}`,
		"bad-history":  `{"type":"WorkItem","worker":"mail","history":"oops"}`,
	}
	for id, body := range bad {
		if code, resp := tb.raw(t, http.MethodPut, "/"+id, body); code != http.StatusCreated {
			t.Fatalf("PUT %s: %d %s", id, code, resp)
		}
	}
	if code, resp := tb.raw(t, http.MethodPut, "/good", `{"type":"WorkItem","worker":"mail"}`); code != http.StatusCreated {
		t.Fatalf("PUT good: %d %s", code, resp)
	}
	tb.install(t)

	batch, err := tb.client.Due(tb.ctx, "mail", 50)
	if err != nil {
		t.Fatal(err)
	}
	if len(batch.Items) != 1 || batch.Items[0].ID != "good" {
		t.Fatalf("due items %v, want only the good job", ids(batch.Items))
	}
	// The due view surfaces all four (an unknown status is not a terminal
	// one) so that couchq can set them aside instead of leaving them stuck.
	if len(batch.Malformed) != 4 {
		t.Fatalf("%d malformed seen, want 4: %v", len(batch.Malformed), batch.Malformed)
	}
	for _, m := range batch.Malformed {
		if m.Err == nil || m.Err.Field == "" || m.Err.Reason == "" {
			t.Fatalf("malformed without a reason: %+v", m)
		}
		if err := tb.client.Quarantine(tb.ctx, m, "test/1/w"); err != nil {
			t.Fatalf("quarantine %s: %v", m.ID, err)
		}
	}
	batch, err = tb.client.Due(tb.ctx, "mail", 50)
	if err != nil || len(batch.Malformed) != 0 || len(batch.Items) != 1 {
		t.Fatalf("after quarantine: %v, %d malformed, %d items", err, len(batch.Malformed), len(batch.Items))
	}
	it, err := tb.client.Get(tb.ctx, "bad-date")
	if err != nil {
		t.Fatal(err)
	}
	if it.Status != protocol.StatusFailed || !strings.Contains(it.LastError, "date") {
		t.Fatalf("quarantined job: status %s, last_error %q", it.Status, it.LastError)
	}
	if inv, _ := it.Extra("invalid"); !strings.Contains(string(inv), `"tomorrow"`) {
		t.Fatalf("offending value not kept: invalid = %s", inv)
	}
	if tenant, _ := it.Extra("tenant"); string(tenant) != `"acme"` {
		t.Fatalf("application field lost: tenant = %s", tenant)
	}
	two, err := tb.client.Get(tb.ctx, "bad-attempts")
	if err != nil || !strings.Contains(two.LastError, "attempts") || !strings.Contains(two.LastError, "date") {
		t.Fatalf("a document with two bad fields: %v %+v", err, two)
	}
}

// A claim made through ClaimMany with confirmation on loses cleanly when a
// competing revision wins the conflict.
func TestClaimManyConfirmsEachClaim(t *testing.T) {
	tb := setup(t, protocol.Config{AlwaysConfirm: true})
	var jobs []protocol.NewJob
	for i := range 5 {
		jobs = append(jobs, protocol.NewJob{Worker: "many", Payload: i})
	}
	if _, err := tb.client.EnqueueMany(tb.ctx, jobs); err != nil {
		t.Fatal(err)
	}
	batch, err := tb.client.Due(tb.ctx, "many", 10)
	if err != nil {
		t.Fatal(err)
	}
	stale := batch.Items[0].Clone()
	res := tb.client.ClaimMany(tb.ctx, batch.Items, "test/1/w", time.Minute)
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("claim %d: %v", i, r.Err)
		}
	}
	// The same rev again: every claim conflicts, none is half-applied.
	again := tb.client.ClaimMany(tb.ctx, []*protocol.WorkItem{stale}, "test/2/w", time.Minute)
	if !errors.Is(again[0].Err, protocol.ErrClaimConflict) || kivik.HTTPStatus(again[0].Err) != http.StatusConflict {
		t.Fatalf("stale claim: %v (status %d)", again[0].Err, kivik.HTTPStatus(again[0].Err))
	}
}

// Complete, fail, release and extend each write over the held revision; a
// 409 means the claim was lost and nothing is overwritten.
func TestHeldClaimTransitions(t *testing.T) {
	clock := opstest.NewClock(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
	tb := setup(t, protocol.Config{Now: clock.Now, MaxAttempts: 2})
	claim := func() *protocol.WorkItem {
		t.Helper()
		batch, err := tb.client.Due(tb.ctx, "t", 1)
		if err != nil || len(batch.Items) != 1 {
			t.Fatalf("due: %v %d", err, len(batch.Items))
		}
		it, err := tb.client.Claim(tb.ctx, batch.Items[0], "test/1/w", 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return it
	}
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "t"}); err != nil {
		t.Fatal(err)
	}

	it := claim()
	stale := it.Clone()
	if err := tb.client.Extend(tb.ctx, it, time.Minute); err != nil {
		t.Fatal(err)
	}
	if want := protocol.ToUnix(clock.Now().Add(time.Minute)); it.LeaseUntil != want {
		t.Fatalf("lease_until %v, want %v", it.LeaseUntil, want)
	}
	// The stale copy lost: a 409, reported as a lost claim, nothing written.
	err := tb.client.Complete(tb.ctx, stale, nil)
	if !errors.Is(err, protocol.ErrClaimLost) || kivik.HTTPStatus(err) != http.StatusConflict {
		t.Fatalf("complete with a stale rev: %v", err)
	}
	if err := tb.client.Fail(tb.ctx, it, "boom", protocol.FailOptions{RetryAfter: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if it.Status != protocol.StatusQueued || it.LastError != "boom" || it.Date != protocol.ToUnix(clock.Now().Add(5*time.Second)) {
		t.Fatalf("after a retryable failure: %+v", it)
	}
	clock.Add(5 * time.Second)
	it = claim()
	if it.Attempts != 2 {
		t.Fatalf("attempts %d, want 2", it.Attempts)
	}
	if err := tb.client.Release(tb.ctx, it, "shutdown"); err != nil {
		t.Fatal(err)
	}
	if it.Attempts != 1 || it.Status != protocol.StatusQueued || it.Claimed {
		t.Fatalf("release must not charge the attempt: %+v", it)
	}
	it = claim()
	if err := tb.client.Fail(tb.ctx, it, "boom again", protocol.FailOptions{}); err != nil {
		t.Fatal(err)
	}
	if it.Status != protocol.StatusFailed || it.FinishedAt == 0 {
		t.Fatalf("attempts used up: want failed, got %+v", it)
	}
	events := []string{}
	for _, e := range it.History {
		events = append(events, e.Event)
	}
	want := "enqueued claimed retry-scheduled claimed released claimed failed"
	if strings.Join(events, " ") != want {
		t.Fatalf("history %v, want %s", events, want)
	}
	if _, err := tb.client.Get(tb.ctx, "no-such-job"); !errors.Is(err, protocol.ErrNotFound) || kivik.HTTPStatus(err) != http.StatusNotFound {
		t.Fatalf("missing job: %v", err)
	}
}

func ids(items []*protocol.WorkItem) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.ID
	}
	return out
}

func copyFS(t *testing.T, src fs.FS) fstest.MapFS {
	t.Helper()
	out := fstest.MapFS{}
	err := fs.WalkDir(src, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(src, p)
		out[p] = &fstest.MapFile{Data: b}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A hand-written claim whose lease is not a number, or missing, written
// before couchq was installed, is swept: quarantined as failed with its bad
// value kept, never left claimed forever (item 8 of the real-CouchDB issue).
func TestSweepQuarantinesClaimsWithoutANumericLease(t *testing.T) {
	tb := setupWithout(t, protocol.Config{})
	bad := map[string]string{
		"lease-never":   `{"type":"WorkItem","worker":"mail","claimed":true,"status":"running","lease_until":"never"}`,
		"lease-missing": `{"type":"WorkItem","worker":"mail","claimed":true,"status":"running","claimed_by":"h/1/w"}`,
		"lease-null":    `{"type":"WorkItem","worker":"mail","claimed":true,"lease_until":null}`,
	}
	for id, body := range bad {
		if code, resp := tb.raw(t, http.MethodPut, "/"+id, body); code != http.StatusCreated {
			t.Fatalf("PUT %s: %d %s", id, code, resp)
		}
	}
	tb.install(t)
	res, err := tb.client.Sweep(tb.ctx, "test/1/sweeper", 100)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sweep: %+v", res)
	for id := range bad {
		it, err := tb.client.Get(tb.ctx, id)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if it.Claimed || it.Status == protocol.StatusRunning {
			t.Errorf("%s still claimed after a sweep: %+v", id, it)
		}
	}
	never, err := tb.client.Get(tb.ctx, "lease-never")
	if err != nil {
		t.Fatal(err)
	}
	if inv, _ := never.Extra("invalid"); !strings.Contains(string(inv), `"never"`) {
		t.Fatalf("the bad lease was not kept: invalid = %s (status %s, last_error %q)", inv, never.Status, never.LastError)
	}
}

// During a rolling deploy two builds of one schema meet: a worker keeps
// the other build's design documents (so that the two builds' workers do
// not replace each other's at every start, and CouchDB rebuild the
// indexes each time); couchq init installs its own.
func TestWorkersKeepAnotherBuildsDesignDocumentsOfTheirSchema(t *testing.T) {
	tb := setup(t, protocol.Config{})
	ctx := tb.ctx
	name := tb.freshName(t)
	if _, err := protocol.InitWith(ctx, tb.kivik, name, protocol.InitOptions{Validation: designdocs.ValidationOn}, tb.log); err != nil {
		t.Fatal(err)
	}
	db := tb.kivik.DB(name)
	// Another build of this schema: one function differs.
	edited := copyFS(t, designdocs.Source())
	edited["views/due_priority/map.js"].Data = []byte(strings.Replace(string(edited["views/due_priority/map.js"].Data),
		"emit([queue, p, date], null);", "emit([queue, p, date], 'other build');", 1))
	other, err := designdocs.Build(edited, designdocs.SchemaVersion)
	if err != nil {
		t.Fatal(err)
	}
	if o, err := designdocs.Install(ctx, db, other, designdocs.ValidationKept, tb.log); err != nil || o != designdocs.Upgraded {
		t.Fatalf("installing the other build's document: %v %v", o, err)
	}
	storedHash := func() string {
		t.Helper()
		have, err := designdocs.Stored(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		return have.Couchq.Hash
	}
	for range 2 {
		if o, err := protocol.Init(ctx, tb.kivik, name, tb.log); err != nil || o != designdocs.KeptStored {
			t.Fatalf("a worker's install over another build's document of its schema: %v %v, want it kept", o, err)
		}
	}
	if storedHash() != other.Couchq.Hash {
		t.Fatalf("the worker replaced the other build's document")
	}
	// So does an application's Init at its start, unless it chooses a
	// validation.
	user, password := server.Credentials()
	srv, err := couchq.Connect(ctx, server.URL(), user, password)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Init(ctx, name, couchq.InitOptions{}); err != nil || storedHash() != other.Couchq.Hash {
		t.Fatalf("the Go API's Init at start replaced the other build's document (%v)", err)
	}
	if err := srv.Init(ctx, name, couchq.InitOptions{Validation: designdocs.ValidationOn}); err != nil || storedHash() == other.Couchq.Hash {
		t.Fatalf("the Go API's Init with a validation chosen kept the other build's document (%v)", err)
	}
	if _, err := designdocs.Install(ctx, db, other, designdocs.ValidationKept, tb.log); err != nil {
		t.Fatal(err)
	}
	// couchq init installs this build's.
	if o, err := protocol.InitWith(ctx, tb.kivik, name, protocol.InitOptions{}, tb.log); err != nil || o != designdocs.Upgraded {
		t.Fatalf("init over another build's document: %v %v, want upgraded", o, err)
	}
	if h := storedHash(); h == other.Couchq.Hash || h == "" {
		t.Fatalf("init kept the other build's document")
	}
	if o, err := protocol.Init(ctx, tb.kivik, name, tb.log); err != nil || o != designdocs.Unchanged {
		t.Fatalf("a worker's install after init: %v %v, want unchanged", o, err)
	}
}

// ErrNotFound is a job's absence, never the database's: code that drops a
// job it is told is gone must not drop it for a deleted database.
func TestNotFoundIsAJobsAbsenceNotTheDatabases(t *testing.T) {
	tb := setup(t, protocol.Config{})
	if _, err := tb.client.Get(tb.ctx, "job:none"); !errors.Is(err, protocol.ErrNotFound) {
		t.Errorf("a job that does not exist: %v, want ErrNotFound", err)
	}
	it, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.kivik.DestroyDB(tb.ctx, tb.db.Name()); err != nil {
		t.Fatal(err)
	}
	_, err = tb.client.Get(tb.ctx, it.ID)
	if err == nil || errors.Is(err, protocol.ErrNotFound) || kivik.HTTPStatus(err) != http.StatusNotFound {
		t.Errorf("a job of a database deleted: %v (status %d), want CouchDB's 404 and not ErrNotFound", err, kivik.HTTPStatus(err))
	}
	if _, err := tb.client.CancelJob(tb.ctx, it.ID, "cli", "gone"); err == nil || errors.Is(err, protocol.ErrNotFound) {
		t.Errorf("cancelling a job of a database deleted: %v, want no ErrNotFound", err)
	}
}

// Bad arguments of the Go API get a clear error: a status that is none,
// an id a document already has.
func TestListAndEnqueueRefuseWhatCannotBe(t *testing.T) {
	tb := setup(t, protocol.Config{})
	if _, err := tb.client.List(tb.ctx, protocol.ListOptions{Status: "bogus"}); err == nil || !strings.Contains(err.Error(), `status "bogus" is none of waiting, queued`) {
		t.Errorf("listing status bogus: %v", err)
	}
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "w", ID: "job:mine"}); err != nil {
		t.Fatal(err)
	}
	_, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "w", ID: "job:mine"})
	if err == nil || !strings.Contains(err.Error(), "job:mine: a document with this id already exists") || kivik.HTTPStatus(err) != http.StatusConflict {
		t.Errorf("enqueueing under an id taken: %v", err)
	}
}
