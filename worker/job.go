package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/couchq"
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
	Item *couchq.WorkItem
	// Slot is the slot reserved for this attempt when the job type has a
	// sequence (Config.Sequences); "" otherwise.
	Slot string
	// Continuation is set when the job runs again after its handler
	// enqueued children and returned JobAwaitChildren, and they finished:
	// Item.After lists the children, whose results the handler may read.
	Continuation bool

	result   json.RawMessage
	client   *protocol.Client
	mu       sync.Mutex
	children []string
}

// EnqueueChild enqueues a child of the running job: its id is derived
// from the job's id and key (one child per key), so that a handler that
// runs again after its claim was lost enqueues the same children, not
// more. A child already there is returned as it is. A handler that then
// returns JobAwaitChildren waits for every child it enqueued (or found) in
// this run.
func (j *Job) EnqueueChild(ctx context.Context, key string, child couchq.NewJob) (*couchq.WorkItem, error) {
	if key == "" {
		return nil, fmt.Errorf("enqueueing a child of job %s: %w: the child key is empty", j.ID, couchq.ErrInvalidJob)
	}
	if j.client == nil {
		return nil, fmt.Errorf("enqueueing a child of job %s: the job is not run by a worker", j.ID)
	}
	child.ID = protocol.ChildID(j.ID, key)
	it, err := j.client.Enqueue(ctx, child)
	if kivik.HTTPStatus(err) == http.StatusConflict {
		// Enqueued by an earlier run of this job.
		it, err = j.client.Get(ctx, child.ID)
	}
	if err != nil {
		return nil, fmt.Errorf("enqueueing child %s of job %s: %w", key, j.ID, err)
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

// Handler runs jobs of one type. Returning nil completes the job; an error
// fails the attempt (retried with backoff until max attempts), unless it is
// one of the steering errors JobSnooze, JobCancel or JobFail.
type Handler interface {
	Handle(ctx context.Context, job *Job) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, job *Job) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, job *Job) error { return f(ctx, job) }

// Typed returns a Handler that decodes each job's payload into a T before
// calling fn. A payload that does not decode fails the job at once (no
// retry could fix it) with the decoding error.
func Typed[T any](fn func(ctx context.Context, job *Job, args T) error) Handler {
	return HandlerFunc(func(ctx context.Context, job *Job) error {
		args, err := DecodePayload[T](job.Payload)
		if err != nil {
			return JobFail(fmt.Errorf("job %s: %w", job.ID, err))
		}
		return fn(ctx, job, args)
	})
}

// DecodePayload decodes a payload into a T; a missing payload decodes as
// JSON null (T's zero value for most types).
func DecodePayload[T any](payload json.RawMessage) (T, error) {
	var args T
	if len(payload) == 0 {
		payload = json.RawMessage("null")
	}
	if err := json.Unmarshal(payload, &args); err != nil {
		return args, fmt.Errorf("decoding payload into %T: %w", args, err)
	}
	return args, nil
}

// SnoozeError asks for the job to run again after a delay, without
// counting the attempt.
type SnoozeError struct{ Delay time.Duration }

func (e *SnoozeError) Error() string { return fmt.Sprintf("snoozed for %s", e.Delay) }

// JobSnooze returns an error that puts the job back to queued, due after d,
// without charging the attempt.
func JobSnooze(d time.Duration) error { return &SnoozeError{Delay: d} }

// CancelError stops the job for good: its status becomes cancelled.
type CancelError struct{ Err error }

func (e *CancelError) Error() string { return fmt.Sprintf("cancelled: %v", e.Err) }
func (e *CancelError) Unwrap() error { return e.Err }

// JobCancel returns an error that cancels the job permanently with err as
// the reason.
func JobCancel(err error) error { return &CancelError{Err: err} }

// FailError fails the job now, without retries, whatever attempts remain.
type FailError struct{ Err error }

func (e *FailError) Error() string { return e.Err.Error() }
func (e *FailError) Unwrap() error { return e.Err }

// JobFail returns an error that fails the job permanently with err.
func JobFail(err error) error { return &FailError{Err: err} }

// AwaitChildrenError finishes the attempt as waiting for the children
// the handler enqueued (Job.EnqueueChild): the job runs again, with
// Job.Continuation set, once every child has finished, however it ended.
type AwaitChildrenError struct{}

func (e *AwaitChildrenError) Error() string { return "waiting for the job's children" }

// JobAwaitChildren returns the error that makes the job wait for the
// children its handler enqueued, without charging the attempt.
func JobAwaitChildren() error { return &AwaitChildrenError{} }

// steering classifies a handler's error.
func steering(err error) (snooze *SnoozeError, cancel *CancelError, fail *FailError) {
	errors.As(err, &snooze)
	errors.As(err, &cancel)
	errors.As(err, &fail)
	return snooze, cancel, fail
}
