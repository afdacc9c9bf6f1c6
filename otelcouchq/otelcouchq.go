// Package otelcouchq traces and measures couchq jobs with OpenTelemetry:
// a span when a job is enqueued, a span for each attempt a worker runs,
// joined into one trace through the job's trace field, and metrics of the
// attempts through the OpenTelemetry metric API.
//
// A producer adds EnqueueHook to its client's couchq.Config.BeforeEnqueue;
// the hook starts an "enqueue <type>" span (kind producer) as a child of
// the caller's span and stores its W3C trace context in the job's trace
// field ({"traceparent": ..., "tracestate": ...}), which programs in any
// language may write too. A worker adds Middleware to its
// worker.Config.Middleware; each attempt runs in a "run <type>" span (kind
// consumer) that is a child of the enqueue span and links to it, so that
// the request that enqueued a job and the attempts that ran it, on any
// machine and however much later, are one trace. WithNewTracePerRun makes
// each attempt a trace of its own, linked to the enqueue, for jobs
// scheduled far ahead.
//
// Traces and metrics go to the global providers (otel.GetTracerProvider,
// otel.GetMeterProvider) unless WithTracerProvider or WithMeterProvider
// name others; the core packages of couchq do not depend on OpenTelemetry.
package otelcouchq

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/worker"
)

// scope names this package as the instrumentation scope of its spans and
// metrics.
const scope = "github.com/couchq/couchq/otelcouchq"

// Attribute keys of the spans and metrics.
const (
	keyJobID   = attribute.Key("couchq.job.id")
	keyJobType = attribute.Key("couchq.job.type")
	keyAttempt = attribute.Key("couchq.job.attempt")
	keyOutcome = attribute.Key("couchq.job.outcome")
	keySystem  = attribute.Key("messaging.system")
	keyOp      = attribute.Key("messaging.operation.type")
)

// Option configures EnqueueHook and Middleware.
type Option func(*config)

type config struct {
	tracers     trace.TracerProvider
	meters      metric.MeterProvider
	newTraceRun bool
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.tracers == nil {
		c.tracers = otel.GetTracerProvider()
	}
	if c.meters == nil {
		c.meters = otel.GetMeterProvider()
	}
	return c
}

// WithTracerProvider sends spans to tp rather than the global provider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracers = tp }
}

// WithMeterProvider records metrics with mp rather than the global
// provider.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.meters = mp }
}

// WithNewTracePerRun starts each attempt's span as the root of a trace of
// its own, linked to the enqueue span rather than its child: for jobs that
// run long after they were enqueued (scheduled days ahead, retried over
// hours), where one trace would otherwise stay open that long.
func WithNewTracePerRun() Option {
	return func(c *config) { c.newTraceRun = true }
}

// EnqueueHook returns a hook for couchq.Config.BeforeEnqueue that starts an
// "enqueue <type>" span as a child of the caller's span and stores its
// trace context in the job's trace field, for Middleware to continue. A
// job that already carries a trace context stays in that trace: the span
// is the child of the span it names, rather than of the caller's. The
// span marks the moment the job was made: the write
// that follows is the caller's.
func EnqueueHook(opts ...Option) func(ctx context.Context, job *couchq.NewJob) error {
	c := newConfig(opts)
	tracer := c.tracers.Tracer(scope)
	// W3C Trace Context only, whatever the global propagator is: the
	// field is documented as that format for producers in any language.
	var traceContext propagation.TraceContext
	return func(ctx context.Context, job *couchq.NewJob) error {
		if len(job.Trace) > 0 {
			given := traceContext.Extract(ctx, propagation.MapCarrier(job.Trace))
			if sc := trace.SpanContextFromContext(given); !sc.IsValid() || !sc.IsRemote() {
				// A trace context that is no W3C one: leave it for the
				// enqueue to refuse, as it would without this hook, rather
				// than start the job a trace of its own.
				return nil
			}
			ctx = given
		}
		attrs := []attribute.KeyValue{keySystem.String("couchq"), keyOp.String("create"), keyJobType.String(job.Worker)}
		if job.ID != "" {
			attrs = append(attrs, keyJobID.String(job.ID))
		}
		ctx, span := tracer.Start(ctx, "enqueue "+job.Worker, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
		defer span.End()
		carrier := propagation.MapCarrier{}
		traceContext.Inject(ctx, carrier)
		if len(carrier) > 0 {
			job.Trace = carrier
		}
		return nil
	}
}

// Middleware returns a worker middleware that runs each attempt in a
// "run <type>" span continuing the job's trace field (see the package
// comment), with an event when the job was claimed, and records two
// metrics per attempt, by job type and outcome:
//
//   - couchq.job.runs: attempts run (a counter);
//   - couchq.job.run.duration: how long they ran, in seconds (a histogram).
//
// The outcome (attribute couchq.job.outcome) is done, snoozed, cancelled,
// failed (no attempt left, or JobFail), retry (a failed attempt that will
// be retried) or interrupted (the job's context ended: a lost claim, a
// cancel or the worker's shutdown). Failures set the span's status to
// error and record the error (with the stack of a panic).
//
// List it first in worker.Config.Middleware so that the span covers the
// other middleware too.
func Middleware(opts ...Option) worker.Middleware {
	c := newConfig(opts)
	tracer := c.tracers.Tracer(scope)
	meter := c.meters.Meter(scope)
	runs, err := meter.Int64Counter("couchq.job.runs",
		metric.WithDescription("Job attempts run by workers, by job type and outcome."), metric.WithUnit("{attempt}"))
	if err != nil {
		otel.Handle(err) // the meter still returns a usable (no-op) instrument
	}
	took, err := meter.Float64Histogram("couchq.job.run.duration",
		metric.WithDescription("How long job attempts ran, by job type and outcome."), metric.WithUnit("s"),
		// The SDK's default buckets are for milliseconds; jobs run from
		// milliseconds to an hour.
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600))
	if err != nil {
		otel.Handle(err)
	}
	var traceContext propagation.TraceContext // as in EnqueueHook
	return func(ctx context.Context, job *worker.Job, next func(context.Context) error) error {
		attrs := []attribute.KeyValue{keySystem.String("couchq"), keyOp.String("process"),
			keyJobID.String(job.ID), keyJobType.String(job.Type), keyAttempt.Int(job.Attempt)}
		start := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)}
		runCtx := ctx
		if job.Item != nil && len(job.Item.Trace) > 0 {
			enqueued := traceContext.Extract(ctx, propagation.MapCarrier(job.Item.Trace))
			if sc := trace.SpanContextFromContext(enqueued); sc.IsValid() {
				start = append(start, trace.WithLinks(trace.Link{SpanContext: sc}))
				if c.newTraceRun {
					start = append(start, trace.WithNewRoot())
				} else {
					runCtx = enqueued
				}
			}
		}
		runCtx, span := tracer.Start(runCtx, "run "+job.Type, start...)
		defer span.End()
		if job.Item != nil && job.Item.ClaimedAt > 0 {
			claimed := time.UnixMicro(int64(job.Item.ClaimedAt * 1e6)) // stored as Unix seconds
			span.AddEvent("claimed", trace.WithTimestamp(claimed),
				trace.WithAttributes(attribute.String("couchq.job.claimed_by", job.Item.ClaimedBy)))
		}
		// runCtx is the worker's context (its cancellation) with the run
		// span in it: the handler's own spans are its children.
		began := time.Now()
		err := next(runCtx)
		elapsed := time.Since(began)

		outcome := outcomeOf(ctx, job, err)
		span.SetAttributes(keyOutcome.String(outcome))
		switch outcome {
		case "done", "snoozed", "cancelled", "awaiting-children":
		default:
			var stack []trace.EventOption
			var perr *worker.PanicError
			if errors.As(err, &perr) {
				stack = append(stack, trace.WithAttributes(attribute.String("exception.stacktrace", string(perr.Stack))))
			}
			span.RecordError(err, stack...)
			span.SetStatus(codes.Error, err.Error())
		}
		set := metric.WithAttributeSet(attribute.NewSet(keyJobType.String(job.Type), keyOutcome.String(outcome)))
		runs.Add(ctx, 1, set)
		took.Record(ctx, elapsed.Seconds(), set)
		return err
	}
}

// outcomeOf names what the worker makes of an attempt's error.
func outcomeOf(ctx context.Context, job *worker.Job, err error) string {
	var snooze *worker.SnoozeError
	var cancel *worker.CancelError
	var fail *worker.FailError
	var await *worker.AwaitChildrenError
	switch {
	case err == nil:
		return "done"
	case errors.As(err, &await):
		return "awaiting-children"
	case errors.As(err, &snooze):
		return "snoozed"
	case errors.As(err, &cancel):
		return "cancelled"
	case errors.As(err, &fail):
		return "failed"
	case ctx.Err() != nil:
		return "interrupted"
	case job.Attempt >= job.MaxAttempts:
		return "failed"
	}
	return "retry"
}
