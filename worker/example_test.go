package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/worker"
)

// A typed handler decodes each job's payload into its own struct.
func ExampleTyped() {
	type welcome struct {
		Email string `json:"email"`
	}
	handler := worker.Typed(func(ctx context.Context, job *worker.Job, args welcome) error {
		fmt.Printf("attempt %d: sending welcome mail to %s\n", job.Attempt, args.Email)
		return job.SetResult(map[string]bool{"sent": true})
	})

	// The runtime builds the Job from a claimed WorkItem; here by hand.
	job := &worker.Job{ID: "job:1", Type: "welcome", Attempt: 1, Payload: json.RawMessage(`{"email":"ada@example.com"}`)}
	if err := handler.Handle(context.Background(), job); err != nil {
		fmt.Println("error:", err)
	}
	fmt.Println(string(job.Result()))
	// Output:
	// attempt 1: sending welcome mail to ada@example.com
	// {"sent":true}
}

// A worker that also enqueues a report every weekday at 7 in Berlin (once
// per tick, however many processes run it), lets at most 10 webhooks start
// per second and at most 3 renders run at once across the fleet. (Compiled,
// not run: it needs a CouchDB server.)
func ExampleConfig_scheduling() {
	ctx := context.Background()
	srv, err := couchq.Connect(ctx, "http://127.0.0.1:5984", "admin", "secret")
	if err != nil {
		panic(err)
	}
	q, err := srv.Open(ctx, "couchq", couchq.Config{})
	if err != nil {
		panic(err)
	}
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		panic(err)
	}
	noop := worker.HandlerFunc(func(context.Context, *worker.Job) error { return nil })
	w, err := worker.New(q, worker.Config{
		Handlers: map[string]worker.Handler{"report": noop, "webhook": noop, "render": noop},
		Periodic: []couchq.Periodic{{
			Name: "morning-report", Schedule: "0 7 * * 1-5", Location: berlin,
			Job: couchq.NewJob{Worker: "report", Priority: couchq.PriorityHighest},
		}},
		RateLimits:       map[string]couchq.RateLimit{"webhook": {N: 10, Per: time.Second}},
		FleetConcurrency: map[string]int{"render": 3},
	})
	if err != nil {
		panic(err)
	}
	// Pausing a type, from any process: its workers stop claiming it.
	if err := q.Pause(ctx, "render", "GPU maintenance"); err != nil {
		panic(err)
	}
	_ = w.Run(ctx)
}

// A service that runs a worker in-process serves its probes and metrics on
// its own mux; or it registers the Metrics on the registry it already
// serves. (Compiled, not run: it needs a CouchDB server.)
func ExampleHealthHandler() {
	ctx := context.Background()
	srv, err := couchq.Connect(ctx, "http://127.0.0.1:5984", "admin", "secret")
	if err != nil {
		panic(err)
	}
	q, err := srv.Open(ctx, "couchq", couchq.Config{})
	if err != nil {
		panic(err)
	}
	m := worker.NewMetrics()
	w, err := worker.New(q, worker.Config{
		Handlers: map[string]worker.Handler{
			"email": worker.HandlerFunc(func(context.Context, *worker.Job) error { return nil }),
		},
		Metrics: m,
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	// /worker/healthz, /worker/readyz, /worker/metrics: no authentication,
	// so mount it where only operators and the orchestrator reach.
	mux.Handle("/worker/", http.StripPrefix("/worker", worker.HealthHandler(w)))

	// Or the metrics alone, on the service's own registry.
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	go func() { _ = http.ListenAndServe("127.0.0.1:8081", mux) }()
	_ = w.Run(ctx)
}
