package otelcouchq_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/otelcouchq"
	"github.com/couchq/couchq/worker"
)

// server is the test server; nil in the worker process that
// TestOtelTraceAcrossProcesses starts (it is handed the server's address).
var server *couchtest.Server

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(m.Run())
	}
	couchtest.Main(m, func(s *couchtest.Server) { server = s })
}

// recorder is a tracer provider whose spans the test reads.
func recorder() (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	return sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)), rec
}

// The enqueue hook makes a producer span, child of the caller's, and
// stores its context in the job; a job that already carries a context
// keeps it.
func TestOtelEnqueueHook(t *testing.T) {
	tp, rec := recorder()
	hook := otelcouchq.EnqueueHook(otelcouchq.WithTracerProvider(tp))
	ctx, req := tp.Tracer("test").Start(context.Background(), "POST /signup")
	job := couchq.NewJob{Worker: "email"}
	if err := hook(ctx, &job); err != nil {
		t.Fatal(err)
	}
	req.End()
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	enq := spans[0]
	if enq.Name() != "enqueue email" || enq.SpanKind() != trace.SpanKindProducer || enq.Parent().SpanID() != req.SpanContext().SpanID() {
		t.Fatalf("enqueue span %q kind %v parent %v", enq.Name(), enq.SpanKind(), enq.Parent().SpanID())
	}
	want := fmt.Sprintf("00-%s-%s-01", enq.SpanContext().TraceID(), enq.SpanContext().SpanID())
	if job.Trace["traceparent"] != want {
		t.Fatalf("job trace %v, want traceparent %s", job.Trace, want)
	}

	const given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	job = couchq.NewJob{Worker: "email", Trace: map[string]string{"traceparent": given}}
	if err := hook(context.Background(), &job); err != nil {
		t.Fatal(err)
	}
	enq = rec.Ended()[2]
	if enq.Parent().TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || enq.Parent().SpanID().String() != "b7ad6b7169203331" {
		t.Fatalf("a job's own trace context: enqueue span's parent %v", enq.Parent())
	}
	if !strings.HasPrefix(job.Trace["traceparent"], "00-0af7651916cd43dd8448eb211c80319c-"+enq.SpanContext().SpanID().String()) {
		t.Fatalf("a job's own trace context became %v", job.Trace)
	}
	// A trace context that is no W3C one is left for the enqueue to
	// refuse, as without the hook: no trace of the job's own is started.
	ended := len(rec.Ended())
	job = couchq.NewJob{Worker: "email", Trace: map[string]string{"traceparent": "garbage"}}
	if err := hook(ctx, &job); err != nil || job.Trace["traceparent"] != "garbage" || len(rec.Ended()) != ended {
		t.Fatalf("a malformed trace context: %v, trace %v, %d spans more", err, job.Trace, len(rec.Ended())-ended)
	}
}

// jobWithTrace is a job as a worker hands it to middleware, enqueued in
// the trace of traceparent.
func jobWithTrace(traceparent string, attempt int) *worker.Job {
	item := &couchq.WorkItem{ID: "job:1", Worker: "email", Attempts: attempt, ClaimedAt: float64(time.Now().Unix()), ClaimedBy: "host/1/w1"}
	if traceparent != "" {
		item.Trace = map[string]string{"traceparent": traceparent}
	}
	return &worker.Job{ID: item.ID, Type: item.Worker, Attempt: attempt, MaxAttempts: 3, Item: item}
}

func attr(attrs []attribute.KeyValue, key string) string {
	for _, a := range attrs {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

// Each attempt runs in a consumer span, child of the enqueue span and
// linked to it, that the handler's spans nest in; its outcome is an
// attribute and failures an error status; the metrics count attempts and
// their durations by type and outcome.
func TestOtelMiddlewareSpansAndMetrics(t *testing.T) {
	tp, rec := recorder()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	mw := otelcouchq.Middleware(otelcouchq.WithTracerProvider(tp), otelcouchq.WithMeterProvider(mp))
	const enqTrace, enqSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	tparent := "00-" + enqTrace + "-" + enqSpan + "-01"

	cancelled, stop := context.WithCancel(context.Background())
	stop()
	for _, tc := range []struct {
		ctx     context.Context
		attempt int
		err     error
		outcome string
	}{
		{context.Background(), 1, nil, "done"},
		{context.Background(), 1, errors.New("smtp down"), "retry"},
		{context.Background(), 3, errors.New("smtp down"), "failed"},
		{context.Background(), 1, worker.JobFail(errors.New("bad address")), "failed"},
		{context.Background(), 1, fmt.Errorf("wrapped: %w", worker.JobSnooze(time.Minute)), "snoozed"},
		{context.Background(), 1, worker.JobCancel(errors.New("unsubscribed")), "cancelled"},
		{context.Background(), 3, worker.JobAwaitChildren(), "awaiting-children"},
		{context.Background(), 2, &worker.PanicError{Value: "nil map", Stack: []byte("goroutine 1 [running]:")}, "retry"},
		{cancelled, 1, context.Canceled, "interrupted"},
	} {
		before := len(rec.Ended())
		var inner trace.Span
		err := mw(tc.ctx, jobWithTrace(tparent, tc.attempt), func(ctx context.Context) error {
			_, inner = tp.Tracer("handler").Start(ctx, "send mail")
			inner.End()
			return tc.err
		})
		if err != tc.err {
			t.Fatalf("%s: middleware returned %v, want the handler's %v unchanged", tc.outcome, err, tc.err)
		}
		spans := rec.Ended()[before:]
		if len(spans) != 2 {
			t.Fatalf("%s: %d spans", tc.outcome, len(spans))
		}
		run := spans[1]
		if run.Name() != "run email" || run.SpanKind() != trace.SpanKindConsumer ||
			run.SpanContext().TraceID().String() != enqTrace || run.Parent().SpanID().String() != enqSpan {
			t.Fatalf("%s: run span %q kind %v trace %s parent %s", tc.outcome, run.Name(), run.SpanKind(), run.SpanContext().TraceID(), run.Parent().SpanID())
		}
		if len(run.Links()) != 1 || run.Links()[0].SpanContext.SpanID().String() != enqSpan {
			t.Fatalf("%s: links %v", tc.outcome, run.Links())
		}
		if spans[0].Parent().SpanID() != run.SpanContext().SpanID() {
			t.Fatalf("%s: the handler's span is not the run span's child", tc.outcome)
		}
		if got := attr(run.Attributes(), "couchq.job.outcome"); got != tc.outcome {
			t.Fatalf("outcome %q, want %q", got, tc.outcome)
		}
		if got := attr(run.Attributes(), "couchq.job.id"); got != "job:1" {
			t.Fatalf("job id %q", got)
		}
		failed := run.Status().Code == codes.Error
		if wantFailed := slices.Contains([]string{"retry", "failed", "interrupted"}, tc.outcome); failed != wantFailed {
			t.Fatalf("%s: status %v", tc.outcome, run.Status())
		}
		if evs := run.Events(); len(evs) == 0 || evs[0].Name != "claimed" {
			t.Fatalf("%s: events %v", tc.outcome, evs)
		}
		if _, ok := tc.err.(*worker.PanicError); ok && !strings.Contains(fmt.Sprint(run.Events()), "goroutine 1 [running]") {
			t.Fatalf("a panic's stack is not recorded: %v", run.Events())
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{}
	histograms := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					typ, _ := dp.Attributes.Value("couchq.job.type")
					out, _ := dp.Attributes.Value("couchq.job.outcome")
					counts[m.Name+" "+typ.String()+" "+out.String()] += dp.Value
				}
			case metricdata.Histogram[float64]:
				for _, dp := range data.DataPoints {
					out, _ := dp.Attributes.Value("couchq.job.outcome")
					histograms[m.Name+" "+out.String()] += dp.Count
					if len(dp.Bounds) == 0 || dp.Bounds[0] != 0.005 || dp.Bounds[len(dp.Bounds)-1] != 3600 {
						t.Fatalf("histogram buckets %v, want seconds from 5 ms to an hour", dp.Bounds)
					}
				}
			}
		}
	}
	wantCounts := map[string]int64{
		"couchq.job.runs email done": 1, "couchq.job.runs email retry": 2, "couchq.job.runs email failed": 2,
		"couchq.job.runs email snoozed": 1, "couchq.job.runs email cancelled": 1, "couchq.job.runs email interrupted": 1, "couchq.job.runs email awaiting-children": 1,
	}
	if fmt.Sprint(counts) != fmt.Sprint(wantCounts) {
		t.Fatalf("counts %v, want %v", counts, wantCounts)
	}
	if histograms["couchq.job.run.duration retry"] != 2 || histograms["couchq.job.run.duration done"] != 1 {
		t.Fatalf("histograms %v", histograms)
	}
}

// WithNewTracePerRun makes each attempt the root of its own trace, linked
// to the enqueue; a job without a trace context starts a trace anyway.
func TestOtelMiddlewareNewTracePerRun(t *testing.T) {
	tp, rec := recorder()
	mw := otelcouchq.Middleware(otelcouchq.WithTracerProvider(tp), otelcouchq.WithNewTracePerRun())
	const enq = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tparent := range []string{enq, ""} {
		if err := mw(context.Background(), jobWithTrace(tparent, 1), func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	linked, plain := rec.Ended()[0], rec.Ended()[1]
	if linked.Parent().IsValid() || linked.SpanContext().TraceID().String() == "4bf92f3577b34da6a3ce929d0e0e4736" ||
		len(linked.Links()) != 1 || linked.Links()[0].SpanContext.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("new trace per run: parent %v trace %s links %v", linked.Parent(), linked.SpanContext().TraceID(), linked.Links())
	}
	if plain.Parent().IsValid() || len(plain.Links()) != 0 || !plain.SpanContext().IsValid() {
		t.Fatalf("a job without a trace context: parent %v links %v", plain.Parent(), plain.Links())
	}
}
