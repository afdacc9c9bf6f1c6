// Package jobrun is one attempt of a job as its handler sees it: the Job,
// the errors that steer its outcome, the call of the handler and the
// outcome it comes to. The worker runs attempts of claimed jobs with it and
// couchqtest runs them in a test without a server, so that a handler
// tested with couchqtest sees exactly what it sees under a worker.
//
// worker re-exports Job and the steering errors as aliases: their methods
// here are promises of the worker package.
package jobrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/couchq/couchq/internal/protocol"
)

// Job is what a handler runs: one attempt of one claimed WorkItem.
type Job struct {
	// ID is the document id.
	ID string
	// Type is the job type (the document's "worker" field).
	Type string
	// Attempt counts from 1 for the first attempt.
	Attempt int
	// MaxAttempts is how many attempts the job gets in all.
	MaxAttempts int
	// Payload is the document's payload as stored (nil when absent).
	Payload json.RawMessage
	// Item is the claimed document; handlers must treat it as read-only.
	// Item.Progress is what the last attempt reported, where a retry may
	// resume.
	Item *protocol.WorkItem
	// Slot is the slot reserved for this attempt when the job type has a
	// sequence (Config.Sequences); "" otherwise.
	Slot string
	// Continuation is set when the job runs again after its handler
	// enqueued children and returned JobAwaitChildren, and they finished:
	// Item.After lists the children, whose results the handler may read.
	Continuation bool

	result   json.RawMessage
	reporter Reporter
	now      func() time.Time
	// client enqueues children (EnqueueChild); nil outside a worker.
	client   *protocol.Client
	mu       sync.Mutex
	children []string
}

// Reporter takes a job's progress reports: the worker writes them to the
// document (throttled), couchqtest keeps them for the test.
type Reporter interface {
	Report(p *protocol.Progress)
}

// New is the Job of one attempt of item, whose progress reports go to
// reporter (nil: checked, then dropped) stamped with now.
func New(item *protocol.WorkItem, maxAttempts int, reporter Reporter, now func() time.Time) *Job {
	if now == nil {
		now = time.Now
	}
	return &Job{
		ID: item.ID, Type: item.Worker, Attempt: item.Attempts, MaxAttempts: maxAttempts,
		Payload: item.Payload, Item: item.Clone(), Continuation: item.Continuation, reporter: reporter, now: now,
	}
}

// Attach gives job the client its handler enqueues children through
// (EnqueueChild).
func Attach(job *Job, c *protocol.Client) { job.client = c }

// ChildrenOf lists the children job's handler enqueued (or found) in this
// run, for JobAwaitChildren.
func ChildrenOf(job *Job) []string {
	job.mu.Lock()
	defer job.mu.Unlock()
	return slices.Clone(job.children)
}

// EnqueueChild enqueues a child of the running job: its id is derived
// from the job's id and key (one child per key), so that a handler that
// runs again after its claim was lost enqueues the same children, not
// more. A child already there is returned as it is; a job at the child's
// id that names another parent (or none) in child_of is an error, since
// someone else wrote it. A handler that then
// returns JobAwaitChildren waits for every child it enqueued (or found) in
// this run.
func (j *Job) EnqueueChild(ctx context.Context, key string, child protocol.NewJob) (*protocol.WorkItem, error) {
	if j.client == nil {
		return nil, fmt.Errorf("enqueueing a child of job %s: the job is not run by a worker", j.ID)
	}
	it, err := j.client.EnqueueChild(ctx, j.ID, key, child)
	if err != nil {
		return nil, err
	}
	j.mu.Lock()
	if !slices.Contains(j.children, it.ID) {
		j.children = append(j.children, it.ID)
	}
	j.mu.Unlock()
	return it, nil
}

// SetResult records what the job produced. It is stored in the document's
// "result" field when the attempt succeeds. v is encoded with encoding/json
// (a json.RawMessage is stored as it is, if valid).
func (j *Job) SetResult(v any) error {
	if raw, ok := v.(json.RawMessage); ok {
		if !json.Valid(raw) {
			return fmt.Errorf("result of job %s is not valid JSON", j.ID)
		}
		j.result = raw
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding result of job %s: %w", j.ID, err)
	}
	j.result = b
	return nil
}

// Result is what SetResult recorded.
func (j *Job) Result() json.RawMessage { return j.result }

// Progress reports how far the job got: done out of total units (total 0
// when unknown), with a short note ("page 40"; cut to 200 bytes). It does
// not wait for a write: the worker stores the latest report with the job's
// next lease renewal, or on its own at most once per
// worker.Config.ProgressInterval, and the last one with the job's outcome, so a
// handler may call it as often as it likes. It fails only on a report that
// makes no sense (a negative count, done above a non-zero total) or once
// ctx is done; the claim is never lost to a progress write.
func (j *Job) Progress(ctx context.Context, done, total int, note string) error {
	if ctx.Err() != nil {
		return fmt.Errorf("reporting progress of job %s: %w", j.ID, context.Cause(ctx))
	}
	now := time.Now
	if j.now != nil {
		now = j.now
	}
	p, err := protocol.NewProgress(done, total, note, now())
	if err != nil {
		return fmt.Errorf("reporting progress of job %s: %w", j.ID, err)
	}
	if j.reporter != nil {
		j.reporter.Report(p)
	}
	return nil
}

// SnoozeError asks for the job to run again after a delay, without
// counting the attempt.
type SnoozeError struct{ Delay time.Duration }

func (e *SnoozeError) Error() string { return fmt.Sprintf("snoozed for %s", e.Delay) }

// CancelError stops the job for good: its status becomes cancelled.
type CancelError struct{ Err error }

func (e *CancelError) Error() string {
	if e.Err == nil {
		return "cancelled"
	}
	return fmt.Sprintf("cancelled: %v", e.Err)
}
func (e *CancelError) Unwrap() error { return e.Err }

// AwaitChildrenError finishes the attempt as waiting for the children
// the handler enqueued (Job.EnqueueChild): the job runs again, with
// Job.Continuation set, once every child has finished, however it ended.
type AwaitChildrenError struct{}

func (e *AwaitChildrenError) Error() string { return "waiting for the job's children" }

// FailError fails the job now, without retries, whatever attempts remain.
type FailError struct{ Err error }

func (e *FailError) Error() string {
	if e.Err == nil {
		// JobFail(err) with an err that happened to be nil still fails the
		// job for good: it must not take the worker down with it.
		return "failed for good (no error given)"
	}
	return e.Err.Error()
}
func (e *FailError) Unwrap() error { return e.Err }

// Middleware wraps a handler call; worker.Middleware documents it.
type Middleware func(ctx context.Context, job *Job, next func(ctx context.Context) error) error

// PanicError is what a handler's panic becomes: the attempt fails with it
// (and is retried like any failure). Value is what the handler panicked
// with and Stack the goroutine's stack where it did.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("handler panicked: %v", e.Value) }

// Call runs handle on job through mw, the first in the list outermost. A
// handler's panic is recovered before any middleware sees it and becomes a
// *PanicError; a middleware's own panic fails the attempt with an error
// naming it. onPanic, when set, is told of each, what ("handler" or
// "middleware") with its value and stack.
func Call(ctx context.Context, job *Job, handle func(context.Context, *Job) error, mw []Middleware,
	onPanic func(what string, p any, stack []byte)) error {
	call := func(ctx context.Context) (err error) {
		defer func() {
			if p := recover(); p != nil {
				perr := &PanicError{Value: p, Stack: debug.Stack()}
				if onPanic != nil {
					onPanic("handler", p, perr.Stack)
				}
				err = perr
			}
		}()
		return handle(ctx, job)
	}
	if len(mw) == 0 {
		return call(ctx)
	}
	for i := len(mw) - 1; i >= 0; i-- {
		m, next := mw[i], call
		call = func(ctx context.Context) error { return m(ctx, job, next) }
	}
	return protect(ctx, call, onPanic)
}

// protect runs the middleware chain, turning a middleware's own panic into
// a failed attempt rather than a crashed worker.
func protect(ctx context.Context, chain func(context.Context) error, onPanic func(what string, p any, stack []byte)) (err error) {
	defer func() {
		if p := recover(); p != nil {
			if onPanic != nil {
				onPanic("middleware", p, debug.Stack())
			}
			err = fmt.Errorf("middleware panicked: %v", p)
		}
	}()
	return chain(ctx)
}

// Kind is what becomes of a job after an attempt.
type Kind string

// The outcomes of an attempt.
const (
	Done      Kind = "done"      // completed, with its result
	Retry     Kind = "retry"     // failed; queued again after a backoff
	Failed    Kind = "failed"    // failed for good (JobFail, or no attempts left)
	Cancelled Kind = "cancelled" // cancelled for good (JobCancel)
	Snoozed   Kind = "snoozed"   // queued again after Delay, the attempt not charged
	// AwaitingChildren: waiting for the children the handler enqueued
	// (JobAwaitChildren); it runs again once they have finished.
	AwaitingChildren Kind = "awaiting-children"
)

// Outcome is what an attempt comes to, from the handler's error.
type Outcome struct {
	Kind Kind
	// Delay is a snooze's delay.
	Delay time.Duration
	// Err is the handler's error (nil when done; a cancel's CancelError).
	Err error
}

// Decide reads the handler's error: nil is done; JobSnooze, JobCancel and
// JobFail steer; any other error is a retry while attempts remain (the
// attempt-th of maxAttempts), else failed.
func Decide(err error, attempt, maxAttempts int) Outcome {
	if err == nil {
		return Outcome{Kind: Done}
	}
	var snooze *SnoozeError
	var cancel *CancelError
	var fail *FailError
	var await *AwaitChildrenError
	switch {
	case errors.As(err, &await):
		return Outcome{Kind: AwaitingChildren, Err: err}
	case errors.As(err, &snooze):
		return Outcome{Kind: Snoozed, Delay: snooze.Delay, Err: err}
	case errors.As(err, &cancel):
		return Outcome{Kind: Cancelled, Err: cancel} // its message is the reason stored
	case errors.As(err, &fail), attempt >= maxAttempts:
		return Outcome{Kind: Failed, Err: err}
	}
	return Outcome{Kind: Retry, Err: err}
}
