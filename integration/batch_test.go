package integration

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/couchq"
)

// Outcomes written at once by many goroutines are coalesced into
// _bulk_docs requests, and each document still wins or loses on its own: a
// stale revision is a lost claim for that job only, and a write the server's
// validation refuses reports the real 403, not a retryable 500.
func TestConcurrentOutcomesEachWinOrLoseAlone(t *testing.T) {
	tb := setup(t, couchq.Config{})
	ctx := tb.ctx
	// An application's own validation that refuses one result.
	code, body := tb.raw(t, http.MethodPut, "/_design/app", `{"validate_doc_update":
		"function (doc) { if (doc.result && doc.result.forbidden) { throw({forbidden: 'no forbidden results'}); } }"}`)
	if code != http.StatusCreated {
		t.Fatalf("installing the app's validation: %d %s", code, body)
	}
	var jobs []couchq.NewJob
	for i := range 60 {
		jobs = append(jobs, couchq.NewJob{Worker: "many", Payload: i})
	}
	if _, err := tb.client.EnqueueMany(ctx, jobs); err != nil {
		t.Fatal(err)
	}
	batch, err := tb.client.Due(ctx, "many", 100)
	if err != nil || len(batch.Items) != 60 {
		t.Fatalf("due: %v, %d items", err, len(batch.Items))
	}
	var held []*couchq.WorkItem
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
	var wg sync.WaitGroup
	errs := make([]error, len(held))
	for i, it := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			result := fmt.Appendf(nil, `{"n":%d}`, i)
			if i == 1 {
				result = []byte(`{"forbidden":true}`)
			}
			errs[i] = tb.client.Complete(ctx, it, result)
		}()
	}
	wg.Wait()
	if !errors.Is(errs[0], couchq.ErrClaimLost) || kivik.HTTPStatus(errs[0]) != http.StatusConflict {
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
		if err != nil || it.Status != couchq.StatusDone || string(it.Result) != fmt.Sprintf(`{"n":%d}`, i) {
			t.Fatalf("job %d: %v %+v", i, err, it)
		}
	}
	if it, _ := tb.client.Get(ctx, held[0].ID); it.Status != couchq.StatusRunning || it.Rev != renewed.Rev {
		t.Errorf("the stale write must not have landed: %+v", it)
	}
}
