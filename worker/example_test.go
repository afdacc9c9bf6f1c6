package worker_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/couchq/couchq/worker"
)

// A typed handler decodes each job's payload into its own struct.
func ExampleTyped() {
	type welcome struct {
		Email string `json:"email"`
	}
	handler := worker.Typed(func(ctx context.Context, job *worker.Job, args welcome) error {
		fmt.Printf("attempt %d: sending welcome mail to %s\n", job.Attempt, args.Email)
		return job.SetResult(map[string]bool{"sent": true})
	})

	// The runtime builds the Job from a claimed WorkItem; here by hand.
	job := &worker.Job{ID: "job:1", Type: "welcome", Attempt: 1, Payload: json.RawMessage(`{"email":"ada@example.com"}`)}
	if err := handler.Handle(context.Background(), job); err != nil {
		fmt.Println("error:", err)
	}
	fmt.Println(string(job.Result()))
	// Output:
	// attempt 1: sending welcome mail to ada@example.com
	// {"sent":true}
}
