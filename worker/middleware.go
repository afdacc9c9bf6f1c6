package worker

import (
	"context"

	"github.com/couchq/couchq/internal/jobrun"
)

// Middleware is a func(ctx context.Context, job *Job, next func(ctx
// context.Context) error) error that wraps every handler call of a worker
// (Config.Middleware): it runs code before and after the attempt, may change the context the
// handler gets, and sees the attempt's outcome as next's error. It must
// call next at most once; one that returns without calling it skips the
// handler, and what it returns is the attempt's outcome.
//
// Where it runs: the job is claimed, its run slot taken (Concurrency,
// FleetConcurrency) and, for a type with a sequence, its slot reserved
// (Job.Slot) before the outermost middleware starts; the lease is renewed
// while any middleware or the handler runs, and ctx is cancelled as the
// handler's is (a lost claim, a cancelled job, the shutdown timeout). The
// outcome is written after the outermost middleware returns.
//
// Errors: the steering errors (JobSnooze, JobCancel, JobFail) reach a
// middleware as the handler returned them, and are read from what the
// outermost middleware returns with errors.As, so a middleware passes them
// on by returning next's error, or an error wrapping it with %w. A panic in
// the handler is recovered before any middleware sees it and reaches them
// as a *PanicError (with the stack), so every middleware sees every outcome
// as an error it can report; a panic in a middleware is recovered too and
// fails the attempt.
type Middleware = jobrun.Middleware

// PanicError is what a handler's panic becomes: the attempt fails with it
// (and is retried like any failure). Value is what the handler panicked
// with and Stack the goroutine's stack where it did.
type PanicError = jobrun.PanicError

// invoke calls the handler through the worker's middleware, first in the
// list outermost, turning panics into errors (internal/jobrun, which
// couchqtest runs handlers with too).
func (r *runner) invoke(ctx context.Context, job *Job) error {
	return jobrun.Call(ctx, job, r.handler.Handle, r.w.cfg.Middleware, func(what string, p any, stack []byte) {
		r.w.log.Error().Str("job", job.ID).Str("type", job.Type).Interface("panic", p).
			Str("stack", string(stack)).Msg(what + " panicked")
	})
}
