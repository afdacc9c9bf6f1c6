package couchqtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/couchqtest"
	"github.com/couchq/couchq/worker"
)

// This file is the example: a handler (renderInvoice) and application code
// that enqueues its jobs (billCustomer), tested with couchqtest: the
// handler in-process with RunJob, the enqueue against a real database with
// RequireEnqueued and RequireNotEnqueued.

// Invoice is the payload of the example's "invoice" jobs.
type Invoice struct {
	Customer string `json:"customer"`
	Pages    int    `json:"pages"`
}

// renderInvoice is an example handler: it reports its progress page by
// page, gives up on a customer it does not know, waits for one that is
// busy and records how many pages it rendered.
func renderInvoice(ctx context.Context, job *worker.Job, inv Invoice) error {
	switch inv.Customer {
	case "":
		return worker.JobCancel(errors.New("no customer"))
	case "busy":
		return worker.JobSnooze(time.Minute)
	case "flaky":
		return errors.New("printer offline")
	}
	for page := 1; page <= inv.Pages; page++ {
		if err := job.Progress(ctx, page, inv.Pages, fmt.Sprintf("page %d", page)); err != nil {
			return err
		}
	}
	return job.SetResult(map[string]int{"pages": inv.Pages})
}

// billCustomer is example application code that enqueues an invoice.
func billCustomer(ctx context.Context, q *couchq.Client, customer string, pages int, urgent bool) error {
	j := couchq.NewJob{Worker: "invoice", Payload: Invoice{Customer: customer, Pages: pages}, At: time.Now().Add(time.Hour)}
	if urgent {
		j.Priority, j.At = couchq.PriorityHighest, time.Time{}
	}
	_, err := q.Enqueue(ctx, j)
	return err
}

// RunJob runs the example handler as a worker would, with no server: each
// outcome as the worker would store it.
func TestRunJobOutcomes(t *testing.T) {
	ctx := context.Background()
	h := worker.Typed(renderInvoice)
	run := func(payload any, opts *couchqtest.RunOpts) *couchqtest.Outcome {
		t.Helper()
		return couchqtest.RunJob(ctx, t, h, couchq.NewJob{Worker: "invoice", Payload: payload}, opts)
	}

	out := run(Invoice{Customer: "acme", Pages: 120}, nil)
	if out.Kind != couchqtest.Done || out.Err != nil || string(out.Result) != `{"pages":120}` {
		t.Fatalf("done: %+v", out)
	}
	if out.Reports != 120 || out.Progress == nil || out.Progress.String() != "120/120 (100%) page 120" {
		t.Errorf("progress: %d reports, last %v", out.Reports, out.Progress)
	}
	if out.Job.Attempt != 1 || out.Job.MaxAttempts != couchq.MaxAttemptsDefault || out.Job.Item.Status != couchq.StatusRunning {
		t.Errorf("the job handed over: attempt %d of %d, status %s", out.Job.Attempt, out.Job.MaxAttempts, out.Job.Item.Status)
	}

	if out := run(Invoice{Customer: "busy"}, nil); out.Kind != couchqtest.Snoozed || out.SnoozeDelay != time.Minute || out.Result != nil {
		t.Errorf("snoozed: %+v", out)
	}
	if out := run(Invoice{}, nil); out.Kind != couchqtest.Cancelled || out.Err.Error() != "cancelled: no customer" {
		t.Errorf("cancelled: %+v", out)
	}
	if out := run(Invoice{Customer: "flaky"}, nil); out.Kind != couchqtest.Retry || out.Err.Error() != "printer offline" {
		t.Errorf("a plain error on the first attempt: %+v, want a retry", out)
	}
	if out := run(Invoice{Customer: "flaky"}, &couchqtest.RunOpts{Attempt: 3, MaxAttempts: 3}); out.Kind != couchqtest.Failed {
		t.Errorf("a plain error on the last attempt: %+v, want failed", out)
	}
	// A payload that does not decode fails at once, as under a worker.
	out = run(json.RawMessage(`{"pages":"many"}`), nil)
	if out.Kind != couchqtest.Failed || !strings.Contains(out.Err.Error(), "decoding payload") {
		t.Errorf("undecodable payload: %+v", out)
	}
	// Middleware wraps the handler as under a worker: its wrapping of a
	// steering error still steers.
	var seen []string
	tenant := func(ctx context.Context, job *worker.Job, next func(context.Context) error) error {
		seen = append(seen, "before "+job.Type)
		if err := next(ctx); err != nil {
			return fmt.Errorf("tenant acme: %w", err)
		}
		return nil
	}
	out = run(Invoice{}, &couchqtest.RunOpts{Middleware: []worker.Middleware{tenant}})
	if out.Kind != couchqtest.Cancelled || len(seen) != 1 || seen[0] != "before invoice" {
		t.Errorf("through middleware: %+v, middleware saw %q", out, seen)
	}
	// A job's own max_attempts counts.
	j := couchq.NewJob{Worker: "invoice", Payload: Invoice{Customer: "flaky"}, MaxAttempts: 1}
	if out := couchqtest.RunJob(ctx, t, h, j, nil); out.Kind != couchqtest.Failed {
		t.Errorf("one attempt allowed: %+v, want failed", out)
	}
}

// A panic is an error (a retry), logged with its stack; a bad job fails
// the test.
func TestRunJobPanicAndBadJob(t *testing.T) {
	ctx := context.Background()
	f := &fakeTB{TB: t}
	boom := worker.HandlerFunc(func(context.Context, *worker.Job) error { panic("boom") })
	out := couchqtest.RunJob(ctx, f, boom, couchq.NewJob{Worker: "x"}, nil)
	var perr *worker.PanicError
	if out.Kind != couchqtest.Retry || !errors.As(out.Err, &perr) || perr.Value != "boom" || out.Err.Error() != "handler panicked: boom" {
		t.Errorf("panic: %+v", out)
	}
	if len(f.logged) != 1 || !strings.Contains(f.logged[0], "panicked: boom") || !strings.Contains(f.logged[0], "goroutine") {
		t.Errorf("panic logged as %q", f.logged)
	}
	f = &fakeTB{TB: t}
	if out := couchqtest.RunJob(ctx, f, boom, couchq.NewJob{Worker: "x", Priority: 9}, nil); out != nil {
		t.Errorf("bad job ran: %+v", out)
	}
	f.failed(t, "building the job to run", "priority")
	f = &fakeTB{TB: t}
	if out := couchqtest.RunJob(ctx, f, nil, couchq.NewJob{Worker: "x"}, nil); out != nil {
		t.Errorf("a nil handler ran: %+v", out)
	}
	f.failed(t, "a nil handler")
	// The context is the caller's, cancellable: a handler sees it end.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	waits := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		<-ctx.Done()
		if err := job.Progress(ctx, 1, 2, ""); err == nil {
			t.Error("progress reported on a cancelled context")
		}
		return ctx.Err()
	})
	if out := couchqtest.RunJob(cctx, t, waits, couchq.NewJob{Worker: "x"}, nil); out.Kind != couchqtest.Retry || !errors.Is(out.Err, context.Canceled) {
		t.Errorf("cancelled context: %+v", out)
	}
}

// The example application code is tested against a real database, then
// the job it enqueued is run with the example handler.
func TestRequireEnqueued(t *testing.T) {
	ctx, q := openQueue(t)
	if err := billCustomer(ctx, q, "acme", 3, false); err != nil {
		t.Fatal(err)
	}
	if err := billCustomer(ctx, q, "globex", 12, true); err != nil {
		t.Fatal(err)
	}
	jobs := couchqtest.RequireEnqueued(ctx, t, q, "invoice", &couchqtest.RequireOpts{
		Payload: map[string]any{"customer": "globex"}, Priority: 1, DueBefore: time.Now().Add(time.Second), Count: 1,
	})
	out := couchqtest.RunJob(ctx, t, worker.Typed(renderInvoice), jobs[0], nil)
	if out.Kind != couchqtest.Done || string(out.Result) != `{"pages":12}` || out.Job.ID != jobs[0].ID {
		t.Fatalf("running the enqueued job: %+v", out)
	}
	couchqtest.RequireEnqueued(ctx, t, q, "invoice", &couchqtest.RequireOpts{
		Payload: Invoice{Customer: "acme", Pages: 3}, Priority: couchq.PriorityDefault,
		DueAfter: time.Now().Add(30 * time.Minute), Status: couchq.StatusQueued,
	})
	couchqtest.RequireEnqueued(ctx, t, q, "invoice", &couchqtest.RequireOpts{Count: 2})
	couchqtest.RequireNotEnqueued(ctx, t, q, "invoice", &couchqtest.RequireOpts{Payload: map[string]any{"customer": "initech"}})
	couchqtest.RequireNotEnqueued(ctx, t, q, "email", nil)

	// Failures say what was looked for and list what was found.
	f := &fakeTB{TB: t}
	if got := couchqtest.RequireEnqueued(ctx, f, q, "invoice", &couchqtest.RequireOpts{Payload: map[string]any{"customer": "initech"}, Priority: 1}); got != nil {
		t.Errorf("returned %d jobs on a failure", len(got))
	}
	msg := f.failed(t, `no invoice job with payload containing {"customer":"initech"}, priority 1 was enqueued`,
		"2 invoice jobs found:", `"customer":"acme"`, `"customer":"globex"`, "queued priority 1", "queued priority 3")
	t.Logf("a failure reads:\n%s", msg)
	if strings.Contains(msg, "(* matches)") {
		t.Errorf("nothing matched, yet marked:\n%s", msg)
	}

	f = &fakeTB{TB: t}
	couchqtest.RequireEnqueued(ctx, f, q, "invoice", &couchqtest.RequireOpts{Payload: map[string]any{"pages": 3}, Count: 2})
	f.failed(t, `want 2 invoice jobs with payload containing {"pages":3}, found 1`, "* job:", "(* matches)")

	f = &fakeTB{TB: t}
	couchqtest.RequireNotEnqueued(ctx, f, q, "invoice", &couchqtest.RequireOpts{DueBefore: time.Now().Add(time.Minute)})
	f.failed(t, "want no invoice job with due before", "found 1", `* `+jobs[0].ID)

	f = &fakeTB{TB: t}
	couchqtest.RequireEnqueued(ctx, f, q, "email", nil)
	f.failed(t, "no email job was enqueued", "the database holds no email job")

	f = &fakeTB{TB: t}
	couchqtest.RequireEnqueued(ctx, f, q, "invoice", &couchqtest.RequireOpts{Payload: func() {}})
	f.failed(t, "encoding the payload wanted")

	// No type is no test: it would match jobs of every type.
	f = &fakeTB{TB: t}
	couchqtest.RequireEnqueued(ctx, f, q, "", nil)
	f.failed(t, "the job type to look for is required")
	f = &fakeTB{TB: t}
	couchqtest.RequireNotEnqueued(ctx, f, nil, "invoice", nil)
	f.failed(t, "a nil client")
}
