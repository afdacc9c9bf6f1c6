package couchq_test

import (
	"context"
	"errors"
	"fmt"
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

// A unique job's id comes from its type and key, so every process that
// enqueues it writes the same document and CouchDB keeps one.
func ExampleUniqueID() {
	at := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	fmt.Println(couchq.UniqueID("digest", couchq.UniqueOpts{Key: "user-42"}, at))
	fmt.Println(couchq.UniqueID("report", couchq.UniqueOpts{Key: "daily", For: 24 * time.Hour}, at))
	// Output:
	// job:unique:digest:user-42
	// job:unique:report:daily@2026-11-23T00:00:00Z
}

// Enqueue a unique job: a second enqueue of the key returns the job that
// holds it. (Compiled, not run: it needs a CouchDB server.)
func ExampleClient_Enqueue_unique() {
	ctx := context.Background()
	srv, err := couchq.Connect(ctx, "http://127.0.0.1:5984", "admin", "secret")
	if err != nil {
		panic(err)
	}
	q, err := srv.Open(ctx, "couchq", couchq.Config{})
	if err != nil {
		panic(err)
	}
	it, err := q.Enqueue(ctx, couchq.NewJob{Worker: "digest", Unique: couchq.UniqueOpts{Key: "user-42"}})
	switch {
	case errors.Is(err, couchq.ErrDuplicate):
		fmt.Println("already queued:", it.ID)
	case err != nil:
		panic(err)
	default:
		fmt.Println("enqueued:", it.ID)
	}
}

// A job's priority runs from 1 (first) to 5 (last); one without a priority
// sits in the middle.
func ExampleWorkItem_EffectivePriority() {
	for _, it := range []couchq.WorkItem{{Priority: couchq.PriorityHighest}, {}, {Priority: 5}} {
		fmt.Println(it.EffectivePriority())
	}
	// Output:
	// 1
	// 3
	// 5
}

// A periodic schedule's ticks, and the job id each tick gets: every process
// running the schedule writes the same id, so a tick yields one job.
func ExampleParseSchedule() {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		panic(err)
	}
	ticks, err := couchq.ParseSchedule("0 7 * * 1-5", berlin) // weekdays at 07:00 in Berlin
	if err != nil {
		panic(err)
	}
	next := ticks.Next(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)) // a Friday noon
	fmt.Println(next.UTC())
	fmt.Println(couchq.PeriodicJobID("report", next))
	// Output:
	// 2026-11-30 06:00:00 +0000 UTC
	// job:periodic:report@2026-11-30T06:00:00Z
}

// A fleet-wide rate limit: N starts per window, windows aligned to the
// Unix epoch.
func ExampleParseRate() {
	for _, s := range []string{"10/s", "600/m", "5/30s"} {
		rl, err := couchq.ParseRate(s)
		if err != nil {
			panic(err)
		}
		fmt.Println(rl.N, rl.Per)
	}
	_, err := couchq.ParseRate("ten/s")
	fmt.Println(err != nil)
	// Output:
	// 10 1s
	// 600 1m0s
	// 5 30s
	// true
}

// Pause a job type: every worker of it stops claiming within a second and
// finishes what it holds. (Compiled, not run: it needs a CouchDB server.)
func ExampleClient_Pause() {
	ctx := context.Background()
	srv, err := couchq.Connect(ctx, "http://127.0.0.1:5984", "admin", "secret")
	if err != nil {
		panic(err)
	}
	q, err := srv.Open(ctx, "couchq", couchq.Config{})
	if err != nil {
		panic(err)
	}
	if err := q.Pause(ctx, "webhook", "ops", "the partner API is down"); err != nil {
		panic(err)
	}
	// ... later
	if err := q.Resume(ctx, "webhook", "ops"); err != nil {
		panic(err)
	}
}
