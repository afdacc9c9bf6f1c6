package opshttp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
)

// getJSON fetches a path of a test server and decodes its 200 answer.
func getJSON(t *testing.T, url string, out any) {
	t.Helper()
	code, body := opstest.Get(t, url)
	if code != http.StatusOK {
		t.Fatalf("%s: %d\n%s", url, code, body)
	}
	if err := json.Unmarshal([]byte(body), out); err != nil {
		t.Fatalf("%s: %v\n%s", url, err, body)
	}
}

// The dashboard's endpoints on the known script, which runs the activity
// and depth views (and timings, for percentiles) through the server:
// every event of the script falls in the minute from T0, so the last
// bucket holds them all, and the queue's depth is 2 (C due, D scheduled)
// from then on.
func TestDashboardSeriesFromAKnownScript(t *testing.T) {
	t.Parallel()
	r := playScript(t)
	hs := serveHandler(r.Ctx, t, r.Q, Config{Now: r.Clock.Now, CacheTTL: -1})

	p := func(v float64) *float64 { return &v }
	for _, c := range []struct {
		path string
		n    int
		step float64
		last float64 // the last bucket's start
	}{
		{"/api/series?window=1h&type=mail", 60, 60, 0},
		{"/api/series", 60, 60, 0}, // every type, 1h
		{"/api/series?window=24h", 144, 600, 0},
		{"/api/series?window=7d&type=mail", 168, 3600, 0},
	} {
		var s protocol.Series
		getJSON(t, hs.URL+c.path, &s)
		if len(s.T) != c.n || s.Step != c.step || s.T[c.n-1] != protocol.ToUnix(r.T0) {
			t.Fatalf("%s: %d buckets of %vs, last at %v; want %d of %vs, last at T0", c.path, len(s.T), s.Step, s.T[len(s.T)-1], c.n, c.step)
		}
		last := c.n - 1
		got := []int64{s.Enqueued[last], s.Started[last], s.Finished[last], s.Failed[last], s.Retried[last], s.Depth[last]}
		if want := []int64{5, 4, 2, 0, 1, 2}; !equal(got, want) {
			t.Errorf("%s: last bucket enqueued, started, finished, failed, retried, depth %v; want %v", c.path, got, want)
		}
		if s.Depth[last-1] != 0 || s.Started[last-1] != 0 {
			t.Errorf("%s: the bucket before the script: depth %d started %d", c.path, s.Depth[last-1], s.Started[last-1])
		}
		for name, pair := range map[string][2]*float64{
			"wait p50": {s.WaitP50[last], p(4)}, "wait p95": {s.WaitP95[last], p(7)},
			"service p50": {s.ServiceP50[last], p(5)}, "service p95": {s.ServiceP95[last], p(10)},
		} {
			if pair[0] == nil || *pair[0] != *pair[1] {
				t.Errorf("%s: %s %v, want %v", c.path, name, pair[0], *pair[1])
			}
		}
		if s.WaitP50[last-1] != nil || s.Truncated {
			t.Errorf("%s: percentiles in an empty bucket, or truncated", c.path)
		}
	}

	// An hour later the script is before the window: the depth is the sum
	// of every change before it.
	r.At(3600 + 20)
	var s protocol.Series
	getJSON(t, hs.URL+"/api/series?window=1h", &s)
	for i, d := range s.Depth {
		if d != 2 || s.Started[i] != 0 {
			t.Fatalf("an hour later, bucket %d: depth %d started %d; want 2 and 0", i, d, s.Started[i])
		}
	}
	// Cancelling the waiting C takes it out of the queue; retrying it puts
	// it back.
	if _, err := r.Q.CancelJob(r.Ctx, "C", "test", ""); err != nil {
		t.Fatal(err)
	}
	getJSON(t, hs.URL+"/api/series?window=1h&type=mail", &s)
	if last := len(s.Depth) - 1; s.Depth[last] != 1 || s.Depth[last-1] != 2 {
		t.Errorf("after cancelling C: depth %v, want 2 then 1", s.Depth[last-1:])
	}
	if _, err := r.Q.Retry(r.Ctx, "C", "test"); err != nil {
		t.Fatal(err)
	}
	getJSON(t, hs.URL+"/api/series?window=1h&type=mail", &s)
	if last := len(s.Depth) - 1; s.Depth[last] != 2 {
		t.Errorf("after retrying C: depth %d, want 2", s.Depth[last])
	}
	r.At(20)

	// C, the one job due, has been due only since its retry, which is
	// after the clock now: it has waited no time yet.
	var queues []protocol.TypeQueue
	getJSON(t, hs.URL+"/api/queues", &queues)
	want := protocol.QueueNow{Due: 1, Scheduled: 1, Running: 1, Done: 2, OldestDueAge: 0}
	if len(queues) != 1 || queues[0].Type != "mail" || queues[0].QueueNow != want {
		t.Errorf("/api/queues: %+v, want mail %+v", queues, want)
	}
	var workers []protocol.WorkerStats
	getJSON(t, hs.URL+"/api/workers", &workers)
	if len(workers) != 0 {
		t.Errorf("/api/workers: %+v", workers)
	}
	var failed []map[string]any
	getJSON(t, hs.URL+"/api/failed", &failed)
	if failed == nil || len(failed) != 0 {
		t.Errorf("/api/failed: %v, want []", failed)
	}
	for path, want := range map[string]string{
		"/api/series?window=2h": `invalid window \"2h\"`,
		"/api/failed?limit=0":   `invalid limit \"0\"`,
	} {
		if code, body := get(t, hs, path); code != http.StatusBadRequest || !strings.Contains(body, want) {
			t.Errorf("%s: %d %s, want 400 with %s", path, code, body, want)
		}
	}
	code, body := get(t, hs, "/")
	if code != http.StatusOK || !strings.Contains(body, `<script src="assets/dashboard.js">`) || !strings.Contains(body, r.Q.DB().Name()) {
		t.Errorf("/: %d\n%s", code, body)
	}
	for _, asset := range []string{"/assets/uPlot.iife.min.js", "/assets/uPlot.min.css", "/assets/dashboard.js", "/assets/dashboard.css"} {
		if code, _ := get(t, hs, asset); code != http.StatusOK {
			t.Errorf("%s: %d", asset, code)
		}
	}
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// failJob enqueues a job of typ with one attempt, claims it and fails it
// for good.
func failJob(t *testing.T, q *protocol.Client, typ, cause string) string {
	t.Helper()
	ctx := t.Context()
	it, err := q.Enqueue(ctx, protocol.NewJob{Worker: typ, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	id := it.ID
	if it, err = q.Claim(ctx, it, "test/1/w", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := q.Fail(ctx, it, cause, protocol.FailOptions{Final: true}); err != nil {
		t.Fatal(err)
	}
	return id
}

// The actions need CouchDB credentials, checked with _session and the
// user's access to the database: none or wrong ones get 401 with a Basic
// challenge, a user who may not read the database 403, an admin acts and
// is named in the job's history. Without Config.CouchURL they are off.
func TestDashboardActionsAuthenticateAgainstCouchDB(t *testing.T) {
	t.Parallel()
	admin, password := srv.Credentials()
	if admin == "" {
		couchtest.Skip(t, "the test server has no admin credentials (PouchDB Server runs as an admin party)")
	}
	ctx, q := newQueue(t)
	id := failJob(t, q, "mail", "smtp timeout")
	hs := serveHandler(ctx, t, q, Config{CouchURL: srv.URL(), CacheTTL: -1})
	off := serveHandler(ctx, t, q, Config{CacheTTL: -1})

	outsider := fmt.Sprintf("dash-outsider-%d", time.Now().UnixNano())
	if err := srv.AddUser(ctx, outsider, "secret"); err != nil {
		t.Fatal(err)
	}
	retry := hs.URL + "/api/jobs/" + id + "/retry"
	for _, c := range []struct {
		user, password string
		code           int
	}{
		{"", "", http.StatusUnauthorized},
		// A wrong password for the outsider, not the admin: CouchDB 3.4+
		// locks an account out after a few failed logins from one address.
		{outsider, "wrong", http.StatusUnauthorized},
		{outsider, "secret", http.StatusForbidden},
	} {
		code, challenge, body := opstest.Post(t, retry, c.user, c.password)
		if code != c.code || (code == http.StatusUnauthorized) != (challenge == `Basic realm="couchq"`) {
			t.Errorf("retry as %q: %d %q %s; want %d", c.user, code, challenge, body, c.code)
		}
	}
	if code, _, body := opstest.Post(t, off.URL+"/api/jobs/"+id+"/retry", admin, password); code != http.StatusForbidden || !strings.Contains(body, "CouchURL") {
		t.Errorf("retry without CouchURL: %d %s", code, body)
	}
	if it, err := q.Get(ctx, id); err != nil || it.Status != protocol.StatusFailed {
		t.Fatalf("refused retries changed the job: %v %v", it, err)
	}

	if code, _, body := opstest.Post(t, retry, admin, password); code != http.StatusOK {
		t.Fatalf("retry as admin: %d %s", code, body)
	}
	it, err := q.Get(ctx, id)
	if err != nil || it.Status != protocol.StatusQueued || it.History[len(it.History)-1].By != admin {
		t.Fatalf("after retry: %+v %v; want queued, retried by %s", it, err, admin)
	}
	if code, _, body := opstest.Post(t, retry, admin, password); code != http.StatusConflict {
		t.Errorf("retrying a queued job: %d %s, want 409", code, body)
	}
	if code, _, body := opstest.Post(t, hs.URL+"/api/jobs/nope/retry", admin, password); code != http.StatusNotFound {
		t.Errorf("retrying a missing job: %d %s, want 404", code, body)
	}
	// CouchDB's session cookie works as well as basic auth; an unknown one
	// is anonymous to CouchDB, so 401 here.
	cookie := sessionCookieFor(t, admin, password)
	for _, c := range []struct {
		value string
		code  int
	}{{"bogus", http.StatusUnauthorized}, {cookie, http.StatusOK}} {
		req, err := http.NewRequest(http.MethodPost, hs.URL+"/api/jobs/"+id+"/cancel", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.AddCookie(&http.Cookie{Name: "AuthSession", Value: c.value})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != c.code {
			t.Errorf("cancel with AuthSession %q: %d, want %d", c.value, resp.StatusCode, c.code)
		}
	}
	if code, _, body := opstest.Post(t, hs.URL+"/api/types/mail/pause", admin, password); code != http.StatusOK {
		t.Errorf("pause: %d %s", code, body)
	}
	if paused, err := q.Paused(ctx, "mail"); err != nil || !paused["mail"] {
		t.Errorf("after pause: %v %v", paused, err)
	}
	if code, _, body := opstest.Post(t, hs.URL+"/api/types/mail/resume", admin, password); code != http.StatusOK {
		t.Errorf("resume: %d %s", code, body)
	}
	if paused, err := q.Paused(ctx, "mail"); err != nil || paused["mail"] {
		t.Errorf("after resume: %v %v", paused, err)
	}
	if code, _ := get(t, hs, "/api/jobs/"+id+"/retry"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET on an action: %d, want 405", code)
	}
}

// sessionCookieFor logs in to the test server (POST /_session) and returns
// the AuthSession cookie's value.
func sessionCookieFor(t *testing.T, user, password string) string {
	t.Helper()
	form := url.Values{"name": {user}, "password": {password}}
	resp, err := http.PostForm(srv.URL()+"/_session", form)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	for _, c := range resp.Cookies() {
		if c.Name == "AuthSession" && c.Value != "" {
			return c.Value
		}
	}
	t.Fatalf("POST /_session as %s: %s, no AuthSession cookie", user, resp.Status)
	return ""
}

// A database whose design document predates the dashboard's views: the
// series says what to do rather than only "missing".
func TestDashboardSeriesWithAnOlderDesignDocument(t *testing.T) {
	t.Parallel()
	ctx, q := newQueue(t)
	var doc map[string]any
	if err := q.DB().Get(ctx, designdocs.OpsID).ScanDoc(&doc); err != nil {
		t.Fatal(err)
	}
	delete(doc["views"].(map[string]any), "activity")
	if _, err := q.DB().Put(ctx, designdocs.OpsID, doc); err != nil {
		t.Fatal(err)
	}
	hs := serveHandler(ctx, t, q, Config{CacheTTL: -1})
	code, body := get(t, hs, "/api/series")
	if code != http.StatusBadGateway || !strings.Contains(body, "run `couchq init` as an admin") {
		t.Errorf("/api/series without the activity view: %d %s", code, body)
	}
}
