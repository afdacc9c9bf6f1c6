package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

type ctxKey string

// runnerWith is a runner of handler through middleware, enough to invoke.
func runnerWith(t *testing.T, handler Handler, mw ...Middleware) *runner {
	return &runner{
		w:       &Worker{cfg: Config{Middleware: mw}, log: zerolog.New(zerolog.NewTestWriter(t))},
		typ:     "t",
		handler: handler,
	}
}

// recording is a middleware that notes its name before and after next, and
// hands the handler a context value naming it.
func recording(name string, trail *[]string) Middleware {
	return func(ctx context.Context, job *Job, next func(context.Context) error) error {
		*trail = append(*trail, name+" before")
		err := next(context.WithValue(ctx, ctxKey(name), true))
		*trail = append(*trail, fmt.Sprintf("%s after (%v)", name, err))
		return err
	}
}

// The first middleware is outermost; each sees the handler's error and the
// handler sees every middleware's context.
func TestMiddlewareOrder(t *testing.T) {
	var trail []string
	r := runnerWith(t, HandlerFunc(func(ctx context.Context, job *Job) error {
		trail = append(trail, fmt.Sprintf("handler a=%v b=%v", ctx.Value(ctxKey("a")), ctx.Value(ctxKey("b"))))
		return errors.New("boom")
	}), recording("a", &trail), recording("b", &trail))
	err := r.invoke(context.Background(), &Job{ID: "j", Type: "t"})
	if err == nil || err.Error() != "boom" {
		t.Fatalf("invoke: %v, want boom", err)
	}
	want := []string{"a before", "b before", "handler a=true b=true", "b after (boom)", "a after (boom)"}
	if !slices.Equal(trail, want) {
		t.Fatalf("trail:\n%s\nwant:\n%s", strings.Join(trail, "\n"), strings.Join(want, "\n"))
	}
}

// A handler's panic reaches the middleware as a *PanicError with its stack;
// a middleware's own panic fails the attempt instead of the worker.
func TestMiddlewareSeesPanic(t *testing.T) {
	var seen error
	r := runnerWith(t, HandlerFunc(func(ctx context.Context, job *Job) error { panic("kaput") }),
		func(ctx context.Context, job *Job, next func(context.Context) error) error {
			seen = next(ctx)
			return seen
		})
	err := r.invoke(context.Background(), &Job{ID: "j", Type: "t"})
	var perr *PanicError
	if !errors.As(seen, &perr) || perr.Value != "kaput" || !strings.Contains(string(perr.Stack), "middleware_test.go") {
		t.Fatalf("middleware saw %#v, want a *PanicError of kaput with the handler's stack", seen)
	}
	if err != seen || err.Error() != "handler panicked: kaput" {
		t.Fatalf("invoke: %v", err)
	}

	r = runnerWith(t, HandlerFunc(func(ctx context.Context, job *Job) error { return nil }),
		func(ctx context.Context, job *Job, next func(context.Context) error) error { panic("in middleware") })
	if err := r.invoke(context.Background(), &Job{ID: "j", Type: "t"}); err == nil || !strings.Contains(err.Error(), "middleware panicked: in middleware") {
		t.Fatalf("invoke with a panicking middleware: %v", err)
	}
	// Without middleware a panic is still an error.
	r = runnerWith(t, HandlerFunc(func(ctx context.Context, job *Job) error { panic(42) }))
	if err := r.invoke(context.Background(), &Job{ID: "j", Type: "t"}); !errors.As(err, &perr) || perr.Value != 42 {
		t.Fatalf("invoke without middleware: %v", err)
	}
}

// Steering errors pass through middleware that returns next's error as it
// is or wrapped with %w, and a middleware may steer by itself.
func TestMiddlewarePassesSteeringErrors(t *testing.T) {
	wrapping := func(ctx context.Context, job *Job, next func(context.Context) error) error {
		if err := next(ctx); err != nil {
			return fmt.Errorf("tenant acme: %w", err)
		}
		return nil
	}
	var trail []string
	for _, tc := range []struct {
		name   string
		err    error
		snooze bool
		cancel bool
		fail   bool
	}{
		{"snooze", JobSnooze(time.Minute), true, false, false},
		{"cancel", JobCancel(errors.New("not wanted")), false, true, false},
		{"fail", JobFail(errors.New("hopeless")), false, false, true},
	} {
		r := runnerWith(t, HandlerFunc(func(ctx context.Context, job *Job) error { return tc.err }),
			recording("plain", &trail), wrapping)
		err := r.invoke(context.Background(), &Job{ID: "j", Type: "t"})
		snooze, cancel, fail := steering(err)
		if (snooze != nil) != tc.snooze || (cancel != nil) != tc.cancel || (fail != nil) != tc.fail {
			t.Fatalf("%s: steering of %v: snooze %v cancel %v fail %v", tc.name, err, snooze, cancel, fail)
		}
		if snooze != nil && snooze.Delay != time.Minute {
			t.Fatalf("snooze delay %s", snooze.Delay)
		}
	}

	// A middleware that does not call next skips the handler and steers.
	ran := false
	r := runnerWith(t, HandlerFunc(func(ctx context.Context, job *Job) error { ran = true; return nil }),
		func(ctx context.Context, job *Job, next func(context.Context) error) error {
			return JobSnooze(time.Second)
		})
	if snooze, _, _ := steering(r.invoke(context.Background(), &Job{ID: "j", Type: "t"})); snooze == nil || ran {
		t.Fatalf("a middleware's own snooze: snooze %v, handler ran %v", snooze, ran)
	}
}

// A nil middleware is refused when the worker is made, not when a job runs.
func TestMiddlewareNilRefused(t *testing.T) {
	cfg := Config{Handlers: map[string]Handler{"t": HandlerFunc(func(context.Context, *Job) error { return nil })},
		Middleware: []Middleware{nil}}.WithDefaults()
	if err := cfg.validate(); err == nil || !strings.Contains(err.Error(), "middleware 0 is nil") {
		t.Fatalf("validate: %v", err)
	}
}

// steering classifies an attempt's error as the worker does (it reads
// them with errors.As, in internal/jobrun's Decide).
func steering(err error) (snooze *SnoozeError, cancel *CancelError, fail *FailError) {
	errors.As(err, &snooze)
	errors.As(err, &cancel)
	errors.As(err, &fail)
	return snooze, cancel, fail
}
