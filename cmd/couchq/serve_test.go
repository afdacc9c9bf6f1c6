package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/couchq/couchq/couchq"
)

// scrape fetches /metrics and parses it as Prometheus text.
func scrape(t *testing.T, s *serving) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := s.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics is not Prometheus text: %v\n%s", err, body)
	}
	return families
}

// metric finds the sample of family name whose labels include want (as
// name=value pairs) and returns its value: a gauge's or counter's value, or
// a summary's sum and count.
func metric(t *testing.T, families map[string]*dto.MetricFamily, name string, want ...string) (value, count float64) {
	t.Helper()
	f := families[name]
	if f == nil {
		t.Errorf("no metric %s", name)
		return -1, -1
	}
next:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for _, pair := range want {
			k, v, _ := strings.Cut(pair, "=")
			if labels[k] != v {
				continue next
			}
		}
		switch f.GetType() {
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue(), 0
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue(), 0
		case dto.MetricType_SUMMARY:
			return m.GetSummary().GetSampleSum(), float64(m.GetSummary().GetSampleCount())
		}
		t.Errorf("%s has type %s", name, f.GetType())
		return -1, -1
	}
	t.Errorf("no %s%v", name, want)
	return -1, -1
}

func checkMetric(t *testing.T, families map[string]*dto.MetricFamily, want float64, name string, labels ...string) {
	t.Helper()
	if got, _ := metric(t, families, name, labels...); !near(got, want) {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

func checkSummaryMetric(t *testing.T, families map[string]*dto.MetricFamily, name string, sum, count float64) {
	t.Helper()
	gotSum, gotCount := metric(t, families, name, "type=mail")
	if !near(gotSum, sum) || gotCount != count {
		t.Errorf("%s: sum %v count %v, want %v and %v", name, gotSum, gotCount, sum, count)
	}
	if families[name].GetType() != dto.MetricType_SUMMARY {
		t.Errorf("%s is a %s, want a summary", name, families[name].GetType())
	}
}

// couchq serve on the known script: /api/stats says what stats --json
// says, /metrics carries the queue gauges and the counters per type, the
// cache holds figures for its time, and purging does not lower counters.
func TestServeMetricsFromAKnownScript(t *testing.T) {
	t.Parallel()
	r := runOpsScript(t)
	s := startServe(t, r.c, "--addr", "127.0.0.1:0")

	// The same report by the CLI and by the API.
	res := r.c.run(t, "stats", "--json", "--since", r.since())
	expect(t, res, exitOK)
	code, body := s.get(t, "/api/stats?since="+r.since())
	if code != http.StatusOK || body != res.stdout {
		t.Errorf("/api/stats: %d\n%s\nwant what stats --json printed:\n%s", code, body, res.stdout)
	}
	var st couchq.Stats
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	checkScriptStats(t, &st)
	code, body = s.get(t, "/api/stats?type=mail&since=5s")
	if code != http.StatusOK || !strings.Contains(body, `"added": 0`) || !strings.Contains(body, `"oldest_due_age": 20`) {
		t.Errorf("/api/stats?type=mail&since=5s: %d\n%s", code, body)
	}

	// T0+20: every event of the script is older than --settle (10s).
	m := scrape(t, s)
	checkMetric(t, m, 1, "couchq_up")
	for status, n := range map[string]float64{"queued": 2, "running": 1, "done": 2, "failed": 0, "cancelled": 0} {
		checkMetric(t, m, n, "couchq_jobs", "type=mail", "status="+status)
	}
	checkMetric(t, m, 1, "couchq_queue_due", "type=mail")
	checkMetric(t, m, 1, "couchq_queue_scheduled", "type=mail")
	checkMetric(t, m, 20, "couchq_oldest_due_age_seconds", "type=mail")
	for name, n := range map[string]float64{"added": 5, "started": 4, "finished": 2, "failed": 0, "retried": 1} {
		checkMetric(t, m, n, "couchq_jobs_"+name+"_total", "type=mail")
		if m["couchq_jobs_"+name+"_total"].GetType() != dto.MetricType_COUNTER {
			t.Errorf("couchq_jobs_%s_total is not a counter", name)
		}
	}
	checkSummaryMetric(t, m, "couchq_job_wait_seconds", 13, 3)
	checkSummaryMetric(t, m, "couchq_job_service_seconds", 15, 2)
	checkSummaryMetric(t, m, "couchq_attempt_duration_seconds", 8, 3)
	if m["go_goroutines"] == nil || m["couchq_jobs"].GetHelp() == "" {
		t.Errorf("runtime metrics or help text missing")
	}

	// Within --cache (5s) a scrape is answered from the cache: D's
	// cancellation does not show yet.
	expect(t, r.c.run(t, "cancel", "D"), exitOK)
	m = scrape(t, s)
	checkMetric(t, m, 1, "couchq_queue_scheduled", "type=mail")
	checkMetric(t, m, 0, "couchq_jobs", "type=mail", "status=cancelled")

	// T0+30: E completes. At T0+41 it is older than --settle and counted.
	r.at(30)
	if err := r.q.Complete(r.ctx, r.e, nil); err != nil {
		t.Fatal(err)
	}
	r.at(41)
	m = scrape(t, s)
	checkMetric(t, m, 0, "couchq_queue_scheduled", "type=mail")
	checkMetric(t, m, 1, "couchq_jobs", "type=mail", "status=cancelled")
	checkMetric(t, m, 3, "couchq_jobs", "type=mail", "status=done")
	checkMetric(t, m, 41, "couchq_oldest_due_age_seconds", "type=mail")
	checkMetric(t, m, 3, "couchq_jobs_finished_total", "type=mail")
	checkMetric(t, m, 5, "couchq_jobs_added_total", "type=mail")
	checkSummaryMetric(t, m, "couchq_job_service_seconds", 15+30, 3)
	checkSummaryMetric(t, m, "couchq_attempt_duration_seconds", 8+23, 4)

	// Purging the done jobs empties the gauge but leaves the counters.
	res = r.c.run(t, "purge", "--status", "done", "--older-than", "0s")
	expect(t, res, exitOK)
	if !strings.Contains(res.stdout, "deleted 3 done jobs") {
		t.Errorf("purge: %s", res.stdout)
	}
	r.at(52)
	m = scrape(t, s)
	checkMetric(t, m, 0, "couchq_jobs", "type=mail", "status=done")
	checkMetric(t, m, 3, "couchq_jobs_finished_total", "type=mail")
	checkSummaryMetric(t, m, "couchq_job_wait_seconds", 13, 3)

	// Jobs as ls --json lists them.
	code, body = s.get(t, "/api/jobs?type=mail&status=queued")
	var docs []map[string]any
	if err := json.Unmarshal([]byte(body), &docs); code != http.StatusOK || err != nil || len(docs) != 1 || docs[0]["_id"] != "C" {
		t.Errorf("/api/jobs?type=mail&status=queued: %d %v\n%s", code, err, body)
	}
	code, body = s.get(t, "/api/jobs?limit=1")
	if err := json.Unmarshal([]byte(body), &docs); code != http.StatusOK || err != nil || len(docs) != 1 {
		t.Errorf("/api/jobs?limit=1: %d %v\n%s", code, err, body)
	}
	for path, want := range map[string]string{
		"/api/jobs?status=stuck":       `invalid status \"stuck\"`,
		"/api/jobs?limit=0":            `invalid limit \"0\"`,
		"/api/jobs?limit=5000":         `invalid limit \"5000\"`,
		"/api/stats?since=soon":        `invalid since \"soon\"`,
		"/api/stats?until=-1h":         `invalid until \"-1h\"`,
		"/api/stats?since=1h&until=2h": "since",
	} {
		code, body := s.get(t, path)
		if code != http.StatusBadRequest || !strings.Contains(body, want) || !strings.Contains(body, `"error"`) {
			t.Errorf("%s: %d %s, want 400 with %s", path, code, body, want)
		}
	}
	code, body = s.get(t, "/healthz")
	if code != http.StatusOK || strings.TrimSpace(body) != `{"couchdb":"ok"}` {
		t.Errorf("/healthz: %d %s", code, body)
	}
	if code, _ := s.get(t, "/nope"); code != http.StatusNotFound {
		t.Errorf("/nope: %d", code)
	}
	if code := s.stop(t); code != exitOK {
		t.Errorf("serve exited %d after an interrupt, want 0", code)
	}
}

// When the database goes away under a running serve: /healthz answers
// 503 with the error, /metrics couchq_up 0, the API 502.
func TestServeReportsAnUnavailableDatabase(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	expect(t, c.run(t, "enqueue", "--type", "mail"), exitOK)
	s := startServe(t, c, "--addr", "127.0.0.1:0", "--cache", "0s", "--settle", "0s")
	if code, _ := s.get(t, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz before: %d", code)
	}
	checkMetric(t, scrape(t, s), 1, "couchq_jobs_added_total", "type=mail")
	if err := srv.Client(t).DestroyDB(context.Background(), c.env["COUCHQ_DB"]); err != nil {
		t.Fatal(err)
	}
	code, body := s.get(t, "/healthz")
	var h map[string]string
	if err := json.Unmarshal([]byte(body), &h); code != http.StatusServiceUnavailable || err != nil ||
		h["couchdb"] != "unavailable" || !strings.Contains(h["error"], "reading database "+c.env["COUCHQ_DB"]) || !strings.Contains(h["error"], "404") {
		t.Errorf("/healthz after the database is gone: %d %s", code, body)
	}
	m := scrape(t, s)
	checkMetric(t, m, 0, "couchq_up")
	checkMetric(t, m, 1, "couchq_stats_refresh_errors_total")
	checkMetric(t, m, 1, "couchq_jobs_added_total", "type=mail") // counters survive
	if m["couchq_queue_due"] != nil || m["couchq_jobs"] != nil {
		t.Errorf("stale gauges served while couchq_up is 0")
	}
	if code, body := s.get(t, "/api/stats"); code != http.StatusBadGateway || !strings.Contains(body, "404") {
		t.Errorf("/api/stats: %d %s", code, body)
	}
	if code, body := s.get(t, "/api/jobs"); code != http.StatusBadGateway || !strings.Contains(body, `"error"`) {
		t.Errorf("/api/jobs: %d %s", code, body)
	}
}

// Binding beyond loopback works but warns.
func TestServeWarnsOffLoopback(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	s := startServe(t, c, "--addr", "0.0.0.0:0")
	if code, _ := s.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	s.stop(t)
	if !strings.Contains(s.stderr.String(), "not loopback") {
		t.Errorf("no warning about the address:\n%s", s.stderr)
	}
	s = startServe(t, c, "--addr", "127.0.0.1:0")
	s.stop(t)
	if strings.Contains(s.stderr.String(), "loopback") {
		t.Errorf("warned on loopback:\n%s", s.stderr)
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

func TestIsLoopback(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]bool{
		"127.0.0.1": true, "::1": true, "localhost": true, "127.1.2.3": true,
		"": false, "0.0.0.0": false, "::": false, "10.0.0.1": false, "example.com": false,
	} {
		if got := isLoopback(host); got != want {
			t.Errorf("isLoopback(%q) = %v, want %v", host, got, want)
		}
	}
}

func TestResponseCache(t *testing.T) {
	t.Parallel()
	clk := &testClock{t: time.Unix(1000, 0)}
	c := &responseCache{ttl: 5 * time.Second, now: clk.Now}
	calls := 0
	compute := func() ([]byte, error) { calls++; return []byte{byte(calls)}, nil }
	get := func(key string) byte {
		b, err := c.get(key, compute)
		if err != nil {
			t.Fatal(err)
		}
		return b[0]
	}
	first, again := get("a"), get("a") // the second from the cache
	if first != 1 || again != 1 || get("b") != 2 {
		t.Fatalf("cache did not hold within its ttl (calls %d)", calls)
	}
	clk.Set(time.Unix(1005, 0))
	if get("a") != 3 {
		t.Errorf("cache held past its ttl")
	}
	for i := range responseCacheMax + 1 {
		get(string(rune('c' + i)))
	}
	if len(c.entries) > responseCacheMax {
		t.Errorf("cache grew to %d entries", len(c.entries))
	}
}
