package couchq_test

import (
	"context"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/worker"
)

// Email is a job's payload, decoded by a typed handler.
type Email struct {
	To       string `json:"to"`
	Template string `json:"template"`
}

func send(context.Context, Email) error { return nil }

// Enqueue jobs and run a worker for them. (Compiled, not run: it needs a
// CouchDB server; the integration tests run the same calls against one.)
func Example() {
	ctx := context.Background()
	log := zerolog.New(os.Stderr)

	srv, err := couchq.Connect(ctx, "http://127.0.0.1:5984", "admin", "secret")
	if err != nil {
		panic(err)
	}
	if _, err := couchq.Init(ctx, srv.Client, "couchq", log); err != nil {
		panic(err)
	}
	q, err := srv.Open(ctx, "couchq", couchq.Config{Logger: log})
	if err != nil {
		panic(err)
	}
	if _, err := q.Enqueue(ctx, couchq.NewJob{Worker: "email", Payload: Email{To: "ada@example.com"}}); err != nil {
		panic(err)
	}
	if _, err := q.Enqueue(ctx, couchq.NewJob{Worker: "email", Payload: Email{To: "grace@example.com"},
		At: time.Now().Add(time.Hour)}); err != nil {
		panic(err)
	}

	w, err := worker.New(q, worker.Config{
		Handlers: map[string]worker.Handler{
			"email": worker.Typed(func(ctx context.Context, job *worker.Job, args Email) error {
				return send(ctx, args)
			}),
		},
		Concurrency: 8,
		Logger:      log,
	})
	if err != nil {
		panic(err)
	}
	_ = w.Run(ctx) // until ctx ends, then a graceful stop
}
