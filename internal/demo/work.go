package demo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// The demo's workers: two worker.Worker values in this process, sharing
// the queue as two processes on two machines would.
const (
	demoWorkers      = 2
	demoConcurrency  = 2
	demoLease        = 10 * time.Second
	demoRetryDelay   = time.Second
	demoWorkDeadline = 20 * time.Second // the scheduled job is due 2 s after enqueue
)

// work starts the demo's workers, prints what their handlers do as they
// do it, and stops them once every job is done.
func (d *demo) work(ctx context.Context) error {
	d.header("Starting %d workers in this process (worker.New, then Start), %d jobs of each type at a time each",
		demoWorkers, demoConcurrency)
	fmt.Fprintln(d.out, "(for real: worker.Run in your program, or 'couchq worker --type T --handler webhook')")

	// Workers go through Connect and Open, as a program of yours would:
	// on CouchDB they then follow the changes feed with a _selector filter.
	srv, err := d.conn.Connect(ctx, d.log)
	if err != nil {
		return cli.ServerError(d.conn.URL, err)
	}
	defer srv.Client.Close()
	q, err := srv.Open(ctx, d.conn.DB, protocol.Config{Logger: d.log})
	if err != nil {
		return cli.ServerError(d.conn.URL, err)
	}
	total, err := d.jobTotal(ctx, q)
	if err != nil {
		return err
	}

	p := &demoPrinter{d: d, start: time.Now()}
	hs := demoHandlers(p)
	var workers []*worker.Worker
	defer func() {
		for _, w := range workers {
			_ = w.Stop(context.WithoutCancel(ctx))
		}
	}()
	for i := range demoWorkers {
		w, err := worker.New((*couchq.Client)(q), worker.Config{
			Handlers:      hs,
			Concurrency:   demoConcurrency,
			LeaseDuration: demoLease,
			Retry:         func(int) time.Duration { return demoRetryDelay },
			ID:            fmt.Sprintf("demo%d", i+1),
			Logger:        d.log,
		})
		if err != nil {
			return err
		}
		if err := w.Start(ctx); err != nil {
			return cli.ServerError(d.conn.URL, err)
		}
		workers = append(workers, w)
	}

	// Watch the status counts until every job is done.
	deadline := time.NewTimer(demoWorkDeadline)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		counts, err := q.Counts(ctx)
		if err != nil {
			return cli.ServerError(d.conn.URL, err)
		}
		done := 0
		for _, byStatus := range counts {
			done += int(byStatus[protocol.StatusDone])
		}
		if done >= total {
			p.printf("all %d of %d jobs done", done, total)
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("only %d of %d jobs done after %s", done, total, demoWorkDeadline)
		case <-tick.C:
		}
	}
	for _, w := range workers {
		if err := w.Stop(ctx); err != nil {
			return err
		}
	}
	workers = nil
	fmt.Fprintln(d.out, "workers stopped (each removed its registry document)")
	return nil
}

// jobTotal counts the demo database's jobs, whatever their status.
func (d *demo) jobTotal(ctx context.Context, q *protocol.Client) (int, error) {
	counts, err := q.Counts(ctx)
	if err != nil {
		return 0, cli.ServerError(d.conn.URL, err)
	}
	n := 0
	for _, byStatus := range counts {
		for _, c := range byStatus {
			n += int(c)
		}
	}
	return n, nil
}

// showRetried shows the job that failed once, with its history.
func (d *demo) showRetried(ctx context.Context) error {
	d.header("couchq show %s   (the thumbnail job that failed once and was retried)", d.retryID)
	return cli.ShowJob(ctx, d.out, d.q, d.retryID, d.opts.Now(), d.opts.Out.JSON)
}

// demoPrinter writes the handlers' lines, stamped with the time since the
// workers started; handlers run concurrently, so it serialises them.
type demoPrinter struct {
	d     *demo
	start time.Time
	mu    sync.Mutex
}

func (p *demoPrinter) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.d.out, "%4.1fs  %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
}

// job prints one line about a job: the worker that runs it, its type, a
// short id and what happened.
func (p *demoPrinter) job(job *worker.Job, format string, args ...any) {
	by := job.Item.ClaimedBy
	by = by[strings.LastIndex(by, "/")+1:]
	id := strings.TrimPrefix(job.ID, "job:")
	if len(id) > 8 {
		id = "…" + id[len(id)-8:]
	}
	p.printf("%-5s  %-9s  %s  %s", by, job.Type, id, fmt.Sprintf(format, args...))
}

// demoHandlers pretend to do the demo jobs' work, taking a moment each.
// The thumbnail job fails on its first attempt, as a flaky dependency
// would make it, and succeeds when the worker retries it.
func demoHandlers(p *demoPrinter) map[string]worker.Handler {
	pause := func(ctx context.Context, d time.Duration) error {
		select {
		case <-time.After(d):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	type email struct {
		To       string `json:"to"`
		Template string `json:"template"`
	}
	type thumbnail struct {
		Image string `json:"image"`
		Width int    `json:"width"`
	}
	type report struct {
		Period string `json:"period"`
	}
	type ping struct {
		N int `json:"n"`
	}
	return map[string]worker.Handler{
		"email": worker.Typed(func(ctx context.Context, job *worker.Job, args email) error {
			if err := pause(ctx, 300*time.Millisecond); err != nil {
				return err
			}
			p.job(job, "sent %q to %s", args.Template, args.To)
			return job.SetResult(map[string]string{"sent_to": args.To, "message_id": strings.TrimPrefix(job.ID, "job:") + "@demo"})
		}),
		"thumbnail": worker.Typed(func(ctx context.Context, job *worker.Job, args thumbnail) error {
			if err := pause(ctx, 200*time.Millisecond); err != nil {
				return err
			}
			if job.Attempt == 1 {
				p.job(job, "attempt 1 failed: image store busy (retry in %s)", demoRetryDelay)
				return errors.New("image store busy: 503 from storage")
			}
			name := fmt.Sprintf("%s-%d.png", strings.TrimSuffix(args.Image, ".png"), args.Width)
			p.job(job, "attempt %d: resized %s to %dpx: %s", job.Attempt, args.Image, args.Width, name)
			return job.SetResult(map[string]string{"thumbnail": name})
		}),
		"report": worker.Typed(func(ctx context.Context, job *worker.Job, args report) error {
			if err := pause(ctx, 400*time.Millisecond); err != nil {
				return err
			}
			p.job(job, "built the %s report (it was scheduled for later)", args.Period)
			return job.SetResult(map[string]any{"period": args.Period, "rows": 42})
		}),
		"ping": worker.Typed(func(ctx context.Context, job *worker.Job, args ping) error {
			if err := pause(ctx, 100*time.Millisecond); err != nil {
				return err
			}
			p.job(job, "pong %d", args.N)
			return job.SetResult(map[string]int{"pong": args.N})
		}),
	}
}
