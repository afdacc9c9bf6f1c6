package worker

import (
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// HealthHandler serves a worker process's probes and metrics:
//
//	/healthz   200 while the process runs (liveness: nothing here blocks on
//	           CouchDB, so a slow server never gets a worker restarted)
//	/readyz    200 when w.Ready() is nil, else 503 with its reason
//	/metrics   w's Config.Metrics with the Go runtime's and the process's
//	           metrics, from a registry of the handler's own; 404 when the
//	           worker has no Metrics
//
// Answers are JSON but for /metrics. Its paths are absolute: mount it at
// the root of a mux, or under a prefix with http.StripPrefix. A service
// with a registry of its own can register the Metrics there instead and
// use this handler for the probes.
func HealthHandler(w *Worker) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
		writeJSON(rw, http.StatusOK, map[string]any{"status": "ok", "claimant": w.ClaimantID()})
	})
	mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, _ *http.Request) {
		if err := w.Ready(); err != nil {
			writeJSON(rw, http.StatusServiceUnavailable, map[string]any{"ready": false, "reason": err.Error()})
			return
		}
		writeJSON(rw, http.StatusOK, map[string]any{"ready": true})
	})
	if m := w.cfg.Metrics; m != nil {
		reg := prometheus.NewRegistry()
		reg.MustRegister(m,
			collectors.NewGoCollector(),
			collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		)
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
			ErrorLog:      promLogger{w},
			ErrorHandling: promhttp.ContinueOnError,
		}))
	}
	return mux
}

func writeJSON(rw http.ResponseWriter, status int, v any) {
	rw.Header().Set("Content-Type", "application/json")
	rw.Header().Set("Cache-Control", "no-store") // a probe's answer is for now
	rw.WriteHeader(status)
	_ = json.NewEncoder(rw).Encode(v) // the client went away: nothing to do
}

// promLogger passes promhttp's errors (a metric that could not be
// encoded) to the worker's log.
type promLogger struct{ w *Worker }

func (l promLogger) Println(v ...any) {
	l.w.log.Error().Interface("error", v).Msg("serving metrics")
}
