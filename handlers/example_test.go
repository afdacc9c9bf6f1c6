package handlers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/couchq/couchq/handlers"
	"github.com/couchq/couchq/worker"
)

// Running the http-check handler directly on a job, as a worker would.
func ExampleHTTPCheck() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "healthy")
	}))
	defer srv.Close()

	check := &handlers.HTTPCheck{Timeout: 5 * time.Second}
	job := &worker.Job{
		ID:          "check-1",
		Type:        handlers.NameHTTPCheck,
		Attempt:     1,
		MaxAttempts: 3,
		Payload:     json.RawMessage(`{"url": "` + srv.URL + `/health", "timeout": "2s"}`),
	}
	if err := check.Handle(context.Background(), job); err != nil {
		fmt.Println("check failed:", err)
		return
	}

	var res handlers.HTTPCheckResult
	if err := json.Unmarshal(job.Result(), &res); err != nil {
		fmt.Println("decoding result:", err)
		return
	}
	fmt.Println("status:", res.Status)
	// Output: status: 200
}
