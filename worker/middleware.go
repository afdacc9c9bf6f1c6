package worker

import (
	"context"
	"fmt"
	"runtime/debug"
)

// Middleware wraps every handler call of a worker (Config.Middleware): it
// runs code before and after the attempt, may change the context the
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
type Middleware func(ctx context.Context, job *Job, next func(ctx context.Context) error) error

// PanicError is what a handler's panic becomes: the attempt fails with it
// (and is retried like any failure). Value is what the handler panicked
// with and Stack the goroutine's stack where it did.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("handler panicked: %v", e.Value) }

// invoke calls the handler through the worker's middleware, first in the
// list outermost, turning panics into errors.
func (r *runner) invoke(ctx context.Context, job *Job) error {
	call := func(ctx context.Context) (err error) {
		defer func() {
			if p := recover(); p != nil {
				perr := &PanicError{Value: p, Stack: debug.Stack()}
				r.w.log.Error().Str("job", job.ID).Str("type", job.Type).Interface("panic", p).
					Str("stack", string(perr.Stack)).Msg("handler panicked")
				err = perr
			}
		}()
		return r.handler.Handle(ctx, job)
	}
	mw := r.w.cfg.Middleware
	if len(mw) == 0 {
		return call(ctx)
	}
	for i := len(mw) - 1; i >= 0; i-- {
		m, next := mw[i], call
		call = func(ctx context.Context) error { return m(ctx, job, next) }
	}
	return r.protect(ctx, job, call)
}

// protect runs the middleware chain, turning a middleware's own panic into
// a failed attempt rather than a crashed worker.
func (r *runner) protect(ctx context.Context, job *Job, chain func(context.Context) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.w.log.Error().Str("job", job.ID).Str("type", job.Type).Interface("panic", p).
				Str("stack", string(debug.Stack())).Msg("middleware panicked")
			err = fmt.Errorf("middleware panicked: %v", p)
		}
	}()
	return chain(ctx)
}
