package couchq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/worker"
)

// Email is a job's payload, decoded by a typed handler.
type Email struct {
	To string `json:"to"`
}

// open connects to the server named by COUCHDB_URL (credentials in
// COUCHDB_USER and COUCHDB_PASSWORD, or in the URL), prepares db and opens
// a queue client on it.
func open(ctx context.Context, db string) *couchq.Client {
	srv, err := couchq.Connect(ctx, os.Getenv("COUCHDB_URL"), os.Getenv("COUCHDB_USER"), os.Getenv("COUCHDB_PASSWORD"))
	if err != nil {
		panic(err)
	}
	// Init creates the database and couchq's design documents, or
	// upgrades them; every process may call it at every start.
	if err := srv.Init(ctx, db, couchq.InitOptions{}); err != nil {
		panic(err)
	}
	q, err := srv.Open(ctx, db, couchq.Config{})
	if err != nil {
		panic(err)
	}
	return q
}

// Enqueue jobs, then run a worker for them. Here the worker drains the
// queue and returns; a service runs it until its context ends.
func Example() {
	ctx := context.Background()
	q := open(ctx, "couchq_example")

	for _, to := range []string{"ada@example.com", "grace@example.com"} {
		if _, err := q.Enqueue(ctx, couchq.NewJob{Worker: "email", Payload: Email{To: to}}); err != nil {
			panic(err)
		}
	}

	var mu sync.Mutex
	var sent []string
	w, err := worker.New(q, worker.Config{
		Handlers: map[string]worker.Handler{
			"email": worker.Typed(func(ctx context.Context, job *worker.Job, args Email) error {
				mu.Lock()
				defer mu.Unlock()
				sent = append(sent, args.To) // send the mail here
				return nil
			}),
		},
		Drain: true, // return once no due work remains
	})
	if err != nil {
		panic(err)
	}
	if err := w.Run(ctx); err != nil {
		panic(err)
	}

	sort.Strings(sent)
	fmt.Println("sent to", sent)
	done, err := q.List(ctx, couchq.ListOptions{Worker: "email", Status: couchq.StatusDone})
	if err != nil {
		panic(err)
	}
	fmt.Println(len(done), "jobs done")
	// Output:
	// sent to [ada@example.com grace@example.com]
	// 2 jobs done
}

// A job scheduled for later, with a priority: it is not claimed before it
// is due, and among due jobs priority 1 runs first.
func ExampleClient_Enqueue() {
	ctx := context.Background()
	q := open(ctx, "couchq_example")

	job, err := q.Enqueue(ctx, couchq.NewJob{
		Worker:   "report",
		Payload:  map[string]string{"month": "2026-11"},
		At:       time.Now().Add(time.Hour),
		Priority: couchq.PriorityHighest,
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(job.Worker, job.Status, job.EffectivePriority(), time.Until(job.DueAt()) > 59*time.Minute)

	// A job that cannot be stored says why.
	_, err = q.Enqueue(ctx, couchq.NewJob{Worker: "report", Priority: 9})
	fmt.Println(errors.Is(err, couchq.ErrInvalidJob))
	// Output:
	// report queued 1 true
	// true
}

// A unique job: a second enqueue of the same key writes nothing and returns
// the job that holds it, so a retried request or many processes enqueueing
// the same work make one job.
func ExampleClient_Enqueue_unique() {
	ctx := context.Background()
	q := open(ctx, "couchq_example_unique")

	digest := couchq.NewJob{Worker: "digest", Unique: couchq.UniqueOpts{Key: "user-42"}}
	first, err := q.Enqueue(ctx, digest)
	if err != nil {
		panic(err)
	}
	again, err := q.Enqueue(ctx, digest)
	fmt.Println(errors.Is(err, couchq.ErrDuplicate), again.ID == first.ID)
	fmt.Println(first.ID)
	// Output:
	// true true
	// job:unique:digest:user-42
}

// A periodic job: workers enqueue one job per tick of the schedule, however
// many processes run it, and run it like any other.
func ExampleClient_periodic() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := open(ctx, "couchq_example_periodic")

	var once sync.Once
	w, err := worker.New(q, worker.Config{
		Handlers: map[string]worker.Handler{
			"cleanup": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
				once.Do(func() {
					fmt.Println("cleanup ran for", job.Type)
					cancel() // one tick is enough here: stop the worker
				})
				return nil
			}),
		},
		// In production, a cron expression: "0 7 * * 1-5" (weekdays at 7)
		// in Location.
		Periodic: []couchq.Periodic{{Name: "cleanup", Schedule: "@every 1s", Job: couchq.NewJob{Worker: "cleanup"}}},
	})
	if err != nil {
		panic(err)
	}
	_ = w.Run(ctx) // until ctx ends, then a graceful stop
	// Output:
	// cleanup ran for cleanup
}

// An agent, a program that is not a couchq worker (or a person at a
// shell), claims jobs and finishes them. couchq serve offers the same over
// HTTP.
func ExampleClient_ClaimForAgent() {
	ctx := context.Background()
	q := open(ctx, "couchq_example_agent")
	if _, err := q.Enqueue(ctx, couchq.NewJob{Worker: "render", Payload: map[string]int{"page": 1}}); err != nil {
		panic(err)
	}

	claim, err := q.ClaimForAgent(ctx, "render", 10, "renderer-1", 5*time.Minute)
	if err != nil {
		panic(err)
	}
	for _, job := range claim.Jobs() {
		fmt.Println("claimed", job.Worker, string(job.Payload))
		if err := q.Complete(ctx, job, json.RawMessage(`{"pages":1}`)); err != nil {
			panic(err)
		}
		done, err := q.Get(ctx, job.ID)
		if err != nil {
			panic(err)
		}
		fmt.Println(done.Status, string(done.Result))
	}
	// Output:
	// claimed render {"page":1}
	// done {"pages":1}
}

// Pause a job type: every worker of it stops claiming within a second and
// finishes what it holds; Resume lets them claim again.
func ExampleClient_Pause() {
	ctx := context.Background()
	q := open(ctx, "couchq_example")
	if err := q.Pause(ctx, "webhook", "the partner API is down"); err != nil {
		panic(err)
	}
	queues, err := q.Queues(ctx)
	if err != nil {
		panic(err)
	}
	for _, tq := range queues {
		if tq.Type == "webhook" {
			fmt.Println(tq.Type, "paused:", tq.Paused)
		}
	}
	if err := q.Resume(ctx, "webhook"); err != nil {
		panic(err)
	}
	// Output:
	// webhook paused: true
}

// Slots of a sequence, such as invoice numbers: each goes to one holder,
// and a slot whose work failed goes to the next.
func ExampleClient_Reserve() {
	ctx := context.Background()
	q := open(ctx, "couchq_example_slots")
	invoices := couchq.NumberedSequence("invoice", "INV-%04d", 1, time.Minute)

	a, err := q.Reserve(ctx, invoices, "order-1")
	if err != nil {
		panic(err)
	}
	b, err := q.Reserve(ctx, invoices, "order-2")
	if err != nil {
		panic(err)
	}
	fmt.Println(a.Slot, b.Slot)
	if err := q.ReleaseSlot(ctx, a); err != nil { // order-1's invoice went out
		panic(err)
	}
	if err := q.AbandonSlot(ctx, b); err != nil { // order-2 failed: its number is free again
		panic(err)
	}
	c, err := q.Reserve(ctx, invoices, "order-3")
	if err != nil {
		panic(err)
	}
	fmt.Println(c.Slot)
	// Output:
	// INV-0001 INV-0002
	// INV-0002
}

// Two sites, Berlin and Tokyo, each with its own database and workers,
// linked into one queue; a job enqueued in Berlin for Tokyo runs in Tokyo.
// (Compiled, not run: it needs two servers; the sites tests run the same
// calls against two.)
func ExampleLinkSites() {
	ctx := context.Background()
	berlin, err := couchq.Connect(ctx, "http://berlin.example:5984", "admin", "secret")
	if err != nil {
		panic(err)
	}
	tokyo, err := couchq.Connect(ctx, "http://tokyo.example:5984", "admin", "secret")
	if err != nil {
		panic(err)
	}
	for _, srv := range []*couchq.Server{berlin, tokyo} {
		if err := srv.Init(ctx, "couchq", couchq.InitOptions{}); err != nil {
			panic(err)
		}
	}
	admin, err := berlin.Open(ctx, "couchq", couchq.Config{})
	if err != nil {
		panic(err)
	}
	for _, site := range []string{"berlin", "tokyo"} { // berlin, the first, is the default
		if err := admin.AddSite(ctx, site); err != nil {
			panic(err)
		}
	}
	err = couchq.LinkSites(ctx,
		couchq.SiteLink{Site: "berlin", Server: berlin, URL: "http://berlin.example:5984", DB: "couchq", User: "admin", Password: "secret"},
		couchq.SiteLink{Site: "tokyo", Server: tokyo, URL: "http://tokyo.example:5984", DB: "couchq", User: "admin", Password: "secret"})
	if err != nil {
		panic(err)
	}
	q, err := berlin.Open(ctx, "couchq", couchq.Config{Site: "berlin"})
	if err != nil {
		panic(err)
	}
	if _, err := q.Enqueue(ctx, couchq.NewJob{Worker: "report", Site: "tokyo"}); err != nil {
		panic(err)
	}
	// Workers opened with couchq.Config{Site: "tokyo"} on Tokyo's server
	// run it, and Berlin's copy shows it done.
}

// Workflows: a job that waits for another (After), and a batch whose
// callback runs once after every one of its jobs has finished, with a
// summary of how they ended in its payload.
func ExampleClient_EnqueueBatch() {
	ctx := context.Background()
	q := open(ctx, "couchq_example_workflow")

	fetch, err := q.Enqueue(ctx, couchq.NewJob{Worker: "fetch"})
	if err != nil {
		panic(err)
	}
	report, err := q.Enqueue(ctx, couchq.NewJob{Worker: "report", After: []string{fetch.ID}})
	if err != nil {
		panic(err)
	}
	fmt.Println("report is", report.Status)

	var pages []couchq.NewJob
	for _, url := range []string{"/a", "/b", "/c"} {
		pages = append(pages, couchq.NewJob{Worker: "page", Payload: url})
	}
	batch, err := q.EnqueueBatch(ctx, pages, couchq.NewJob{Worker: "index", Payload: map[string]string{"site": "example.com"}})
	if err != nil {
		panic(err)
	}

	var mu sync.Mutex
	var ran []string
	record := func(ctx context.Context, job *worker.Job) error {
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, job.Type)
		return nil
	}
	summary := make(chan string, 1)
	w, err := worker.New(q, worker.Config{Handlers: map[string]worker.Handler{
		"fetch": worker.HandlerFunc(record), "report": worker.HandlerFunc(record), "page": worker.HandlerFunc(record),
		"index": worker.Typed(func(ctx context.Context, job *worker.Job, args struct {
			Site  string `json:"site"`
			Batch struct {
				Done, Failed, Cancelled int
			} `json:"batch"`
		}) error {
			summary <- fmt.Sprintf("index %s: %d done, %d failed, %d cancelled", args.Site, args.Batch.Done, args.Batch.Failed, args.Batch.Cancelled)
			return nil
		}),
	}})
	if err != nil {
		panic(err)
	}
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = w.Stop(ctx) }()

	fmt.Println(<-summary)
	for {
		if it, err := q.Get(ctx, report.ID); err == nil && it.Status == couchq.StatusDone {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Println("fetch ran before report:", indexOf(ran, "fetch") < indexOf(ran, "report"))
	b, err := q.Batch(ctx, batch)
	if err != nil {
		panic(err)
	}
	fmt.Println("batch pending:", b.Pending)
	// Output:
	// report is waiting
	// index example.com: 3 done, 0 failed, 0 cancelled
	// fetch ran before report: true
	// batch pending: 0
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}
