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
	workers := make([]*worker.Worker, len(specs))
	// One set of metrics for the process, whatever number of types it runs.
	var metrics *worker.Metrics
	if specs[0].HealthAddr != "" {
		metrics = worker.NewMetrics()
	}
	for i, f := range specs {
		q, err := srv.Open(ctx, conn.DB, protocol.Config{Logger: log, MaxAttempts: f.MaxAttempts, Site: conn.Site, BeforeEnqueue: f.BeforeEnqueue})
		if err != nil {
			return cli.ServerError(conn.URL, err)
		}
		cfg := f.config(hs[i], log)
		cfg.Metrics = metrics
		if workers[i], err = worker.New((*couchq.Client)(q), cfg); err != nil {
			return &cli.UsageError{Err: err} // check covers what New rejects; kept as a backstop
		}
		log.Info().Str("url", conn.URL).Str("db", conn.DB).Str("types", f.Types).Str("handler", orDefault(f.Handler, "go")).
			Str("vendor", srv.Caps.Vendor).Bool("selector_feed", srv.Caps.SelectorFilter).Msg("connected")
	}
	if specs[0].HealthAddr != "" {
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
	// One failing worker stops the others: the process is one unit for
	// its supervisor, which restarts it whole.
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
	if first != nil {
		return cli.ServerError(conn.URL, fmt.Errorf("running worker: %w", first))
	}
	return nil
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
