package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
)

// scrape fetches /metrics and parses it as Prometheus text.
func scrape(t *testing.T, s *serving) opstest.Metrics {
	t.Helper()
	code, body := s.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	return opstest.ParseMetrics(t, body)
}

// couchq serve on the known script answers what the commands print:
// /api/stats is stats --json and /api/jobs is ls --json, byte for byte,
// and the default --cache and --settle hold. What the handler serves is
// opshttp's tests'; these are serve's flags and wiring.
func TestServeAnswersAsTheCommandsPrint(t *testing.T) {
	t.Parallel()
	r := runOpsScript(t)
	s := startServe(t, r.c, "--addr", "127.0.0.1:0")

	res := r.c.run(t, "stats", "--json", "--since", r.Since())
	expect(t, res, exitOK)
	code, body := s.get(t, "/api/stats?since="+r.Since())
	if code != http.StatusOK || body != res.stdout {
		t.Errorf("/api/stats: %d\n%s\nwant what stats --json printed:\n%s", code, body, res.stdout)
	}
	var st protocol.Stats
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	opstest.CheckStats(t, &st)
	res = r.c.run(t, "ls", "--json", "--type", "mail", "--limit", "3")
	expect(t, res, exitOK)
	if code, body := s.get(t, "/api/jobs?type=mail&limit=3"); code != http.StatusOK || body != res.stdout {
		t.Errorf("/api/jobs: %d\n%s\nwant what ls --json printed:\n%s", code, body, res.stdout)
	}

	// T0+20: every event of the script is older than the default --settle
	// (10s), so all are counted.
	m := scrape(t, s)
	m.Check(t, 1, "couchq_up")
	m.Check(t, 5, "couchq_jobs_added_total", "type=mail")
	m.Check(t, 1, "couchq_queue_scheduled", "type=mail")
	// Within the default --cache (5s) a scrape is answered from the cache:
	// D's cancellation does not show yet.
	expect(t, r.c.run(t, "cancel", "D"), exitOK)
	scrape(t, s).Check(t, 1, "couchq_queue_scheduled", "type=mail")
	r.At(26)
	scrape(t, s).Check(t, 0, "couchq_queue_scheduled", "type=mail")
	if code := s.stop(t); code != exitOK {
		t.Errorf("serve exited %d after an interrupt, want 0", code)
	}
}

// When the database goes away under a running serve: /healthz and the API
// say where and what, as the commands do (the HTTP status); --cache 0s
// and --settle 0s mean none, not the defaults.
func TestServeReportsAnUnavailableDatabase(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	expect(t, c.run(t, "enqueue", "--type", "mail"), exitOK)
	s := startServe(t, c, "--addr", "127.0.0.1:0", "--cache", "0s", "--settle", "0s")
	if code, _ := s.get(t, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz before: %d", code)
	}
	scrape(t, s).Check(t, 1, "couchq_jobs_added_total", "type=mail") // no settle
	if err := srv.Client(t).DestroyDB(context.Background(), c.env["COUCHQ_DB"]); err != nil {
		t.Fatal(err)
	}
	code, body := s.get(t, "/healthz")
	var h map[string]string
	if err := json.Unmarshal([]byte(body), &h); code != http.StatusServiceUnavailable || err != nil ||
		h["couchdb"] != "unavailable" || !strings.Contains(h["error"], "reading database "+c.env["COUCHQ_DB"]) || !strings.Contains(h["error"], "(HTTP 404") {
		t.Errorf("/healthz after the database is gone: %d %s", code, body)
	}
	scrape(t, s).Check(t, 0, "couchq_up") // no cache
	if code, body := s.get(t, "/api/stats"); code != http.StatusBadGateway || !strings.Contains(body, "(HTTP 404") {
		t.Errorf("/api/stats: %d %s", code, body)
	}
}

// Reads need a CouchDB login by default off loopback, and not on it;
// --read-auth says otherwise either way, and binding beyond loopback with
// open reads warns. /healthz and /metrics are open whatever the setting.
func TestServeReadAuthFollowsTheAddress(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	for _, tc := range []struct {
		args      []string
		protected bool
		warns     bool
	}{
		{[]string{"--addr", "0.0.0.0:0"}, true, false},
		{[]string{"--addr", "0.0.0.0:0", "--read-auth=false"}, false, true},
		{[]string{"--addr", "127.0.0.1:0"}, false, false},
		{[]string{"--addr", "127.0.0.1:0", "--read-auth"}, true, false},
	} {
		s := startServe(t, c, tc.args...)
		for _, open := range []string{"/healthz", "/metrics"} {
			if code, body := s.get(t, open); code != http.StatusOK {
				t.Errorf("%v: %s: %d %s", tc.args, open, code, body)
			}
		}
		want := http.StatusOK
		if tc.protected {
			want = http.StatusUnauthorized
		}
		resp, err := http.Get(s.url + "/api/jobs")
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != want || tc.protected != (resp.Header.Get("WWW-Authenticate") == `Basic realm="couchq"`) {
			t.Errorf("%v: /api/jobs without credentials: %d %q, want %d", tc.args, resp.StatusCode, resp.Header.Get("WWW-Authenticate"), want)
		}
		// A page that points a name of its own at loopback (DNS
		// rebinding) reads nothing from open reads there.
		req, err := http.NewRequest(http.MethodGet, s.url+"/api/jobs", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = "attacker.example:80"
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if rebound := !tc.protected && strings.HasPrefix(tc.args[1], "127."); rebound != (resp.StatusCode == http.StatusMisdirectedRequest) {
			t.Errorf("%v: /api/jobs addressed to another name: %d", tc.args, resp.StatusCode)
		}
		s.stop(t)
		if warned := strings.Contains(s.stderr.String(), "not loopback"); warned != tc.warns {
			t.Errorf("%v: warned %v, want %v:\n%s", tc.args, warned, tc.warns, s.stderr)
		}
	}
}

// The real binary stops cleanly, exit 0, on SIGTERM.
func TestServeBinaryGracefulStop(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	bin := filepath.Join(t.TempDir(), "couchq")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--json")
	for k, v := range c.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var exited atomic.Bool
	t.Cleanup(func() {
		if !exited.Load() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	var out struct {
		Listening string `json:"listening"`
	}
	if err := json.NewDecoder(stdout).Decode(&out); err != nil {
		t.Fatalf("reading the address: %v; stderr:\n%s", err, stderr.String())
	}
	resp, err := http.Get(out.Listening + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz: %d", resp.StatusCode)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		exited.Store(true)
		if err != nil {
			t.Errorf("serve after SIGTERM: %v; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not stop on SIGTERM")
	}
}

// The dashboard's actions through couchq serve: it checks the request's
// credentials against the server it reaches, without its own. A member of
// the database (a couchq worker) retries a job and is named in its
// history; a user who may not read the database is refused; without
// credentials the answer asks for them.
func TestServeDashboardActionsAsACouchDBUser(t *testing.T) {
	t.Parallel()
	admin := online(t)
	worker, wpw := addUser(t, "dash-worker", "couchq-test-dash-workers")
	outsider, opw := addUser(t, "dash-outsider")
	expect(t, admin.run(t, "init", "--workers", "role:couchq-test-dash-workers"), exitOK)
	expect(t, admin.run(t, "enqueue", "--type", "mail", "--id", "m1"), exitOK)
	expect(t, admin.run(t, "cancel", "m1"), exitOK)
	s := startServe(t, admin)

	retry := func(user, password string) (int, string) {
		code, challenge, body := opstest.Post(t, s.url+"/api/jobs/m1/retry", user, password)
		return code, challenge + " " + body
	}
	if code, body := retry("", ""); code != http.StatusUnauthorized || !strings.Contains(body, `Basic realm="couchq"`) {
		t.Errorf("retry without credentials: %d %s", code, body)
	}
	if code, body := retry(outsider, opw); code != http.StatusForbidden || !strings.Contains(body, "may not read database") {
		t.Errorf("retry as an outsider: %d %s", code, body)
	}
	if code, body := retry(worker, wpw); code != http.StatusOK || !strings.Contains(body, `"by": "`+worker+`"`) {
		t.Errorf("retry as a worker: %d %s", code, body)
	}
	if code, body := s.get(t, "/api/jobs?status=queued"); code != http.StatusOK || !strings.Contains(body, `"_id": "m1"`) {
		t.Errorf("m1 not queued after the retry: %d %s", code, body)
	}
}

// couchq serve --read-auth reads as the user who logs in: a member of the
// database (a couchq worker, by role) reads the jobs, a user outside the
// database's _security gets 403, no credentials 401; --hide-payload keeps
// a type's payloads out.
func TestServeReadsAsACouchDBUser(t *testing.T) {
	t.Parallel()
	admin := online(t)
	worker, wpw := addUser(t, "dash-reader", "couchq-test-dash-readers")
	outsider, opw := addUser(t, "dash-reader-outsider")
	expect(t, admin.run(t, "init", "--workers", "role:couchq-test-dash-readers"), exitOK)
	expect(t, admin.run(t, "enqueue", "--type", "mail", "--id", "m1", "--payload", `{"to":"ann@example.com"}`), exitOK)
	expect(t, admin.run(t, "enqueue", "--type", "billing", "--id", "b1", "--payload", `{"card":"4111"}`), exitOK)
	s := startServe(t, admin, "--addr", "127.0.0.1:0", "--read-auth", "--hide-payload", "billing")

	read := func(user, password string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, s.url+"/api/jobs?status=queued", nil)
		if err != nil {
			t.Fatal(err)
		}
		if user != "" {
			req.SetBasicAuth(user, password)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	if code, body := read("", ""); code != http.StatusUnauthorized {
		t.Errorf("/api/jobs without credentials: %d %s", code, body)
	}
	if code, body := read(outsider, opw); code != http.StatusForbidden || !strings.Contains(body, "may not read database") {
		t.Errorf("/api/jobs as an outsider: %d %s", code, body)
	}
	code, body := read(worker, wpw)
	if code != http.StatusOK || !strings.Contains(body, "ann@example.com") || strings.Contains(body, `"card"`) || !strings.Contains(body, `"payload_hidden": true`) {
		t.Errorf("/api/jobs as a member: %d %s", code, body)
	}
	if code, _ := s.get(t, "/metrics"); code != http.StatusOK {
		t.Errorf("/metrics: %d", code)
	}
}
