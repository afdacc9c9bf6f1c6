package opshttp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
)

// Agents claim and finish jobs over HTTP as the CouchDB user they log in
// as, and may only act on what they hold; a server admin may release
// anyone's.
func TestAgentEndpoints(t *testing.T) {
	t.Parallel()
	admin, adminPW := srv.Credentials()
	if admin == "" {
		couchtest.Skip(t, "the test server has no admin credentials (PouchDB Server runs as an admin party)")
	}
	ctx, q := newQueue(t)
	hs := serveHandler(ctx, t, q, Config{CouchURL: srv.URL(), CacheTTL: -1})
	sfx := time.Now().UnixNano()
	alice, bob := fmt.Sprintf("alice-%d", sfx), fmt.Sprintf("bob-%d", sfx)
	for _, u := range []string{alice, bob} {
		if err := srv.AddUser(ctx, u, "pw"); err != nil {
			t.Fatal(err)
		}
	}
	// Both may read the database.
	sec := fmt.Sprintf(`{"admins":{"names":[],"roles":["_admin"]},"members":{"names":[%q,%q],"roles":["_admin"]}}`, alice, bob)
	req, err := http.NewRequest(http.MethodPut, srv.DBURL(q.DB().Name())+"/_security", strings.NewReader(sec))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("setting _security: %v %v", resp, err)
	}
	for i := range 3 {
		if _, err := q.Enqueue(ctx, protocol.NewJob{Worker: "review", ID: fmt.Sprintf("doc-%d", i), Priority: i + 1}); err != nil {
			t.Fatal(err)
		}
	}
	post := func(path, user, body string) (int, string) {
		t.Helper()
		code, _, answer := opstest.PostJSON(t, hs.URL+path, user, "pw", body)
		return code, answer
	}
	code, body := post("/api/claim", alice, `{"type":"review","count":2,"lease":"30m"}`)
	var claim struct {
		Agent string               `json:"agent"`
		Jobs  []*protocol.WorkItem `json:"jobs"`
		Held  int                  `json:"held"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &claim) != nil || len(claim.Jobs) != 2 || claim.Agent != alice {
		t.Fatalf("claim: %d %s", code, body)
	}
	// Highest priority first; claimed_by is the authenticated user.
	if claim.Jobs[0].ID != "doc-0" || claim.Jobs[0].ClaimedBy != alice {
		t.Errorf("first claimed: %s by %s", claim.Jobs[0].ID, claim.Jobs[0].ClaimedBy)
	}
	if code, body = post("/api/claim", alice, `{"type":"review","count":2}`); code != http.StatusOK || !strings.Contains(body, `"held": 2`) {
		t.Errorf("claim again: %d %s, want alice's two held jobs back", code, body)
	}
	if code, body = post("/api/jobs/doc-0/complete", bob, `{"result":{"ok":true}}`); code != http.StatusConflict || !strings.Contains(body, alice+" holds it") {
		t.Errorf("bob completing alice's job: %d %s", code, body)
	}
	if code, body = post("/api/jobs/doc-0/extend", alice, `{"lease":"2h"}`); code != http.StatusOK {
		t.Errorf("extend: %d %s", code, body)
	}
	// Progress, over HTTP as the worker's is stored, and shown by the API.
	if code, body = post("/api/jobs/doc-0/progress", alice, `{"done":40,"total":120,"note":"page 40"}`); code != http.StatusOK ||
		!strings.Contains(body, `"progress": {`) || !strings.Contains(body, `"note": "page 40"`) {
		t.Errorf("progress: %d %s", code, body)
	}
	if code, body = post("/api/jobs/doc-0/progress", bob, `{"done":1}`); code != http.StatusConflict {
		t.Errorf("bob reporting progress of alice's job: %d %s", code, body)
	}
	for _, bad := range []string{`{}`, `{"done":5,"total":4}`, `{"done":-1}`} {
		if code, body = post("/api/jobs/doc-0/progress", alice, bad); code != http.StatusBadRequest {
			t.Errorf("progress %s: %d %s, want 400", bad, code, body)
		}
	}
	if code, body := get(t, hs, "/api/jobs?type=review&status=running"); code != http.StatusOK || !strings.Contains(body, `"done": 40`) || !strings.Contains(body, `"total": 120`) {
		t.Errorf("GET /api/jobs of the running jobs after progress: %d %s", code, body)
	}
	if code, body = post("/api/jobs/doc-0/complete", alice, `{"result":{"approved":true}}`); code != http.StatusOK {
		t.Errorf("complete: %d %s", code, body)
	}
	// Ids of no job: CouchDB's own, a design document, a job that is not there.
	for _, id := range []string{"_all_docs", "_design%2Fcouchq", "nothing"} {
		if code, body = post("/api/jobs/"+id+"/complete", alice, `{}`); code != http.StatusNotFound {
			t.Errorf("completing %s: %d %s, want 404", id, code, body)
		}
	}
	if code, body = post("/api/jobs/doc-1/fail", alice, `{"error":""}`); code != http.StatusBadRequest {
		t.Errorf("fail without an error: %d %s", code, body)
	}
	if code, body = post("/api/jobs/doc-1/fail", alice, `{"error":"off topic","no_retry":true}`); code != http.StatusOK {
		t.Errorf("fail: %d %s", code, body)
	}
	for _, bad := range []string{`{"type":"review","lease":"forever"}`, `{"type":"review","lease":"1ms"}`, `{"type":"review","leese":"2h"}`} {
		if code, body = post("/api/claim", bob, bad); code != http.StatusBadRequest {
			t.Errorf("claim %s: %d %s, want 400", bad, code, body)
		}
	}
	if code, body = post("/api/jobs/doc-1/fail", alice, `{"error":"`+strings.Repeat("x", 2<<20)+`"}`); code != http.StatusRequestEntityTooLarge ||
		!strings.Contains(body, "larger than 1048576 bytes") {
		t.Errorf("a body of 2 MiB: %d %.300s, want 413", code, body)
	}
	if code, body = post("/api/claim", bob, `{"type":"review"}`); code != http.StatusOK || !strings.Contains(body, `"doc-2"`) {
		t.Fatalf("bob's claim: %d %s", code, body)
	}
	if code, body = post("/api/jobs/doc-2/release", alice, ``); code != http.StatusConflict {
		t.Errorf("alice releasing bob's job: %d %s", code, body)
	}
	// A server admin may release anyone's.
	if code, _, body := opstest.PostJSON(t, hs.URL+"/api/jobs/doc-2/release", admin, adminPW, ``); code != http.StatusOK {
		t.Errorf("admin releasing bob's job: %d %s", code, body)
	}
	want := map[string]protocol.Status{"doc-0": protocol.StatusDone, "doc-1": protocol.StatusFailed, "doc-2": protocol.StatusQueued}
	for id, status := range want {
		it, err := q.Get(ctx, id)
		if err != nil || it.Status != status || it.Claimed {
			t.Errorf("%s: %+v %v, want %s and unclaimed", id, it, err, status)
		}
	}
	if code, _, _ := opstest.PostJSON(t, hs.URL+"/api/claim", "", "", `{"type":"review"}`); code != http.StatusUnauthorized {
		t.Errorf("claim without credentials: %d", code)
	}

	// With couchq's roles set, acting takes the worker role: the handler
	// writes with its own connection and must not lend it to a producer.
	cs, err := protocol.Connect(ctx, srv.URL(), admin, adminPW)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Client.Close()
	if _, err := cs.SetRoles(ctx, q.DB().Name(), protocol.Roles{Workers: protocol.Access{Names: []string{alice}}, Producers: protocol.Access{Names: []string{bob}}}); err != nil {
		t.Fatal(err)
	}
	if code, body = post("/api/claim", bob, `{"type":"review"}`); code != http.StatusForbidden || !strings.Contains(body, "worker role") {
		t.Errorf("a producer claiming: %d %s, want 403", code, body)
	}
	if code, body = post("/api/jobs/doc-1/retry", bob, ``); code != http.StatusForbidden {
		t.Errorf("a producer retrying from the dashboard: %d %s, want 403", code, body)
	}
	if code, body = post("/api/claim", alice, `{"type":"review"}`); code != http.StatusOK {
		t.Errorf("a worker claiming: %d %s", code, body)
	}

	// Once the database has sites, a server started without one claims for
	// no site: the agent is told why (409), not that CouchDB failed (502).
	if _, err := q.AddSite(ctx, "A"); err != nil {
		t.Fatal(err)
	}
	if code, body = post("/api/claim", alice, `{"type":"review"}`); code != http.StatusConflict || !strings.Contains(body, "couchq serve --site") {
		t.Errorf("claiming through a server of no site in a database of sites: %d %s, want 409 naming --site", code, body)
	}
}
