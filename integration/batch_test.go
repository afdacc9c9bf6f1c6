package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/internal/protocol"
)

// Outcomes written at once by many goroutines are coalesced into
// _bulk_docs requests, and each document still wins or loses on its own: a
// stale revision is a lost claim for that job only, and a write the server's
// validation refuses reports the real 403, not a retryable 500.
func TestConcurrentOutcomesEachWinOrLoseAlone(t *testing.T) {
	tb := setup(t, protocol.Config{})
	ctx := tb.ctx
	// An application's own validation that refuses one result.
	code, body := tb.raw(t, http.MethodPut, "/_design/app", `{"validate_doc_update":
		"function (doc) { if (doc.result && doc.result.forbidden) { throw({forbidden: 'no forbidden results'}); } }"}`)
	if code != http.StatusCreated {
		t.Fatalf("installing the app's validation: %d %s", code, body)
	}
	var jobs []protocol.NewJob
	for i := range 60 {
		jobs = append(jobs, protocol.NewJob{Worker: "many", Payload: i})
	}
	if _, err := tb.client.EnqueueMany(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	batch, err := tb.client.Due(ctx, "many", 100)
	if err != nil || len(batch.Items) != 60 {
		t.Fatalf("due: %v, %d items", err, len(batch.Items))
	}
	var held []*protocol.WorkItem
	for _, r := range tb.client.ClaimMany(ctx, batch.Items, "many/1/w", time.Minute) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		held = append(held, r.Item)
	}
	// Job 0 is renewed behind our back (its held copy goes stale); job 1's
	// result is refused by the application's validation.
	renewed := held[0].Clone()
	if err := tb.client.Extend(ctx, renewed, time.Minute); err != nil {
		t.Fatal(err)
	}
	errs := completeAll(ctx, tb.client, held, 0, func(i int) json.RawMessage {
		if i == 1 {
			return json.RawMessage(`{"forbidden":true}`)
		}
		return fmt.Appendf(nil, `{"n":%d}`, i)
	})
	if !errors.Is(errs[0], protocol.ErrClaimLost) || kivik.HTTPStatus(errs[0]) != http.StatusConflict {
		t.Errorf("stale job: %v", errs[0])
	}
	if kivik.HTTPStatus(errs[1]) != http.StatusForbidden {
		t.Errorf("refused result: want the server's 403, got %v (status %d)", errs[1], kivik.HTTPStatus(errs[1]))
	}
	for i := 2; i < len(held); i++ {
		if errs[i] != nil {
			t.Fatalf("job %d: %v", i, errs[i])
		}
		it, err := tb.client.Get(ctx, held[i].ID)
		if err != nil || it.Status != protocol.StatusDone || string(it.Result) != fmt.Sprintf(`{"n":%d}`, i) {
			t.Fatalf("job %d: %v %+v", i, err, it)
		}
	}
	if it, _ := tb.client.Get(ctx, held[0].ID); it.Status != protocol.StatusRunning || it.Rev != renewed.Rev {
		t.Errorf("the stale write must not have landed: %+v", it)
	}
}

// completeAll completes the held jobs, each in its own goroutine started
// gap after the one before, with result(i) for the i-th, and returns each
// one's error.
func completeAll(ctx context.Context, client *protocol.Client, held []*protocol.WorkItem, gap time.Duration, result func(i int) json.RawMessage) []error {
	var wg sync.WaitGroup
	errs := make([]error, len(held))
	for i, it := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = client.Complete(ctx, it, result(i))
		}()
		time.Sleep(gap)
	}
	wg.Wait()
	return errs
}

// A held job's write that finds no request in flight waits WriteLinger for
// others: outcomes that come within it go in one _bulk_docs. Without the
// wait the first goes alone, as a PUT.
func TestLoneWriteWaitsForOthersToJoinIt(t *testing.T) {
	for name, linger := range map[string]time.Duration{"linger 1s": time.Second, "no linger": -1} {
		t.Run(name, func(t *testing.T) {
			tb := setup(t, protocol.Config{})
			var writes writeLog
			client := clientThrough(t, tb, protocol.Config{WriteLinger: linger}, writes.through)
			checkWriteLinger(t, tb.ctx, client, &writes, linger)
		})
	}
}

// checkWriteLinger completes three held jobs 20 ms apart through client,
// whose writes pass through writes, and checks that they went together
// when linger is above that, the first alone otherwise.
func checkWriteLinger(t *testing.T, ctx context.Context, client *protocol.Client, writes *writeLog, linger time.Duration) {
	t.Helper()
	var jobs []protocol.NewJob
	for i := range 3 {
		jobs = append(jobs, protocol.NewJob{Worker: "together", Payload: i})
	}
	enqueued, err := client.EnqueueMany(ctx, jobs)
	if err != nil {
		t.Fatal(err)
	}
	var due []*protocol.WorkItem
	for _, r := range enqueued {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		due = append(due, r.Item)
	}
	var held []*protocol.WorkItem
	for _, r := range client.ClaimMany(ctx, due, "together/1/w", time.Minute) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		held = append(held, r.Item)
	}
	writes.reset()
	errs := completeAll(ctx, client, held, 20*time.Millisecond, func(int) json.RawMessage { return nil })
	for i, err := range errs {
		if err != nil {
			t.Fatalf("job %d: %v", i, err)
		}
	}
	got := writes.sizes()
	if linger > 100*time.Millisecond {
		if len(got) != 1 || got[0] != "_bulk_docs 3" {
			t.Fatalf("the outcomes went as %v; want them together in one _bulk_docs", got)
		}
		return
	}
	if len(got) < 2 || got[0] != "PUT" {
		t.Fatalf("the outcomes went as %v; want the first alone, at once, as a PUT", got)
	}
}

// writeLog records the job writes that pass through it: "PUT" for a
// document's, "_bulk_docs N" for a batch of N.
type writeLog struct {
	mu     sync.Mutex
	writes []string
}

func (l *writeLog) through(next http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		var w string
		switch {
		case r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/job:"):
			w = "PUT"
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/_bulk_docs") && r.Body != nil:
			body, err := readRequestBody(r)
			if err != nil {
				return nil, err
			}
			var batch struct{ Docs []json.RawMessage }
			_ = json.Unmarshal(body, &batch)
			w = fmt.Sprintf("_bulk_docs %d", len(batch.Docs))
		}
		if w != "" {
			l.mu.Lock()
			l.writes = append(l.writes, w)
			l.mu.Unlock()
		}
		return next.RoundTrip(r)
	})
}

func (l *writeLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writes = nil
}

func (l *writeLog) sizes() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.writes...)
}
