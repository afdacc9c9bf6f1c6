// Package couchqtest helps test code that uses couchq.
//
// RunJob runs a handler on a job in the test's own goroutine, with no
// server: the job is built and claimed as a worker would, and the handler
// gets the same Job, payload decoding and context as under a worker; the
// outcome says what the worker would then store. RequireEnqueued and
// RequireNotEnqueued check, against a real database, what the code under
// test enqueued.
package couchqtest

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/jobrun"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// Kind is what a worker would make of an attempt: Done, Retry, Failed,
// Cancelled, Snoozed or AwaitingChildren.
type Kind = jobrun.Kind

// The outcomes of an attempt. A handler's nil is Done; JobSnooze, JobCancel
// and JobFail give Snoozed, Cancelled and Failed; any other error (a panic
// too) is a Retry while attempts remain, else Failed.
const (
	Done      = jobrun.Done
	Retry     = jobrun.Retry
	Failed    = jobrun.Failed
	Cancelled = jobrun.Cancelled
	Snoozed   = jobrun.Snoozed
	// AwaitingChildren is a handler's JobAwaitChildren: the job waits for
	// the children it enqueued (Job.EnqueueChild needs a worker's client,
	// so under RunJob a handler that enqueues children gets an error).
	AwaitingChildren = jobrun.AwaitingChildren
)

// RunOpts adjust RunJob; the zero value (or nil) runs the first attempt.
type RunOpts struct {
	// Attempt is the attempt to run, from 1; 0 runs the one after the
	// job's stored attempts (the first, for a NewJob).
	Attempt int
	// MaxAttempts is the queue's default (couchq.Config.MaxAttempts) for a
	// job without its own; 0 is couchq.MaxAttemptsDefault.
	MaxAttempts int
	// Slot is the sequence slot handed to the handler (Job.Slot).
	Slot string
	// Middleware wraps the handler call as worker.Config.Middleware does.
	Middleware []worker.Middleware
}

// Outcome is what RunJob's attempt came to.
type Outcome struct {
	// Kind is what a worker would store: the job done, retried, failed,
	// cancelled or snoozed.
	Kind Kind
	// Err is the handler's error: nil when done (a cancel's reason is
	// its CancelError; a handler's panic a *worker.PanicError).
	Err error
	// Result is what the handler recorded with Job.SetResult.
	Result json.RawMessage
	// SnoozeDelay is a snooze's delay.
	SnoozeDelay time.Duration
	// Progress is the handler's last Job.Progress report (nil when none),
	// and Reports how many it made.
	Progress *couchq.Progress
	Reports  int
	// Job is the Job the handler was given.
	Job *worker.Job
}

// RunJob runs handler on one attempt of job, a couchq.NewJob (built as
// Enqueue would build it) or a *couchq.WorkItem (as stored, say by
// Client.Get), claimed as a worker claims it. The handler runs in the
// calling goroutine on a context derived from ctx, as a worker derives it
// from its own, through opts.Middleware as a worker's, and a panic is
// recovered as a worker recovers it (logged with t). A job that could not
// be enqueued fails the test.
func RunJob[J couchq.NewJob | *couchq.WorkItem](ctx context.Context, t testing.TB, handler worker.Handler, job J, opts *RunOpts) *Outcome {
	t.Helper()
	if handler == nil {
		t.Fatalf("couchqtest: a nil handler to run")
		return nil
	}
	if opts == nil {
		opts = &RunOpts{}
	}
	client := protocol.Offline(protocol.Config{Actor: "couchqtest", MaxAttempts: opts.MaxAttempts})
	var item *protocol.WorkItem
	switch j := any(job).(type) {
	case couchq.NewJob:
		it, err := client.Draft(j)
		if err != nil {
			t.Fatalf("couchqtest: building the job to run: %v", err)
			return nil
		}
		item = it
	case *couchq.WorkItem:
		if j == nil {
			t.Fatalf("couchqtest: a nil job to run")
			return nil
		}
		item = j
	}
	if !item.Claimed {
		if opts.Attempt > 0 {
			item = item.Clone()
			item.Attempts = opts.Attempt - 1
		}
		item = client.DraftClaim(item, "couchqtest", worker.LeaseDurationDefault)
	} else if opts.Attempt > 0 {
		item = item.Clone()
		item.Attempts = opts.Attempt
	}
	rep := &reports{}
	j := jobrun.New(item, client.MaxAttempts(item), rep, nil)
	j.Slot = opts.Slot
	// The worker gives each job a context of its own, cancelled (with a
	// cause) when its claim is lost or the worker stops.
	jctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	err := jobrun.Call(jctx, j, handler.Handle, opts.Middleware, func(what string, p any, stack []byte) {
		t.Logf("couchqtest: %s of job %s panicked: %v\n%s", what, j.ID, p, stack)
	})
	out := jobrun.Decide(err, j.Attempt, j.MaxAttempts)
	o := &Outcome{Kind: out.Kind, Err: out.Err, SnoozeDelay: out.Delay, Job: j}
	if out.Kind == jobrun.Done {
		o.Result = j.Result()
	}
	o.Progress, o.Reports = rep.last()
	return o
}

// reports keeps a job's progress reports.
type reports struct {
	mu     sync.Mutex
	latest *protocol.Progress
	n      int
}

func (r *reports) Report(p *protocol.Progress) {
	r.mu.Lock()
	r.latest = p
	r.n++
	r.mu.Unlock()
}

func (r *reports) last() (*protocol.Progress, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.latest, r.n
}
