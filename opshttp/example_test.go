package opshttp_test

import (
	"context"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/opshttp"
)

// A service that runs couchq workers mounts the queue's dashboard, metrics
// and API under /couchq/ on its own mux, beside its own endpoints. (Compiled, not
// run: it needs a CouchDB server; the package's tests serve the same
// handler from one.)
func ExampleNewHandler() {
	ctx := context.Background()
	log := zerolog.New(os.Stderr)
	var q *couchq.Client // the service's queue client, opened as in couchq's Example

	mux := http.NewServeMux()
	mux.HandleFunc("GET /orders", func(w http.ResponseWriter, r *http.Request) { /* the service's own */ })
	// /couchq/ (the dashboard), /couchq/metrics, /couchq/api/...,
	// /couchq/healthz. Only the dashboard's actions authenticate, against
	// the CouchDB server at CouchURL: mount it where only operators reach.
	mux.Handle("/couchq/", http.StripPrefix("/couchq", opshttp.NewHandler(ctx, q, opshttp.Config{
		Logger: log, CouchURL: "http://127.0.0.1:5984",
	})))

	server := &http.Server{
		Addr:              "127.0.0.1:8080",
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		// A scrape may wait for one refresh from CouchDB.
		WriteTimeout: opshttp.RefreshTimeoutDefault + 15*time.Second,
	}
	if err := server.ListenAndServe(); err != nil {
		log.Error().Err(err).Msg("serving")
	}
}

// A service that serves /metrics from a registry of its own adds the
// queue's metrics to it. (Compiled, not run: it needs a CouchDB server.)
func ExampleNewCollector() {
	ctx := context.Background()
	var q *couchq.Client // the service's queue client, opened as in couchq's Example

	reg := prometheus.NewRegistry() // the service's, with its own metrics
	reg.MustRegister(opshttp.NewCollector(ctx, q, opshttp.Config{CacheTTL: 15 * time.Second}))
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	_ = mux // served as in ExampleNewHandler
}
