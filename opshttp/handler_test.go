package opshttp

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
)

// The handler on the known script: /api/stats is the report, /metrics
// carries the queue gauges and the counters per type, the cache holds
// figures for its time, counters count up to Settle ago, and purging does
// not lower them.
func TestHandlerFromAKnownScript(t *testing.T) {
	t.Parallel()
	r := playScript(t)
	hs := serveHandler(r.Ctx, t, r.Q, Config{Now: r.Clock.Now})

	code, body := get(t, hs, "/api/stats?since="+r.Since())
	var st protocol.Stats
	if err := json.Unmarshal([]byte(body), &st); code != http.StatusOK || err != nil {
		t.Fatalf("/api/stats: %d %v\n%s", code, err, body)
	}
	opstest.CheckStats(t, &st)
	code, body = get(t, hs, "/api/stats?type=mail&since=5s")
	if code != http.StatusOK || !strings.Contains(body, `"added": 0`) || !strings.Contains(body, `"oldest_due_age": 20`) {
		t.Errorf("/api/stats?type=mail&since=5s: %d\n%s", code, body)
	}

	// T0+20: every event of the script is older than Settle (10s).
	m := scrape(t, hs)
	m.Check(t, 1, "couchq_up")
	for status, n := range map[string]float64{"queued": 2, "running": 1, "done": 2, "failed": 0, "cancelled": 0} {
		m.Check(t, n, "couchq_jobs", "type=mail", "status="+status)
	}
	m.Check(t, 1, "couchq_queue_due", "type=mail")
	m.Check(t, 1, "couchq_queue_scheduled", "type=mail")
	m.Check(t, 20, "couchq_oldest_due_age_seconds", "type=mail")
	for name, n := range map[string]float64{"added": 5, "started": 4, "finished": 2, "failed": 0, "retried": 1} {
		m.Check(t, n, "couchq_jobs_"+name+"_total", "type=mail")
		if m["couchq_jobs_"+name+"_total"].GetType() != dto.MetricType_COUNTER {
			t.Errorf("couchq_jobs_%s_total is not a counter", name)
		}
	}
	m.CheckSummary(t, "couchq_job_wait_seconds", 13, 3)
	m.CheckSummary(t, "couchq_job_service_seconds", 15, 2)
	m.CheckSummary(t, "couchq_attempt_duration_seconds", 8, 3)
	if m["go_goroutines"] == nil || m["couchq_jobs"].GetHelp() == "" {
		t.Errorf("runtime metrics or help text missing")
	}

	// Within CacheTTL (5s) a scrape is answered from the cache: D's
	// cancellation does not show yet.
	if _, err := r.Q.CancelJob(r.Ctx, "D", "test", ""); err != nil {
		t.Fatal(err)
	}
	m = scrape(t, hs)
	m.Check(t, 1, "couchq_queue_scheduled", "type=mail")
	m.Check(t, 0, "couchq_jobs", "type=mail", "status=cancelled")

	// T0+30: E completes. At T0+41 it is older than Settle and counted.
	r.At(30)
	if err := r.Q.Complete(r.Ctx, r.E, nil); err != nil {
		t.Fatal(err)
	}
	r.At(41)
	m = scrape(t, hs)
	m.Check(t, 0, "couchq_queue_scheduled", "type=mail")
	m.Check(t, 1, "couchq_jobs", "type=mail", "status=cancelled")
	m.Check(t, 3, "couchq_jobs", "type=mail", "status=done")
	m.Check(t, 41, "couchq_oldest_due_age_seconds", "type=mail")
	m.Check(t, 3, "couchq_jobs_finished_total", "type=mail")
	m.Check(t, 5, "couchq_jobs_added_total", "type=mail")
	m.CheckSummary(t, "couchq_job_service_seconds", 15+30, 3)
	m.CheckSummary(t, "couchq_attempt_duration_seconds", 8+23, 4)

	// Purging the done jobs empties the gauge but leaves the counters.
	if n, err := r.Q.Purge(r.Ctx, protocol.PurgeOptions{Status: protocol.StatusDone}); err != nil || n != 3 {
		t.Fatalf("purge: %d, %v; want 3 deleted", n, err)
	}
	r.At(52)
	m = scrape(t, hs)
	m.Check(t, 0, "couchq_jobs", "type=mail", "status=done")
	m.Check(t, 3, "couchq_jobs_finished_total", "type=mail")
	m.CheckSummary(t, "couchq_job_wait_seconds", 13, 3)

	// The jobs as stored.
	code, body = get(t, hs, "/api/jobs?type=mail&status=queued")
	var docs []map[string]any
	if err := json.Unmarshal([]byte(body), &docs); code != http.StatusOK || err != nil || len(docs) != 1 || docs[0]["_id"] != "C" {
		t.Errorf("/api/jobs?type=mail&status=queued: %d %v\n%s", code, err, body)
	}
	code, body = get(t, hs, "/api/jobs?limit=1")
	if err := json.Unmarshal([]byte(body), &docs); code != http.StatusOK || err != nil || len(docs) != 1 {
		t.Errorf("/api/jobs?limit=1: %d %v\n%s", code, err, body)
	}
	// One job, by id.
	code, body = get(t, hs, "/api/jobs/C")
	var one map[string]any
	if err := json.Unmarshal([]byte(body), &one); code != http.StatusOK || err != nil || one["_id"] != "C" || one["status"] != "queued" {
		t.Errorf("/api/jobs/C: %d %v\n%s", code, err, body)
	}
	for _, missing := range []string{"/api/jobs/no-such-job", "/api/jobs/_design%2Fcouchq"} {
		if code, body := get(t, hs, missing); code != http.StatusNotFound || !strings.Contains(body, `"error"`) {
			t.Errorf("%s: %d %s, want 404", missing, code, body)
		}
	}
	for path, want := range map[string]string{
		"/api/jobs?status=stuck":       `invalid status \"stuck\": want one of waiting, queued, running, done, failed, cancelled`,
		"/api/jobs?limit=0":            `invalid limit \"0\"`,
		"/api/jobs?limit=5000":         `invalid limit \"5000\"`,
		"/api/stats?since=soon":        `invalid since \"soon\"`,
		"/api/stats?until=-1h":         `invalid until \"-1h\"`,
		"/api/stats?since=1h&until=2h": "is not before until",
	} {
		code, body := get(t, hs, path)
		if code != http.StatusBadRequest || !strings.Contains(body, want) || !strings.Contains(body, `"error"`) {
			t.Errorf("%s: %d %s, want 400 with %s", path, code, body, want)
		}
	}
	code, body = get(t, hs, "/healthz")
	if code != http.StatusOK || strings.TrimSpace(body) != `{"couchdb":"ok"}` {
		t.Errorf("/healthz: %d %s", code, body)
	}
	if code, body := get(t, hs, "/"); code != http.StatusOK || !strings.Contains(body, "/api/jobs") {
		t.Errorf("/: %d %s", code, body)
	}
	if code, _ := get(t, hs, "/nope"); code != http.StatusNotFound {
		t.Errorf("/nope: %d", code)
	}
}

// When the database goes away: /healthz answers 503 with the error,
// /metrics couchq_up 0 without stale gauges but with the counters so far,
// the API 502; the errors are rendered by Config.ErrorMessage.
func TestHandlerReportsAnUnavailableDatabase(t *testing.T) {
	t.Parallel()
	ctx, q := newQueue(t)
	name := q.DB().Name()
	if _, err := q.Enqueue(ctx, protocol.NewJob{Worker: "mail"}); err != nil {
		t.Fatal(err)
	}
	// No cache and no settle: each scrape sees the database as it is.
	hs := serveHandler(ctx, t, q, Config{CacheTTL: -1, Settle: -1,
		ErrorMessage: func(err error) string { return "rendered: " + err.Error() }})
	if code, _ := get(t, hs, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz before: %d", code)
	}
	scrape(t, hs).Check(t, 1, "couchq_jobs_added_total", "type=mail")
	if err := srv.Client(t).DestroyDB(ctx, name); err != nil {
		t.Fatal(err)
	}
	code, body := get(t, hs, "/healthz")
	var h map[string]string
	if err := json.Unmarshal([]byte(body), &h); code != http.StatusServiceUnavailable || err != nil ||
		h["couchdb"] != "unavailable" || !strings.HasPrefix(h["error"], "reading database "+name+": rendered: ") {
		t.Errorf("/healthz after the database is gone: %d %s", code, body)
	}
	m := scrape(t, hs)
	m.Check(t, 0, "couchq_up")
	m.Check(t, 1, "couchq_stats_refresh_errors_total")
	m.Check(t, 1, "couchq_jobs_added_total", "type=mail") // counters survive
	if m["couchq_queue_due"] != nil || m["couchq_jobs"] != nil {
		t.Errorf("stale gauges served while couchq_up is 0")
	}
	for _, path := range []string{"/api/stats", "/api/jobs"} {
		code, body := get(t, hs, path)
		var e map[string]string
		if err := json.Unmarshal([]byte(body), &e); code != http.StatusBadGateway || err != nil || !strings.HasPrefix(e["error"], "rendered: ") {
			t.Errorf("%s: %d %s, want 502 with the rendered error", path, code, body)
		}
	}
}

// Mounted under a prefix of a service's own mux, as the package
// documentation says.
func TestHandlerUnderAPrefix(t *testing.T) {
	t.Parallel()
	ctx, q := newQueue(t)
	mux := http.NewServeMux()
	mux.Handle("/couchq/", http.StripPrefix("/couchq", NewHandler(ctx, (*couchq.Client)(q), Config{})))
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("the service")) })
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	for path, want := range map[string]string{
		"/couchq/healthz": `{"couchdb":"ok"}`, "/couchq/api/jobs": "[]", "/couchq/metrics": "couchq_up 1",
		"/couchq/": `<title>couchq — ` + q.DB().Name(), "/couchq/assets/dashboard.js": "uPlot",
		"/couchq/api/queues": "[]", "/elsewhere": "the service",
	} {
		if code, body := get(t, hs, path); code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("%s: %d %s, want 200 with %s", path, code, body, want)
		}
	}
}

// NewCollector on a registry of one's own: the couchq_* families alone,
// counting the script.
func TestCollectorOnItsOwnRegistry(t *testing.T) {
	t.Parallel()
	r := playScript(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(r.Ctx, (*couchq.Client)(r.Q), Config{Now: r.Clock.Now}))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	m := opstest.Metrics{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "couchq_") {
			t.Errorf("metric %s on the collector's registry", f.GetName())
		}
		m[f.GetName()] = f
	}
	m.Check(t, 1, "couchq_up")
	m.Check(t, 2, "couchq_jobs_finished_total", "type=mail")
	m.Check(t, 1, "couchq_queue_due", "type=mail")
	m.CheckSummary(t, "couchq_job_wait_seconds", 13, 3)
}

func TestConfigWithDefaults(t *testing.T) {
	t.Parallel()
	c := Config{}.WithDefaults()
	if c.CacheTTL != CacheTTLDefault || c.Settle != SettleDefault || c.RefreshTimeout != RefreshTimeoutDefault ||
		c.Now == nil || c.ErrorMessage == nil || c.ErrorMessage(context.Canceled) != context.Canceled.Error() {
		t.Errorf("defaults: %+v", c)
	}
	// Negative is none, and stays so.
	c = Config{CacheTTL: -1, Settle: -1, RefreshTimeout: time.Second}.WithDefaults()
	if c.ttl() != 0 || c.settle() != 0 || c.RefreshTimeout != time.Second {
		t.Errorf("none: ttl %v settle %v timeout %v", c.ttl(), c.settle(), c.RefreshTimeout)
	}
}
