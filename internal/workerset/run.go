package workerset

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/handlers"
	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// Run runs one worker per checked spec (one for couchq worker's flags,
// one per job type of a configuration file) in this process until ctx
// ends or one of them fails, creating the database and its design
// documents first if needed. conn is resolved. The first spec's
// HealthAddr and ShutdownTimeout are the process's.
func Run(ctx context.Context, log zerolog.Logger, conn *cli.Conn, specs []*Spec) error {
	// Handlers are built before connecting so that a command that cannot
	// run (exec of a missing program) is a usage error, not a failed job.
	hs, err := buildHandlers(conn, specs)
	if err != nil {
		return err
	}

	srv, err := conn.Connect(ctx, log)
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	defer srv.Client.Close()
	if _, err := protocol.Init(ctx, srv.Client, conn.DB, log); err != nil {
		return cli.ServerError(conn.URL, fmt.Errorf("preparing database %s: %w", conn.DB, err))
	}
	// One set of metrics for the process, whatever number of types it runs.
	var metrics *worker.Metrics
	if specs[0].HealthAddr != "" {
		metrics = worker.NewMetrics()
	}
	var queue *protocol.Client
	newWorkers := func(round int) ([]*worker.Worker, error) {
		workers := make([]*worker.Worker, len(specs))
		for i, f := range specs {
			q, err := srv.Open(ctx, conn.DB, protocol.Config{Logger: log, MaxAttempts: f.MaxAttempts, Site: conn.Site, BeforeEnqueue: f.BeforeEnqueue})
			if err != nil {
				return nil, cli.ServerError(conn.URL, err)
			}
			queue = q
			cfg := f.config(hs[i], log)
			cfg.Metrics = metrics
			if round > 1 {
				// The schedules ticked in the first round; ticking again
				// in each round would keep a drain going for ever.
				cfg.Periodic = nil
			}
			if workers[i], err = worker.New((*couchq.Client)(q), cfg); err != nil {
				return nil, &cli.UsageError{Err: err} // check covers what New rejects; kept as a backstop
			}
			if round == 1 {
				log.Info().Str("url", conn.URL).Str("db", conn.DB).Str("types", f.Types).Str("handler", orDefault(f.Handler, "go")).
					Str("vendor", srv.Caps.Vendor).Bool("selector_feed", srv.Caps.SelectorFilter).Msg("connected")
			}
		}
		return workers, nil
	}
	workers, err := newWorkers(1)
	if err != nil {
		return err
	}
	if specs[0].HealthAddr != "" {
		// The probes follow the first round's workers: a drain that
		// runs again is a cron job's, which nothing probes.
		stopHealth, err := serveHealth(ctx, workers, specs[0], log)
		if err != nil {
			return err
		}
		defer stopHealth()
	}

	runDone := make(chan struct{})
	defer close(runDone)
	go func() {
		select {
		case <-ctx.Done():
			log.Info().Dur("shutdown_timeout", specs[0].ShutdownTimeout).
				Msg("stopping: no new claims; running jobs may finish, then are released (signal again to exit at once)")
		case <-runDone:
		}
	}()
	for round := 1; ; round++ {
		if err := runAll(ctx, workers); err != nil {
			return cli.ServerError(conn.URL, fmt.Errorf("running worker: %w", err))
		}
		// Each type of a configuration file has a worker of its own, which
		// drains alone: a job of one type may have enqueued work of
		// another whose worker had drained already. The process drains
		// once every worker has, and no work of its types is due.
		// A round that claimed nothing leaves what is due to others (a
		// paused type, a job another site owns): another would too.
		if !specs[0].Drain || len(specs) == 1 || ctx.Err() != nil || claimedBy(workers) == 0 {
			return nil
		}
		due, err := dueTypes(ctx, queue, specs)
		if err != nil {
			return cli.ServerError(conn.URL, fmt.Errorf("draining: %w", err))
		}
		if len(due) == 0 {
			return nil
		}
		log.Info().Strs("types", due).Int("round", round+1).Msg("drain: work of these types came due after their workers drained; draining again")
		if workers, err = newWorkers(round + 1); err != nil {
			return err
		}
	}
}

// runAll runs the workers until each returns (ctx ended, or drained) or
// one fails, which stops the others: the process is one unit for its
// supervisor, which restarts it whole.
func runAll(ctx context.Context, workers []*worker.Worker) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(workers))
	for _, w := range workers {
		go func() {
			err := w.Run(runCtx)
			if err != nil {
				cancel()
			}
			errs <- err
		}()
	}
	var first error
	for range workers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// claimedBy is how many jobs the workers claimed.
func claimedBy(workers []*worker.Worker) int64 {
	var n int64
	for _, w := range workers {
		n += w.Stats().Claimed
	}
	return n
}

// dueTypes lists the specs' job types that have a job due now.
func dueTypes(ctx context.Context, q *protocol.Client, specs []*Spec) ([]string, error) {
	var due []string
	for _, f := range specs {
		for _, typ := range strings.Split(f.Types, ",") {
			b, err := q.Due(ctx, typ, 1)
			if err != nil {
				return nil, err
			}
			if len(b.Items) > 0 {
				due = append(due, typ)
			}
		}
	}
	return due, nil
}

// healthWriteTimeout bounds writing one answer of --health-addr: the
// probes make no request and the metrics are in memory.
const healthWriteTimeout = 30 * time.Second

// serveHealth serves w's probes and metrics on --health-addr for as long as
// the worker runs, draining included (/readyz then says it is stopping);
// the returned function shuts the server down.
func serveHealth(ctx context.Context, ws []*worker.Worker, f *Spec, log zerolog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", f.HealthAddr)
	if err != nil {
		return nil, fmt.Errorf("listening on --health-addr %s: %w", f.HealthAddr, err)
	}
	url := "http://" + ln.Addr().String()
	if !cli.IsLoopback(f.healthHost) {
		log.Warn().Str("addr", ln.Addr().String()).
			Msg("--health-addr is not loopback: there is no authentication; put a proxy or firewall in front")
	}
	log.Info().Str("url", url).Msg("health and metrics on " + url + ": /healthz, /readyz, /metrics")
	// A scrape in flight when the stop signal comes is still answered.
	reqCtx := context.WithoutCancel(ctx)
	srv := cli.NewHTTPServer(reqCtx, worker.HealthHandler(ws...), healthWriteTimeout, log)
	served := make(chan struct{})
	go func() {
		defer close(served)
		// The worker goes on without its probes: they are no reason to
		// stop running jobs.
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Str("url", url).Msg("health server stopped")
		}
	}()
	return func() {
		sctx, cancel := context.WithTimeout(reqCtx, cli.ServeShutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
		<-served
	}, nil
}

// loggingHandler logs each attempt's start and success at info level, so
// that an operator sees every claim; the worker itself logs failures and
// refused results.
type loggingHandler struct {
	next worker.Handler
	log  zerolog.Logger
}

func (h loggingHandler) Handle(ctx context.Context, job *worker.Job) error {
	start := time.Now()
	h.log.Info().Str("job", job.ID).Str("type", job.Type).Int("attempt", job.Attempt).
		Int("max_attempts", job.MaxAttempts).Msg("job claimed")
	err := h.next.Handle(ctx, job)
	if err == nil {
		h.log.Info().Str("job", job.ID).Str("type", job.Type).Int("attempt", job.Attempt).
			Dur("took", time.Since(start)).Msg("handler succeeded")
	} else {
		h.log.Debug().Str("job", job.ID).Str("type", job.Type).Int("attempt", job.Attempt).
			Err(err).Dur("took", time.Since(start)).Msg("handler failed")
	}
	return err
}

// Check reports what would keep specs from running with conn before any
// request: a handler that cannot be built (exec of a missing program) or
// a CA file that holds no certificate. conn is resolved.
func Check(conn *cli.Conn, specs []*Spec) error {
	if _, err := buildHandlers(conn, specs); err != nil {
		return err
	}
	_, err := conn.HTTPClient(zerolog.Nop())
	return err
}

// buildHandlers builds each spec's handlers: its built-in one for each of
// its types, or its Go ones.
func buildHandlers(conn *cli.Conn, specs []*Spec) ([]map[string]worker.Handler, error) {
	hs := make([]map[string]worker.Handler, len(specs))
	for i, f := range specs {
		if f.Handler == "" {
			hs[i] = f.Handlers
			continue
		}
		opts := handlers.Options{HTTPTimeout: f.HTTPTimeout, Exec: f.argv}
		if f.Handler == handlers.NameExec {
			opts.ExecEnv = commandEnv(os.Environ(), conn.Passwords())
		}
		h, err := handlers.New(f.Handler, opts)
		if err != nil {
			if len(specs) > 1 {
				err = fmt.Errorf("type %s: %w", f.Types, err)
			}
			return nil, &cli.UsageError{Err: err}
		}
		hs[i] = map[string]worker.Handler{}
		for _, t := range f.typeList {
			hs[i][t] = h
		}
	}
	return hs, nil
}

// commandEnv is environ without the CouchDB passwords the worker was
// given: a variable whose value holds one anywhere ($COUCHDB_PASSWORD, a
// configuration file's password_env, a copy with a trailing newline), a
// URL that carries one ($COUCHDB_URL), or the name of the file that holds
// one ($COUCHDB_PASSWORD_FILE). A
// command has no need of the worker's credentials, and what it prints to
// stderr is stored in the job, where every reader of the database sees it.
func commandEnv(environ []string, passwords []string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if k == "COUCHDB_PASSWORD_FILE" {
			continue // the command could read the file
		}
		if !slices.ContainsFunc(passwords, func(pw string) bool {
			// Anywhere in the value (a copy with a newline, a
			// connection string), or escaped in a URL: user:p%40ss@host.
			inURL := url.UserPassword("", pw).String() + "@"
			return pw != "" && (strings.Contains(v, pw) || strings.Contains(v, inURL))
		}) {
			out = append(out, kv)
		}
	}
	return out
}
