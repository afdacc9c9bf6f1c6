package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// outsideClock records, by the test process's own clock, when each job's
// handler started and ended: a dependency is proven only if no job started
// before every job it waits for had ended.
type outsideClock struct {
	mu     sync.Mutex
	starts map[string][]time.Time
	ends   map[string]time.Time
}

func newOutsideClock() *outsideClock {
	return &outsideClock{starts: map[string][]time.Time{}, ends: map[string]time.Time{}}
}

func (o *outsideClock) start(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.starts[id] = append(o.starts[id], time.Now())
}

func (o *outsideClock) end(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ends[id] = time.Now()
}

// checkAfter fails the test if job started before any of deps ended (or
// a dep never ended).
func (o *outsideClock) checkAfter(t *testing.T, job string, deps ...string) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.starts[job] {
		for _, d := range deps {
			e, ok := o.ends[d]
			if !ok || !s.After(e) {
				t.Errorf("job %s started at %s before its dependency %s ended (%v, ended %v)", job, s.Format(time.StampMicro), d, e.Format(time.StampMicro), ok)
			}
		}
	}
}

// recording wraps a handler with the outside clock.
func recording(clock *outsideClock, h worker.HandlerFunc) worker.Handler {
	return worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		clock.start(job.ID)
		err := h(ctx, job)
		clock.end(job.ID)
		return err
	})
}

func mustEnqueue(t *testing.T, tb *testBundle, j protocol.NewJob) *protocol.WorkItem {
	t.Helper()
	it, err := tb.client.Enqueue(tb.ctx, j)
	if err != nil {
		t.Fatal(err)
	}
	return it
}

// A diamond and a chain of dependencies run in order, none before its
// parents have finished; the waiting jobs show as waiting (Get, the status
// counts, the waiting view) and never in the due view.
func TestDependenciesReleasedInOrder(t *testing.T) {
	tb := setup(t, protocol.Config{})
	clock := newOutsideClock()
	gate := make(chan struct{})
	handler := recording(clock, func(ctx context.Context, job *worker.Job) error {
		if string(job.Payload) == `"gated"` {
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		time.Sleep(20 * time.Millisecond)
		return nil
	})
	a := mustEnqueue(t, tb, protocol.NewJob{Worker: "step", Payload: "gated"})
	b := mustEnqueue(t, tb, protocol.NewJob{Worker: "step", Payload: "gated"})
	c := mustEnqueue(t, tb, protocol.NewJob{Worker: "step", After: []string{a.ID, b.ID}})
	d := mustEnqueue(t, tb, protocol.NewJob{Worker: "step", After: []string{c.ID, c.ID}})
	e := mustEnqueue(t, tb, protocol.NewJob{Worker: "other", After: []string{d.ID, a.ID}})
	for _, it := range []*protocol.WorkItem{c, d, e} {
		if it.Status != protocol.StatusWaiting {
			t.Fatalf("job %s enqueued with dependencies is %s, want waiting", it.ID, it.Status)
		}
	}
	if len(d.After) != 1 {
		t.Fatalf("a repeated dependency is kept once: %v", d.After)
	}
	if due := tb.due(t, "step"); strings.Contains(strings.Join(due, " "), c.ID) {
		t.Fatalf("a waiting job is in the due view: %v", due)
	}
	counts, err := tb.client.Counts(tb.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if counts["step"][protocol.StatusWaiting] != 2 || counts["other"][protocol.StatusWaiting] != 1 {
		t.Fatalf("counts: %v", counts)
	}
	list, err := tb.client.List(tb.ctx, protocol.ListOptions{Status: protocol.StatusWaiting})
	if err != nil || len(list.Items) != 3 {
		t.Fatalf("ls --status waiting: %v (%v)", ids(list.Items), err)
	}
	startWorker(t, tb, fastWorker(tb, map[string]worker.Handler{"step": handler, "other": handler}))
	time.Sleep(300 * time.Millisecond)
	if it, _ := tb.client.Get(tb.ctx, c.ID); it.Status != protocol.StatusWaiting {
		t.Fatalf("job %s ran before its dependencies: %s", c.ID, it.Status)
	}
	close(gate)
	done := waitStatus(t, tb, e.ID, protocol.StatusDone, 20*time.Second)
	clock.checkAfter(t, c.ID, a.ID, b.ID)
	clock.checkAfter(t, d.ID, c.ID)
	clock.checkAfter(t, e.ID, d.ID, a.ID)
	if got := events(done); got != "enqueued dependencies-done claimed done" {
		t.Fatalf("history of %s: %s", e.ID, got)
	}
	if done.ReleasedAt == 0 {
		t.Fatalf("released job has no released_at: %+v", done)
	}
}

// A dependency that fails for good cancels its dependents (the default),
// which cancels theirs in turn; under "run" the dependent runs anyway,
// and its history says why.
func TestDependencyFailurePolicies(t *testing.T) {
	tb := setup(t, protocol.Config{})
	clock := newOutsideClock()
	startWorker(t, tb, fastWorker(tb, map[string]worker.Handler{
		"doomed": recording(clock, func(ctx context.Context, job *worker.Job) error {
			return worker.JobFail(errors.New("broken for good"))
		}),
		"fine": recording(clock, func(ctx context.Context, job *worker.Job) error { return nil }),
	}))
	parent := mustEnqueue(t, tb, protocol.NewJob{Worker: "doomed", At: time.Now().Add(300 * time.Millisecond)})
	cancelled := mustEnqueue(t, tb, protocol.NewJob{Worker: "fine", After: []string{parent.ID}})
	grandchild := mustEnqueue(t, tb, protocol.NewJob{Worker: "fine", After: []string{cancelled.ID}})
	runs := mustEnqueue(t, tb, protocol.NewJob{Worker: "fine", After: []string{parent.ID}, OnDependencyFailure: protocol.DependencyRun})
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "fine", After: []string{parent.ID}, OnDependencyFailure: "maybe"}); !errors.Is(err, protocol.ErrInvalidJob) {
		t.Fatalf("an unknown policy: %v", err)
	}
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "fine", OnDependencyFailure: protocol.DependencyRun}); !errors.Is(err, protocol.ErrInvalidJob) || !strings.Contains(err.Error(), "needs After") {
		t.Fatalf("a policy without After: %v", err)
	}
	it := waitStatus(t, tb, cancelled.ID, protocol.StatusCancelled, 10*time.Second)
	if !strings.Contains(it.LastError, parent.ID) || !strings.Contains(it.LastError, "on_dependency_failure is cancel") {
		t.Fatalf("cancelled dependent's error: %q", it.LastError)
	}
	if got := events(it); got != "enqueued cancelled" {
		t.Fatalf("cancelled dependent's history: %s", got)
	}
	waitStatus(t, tb, grandchild.ID, protocol.StatusCancelled, 10*time.Second)
	it = waitStatus(t, tb, runs.ID, protocol.StatusDone, 10*time.Second)
	clock.checkAfter(t, runs.ID, parent.ID)
	h := it.History
	if len(h) < 2 || h[1].Event != protocol.EventDependenciesDone || !strings.Contains(h[1].Error, "on_dependency_failure is run") {
		t.Fatalf("run-anyway dependent's history: %+v", h)
	}
	if len(clock.starts[cancelled.ID])+len(clock.starts[grandchild.ID]) != 0 {
		t.Fatal("a cancelled dependent ran")
	}
}

// Enqueue refuses a dependency that does not exist (422) or the job itself
// (400), with a DependencyError; EnqueueMany takes a dependency on a job
// earlier in the same call, never a later one, so no cycle can form.
func TestEnqueueRefusesMissingAndSelfDependencies(t *testing.T) {
	tb := setup(t, protocol.Config{})
	_, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "w", After: []string{"job:nope"}})
	var de *protocol.DependencyError
	if !errors.As(err, &de) || de.HTTPStatus() != http.StatusUnprocessableEntity || de.Dependency != "job:nope" || !errors.Is(err, protocol.ErrInvalidJob) {
		t.Fatalf("missing dependency: %v", err)
	}
	_, err = tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "w", ID: "job:self", After: []string{"job:self"}})
	if !errors.As(err, &de) || de.HTTPStatus() != http.StatusBadRequest {
		t.Fatalf("self dependency: %v", err)
	}
	res, err := tb.client.EnqueueMany(tb.ctx, []protocol.NewJob{
		{Worker: "w", ID: "job:first"},
		{Worker: "w", ID: "job:second", After: []string{"job:first"}},
		{Worker: "w", ID: "job:third", After: []string{"job:fourth"}},
		{Worker: "w", ID: "job:fourth", After: []string{"job:third"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Err != nil || res[1].Err != nil || res[1].Item.Status != protocol.StatusWaiting {
		t.Fatalf("a dependency earlier in the call: %+v %+v", res[0], res[1])
	}
	if !errors.As(res[2].Err, &de) || de.Dependency != "job:fourth" {
		t.Fatalf("a dependency later in the call: %v", res[2].Err)
	}
	if !errors.As(res[3].Err, &de) || de.Dependency != "job:third" {
		t.Fatalf("a dependency refused earlier in the call: %v", res[3].Err)
	}
	// A document of CouchDB's or couchq's own is no job, nor an
	// application's own document.
	if status, body := tb.raw(t, http.MethodPut, "/note1", `{"type":"Note","x":1}`); status != http.StatusCreated {
		t.Fatalf("an application's document: %d %s", status, body)
	}
	for _, id := range []string{protocol.SequenceID("par"), "_design/couchq", "note1"} {
		_, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "w", After: []string{id}})
		if !errors.As(err, &de) || de.Dependency != id || de.HTTPStatus() != http.StatusUnprocessableEntity {
			t.Errorf("waiting for %s: %v", id, err)
		}
	}
}

// No cycle of dependencies stands: an enqueue that would close one is
// refused (a job written by hand may wait for an id to come), and a cycle
// written by hand is failed by the sweeper once the grace has passed, the
// rest of it then cancelled; nothing waits for ever.
func TestDependencyCyclesAreRefusedOrFailed(t *testing.T) {
	tb := setup(t, protocol.Config{})
	if status, body := tb.raw(t, http.MethodPut, "/job:x", `{"type":"WorkItem","worker":"w","after":["job:y"]}`); status != http.StatusCreated {
		t.Fatalf("hand-written job waiting for one to come: %d %s", status, body)
	}
	_, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "w", ID: "job:y", After: []string{"job:x"}})
	var de *protocol.DependencyError
	if !errors.As(err, &de) || de.HTTPStatus() != http.StatusBadRequest || !strings.Contains(err.Error(), "job:y waits for job:x waits for job:y") {
		t.Fatalf("an enqueue closing a cycle: %v", err)
	}
	if _, err := tb.client.Get(tb.ctx, "job:y"); !errors.Is(err, protocol.ErrNotFound) {
		t.Fatalf("the refused job was written: %v", err)
	}
	// Written by hand, a cycle of three, enqueued two minutes ago.
	created := float64(time.Now().Add(-2 * time.Minute).Unix())
	for id, after := range map[string]string{"job:c1": "job:c2", "job:c2": "job:c3", "job:c3": "job:c1"} {
		if status, body := tb.raw(t, http.MethodPut, "/"+id, fmt.Sprintf(`{"type":"WorkItem","worker":"w","after":[%q],"created_at":%f}`, after, created)); status != http.StatusCreated {
			t.Fatalf("%s: %d %s", id, status, body)
		}
	}
	// And a cycle of two with no created_at: its grace starts when the
	// sweeper first meets it.
	for id, after := range map[string]string{"job:d1": "job:d2", "job:d2": "job:d1"} {
		if status, body := tb.raw(t, http.MethodPut, "/"+id, fmt.Sprintf(`{"type":"WorkItem","worker":"w","after":[%q]}`, after)); status != http.StatusCreated {
			t.Fatalf("%s: %d %s", id, status, body)
		}
	}
	if _, err := tb.client.SweepWaiting(tb.ctx, "sweeper", 100); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"job:d1", "job:d2"} {
		if it, err := tb.client.Get(tb.ctx, id); err != nil || it.Status != protocol.StatusWaiting || it.CreatedAt == 0 {
			t.Fatalf("%s of a cycle without created_at after a sweep: %+v %v, want waiting with its grace started", id, it, err)
		}
	}
	later, err := protocol.New(tb.ctx, tb.db, protocol.Config{Now: func() time.Time { return time.Now().Add(2 * protocol.MissingDependencyGrace) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := later.SweepWaiting(tb.ctx, "sweeper", 100); err != nil {
		t.Fatal(err)
	}
	failed := 0
	for _, id := range []string{"job:c1", "job:c2", "job:c3", "job:d1", "job:d2"} {
		it, err := tb.client.Get(tb.ctx, id)
		switch {
		case err != nil:
			t.Fatal(err)
		case it.Status == protocol.StatusFailed && strings.Contains(it.LastError, "waits for itself"):
			failed++
		case it.Status != protocol.StatusCancelled:
			t.Errorf("%s of a cycle after a sweep: %s %q", id, it.Status, it.LastError)
		}
	}
	if failed != 2 {
		t.Errorf("%d jobs of the two cycles failed, want 1 each (the others cancelled by it)", failed)
	}
}

// A document written by hand with an after field (and no status) waits
// like an enqueued one; malformed after fields are refused by the
// validation function; a hand-written job waiting for one that does not
// exist is failed by the sweeper once the grace has passed.
func TestHandWrittenAfterFields(t *testing.T) {
	tb := setup(t, protocol.Config{})
	parent := mustEnqueue(t, tb, protocol.NewJob{Worker: "w"})
	status, body := tb.raw(t, http.MethodPut, "/job:hand", fmt.Sprintf(`{"type":"WorkItem","worker":"w","after":[%q]}`, parent.ID))
	if status != http.StatusCreated {
		t.Fatalf("hand-written dependent: %d %s", status, body)
	}
	it, err := tb.client.Get(tb.ctx, "job:hand")
	if err != nil || it.Status != protocol.StatusWaiting {
		t.Fatalf("hand-written dependent reads as %+v (%v)", it, err)
	}
	if due := tb.due(t, "w"); len(due) != 1 || due[0] != parent.ID {
		t.Fatalf("due: %v", due)
	}
	for _, bad := range []string{
		`"after":"job:x"`, `"after":[1]`, `"after":[""]`, `"after":["job:bad"],"_id":"job:bad"`,
		`"on_dependency_failure":"later"`, `"batch":7`, `"batch_size":-1`, `"continuation":"yes"`, `"released_at":"now"`,
	} {
		doc := `{"type":"WorkItem","worker":"w",` + bad + `}`
		id := "job:bad"
		if status, body := tb.raw(t, http.MethodPut, "/"+id, doc); status != http.StatusForbidden {
			t.Errorf("malformed %s: %d %s", bad, status, body)
		}
	}
	old := protocol.ToUnix(time.Now().Add(-2 * protocol.MissingDependencyGrace))
	status, body = tb.raw(t, http.MethodPut, "/job:orphan", fmt.Sprintf(`{"type":"WorkItem","worker":"w","after":["job:never"],"created_at":%v}`, old))
	if status != http.StatusCreated {
		t.Fatalf("orphan: %d %s", status, body)
	}
	status, body = tb.raw(t, http.MethodPut, "/job:young", `{"type":"WorkItem","worker":"w","after":["job:never"]}`)
	if status != http.StatusCreated {
		t.Fatalf("young orphan: %d %s", status, body)
	}
	// The parent finishes with no worker to release the dependent: the
	// sweep does.
	batch, _ := tb.client.Due(tb.ctx, "w", 10)
	claimed, err := tb.client.Claim(tb.ctx, batch.Items[0], "test/1/w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.client.Complete(tb.ctx, claimed, nil); err != nil {
		t.Fatal(err)
	}
	res, err := tb.client.Sweep(tb.ctx, "test/sweeper", 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.Released != 3 {
		t.Fatalf("sweep released %d, want 3 (the dependent, the orphan failed, the young orphan's grace started): %+v", res.Released, res)
	}
	if it, _ := tb.client.Get(tb.ctx, "job:hand"); it.Status != protocol.StatusQueued || it.ReleasedAt == 0 {
		t.Fatalf("hand-written dependent after the sweep: %+v", it)
	}
	it, _ = tb.client.Get(tb.ctx, "job:orphan")
	if it.Status != protocol.StatusFailed || !strings.Contains(it.LastError, "job:never, which does not exist") {
		t.Fatalf("orphan after the sweep: %s %q", it.Status, it.LastError)
	}
	it, _ = tb.client.Get(tb.ctx, "job:young")
	if it.Status != protocol.StatusWaiting || it.CreatedAt == 0 {
		t.Fatalf("young orphan after the sweep: %+v", it)
	}
}

// Cancelling a job a dependent waits for cancels the dependent at once,
// and the dependents of that one in turn, down a chain; a batch whose job
// was so cancelled has its callback released; no worker runs meanwhile.
func TestCancelReleasesDependents(t *testing.T) {
	tb := setup(t, protocol.Config{})
	parent := mustEnqueue(t, tb, protocol.NewJob{Worker: "w", At: time.Now().Add(time.Hour)})
	child := mustEnqueue(t, tb, protocol.NewJob{Worker: "w", After: []string{parent.ID}})
	chain := []string{child.ID}
	for range 3 {
		chain = append(chain, mustEnqueue(t, tb, protocol.NewJob{Worker: "w", After: []string{chain[len(chain)-1]}}).ID)
	}
	batch, err := tb.client.EnqueueBatch(tb.ctx, []protocol.NewJob{{Worker: "w", ID: "batched", After: []string{chain[1]}}}, protocol.NewJob{Worker: "report"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tb.client.CancelJob(tb.ctx, parent.ID, "test", "not needed"); err != nil {
		t.Fatal(err)
	}
	for _, id := range append(chain, "batched") {
		if it, err := tb.client.Get(tb.ctx, id); err != nil || it.Status != protocol.StatusCancelled {
			t.Errorf("%s, down the chain of a cancelled job: %+v (%v)", id, it, err)
		}
	}
	if cb, err := tb.client.Get(tb.ctx, protocol.BatchCallbackID(batch)); err != nil || cb.Status != protocol.StatusQueued {
		t.Errorf("the callback of a batch whose one job was cancelled: %+v (%v)", cb, err)
	}
	it, err := tb.client.Get(tb.ctx, child.ID)
	if err != nil || it.Status != protocol.StatusCancelled {
		t.Fatalf("dependent of a cancelled job: %+v (%v)", it, err)
	}
	var raw map[string]json.RawMessage
	_ = json.Unmarshal(mustJSON(t, it), &raw)
	if string(raw["status"]) != `"cancelled"` {
		t.Fatalf("stored: %s", raw["status"])
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A batch's callback runs once, after every job of the batch has finished
// (a job failing an attempt and then succeeding counts once it succeeds),
// with the summary in its payload.
func TestBatchCallbackRunsOnceWithSummary(t *testing.T) {
	tb := setup(t, protocol.Config{})
	clock := newOutsideClock()
	var mu sync.Mutex
	callbacks := 0
	var summary json.RawMessage
	startWorker(t, tb, fastWorker(tb, map[string]worker.Handler{
		"part": recording(clock, func(ctx context.Context, job *worker.Job) error {
			switch string(job.Payload) {
			case `"fail"`:
				return worker.JobFail(errors.New("no good"))
			case `"cancel"`:
				return worker.JobCancel(errors.New("not wanted"))
			case `"flaky"`:
				if job.Attempt < 3 {
					return errors.New("not yet")
				}
			}
			time.Sleep(5 * time.Millisecond)
			return nil
		}),
		"collect": recording(clock, func(ctx context.Context, job *worker.Job) error {
			mu.Lock()
			defer mu.Unlock()
			callbacks++
			summary = job.Payload
			return nil
		}),
	}))
	var jobs []protocol.NewJob
	for i := range 30 {
		p := "ok"
		switch i {
		case 3, 17:
			p = "fail"
		case 5:
			p = "cancel"
		case 8, 9:
			p = "flaky"
		}
		jobs = append(jobs, protocol.NewJob{Worker: "part", Payload: p})
	}
	id, err := tb.client.EnqueueBatch(tb.ctx, jobs, protocol.NewJob{Worker: "collect", Payload: map[string]string{"report": "weekly"}})
	if err != nil {
		t.Fatal(err)
	}
	cb := waitStatus(t, tb, protocol.BatchCallbackID(id), protocol.StatusDone, 20*time.Second)
	time.Sleep(500 * time.Millisecond) // a second release would run it again by now
	mu.Lock()
	defer mu.Unlock()
	if callbacks != 1 {
		t.Fatalf("the callback ran %d times", callbacks)
	}
	var got struct {
		Report string `json:"report"`
		Batch  struct {
			ID        string   `json:"id"`
			Done      int      `json:"done"`
			Failed    int      `json:"failed"`
			Cancelled int      `json:"cancelled"`
			FailedIDs []string `json:"failed_ids"`
		} `json:"batch"`
	}
	if err := json.Unmarshal(summary, &got); err != nil {
		t.Fatal(err)
	}
	if got.Report != "weekly" || got.Batch.ID != id || got.Batch.Done != 27 || got.Batch.Failed != 2 || got.Batch.Cancelled != 1 || len(got.Batch.FailedIDs) != 2 {
		t.Fatalf("callback payload: %s", summary)
	}
	b, err := tb.client.Batch(tb.ctx, id)
	if err != nil || b.Size != 30 || b.Done != 27 || b.Pending != 0 || b.Callback == nil || b.Callback.ID != cb.ID {
		t.Fatalf("batch status: %+v (%v)", b, err)
	}
	all := allJobs(t, tb, "part")
	var parts []string
	for _, it := range all {
		parts = append(parts, it.ID)
	}
	clock.checkAfter(t, cb.ID, parts...)
	if n := strings.Count(events(cb), protocol.EventDependenciesDone); n != 1 {
		t.Fatalf("callback released %d times: %s", n, events(cb))
	}
}

// A job enqueued while its dependency's outcome is being written can be
// missed by both sides: the finishing worker's look for dependents comes
// before the job is written, and the job's own check comes before the
// outcome is stored (and its later checks end with its enqueuer, a CLI
// that exits at once, or come before a slow outcome write). The worker
// that finished the dependency looks once more after a quarter of a
// second, so the job does not wait for the sweeper.
func TestDependentMissedByTheFirstLookIsFoundAgain(t *testing.T) {
	tb := setup(t, protocol.Config{})
	// A job that waits for another, so that the client knows waiting jobs
	// exist and looks for dependents while outcomes are written.
	other := mustEnqueue(t, tb, protocol.NewJob{Worker: "part"})
	mustEnqueue(t, tb, protocol.NewJob{Worker: "step", After: []string{other.ID}})
	parent := mustEnqueue(t, tb, protocol.NewJob{Worker: "part"})
	running, err := tb.client.Claim(tb.ctx, parent, "test/1/w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// The handler has returned: the look starts while the outcome is
	// written, and answers before the dependent exists.
	look := tb.client.LookForDependents(tb.ctx, parent.ID)
	if look == nil {
		t.Fatal("no look for dependents although a job waits")
	}
	time.Sleep(300 * time.Millisecond)
	child := mustEnqueue(t, tb, protocol.NewJob{Worker: "step", After: []string{parent.ID}})
	// The child's enqueue checks again for a second; the outcome is slower.
	time.Sleep(1500 * time.Millisecond)
	if err := tb.client.Complete(tb.ctx, running, nil); err != nil {
		t.Fatal(err)
	}
	released, err := tb.client.FinishedReleasing(tb.ctx, running, "test/1/w", look)
	if err != nil || len(released) != 0 {
		t.Fatalf("the first look released %d (%v)", len(released), err)
	}
	if got, err := tb.client.Get(tb.ctx, child.ID); err != nil || got.Status != protocol.StatusWaiting {
		t.Fatalf("child after the first look: %+v (%v), want it still waiting", got, err)
	}
	if released, err := tb.client.LookAgainForDependents(tb.ctx, "test/1/w", time.Hour); err != nil || len(released) != 0 {
		t.Fatalf("looked again too soon: %d (%v)", len(released), err)
	}
	released, err = tb.client.LookAgainForDependents(tb.ctx, "test/1/w", 0)
	if err != nil || len(released) != 1 || released[0].ID != child.ID || released[0].Status != protocol.StatusQueued {
		t.Fatalf("looked again: %v (%v)", released, err)
	}
	if again, err := tb.client.LookAgainForDependents(tb.ctx, "test/1/w", 0); err != nil || len(again) != 0 {
		t.Fatalf("looked again twice: %d (%v)", len(again), err)
	}
	got, err := tb.client.Get(tb.ctx, child.ID)
	if err != nil || got.Status != protocol.StatusQueued || strings.Count(events(got), protocol.EventDependenciesDone) != 1 {
		t.Fatalf("child: %+v (%v)", got, err)
	}
}

// A worker that finished a batch's job while others were unfinished
// counts the batch again once its jobs stop finishing there, so the
// callback does not wait for the sweeper when the batch's last outcome was
// written by a process that never counted it (it died between the two, or
// the index it read lagged behind the outcome).
func TestBatchCountedAgainWhenQuiet(t *testing.T) {
	tb := setup(t, protocol.Config{})
	id, err := tb.client.EnqueueBatch(tb.ctx, []protocol.NewJob{{Worker: "part"}, {Worker: "part"}}, protocol.NewJob{Worker: "collect"})
	if err != nil {
		t.Fatal(err)
	}
	var claimed []*protocol.WorkItem
	for _, it := range allJobs(t, tb, "part") {
		c, err := tb.client.Claim(tb.ctx, it, "test/1/w", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		claimed = append(claimed, c)
	}
	if len(claimed) != 2 {
		t.Fatalf("%d jobs in the batch, want 2", len(claimed))
	}
	first, last := claimed[0], claimed[1]
	if err := tb.client.Complete(tb.ctx, first, nil); err != nil {
		t.Fatal(err)
	}
	released, err := tb.client.FinishedReleasing(tb.ctx, first, "test/1/w", nil)
	if err != nil || len(released) != 0 {
		t.Fatalf("the first job's finish released %d (%v)", len(released), err)
	}
	// Nothing to count yet: the batch has had a job finish just now.
	if released, err := tb.client.SettleQuietBatches(tb.ctx, "test/1/w", time.Hour); err != nil || len(released) != 0 {
		t.Fatalf("settled before quiet: %d (%v)", len(released), err)
	}
	// The last outcome, written by a process that stops there.
	if err := tb.client.Complete(tb.ctx, last, nil); err != nil {
		t.Fatal(err)
	}
	released, err = tb.client.SettleQuietBatches(tb.ctx, "test/1/w", 0)
	if err != nil || len(released) != 1 || released[0].ID != protocol.BatchCallbackID(id) || released[0].Status != protocol.StatusQueued {
		t.Fatalf("settled: %v (%v)", released, err)
	}
	if again, err := tb.client.SettleQuietBatches(tb.ctx, "test/1/w", 0); err != nil || len(again) != 0 {
		t.Fatalf("settled twice: %d (%v)", len(again), err)
	}
	cb, err := tb.client.Get(tb.ctx, protocol.BatchCallbackID(id))
	if err != nil || cb.Status != protocol.StatusQueued || !strings.Contains(string(cb.Payload), `"done":2`) {
		t.Fatalf("callback: %+v (%v)", cb, err)
	}
}

// Cancelling a batch cancels its unfinished jobs, a page of them in one
// write (one cancel after another chased the workers running the batch),
// and what waited for them follows at once; the callback then runs with
// them counted cancelled.
func TestBatchCancel(t *testing.T) {
	tb := setup(t, protocol.Config{})
	ran := make(chan string, 10)
	startWorker(t, tb, fastWorker(tb, map[string]worker.Handler{
		"later":   worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error { return nil }),
		"collect": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error { ran <- string(job.Payload); return nil }),
	}))
	const size = 600 // more than a page
	var jobs []protocol.NewJob
	for range size {
		jobs = append(jobs, protocol.NewJob{Worker: "later", At: time.Now().Add(time.Hour)})
	}
	id, err := tb.client.EnqueueBatch(tb.ctx, jobs, protocol.NewJob{Worker: "collect"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := tb.client.Batch(tb.ctx, id)
	if err != nil || b.Pending != size || b.Callback.Status != protocol.StatusWaiting {
		t.Fatalf("batch before the cancel: %+v (%v)", b, err)
	}
	// A job outside the batch waits for one of its jobs.
	some, err := tb.client.List(tb.ctx, protocol.ListOptions{Worker: "later", Limit: 1})
	if err != nil || len(some.Items) != 1 {
		t.Fatalf("a job of the batch: %+v %v", some, err)
	}
	dependent := mustEnqueue(t, tb, protocol.NewJob{Worker: "later", After: []string{some.Items[0].ID}})

	var writes writeLog
	client := clientThrough(t, tb, protocol.Config{}, writes.through)
	n, err := client.CancelBatch(tb.ctx, id, "test", "")
	if err != nil || n != size {
		t.Fatalf("cancelled %d (%v)", n, err)
	}
	var pages []string // besides the releases of the dependent and the callback
	for _, w := range writes.sizes() {
		if w != "_bulk_docs 1" {
			pages = append(pages, w)
		}
	}
	if !slices.Equal(pages, []string{"_bulk_docs 500", "_bulk_docs 100"}) {
		t.Errorf("the cancels went as %v; want a page of 500 in one write, then the other 100", writes.sizes())
	}
	if it, err := tb.client.Get(tb.ctx, dependent.ID); err != nil || it.Status != protocol.StatusCancelled {
		t.Errorf("the job waiting for a cancelled one, once the cancel returned: %+v %v", it, err)
	}
	if n, err := tb.client.CancelBatch(tb.ctx, id, "test", ""); err != nil || n != 0 {
		t.Errorf("cancelling the cancelled batch again: %d %v, want 0 and no error", n, err)
	}
	if _, err := tb.client.CancelBatch(tb.ctx, "batch:none", "test", ""); !errors.Is(err, protocol.ErrNotFound) {
		t.Errorf("cancelling a batch that never was: %v, want ErrNotFound", err)
	}
	select {
	case p := <-ran:
		if !strings.Contains(p, fmt.Sprintf(`"cancelled":%d`, size)) {
			t.Fatalf("callback payload: %s", p)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the callback did not run after the batch was cancelled")
	}
}

// A handler that enqueues children and waits for them runs again as its
// continuation once they have finished; children keyed by the parent's id
// are enqueued once however often the handler runs.
func TestFanOutChildrenAreIdempotent(t *testing.T) {
	tb := setup(t, protocol.Config{})
	clock := newOutsideClock()
	var mu sync.Mutex
	var continuation *worker.Job
	startWorker(t, tb, fastWorker(tb, map[string]worker.Handler{
		"fan": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			if job.Continuation {
				clock.start(job.ID + "#continuation")
				mu.Lock()
				continuation = job
				mu.Unlock()
				return job.SetResult(len(job.Item.After))
			}
			for i := range 5 {
				if _, err := job.EnqueueChild(ctx, fmt.Sprint(i), protocol.NewJob{Worker: "leaf", Payload: i}); err != nil {
					return err
				}
			}
			if job.Attempt == 1 {
				return errors.New("lost after enqueueing the children") // runs again, enqueues them again
			}
			return worker.JobAwaitChildren()
		}),
		"leaf": recording(clock, func(ctx context.Context, job *worker.Job) error {
			time.Sleep(10 * time.Millisecond)
			return nil
		}),
	}))
	parent := mustEnqueue(t, tb, protocol.NewJob{Worker: "fan"})
	done := waitStatus(t, tb, parent.ID, protocol.StatusDone, 20*time.Second)
	leaves := allJobs(t, tb, "leaf")
	if len(leaves) != 5 {
		t.Fatalf("%d children, want 5", len(leaves))
	}
	var kids []string
	for _, l := range leaves {
		if !strings.HasPrefix(l.ID, parent.ID+":") || l.ChildOf != parent.ID {
			t.Fatalf("child %s (child_of %q) is not derived from the parent %s", l.ID, l.ChildOf, parent.ID)
		}
		kids = append(kids, l.ID)
	}
	clock.checkAfter(t, parent.ID+"#continuation", kids...)
	mu.Lock()
	defer mu.Unlock()
	if continuation == nil || string(done.Result) != "5" {
		t.Fatalf("continuation %v, result %s", continuation, done.Result)
	}
	if got := events(done); got != "enqueued claimed retry-scheduled claimed awaiting-children dependencies-done claimed done" {
		t.Fatalf("history: %s", got)
	}
}

// A job that stands at a child's id but was not enqueued as that child
// (written by hand, or by a producer where roles are off) is not taken
// for it: the parent does not wait for it, the attempt fails saying why,
// and the job is left as it was.
func TestFanOutRefusesAJobAtAChildsIDThatIsNotItsChild(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var leafRuns atomic.Int32
	startWorker(t, tb, fastWorker(tb, squatterHandlers(&leafRuns)))
	testFanOutRefusesASquatter(t, tb.ctx, tb.client, &leafRuns, func(id string) *protocol.WorkItem {
		return waitStatus(t, tb, id, protocol.StatusFailed, 20*time.Second)
	})
}

// squatterHandlers are a parent type "fan" that enqueues child "0" and
// waits for it, failing for good if it cannot, and its child type "leaf",
// counted in leafRuns.
func squatterHandlers(leafRuns *atomic.Int32) map[string]worker.Handler {
	return map[string]worker.Handler{
		"fan": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			if _, err := job.EnqueueChild(ctx, "0", protocol.NewJob{Worker: "leaf"}); err != nil {
				return worker.JobFail(err)
			}
			return worker.JobAwaitChildren()
		}),
		"leaf": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			leafRuns.Add(1)
			return job.SetResult("planted")
		}),
	}
}

// testFanOutRefusesASquatter enqueues through c a job at a child's id,
// then its parent, which a worker of squatterHandlers runs: the parent
// fails (waitFailed waits for that), and the job at the child's id is
// left as it was, never run.
func testFanOutRefusesASquatter(t *testing.T, ctx context.Context, c *protocol.Client, leafRuns *atomic.Int32, waitFailed func(id string) *protocol.WorkItem) {
	t.Helper()
	const parentID = "job:fan-with-a-squatter"
	squatter, err := c.Enqueue(ctx, protocol.NewJob{Worker: "leaf", ID: protocol.ChildID(parentID, "0"), At: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(ctx, protocol.NewJob{Worker: "fan", ID: parentID}); err != nil {
		t.Fatal(err)
	}
	failed := waitFailed(parentID)
	if !strings.Contains(failed.LastError, "is not one: it was enqueued by someone else") || failed.Continuation {
		t.Fatalf("the parent: continuation %v, last_error %q", failed.Continuation, failed.LastError)
	}
	it, err := c.Get(ctx, squatter.ID)
	if err != nil || it.Rev != squatter.Rev || it.ChildOf != "" {
		t.Fatalf("the job at the child's id: %+v %v; want it untouched", it, err)
	}
	if n := leafRuns.Load(); n != 0 {
		t.Fatalf("the leaf ran %d times", n)
	}
}

// silentFeed holds every _changes request until its context ends, with
// no change: a worker behind it is never woken by the feed.
type silentFeed struct{ next http.RoundTripper }

func (s silentFeed) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/_changes") {
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	return s.next.RoundTrip(r)
}

// The worker that finishes a job claims the dependents it released at
// once when it has a free slot for them: here its changes feed never
// reports anything and its fallback poll is a minute away, so only that
// claim can start the dependent within seconds. A dependent not due yet
// is left to its time.
func TestWorkerClaimsTheDependentsItReleases(t *testing.T) {
	tb := setup(t, protocol.Config{})
	parent := mustEnqueue(t, tb, protocol.NewJob{Worker: "first"})
	child := mustEnqueue(t, tb, protocol.NewJob{Worker: "then", After: []string{parent.ID}})
	later := mustEnqueue(t, tb, protocol.NewJob{Worker: "then", After: []string{parent.ID}, At: time.Now().Add(time.Hour)})
	client := clientThrough(t, tb, protocol.Config{}, func(next http.RoundTripper) http.RoundTripper { return silentFeed{next} })
	clock := newOutsideClock()
	cfg := fastWorker(tb, map[string]worker.Handler{
		"first": recording(clock, func(ctx context.Context, job *worker.Job) error { return nil }),
		"then":  recording(clock, func(ctx context.Context, job *worker.Job) error { return nil }),
	})
	cfg.FallbackPoll = time.Minute
	runWorker(t, tb.ctx, client, cfg)
	waitStatus(t, tb, child.ID, protocol.StatusDone, 15*time.Second)
	clock.checkAfter(t, child.ID, parent.ID)
	if it, err := tb.client.Get(tb.ctx, later.ID); err != nil || it.Status != protocol.StatusQueued || it.Attempts != 0 {
		t.Fatalf("the dependent due in an hour: %+v (%v)", it, err)
	}
}

// A job enqueued to wait for a running one whose handler has returned can
// slip between the two sides that release it: the finishing worker looked
// for dependents before the job was written, and the enqueue read the
// dependency before its outcome was. The enqueue checks such a job again
// a moment later. Here the dependency's outcome is written after the
// enqueue, with no release and no sweeper: the enqueue's second check
// alone must release the job, well before any sweep.
func TestDependentOfAFinishingJobIsReleasedByItsEnqueue(t *testing.T) {
	tb := setup(t, protocol.Config{})
	checkDependentOfAFinishingJob(t, tb.ctx, tb.client)
}

func checkDependentOfAFinishingJob(t *testing.T, ctx context.Context, c *protocol.Client) {
	t.Helper()
	parent, err := c.Enqueue(ctx, protocol.NewJob{Worker: "finishing"})
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := c.Claim(ctx, parent, "test/1/w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	child, err := c.Enqueue(ctx, protocol.NewJob{Worker: "after", After: []string{parent.ID}})
	if err != nil {
		t.Fatal(err)
	}
	if child.Status != protocol.StatusWaiting {
		t.Fatalf("the dependent of a running job was enqueued %s, want waiting", child.Status)
	}
	if err := c.Complete(ctx, claimed, nil); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		it, err := c.Get(ctx, child.ID)
		if err != nil {
			t.Fatal(err)
		}
		if it.Status == protocol.StatusQueued {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dependent still reads %s 3 s after its dependency finished, with no worker or sweeper to release it", it.Status)
		}
	}
}

// A worker that releases a dependent claims it at once (claimReleased),
// while its feed reports the same job as due: the worker must not claim
// it a second time from the feed. That claim lost a certain race (409),
// which also made the worker leave its next releases to a claim round.
// The transport holds the feed's report of the released job until the
// release's claim is on its way, and that claim for a moment, so that a
// claim from the feed would meet it.
func TestReleasedJobIsNotClaimedTwiceByItsWorker(t *testing.T) {
	tb := setup(t, protocol.Config{})
	parent := mustEnqueue(t, tb, protocol.NewJob{Worker: "first"})
	child := mustEnqueue(t, tb, protocol.NewJob{Worker: "then", After: []string{parent.ID}})
	var held atomic.Int64
	claiming := make(chan struct{})
	client := clientThrough(t, tb, protocol.Config{}, func(next http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			switch {
			case r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/"+child.ID):
				body, err := readRequestBody(r)
				if err != nil {
					return nil, err
				}
				if bytes.Contains(body, []byte(`"claimed":true`)) && held.Add(1) == 1 {
					close(claiming)
					time.Sleep(300 * time.Millisecond)
				}
			case strings.HasSuffix(r.URL.Path, "/_changes"):
				resp, body, err := roundTripOK(next, r)
				if err == nil && bytes.Contains(body, []byte(child.ID)) {
					select { // the job was released: report it once its claim is on its way
					case <-claiming:
					case <-time.After(2 * time.Second):
					}
				}
				return resp, err
			}
			return next.RoundTrip(r)
		})
	})
	ran := make(chan string, 4)
	record := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		ran <- job.ID
		return nil
	})
	w := runWorker(t, tb.ctx, client, fastWorker(tb, map[string]worker.Handler{"first": record, "then": record}))
	waitStatus(t, tb, child.ID, protocol.StatusDone, 15*time.Second)
	time.Sleep(300 * time.Millisecond) // a claim from the feed would be answered by now
	if held.Load() == 0 {
		t.Fatal("no claim of the dependent was held: the test proved nothing")
	}
	if len(ran) != 2 {
		t.Errorf("%d handler runs, want 2 (the job and its dependent)", len(ran))
	}
	if st := w.Stats(); st.Claimed != 2 || st.Conflicts != 0 {
		t.Errorf("%d claims won and %d lost, want 2 and none: the released job was claimed twice", st.Claimed, st.Conflicts)
	}
}

// A released job whose claim was never stored (the request failed on its
// way) stays the worker's to claim again at the revision it read: the
// worker skips the revisions it claimed over for a while, since a copy may
// report them again, but not one whose claim may not have been written.
func TestReleasedJobWhoseClaimFailedIsClaimedAgain(t *testing.T) {
	tb := setup(t, protocol.Config{})
	parent := mustEnqueue(t, tb, protocol.NewJob{Worker: "first"})
	child := mustEnqueue(t, tb, protocol.NewJob{Worker: "then", After: []string{parent.ID}})
	var failed atomic.Int64
	client := clientThrough(t, tb, protocol.Config{}, func(next http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/"+child.ID) {
				body, err := readRequestBody(r)
				if err != nil {
					return nil, err
				}
				if bytes.Contains(body, []byte(`"claimed":true`)) && failed.Add(1) == 1 {
					return nil, errors.New("connection reset before the claim was sent")
				}
			}
			return next.RoundTrip(r)
		})
	})
	ran := make(chan string, 4)
	record := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		ran <- job.ID
		return nil
	})
	runWorker(t, tb.ctx, client, fastWorker(tb, map[string]worker.Handler{"first": record, "then": record}))
	waitStatus(t, tb, child.ID, protocol.StatusDone, 10*time.Second)
	if failed.Load() < 2 {
		t.Fatalf("%d claims of the dependent sent, want the failed one and another", failed.Load())
	}
}
