package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/couchq/couchq/internal/jobrun"
)

// Job is what a handler runs: one attempt of one claimed WorkItem. Its
// fields: ID, Type, Attempt (from 1), MaxAttempts, Payload (as stored),
// Item (the claimed document, read-only; Item.Progress is what the last
// attempt reported) and Slot (the sequence's slot, see Config.Sequences).
// Its methods: SetResult and Result (what is stored as the result when the
// attempt succeeds), Progress (how far the job got, shown by couchq show,
// ls and the dashboard; throttled, see Config.ProgressInterval) and
// EnqueueChild (a child job, with an id derived from the job's and a key,
// so that a run again after a lost claim makes no duplicates; see
// JobAwaitChildren). Continuation is set when the job runs again after its
// children finished.
type Job = jobrun.Job

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

// SnoozeError asks for the job to run again after a delay (Delay), without
// counting the attempt.
type SnoozeError = jobrun.SnoozeError

// JobSnooze returns an error that puts the job back to queued, due after d,
// without charging the attempt. A d of zero or less makes it due at once;
// since a snooze charges nothing, a handler that always snoozes runs the
// job for ever. d is a time.Duration: JobSnooze(30) is 30 nanoseconds.
func JobSnooze(d time.Duration) error { return &SnoozeError{Delay: d} }

// CancelError stops the job for good: its status becomes cancelled.
type CancelError = jobrun.CancelError

// JobCancel returns an error that cancels the job permanently with err as
// the reason.
func JobCancel(err error) error { return &CancelError{Err: err} }

// FailError fails the job now, without retries, whatever attempts remain.
type FailError = jobrun.FailError

// JobFail returns an error that fails the job permanently with err.
func JobFail(err error) error { return &FailError{Err: err} }

// AwaitChildrenError finishes the attempt as waiting for the children
// the handler enqueued (Job.EnqueueChild): the job runs again, with
// Job.Continuation set, once every child has finished, however it ended.
type AwaitChildrenError = jobrun.AwaitChildrenError

// JobAwaitChildren returns the error that makes the job wait for the
// children its handler enqueued, without charging the attempt.
func JobAwaitChildren() error { return &AwaitChildrenError{} }
