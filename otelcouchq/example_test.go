package otelcouchq_test

import (
	"context"
	"log"
	"os"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/otelcouchq"
	"github.com/couchq/couchq/worker"
)

// A producer traces the jobs it enqueues, and a worker continues each
// job's trace: with the global providers set up by your program (an OTLP
// exporter, say), the request that enqueued a job and the attempts that
// ran it are one trace.
func Example() {
	ctx := context.Background()
	srv, err := couchq.Connect(ctx, os.Getenv("COUCHDB_URL"), os.Getenv("COUCHDB_USER"), os.Getenv("COUCHDB_PASSWORD"))
	if err != nil {
		log.Fatal(err)
	}
	q, err := srv.Open(ctx, "couchq", couchq.Config{
		BeforeEnqueue: []func(context.Context, *couchq.NewJob) error{otelcouchq.EnqueueHook()},
	})
	if err != nil {
		log.Fatal(err)
	}
	// In a request handler, ctx holds the request's span.
	if _, err := q.Enqueue(ctx, couchq.NewJob{Worker: "welcome-email", Payload: map[string]string{"to": "ada@example.com"}}); err != nil {
		log.Fatal(err)
	}

	w, err := worker.New(q, worker.Config{
		Handlers: map[string]worker.Handler{"welcome-email": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			// ctx holds the run span: spans started here are its children.
			return nil
		})},
		Middleware: []worker.Middleware{otelcouchq.Middleware()},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
