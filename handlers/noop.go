package handlers

import (
	"context"

	"github.com/couchq/couchq/worker"
)

// Noop is the noop handler: it succeeds at once without looking at the
// payload and records no result. It exists to measure the queue itself
// (couchq-bench, load tests): with a handler that costs nothing, a
// worker's throughput is the protocol's cost alone.
type Noop struct{}

// Handle completes the job.
func (Noop) Handle(context.Context, *worker.Job) error { return nil }
