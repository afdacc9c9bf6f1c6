package integration

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

const testTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// An enqueue hook's fields are stored in the document on every enqueue
// path: one job, many, a unique one and a periodic tick; the caller's job
// is left as it was.
func TestEnqueueHookAddsFields(t *testing.T) {
	var calls atomic.Int32
	now := time.Now()
	var clock sync.Mutex
	tb := setup(t, protocol.Config{
		Now: func() time.Time { clock.Lock(); defer clock.Unlock(); return now },
		BeforeEnqueue: []func(context.Context, *protocol.NewJob) error{
			func(ctx context.Context, j *protocol.NewJob) error {
				calls.Add(1)
				if j.Extra == nil {
					j.Extra = map[string]any{}
				}
				j.Extra["tenant"] = ctx.Value(ctxTenant{})
				return nil
			},
			func(ctx context.Context, j *protocol.NewJob) error {
				// Later hooks see what earlier ones set.
				if j.Extra["tenant"] == nil {
					return errors.New("no tenant")
				}
				j.Trace = map[string]string{"traceparent": testTraceparent, "tracestate": "vendor=1"}
				return nil
			},
		},
	})
	ctx := context.WithValue(tb.ctx, ctxTenant{}, "acme")
	mine := protocol.NewJob{Worker: "email", Extra: map[string]any{"region": "eu"}}
	one, err := tb.client.Enqueue(ctx, mine)
	if err != nil {
		t.Fatal(err)
	}
	if len(mine.Extra) != 1 || mine.Trace != nil {
		t.Fatalf("the hooks changed the caller's job: %+v", mine)
	}
	many, err := tb.client.EnqueueMany(ctx, []protocol.NewJob{{Worker: "email"}, {Worker: "email", Unique: protocol.UniqueOpts{Key: "k"}}})
	if err != nil {
		t.Fatal(err)
	}
	unique, err := tb.client.Enqueue(ctx, protocol.NewJob{Worker: "email", Unique: protocol.UniqueOpts{Key: "k2"}})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := tb.client.EnqueueBatch(ctx, []protocol.NewJob{{Worker: "email", ID: "batched-email"}}, protocol.NewJob{Worker: "report"})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{one.ID, unique.ID, "batched-email", protocol.BatchCallbackID(batch)}
	for _, r := range many {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		ids = append(ids, r.Item.ID)
	}
	// A periodic tick enqueues through the same hooks (here without a
	// tenant in its context: the schedule's own).
	sched := protocol.Periodic{Name: "nightly", Schedule: "@every 1s", Job: protocol.NewJob{Worker: "email"}}
	ticks, err := protocol.CheckPeriodic(sched)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := tb.client.TickPeriodic(ctx, sched, ticks, "test"); err != nil {
		t.Fatal(err)
	}
	clock.Lock()
	now = now.Add(1500 * time.Millisecond)
	clock.Unlock()
	_, ticked, err := tb.client.TickPeriodic(ctx, sched, ticks, "test")
	if err != nil || len(ticked) == 0 {
		t.Fatalf("periodic tick: %v %v", ticked, err)
	}
	ids = append(ids, ticked...)
	if n := calls.Load(); n != int32(len(ids)) {
		t.Fatalf("the hook ran %d times for %d jobs", n, len(ids))
	}
	for _, id := range ids {
		doc := rawDoc(t, tb.client, id)
		trace, _ := doc["trace"].(map[string]any)
		if doc["tenant"] != "acme" || trace["traceparent"] != testTraceparent || trace["tracestate"] != "vendor=1" {
			t.Fatalf("job %s as stored: tenant %v trace %v", id, doc["tenant"], doc["trace"])
		}
		it, err := tb.client.Get(tb.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if tenant, _ := it.Extra("tenant"); string(tenant) != `"acme"` || it.Trace["traceparent"] != testTraceparent {
			t.Fatalf("job %s as read: tenant %s trace %v", id, tenant, it.Trace)
		}
	}
	if doc := rawDoc(t, tb.client, one.ID); doc["region"] != "eu" {
		t.Fatalf("the caller's own extra field is lost: %v", doc)
	}
}

type ctxTenant struct{}

// A hook's error refuses the job with an error that wraps it and stores
// nothing; in a bulk enqueue it refuses that job only.
func TestEnqueueHookError(t *testing.T) {
	errNoTenant := errors.New("no tenant in context")
	tb := setup(t, protocol.Config{BeforeEnqueue: []func(context.Context, *protocol.NewJob) error{
		func(ctx context.Context, j *protocol.NewJob) error { return nil },
		func(ctx context.Context, j *protocol.NewJob) error {
			if j.Worker == "refused" {
				return errNoTenant
			}
			return nil
		},
	}})
	_, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "refused"})
	if !errors.Is(err, errNoTenant) || !strings.Contains(err.Error(), "refused by enqueue hook 1") {
		t.Fatalf("enqueue: %v", err)
	}
	res, err := tb.client.EnqueueMany(tb.ctx, []protocol.NewJob{{Worker: "refused"}, {Worker: "fine"}})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(res[0].Err, errNoTenant) || res[0].Item != nil || res[1].Err != nil {
		t.Fatalf("bulk: %+v", res)
	}
	// A batch with a refused job is refused whole: neither its jobs nor
	// its callback are written.
	if _, err := tb.client.EnqueueBatch(tb.ctx, []protocol.NewJob{{Worker: "fine", ID: "batched-fine"}, {Worker: "refused"}},
		protocol.NewJob{Worker: "fine"}); !errors.Is(err, errNoTenant) || !strings.Contains(err.Error(), "job 1 of the batch") {
		t.Fatalf("batch: %v", err)
	}
	if _, err := tb.client.EnqueueBatch(tb.ctx, []protocol.NewJob{{Worker: "fine", ID: "batched-fine"}},
		protocol.NewJob{Worker: "refused"}); !errors.Is(err, errNoTenant) || !strings.Contains(err.Error(), "callback") {
		t.Fatalf("batch with a refused callback: %v", err)
	}
	if _, err := tb.client.Get(tb.ctx, "batched-fine"); !errors.Is(err, protocol.ErrNotFound) {
		t.Fatalf("a job of a refused batch: %v", err)
	}
	if got := allJobs(t, tb, "refused"); len(got) != 0 {
		t.Fatalf("refused jobs were stored: %v", ids(got))
	}
	// The fields a hook may set are checked like the rest of the job.
	tb2 := setup(t, protocol.Config{BeforeEnqueue: []func(context.Context, *protocol.NewJob) error{
		func(ctx context.Context, j *protocol.NewJob) error {
			j.Extra = map[string]any{"status": "mine"}
			return nil
		},
	}})
	if _, err := tb2.client.Enqueue(tb2.ctx, protocol.NewJob{Worker: "w"}); !errors.Is(err, protocol.ErrInvalidJob) {
		t.Fatalf("an extra field named status: %v", err)
	}
}

// The trace field is checked by the design document's validation, as any
// producer writes it, and by the Go client before it writes.
func TestHookTraceFieldValidated(t *testing.T) {
	tb := setup(t, protocol.Config{})
	for _, tc := range []struct {
		trace string
		want  string // "" for accepted
	}{
		{`{"traceparent":"` + testTraceparent + `"}`, ""},
		{`{"traceparent":"` + testTraceparent + `","tracestate":"a=1,b=2"}`, ""},
		{`null`, ""},
		{`"` + testTraceparent + `"`, "trace must be an object"},
		{`{}`, "trace.traceparent is required"},
		{`{"traceparent":"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"}`, "trace.traceparent must be a W3C traceparent"},
		{`{"traceparent":"00-00000000000000000000000000000000-00f067aa0ba902b7-01"}`, "trace.traceparent must be a W3C traceparent"},
		{`{"traceparent":"` + testTraceparent + `","baggage":"k=v"}`, "trace may hold only traceparent and tracestate"},
		{`{"traceparent":"` + testTraceparent + `","tracestate":1}`, "trace.tracestate must be a string"},
	} {
		code, body := tb.raw(t, http.MethodPost, "", `{"type":"WorkItem","worker":"w","trace":`+tc.trace+`}`)
		switch {
		case tc.want == "" && code != http.StatusCreated:
			t.Errorf("trace %s: %d %s, want it stored", tc.trace, code, body)
		case tc.want != "" && (code != http.StatusForbidden || !strings.Contains(body, tc.want)):
			t.Errorf("trace %s: %d %s, want 403 saying %q", tc.trace, code, body, tc.want)
		}
	}
	for _, tr := range []map[string]string{{"traceparent": "zz"}, {"tracestate": "a=1"}, {"traceparent": testTraceparent, "b3": "x"}} {
		if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "w", Trace: tr}); !errors.Is(err, protocol.ErrInvalidJob) {
			t.Errorf("enqueue with trace %v: %v, want ErrInvalidJob", tr, err)
		}
	}
}

// Middleware in a running worker: every attempt passes through it in
// order, steering errors keep their meaning, and a panic reaches it as a
// *worker.PanicError before the attempt is retried.
func TestMiddlewareInWorker(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var mu sync.Mutex
	trail := map[string][]string{} // by job: the middleware it went through
	var panics atomic.Int32
	note := func(job *worker.Job, s string) { mu.Lock(); trail[job.ID] = append(trail[job.ID], s); mu.Unlock() }
	cfg := fastWorker(tb, map[string]worker.Handler{
		"snooze": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			if job.Item.History[len(job.Item.History)-2].Event != "snoozed" {
				return worker.JobSnooze(50 * time.Millisecond)
			}
			return nil
		}),
		"cancel": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			return worker.JobCancel(errors.New("not wanted"))
		}),
		"panic": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			if job.Attempt == 1 {
				panic("nil map")
			}
			return nil
		}),
	})
	cfg.Middleware = []worker.Middleware{
		func(ctx context.Context, job *worker.Job, next func(context.Context) error) error {
			note(job, "outer")
			err := next(ctx)
			var perr *worker.PanicError
			if errors.As(err, &perr) {
				panics.Add(1)
			}
			return err
		},
		func(ctx context.Context, job *worker.Job, next func(context.Context) error) error {
			note(job, "inner")
			if err := next(ctx); err != nil {
				return errors.Join(errors.New("seen by the inner middleware"), err)
			}
			return nil
		},
	}
	startWorker(t, tb, cfg)
	jobs := map[string]string{}
	for _, typ := range []string{"snooze", "cancel", "panic"} {
		it, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: typ})
		if err != nil {
			t.Fatal(err)
		}
		jobs[typ] = it.ID
	}
	it := waitStatus(t, tb, jobs["snooze"], protocol.StatusDone, 10*time.Second)
	if it.Attempts != 1 || events(it) != "enqueued claimed snoozed claimed done" {
		t.Fatalf("snoozed through middleware: attempts %d, history %s", it.Attempts, events(it))
	}
	it = waitStatus(t, tb, jobs["cancel"], protocol.StatusCancelled, 10*time.Second)
	if !strings.Contains(it.LastError, "not wanted") {
		t.Fatalf("cancelled through middleware: %q", it.LastError)
	}
	it = waitStatus(t, tb, jobs["panic"], protocol.StatusDone, 10*time.Second)
	if it.Attempts != 2 || !strings.Contains(it.History[2].Error, "handler panicked: nil map") || panics.Load() != 1 {
		t.Fatalf("panic through middleware: attempts %d, history %+v, middleware saw %d panics", it.Attempts, it.History, panics.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	// Each attempt went through both, outer first.
	for typ, runs := range map[string]int{"snooze": 2, "cancel": 1, "panic": 2} {
		got := strings.Join(trail[jobs[typ]], " ")
		if want := strings.TrimSpace(strings.Repeat("outer inner ", runs)); got != want {
			t.Errorf("%s job: middleware ran %q, want %q", typ, got, want)
		}
	}
}
