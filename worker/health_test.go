package worker_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/couchq/couchq/opshttp"
	"github.com/couchq/couchq/worker"
)

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(body)
}

var noop = worker.HandlerFunc(func(context.Context, *worker.Job) error { return nil })

// A worker that has not started is alive but not ready, and says why;
// /metrics serves its Metrics with the runtime's.
func TestHealthHandlerUnstarted(t *testing.T) {
	w, err := worker.New(nil, worker.Config{Handlers: map[string]worker.Handler{"mail": noop}, Metrics: worker.NewMetrics()})
	if err != nil {
		t.Fatal(err)
	}
	h := worker.HealthHandler(w)
	if code, body := get(t, h, "/healthz"); code != http.StatusOK || !strings.Contains(body, `"status":"ok"`) {
		t.Errorf("/healthz: %d %s", code, body)
	}
	code, body := get(t, h, "/readyz")
	var ready struct {
		Ready  bool   `json:"ready"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal([]byte(body), &ready); err != nil || code != http.StatusServiceUnavailable || ready.Ready ||
		ready.Reason != "worker not started" {
		t.Errorf("/readyz: %d %s (%v)", code, body, err)
	}
	code, body = get(t, h, "/metrics")
	if code != http.StatusOK || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics: %d\n%s", code, body)
	}
	if code, _ := get(t, h, "/nothing"); code != http.StatusNotFound {
		t.Errorf("/nothing: %d", code)
	}
}

// Without Metrics the probes still answer and /metrics is not found.
func TestHealthHandlerWithoutMetrics(t *testing.T) {
	w, err := worker.New(nil, worker.Config{Handlers: map[string]worker.Handler{"mail": noop}})
	if err != nil {
		t.Fatal(err)
	}
	h := worker.HealthHandler(w)
	if code, _ := get(t, h, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	if code, _ := get(t, h, "/metrics"); code != http.StatusNotFound {
		t.Errorf("/metrics without Metrics: %d", code)
	}
}

// A service that embeds workers and serves the queue's metrics can register
// both collectors on one registry: no name is shared.
func TestMetricsDoNotCollideWithServe(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(opshttp.NewCollector(context.Background(), nil, opshttp.Config{})); err != nil {
		t.Fatal(err)
	}
	if err := reg.Register(worker.NewMetrics()); err != nil {
		t.Fatalf("worker metrics next to couchq serve's: %v", err)
	}
}
