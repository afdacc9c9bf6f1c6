package otelcouchq_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/otelcouchq"
	"github.com/couchq/couchq/worker"
)

// The worker process of TestOtelTraceAcrossProcesses is this test binary
// again, running TestHelperProcess with these variables set.
const (
	helperEnv      = "OTELCOUCHQ_HELPER" // the file it writes its spans to
	helperURL      = "OTELCOUCHQ_URL"
	helperUser     = "OTELCOUCHQ_USER"
	helperPassword = "OTELCOUCHQ_PASSWORD"
	helperDB       = "OTELCOUCHQ_DB"
)

// spanJSON is a span as the worker process reports it to the test.
type spanJSON struct {
	Name    string            `json:"name"`
	Kind    string            `json:"kind"`
	TraceID string            `json:"trace_id"`
	SpanID  string            `json:"span_id"`
	Parent  string            `json:"parent"` // the parent's span id; "" for a root
	Links   []string          `json:"links"`  // trace id/span id
	Attrs   map[string]string `json:"attrs"`
	Events  []string          `json:"events"`
}

// A request's span, the job it enqueued and the attempt a worker in another
// process ran are one trace: the run span is the enqueue span's child and
// links to it, and the handler's own span is the run span's child. A job a
// program wrote by hand with a traceparent continues that trace too.
func TestOtelTraceAcrossProcesses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	user, password := server.Credentials()
	srv, err := couchq.Connect(ctx, server.URL(), user, password)
	if err != nil {
		t.Fatal(err)
	}
	db := server.UniqueDBName(t)
	if err := srv.Init(ctx, db, couchq.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	q, err := srv.Open(ctx, db, couchq.Config{
		BeforeEnqueue: []func(context.Context, *couchq.NewJob) error{otelcouchq.EnqueueHook(otelcouchq.WithTracerProvider(tp))},
	})
	if err != nil {
		t.Fatal(err)
	}
	reqCtx, req := tp.Tracer("test").Start(ctx, "POST /signup", trace.WithSpanKind(trace.SpanKindServer))
	job, err := q.Enqueue(reqCtx, couchq.NewJob{Worker: "email", Payload: map[string]string{"to": "ada@example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	// Its first attempt fails: the second continues the same trace.
	flaky, err := q.Enqueue(reqCtx, couchq.NewJob{Worker: "email", Payload: map[string]string{"to": "bob@example.com", "fail": "once"}})
	if err != nil {
		t.Fatal(err)
	}
	req.End()
	// A producer in another language writes the field by hand.
	const handTrace, handSpan = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	if _, err := q.DB().Put(ctx, "job:by-hand", map[string]any{
		"type": "WorkItem", "worker": "email", "trace": map[string]string{"traceparent": "00-" + handTrace + "-" + handSpan + "-01"},
	}); err != nil {
		t.Fatal(err)
	}
	var enqueues []tracetest.SpanStub
	for _, s := range exporter.GetSpans() {
		if s.Name == "enqueue email" {
			enqueues = append(enqueues, s)
		}
	}
	if len(enqueues) != 2 {
		t.Fatalf("%d enqueue spans", len(enqueues))
	}
	for _, e := range enqueues {
		if !e.SpanContext.IsValid() || e.Parent.SpanID() != req.SpanContext().SpanID() || e.SpanKind != trace.SpanKindProducer {
			t.Fatalf("enqueue span %+v is not the request's child", e)
		}
	}
	enqueue, enqueueFlaky := enqueues[0], enqueues[1]

	out := filepath.Join(t.TempDir(), "spans.json")
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+out, helperURL+"="+server.URL(), helperUser+"="+user,
		helperPassword+"="+password, helperDB+"="+db)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("worker process: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var spans []spanJSON
	if err := json.Unmarshal(b, &spans); err != nil {
		t.Fatal(err)
	}
	runs := map[string]spanJSON{} // by job id, and attempt for the flaky job
	var handler []spanJSON
	for _, s := range spans {
		switch s.Name {
		case "run email":
			key := s.Attrs["couchq.job.id"]
			if key == flaky.ID {
				key += "#" + s.Attrs["couchq.job.attempt"]
			}
			runs[key] = s
		case "send mail":
			handler = append(handler, s)
		}
	}
	if len(runs) != 4 || len(handler) != 4 {
		t.Fatalf("the worker process recorded %d runs and %d handler spans: %+v", len(runs), len(handler), spans)
	}
	run := runs[job.ID]
	enqTrace, enqSpan := enqueue.SpanContext.TraceID().String(), enqueue.SpanContext.SpanID().String()
	if run.TraceID != req.SpanContext().TraceID().String() || run.TraceID != enqTrace || run.Parent != enqSpan {
		t.Fatalf("run span %+v is not in the request's trace (%s) as the enqueue span's (%s) child", run, enqTrace, enqSpan)
	}
	if len(run.Links) != 1 || run.Links[0] != enqTrace+"/"+enqSpan {
		t.Fatalf("run span links %v, want the enqueue span", run.Links)
	}
	if run.Kind != "consumer" || run.Attrs["couchq.job.outcome"] != "done" || run.Attrs["couchq.job.attempt"] != "1" {
		t.Fatalf("run span %+v", run)
	}
	if len(run.Events) == 0 || run.Events[0] != "claimed" {
		t.Fatalf("run span events %v", run.Events)
	}
	flakySpan := enqueueFlaky.SpanContext.SpanID().String()
	for attempt, outcome := range map[string]string{"1": "retry", "2": "done"} {
		r := runs[flaky.ID+"#"+attempt]
		if r.TraceID != enqTrace || r.Parent != flakySpan || r.Attrs["couchq.job.outcome"] != outcome {
			t.Fatalf("attempt %s of the flaky job: %+v, want a child of %s with outcome %s", attempt, r, flakySpan, outcome)
		}
	}
	hand := runs["job:by-hand"]
	if hand.TraceID != handTrace || hand.Parent != handSpan {
		t.Fatalf("the hand-written job's run span %+v, want trace %s, parent %s", hand, handTrace, handSpan)
	}
	runIDs := map[string]bool{}
	for _, r := range runs {
		runIDs[r.SpanID] = true
	}
	for _, h := range handler {
		if !runIDs[h.Parent] {
			t.Fatalf("handler span %+v is no run span's child", h)
		}
	}
	for _, id := range []string{job.ID, flaky.ID, "job:by-hand"} {
		it, err := q.Get(ctx, id)
		if err != nil || it.Status != couchq.StatusDone {
			t.Fatalf("job %s: %+v %v", id, it, err)
		}
	}
}

// TestHelperProcess is the worker process of TestOtelTraceAcrossProcesses:
// it runs the queue's jobs until none is left, traced into memory, and
// writes the spans to the file named by helperEnv.
func TestHelperProcess(t *testing.T) {
	out := os.Getenv(helperEnv)
	if out == "" {
		t.Skip("the worker process of TestOtelTraceAcrossProcesses")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	srv, err := couchq.Connect(ctx, os.Getenv(helperURL), os.Getenv(helperUser), os.Getenv(helperPassword))
	if err != nil {
		t.Fatal(err)
	}
	q, err := srv.Open(ctx, os.Getenv(helperDB), couchq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(q, worker.Config{
		Handlers: map[string]worker.Handler{"email": worker.Typed(func(ctx context.Context, job *worker.Job, args map[string]string) error {
			_, span := tp.Tracer("mailer").Start(ctx, "send mail")
			defer span.End()
			if args["fail"] == "once" && job.Attempt == 1 {
				return errors.New("mail server busy")
			}
			return nil
		})},
		Middleware: []worker.Middleware{otelcouchq.Middleware(otelcouchq.WithTracerProvider(tp))},
		Retry:      func(int) time.Duration { return 10 * time.Millisecond },
	})
	if err != nil {
		t.Fatal(err)
	}
	// Until the three jobs are done: a drain could end between the failed
	// attempt and its retry, which is due a moment later.
	runCtx, stop := context.WithCancel(ctx)
	go func() {
		defer stop()
		for runCtx.Err() == nil {
			done, err := q.List(runCtx, couchq.ListOptions{Worker: "email", Status: couchq.StatusDone})
			if err == nil && len(done) == 3 {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	if err := w.Run(runCtx); err != nil {
		t.Fatal(err)
	}
	var spans []spanJSON
	for _, s := range exporter.GetSpans() {
		sj := spanJSON{Name: s.Name, Kind: s.SpanKind.String(), TraceID: s.SpanContext.TraceID().String(),
			SpanID: s.SpanContext.SpanID().String(), Attrs: map[string]string{}}
		if s.Parent.IsValid() {
			sj.Parent = s.Parent.SpanID().String()
		}
		for _, l := range s.Links {
			sj.Links = append(sj.Links, fmt.Sprintf("%s/%s", l.SpanContext.TraceID(), l.SpanContext.SpanID()))
		}
		for _, a := range s.Attributes {
			sj.Attrs[string(a.Key)] = a.Value.String()
		}
		for _, e := range s.Events {
			sj.Events = append(sj.Events, e.Name)
		}
		spans = append(spans, sj)
	}
	b, err := json.Marshal(spans)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
