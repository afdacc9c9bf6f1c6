package handlers_test

import (
	"context"
	"testing"

	"github.com/couchq/couchq/handlers"
)

func TestNoopSucceedsWithoutResult(t *testing.T) {
	h, err := handlers.New(handlers.NameNoop, handlers.Options{})
	if err != nil {
		t.Fatalf("New(noop): %v", err)
	}
	for _, payload := range []string{"", `{"anything": [1, 2]}`, `"not an object"`} {
		job := newJob(t, payload)
		if err := h.Handle(context.Background(), job); err != nil {
			t.Fatalf("noop with payload %q: %v", payload, err)
		}
		if job.Result() != nil {
			t.Fatalf("noop recorded a result: %s", job.Result())
		}
	}
	// A cancelled context (a stopping worker) still completes: there is
	// nothing to interrupt, and releasing the job would only run it again.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h.Handle(ctx, newJob(t, "")); err != nil {
		t.Fatalf("noop with a cancelled context: %v", err)
	}
}
