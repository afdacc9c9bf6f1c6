package worker

import (
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// HealthHandler serves a worker process's probes and metrics, for one
// worker or several run by one process (one per job type):
//
//	/healthz   200 while the process runs (liveness: nothing here blocks on
//	           CouchDB, so a slow server never gets a worker restarted)
//	/readyz    200 when every worker's Ready() is nil, else 503 with the
//	           first reason
//	/metrics   the workers' Config.Metrics (each distinct one once; share
//	           one Metrics between workers of a process) with the Go
//	           runtime's and the process's metrics, from a registry of the
//	           handler's own; 404 when no worker has Metrics
//
// Answers are JSON but for /metrics. Its paths are absolute: mount it at
// the root of a mux, or under a prefix with http.StripPrefix. A service
// with a registry of its own can register the Metrics there instead and
// use this handler for the probes.
func HealthHandler(ws ...*Worker) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
		claimants := make([]string, len(ws))
		for i, w := range ws {
			claimants[i] = w.ClaimantID()
		}
		body := map[string]any{"status": "ok", "claimants": claimants}
		if len(ws) == 1 {
			body["claimant"] = claimants[0]
		}
		writeJSON(rw, http.StatusOK, body)
	})
	mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, _ *http.Request) {
		for _, w := range ws {
			if err := w.Ready(); err != nil {
				reason := err.Error()
				if len(ws) > 1 {
					reason = w.ClaimantID() + ": " + reason
				}
				writeJSON(rw, http.StatusServiceUnavailable, map[string]any{"ready": false, "reason": reason})
				return
			}
		}
		writeJSON(rw, http.StatusOK, map[string]any{"ready": true})
	})
	reg := prometheus.NewRegistry()
	seen := map[*Metrics]bool{}
	for _, w := range ws {
		if m := w.cfg.Metrics; m != nil && !seen[m] {
			seen[m] = true
			reg.MustRegister(m)
		}
	}
	if len(seen) > 0 {
		reg.MustRegister(
			collectors.NewGoCollector(),
			collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		)
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
			ErrorLog:      promLogger{ws[0]},
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
