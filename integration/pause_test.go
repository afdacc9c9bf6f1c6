package integration

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// pauseProbe is a handler that holds each job until released and records
// which jobs started.
type pauseProbe struct {
	mu      sync.Mutex
	started []string
	release chan struct{}
}

func (p *pauseProbe) handler() worker.Handler {
	return worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		p.mu.Lock()
		p.started = append(p.started, job.ID)
		p.mu.Unlock()
		select {
		case <-p.release:
		case <-ctx.Done():
		}
		return nil
	})
}

func (p *pauseProbe) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.started)
}

// Pausing a type stops its workers from claiming it — they follow the
// control document through the feed (the fallback poll is a minute) —
// while the jobs they hold finish; another type goes on. Resuming starts
// the waiting jobs at once.
func TestPauseStopsClaimingAndResumeStartsAgain(t *testing.T) {
	tb := setup(t, protocol.Config{})
	probe := &pauseProbe{release: make(chan struct{})}
	var other sync.WaitGroup
	cfg := fastWorker(tb, map[string]worker.Handler{
		"mail": probe.handler(),
		"other": worker.HandlerFunc(func(context.Context, *worker.Job) error {
			other.Done()
			return nil
		}),
	})
	cfg.Concurrency = 2
	startWorker(t, tb, cfg)
	enqueue := func(typ string, n int) []string {
		t.Helper()
		var ids []string
		for range n {
			it, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: typ})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, it.ID)
		}
		return ids
	}
	held := enqueue("mail", 2)
	waitFor(t, 10*time.Second, "the worker to hold both mail jobs", func() bool { return probe.count() == 2 })

	if err := tb.client.Pause(tb.ctx, "mail", "test", "mail server down"); err != nil {
		t.Fatal(err)
	}
	if err := tb.client.Pause(tb.ctx, "mail", "test", "mail server down"); err != nil {
		t.Fatalf("pausing a paused type: %v", err)
	}
	time.Sleep(time.Second) // "within a second"
	close(probe.release)    // the held jobs finish while paused
	for _, id := range held {
		waitStatus(t, tb, id, protocol.StatusDone, 10*time.Second)
	}
	waiting := enqueue("mail", 3)
	other.Add(2)
	enqueue("other", 2)
	done := make(chan struct{})
	go func() { other.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a paused type held up another type")
	}
	time.Sleep(time.Second)
	if n := probe.count(); n != 2 {
		t.Fatalf("%d mail jobs started; the worker claimed %d after the type was paused", n, n-2)
	}
	st, err := tb.client.Stats(tb.ctx, protocol.StatsOptions{Worker: "mail"})
	if err != nil {
		t.Fatal(err)
	}
	if q := st.Types[0].Queue; !q.Paused || q.Due != 3 || q.OldestDueAge != 0 {
		t.Fatalf("stats of the paused type: %+v; want paused, 3 due, none late", q)
	}

	resumed := time.Now()
	if err := tb.client.Resume(tb.ctx, "mail", "test"); err != nil {
		t.Fatal(err)
	}
	for _, id := range waiting {
		waitStatus(t, tb, id, protocol.StatusDone, 10*time.Second)
	}
	t.Logf("3 waiting jobs done %s after the resume (fallback poll %s)", time.Since(resumed).Round(time.Millisecond), cfg.FallbackPoll)
	if p, err := tb.client.Paused(tb.ctx); err != nil || len(p) != 0 {
		t.Fatalf("paused types after resume: %v %v", p, err)
	}
}

// A worker started while its type is paused claims nothing until resumed.
func TestWorkerStartsPaused(t *testing.T) {
	tb := setup(t, protocol.Config{})
	if err := tb.client.Pause(tb.ctx, "late", "test", ""); err != nil {
		t.Fatal(err)
	}
	it, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "late"})
	if err != nil {
		t.Fatal(err)
	}
	startWorker(t, tb, fastWorker(tb, map[string]worker.Handler{
		"late": worker.HandlerFunc(func(context.Context, *worker.Job) error { return nil }),
	}))
	time.Sleep(time.Second)
	if got, err := tb.client.Get(tb.ctx, it.ID); err != nil || got.Status != protocol.StatusQueued {
		t.Fatalf("job of a paused type: %+v %v; want it still queued", got, err)
	}
	if err := tb.client.Resume(tb.ctx, "late", "test"); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, tb, it.ID, protocol.StatusDone, 10*time.Second)
}

// A control document written by hand is checked like a job.
func TestControlDocumentsValidated(t *testing.T) {
	tb := setup(t, protocol.Config{})
	for id, body := range map[string]string{
		"control:a":     `{"type":"TypeControl","worker":"b","paused":true}`,
		"control:c":     `{"type":"TypeControl","worker":"c","paused":"yes"}`,
		"control:empty": `{"type":"TypeControl","paused":true}`,
	} {
		if code, resp := tb.raw(t, http.MethodPut, "/"+id, body); code != http.StatusForbidden || !strings.Contains(resp, "invalid TypeControl") {
			t.Errorf("%s %s: %d %s, want 403 invalid TypeControl", id, body, code, resp)
		}
	}
	if code, resp := tb.raw(t, http.MethodPut, "/control:d", `{"type":"TypeControl","worker":"d","paused":true}`); code != http.StatusCreated {
		t.Fatalf("a good control document: %d %s", code, resp)
	}
	if p, err := tb.client.Paused(tb.ctx); err != nil || !p["d"] || len(p) != 1 {
		t.Fatalf("paused types: %v %v, want d", p, err)
	}
	// Pausing a paused type changes nothing, though the second pause gives
	// no reason; a new reason replaces the old one.
	if err := tb.client.Pause(tb.ctx, "e", "ops", "partner down"); err != nil {
		t.Fatal(err)
	}
	first := controlOf(t, tb, "e")
	if err := tb.client.Pause(tb.ctx, "e", "ops", ""); err != nil {
		t.Fatal(err)
	}
	if again := controlOf(t, tb, "e"); again.Rev != first.Rev || again.Reason != "partner down" {
		t.Errorf("pausing twice: %+v, then %+v", first, again)
	}
	if err := tb.client.Pause(tb.ctx, "e", "ops", "partner still down"); err != nil {
		t.Fatal(err)
	}
	if again := controlOf(t, tb, "e"); again.Reason != "partner still down" {
		t.Errorf("a pause with a new reason: %+v", again)
	}
	// A job written by hand at a control document's id is not a control
	// document: pausing its type is refused and the job stays as it was.
	if code, resp := tb.raw(t, http.MethodPut, "/control:x", `{"type":"WorkItem","worker":"x","status":"done"}`); code != http.StatusCreated {
		t.Fatalf("a job at control:x: %d %s", code, resp)
	}
	if err := tb.client.Pause(tb.ctx, "x", "ops", ""); err == nil || !strings.Contains(err.Error(), "not its control document") {
		t.Errorf("pausing x over a job at control:x: %v", err)
	}
	if it, err := tb.client.Get(tb.ctx, "control:x"); err != nil || it.Status != protocol.StatusDone || !strings.HasPrefix(it.Rev, "1-") {
		t.Errorf("the job at control:x after the pause: %+v, %v", it, err)
	}
	// Nor can a job be enqueued there.
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "x", ID: protocol.ControlID("y")}); !errors.Is(err, protocol.ErrInvalidJob) {
		t.Errorf("enqueueing a job at control:y: %v", err)
	}
}

// controlOf reads type typ's control document.
func controlOf(t *testing.T, tb *testBundle, typ string) protocol.TypeControl {
	t.Helper()
	ctl, err := tb.client.Controls(tb.ctx, typ)
	if err != nil {
		t.Fatal(err)
	}
	return ctl[typ]
}
