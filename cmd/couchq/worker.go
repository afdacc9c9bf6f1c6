package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/handlers"
	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

const workerUsage = `Usage: couchq worker --type T[,T2...] --handler NAME [flags]
       couchq worker --config FILE [--type T,...] [--check] [flags]

Runs jobs of the given types with a built-in handler until it is stopped.
It creates the database and design document first if needed (as couchq
init does), wakes on the _changes feed, renews its leases while jobs run,
retries failures with backoff and sweeps the expired leases of dead
workers. Logs go to stderr, at info level unless --log-level says otherwise.

The first SIGINT or SIGTERM stops claiming and lets running jobs finish
for up to --shutdown-timeout; jobs still running then are cancelled and
released back to the queue (no attempt charged). A second signal exits at
once with status 1: the claims left behind return to the queue when their
lease runs out, through any worker's sweeper or couchq sweep.

	--type T[,T2...]       job types to run (required)
	--handler NAME         built-in handler: exec, http-check, noop or webhook
	                       (required)
	--exec "CMD ARGS"      the command the exec handler runs for every job; split
	                       into words like a shell does (quotes, backslashes) but
	                       never run through one; the job arrives on stdin
	--http-timeout D       bound on each http-check and webhook request
	                       unless the payload has a "timeout" (default 10s)
	--concurrency N        jobs of each type run at once (default 4)
	--lease D              how long a claim holds without renewal (default 30s)
	--drain                exit 0 once no due work of these types remains
	--delete-done          delete finished jobs instead of keeping them as done
	--max-attempts N       attempts for jobs without their own max_attempts
	                       (default 25)
	--shutdown-timeout D   how long running jobs may finish after a stop signal
	                       (default 30s)
	--rate 'T=N/PER'       at most N jobs of type T start per PER (s, m, h or a
	                       duration, windows aligned to the Unix epoch) across all
	                       worker processes together; give every process the same
	                       limit. Repeatable
	--fleet-concurrency 'T=K'
	                       at most K jobs of type T run at once across all worker
	                       processes together (--concurrency still bounds each);
	                       give every process the same limit. Repeatable
	--periodic 'T=SPEC'    enqueue a job of type T at every tick of SPEC: a cron
	                       expression ("0 7 * * 1-5", "@daily", "CRON_TZ=Europe/Berlin
	                       0 7 * * *") or "@every 5m". Repeatable. Any number of
	                       processes may run the same schedule: each tick yields
	                       one job (id job:periodic:T@TICK). T need not be one of
	                       --type. 'couchq periodic ls' shows the schedules
	--periodic-tz ZONE     time zone of cron expressions without CRON_TZ
	                       (default UTC)
	--catch-up once|all    ticks missed while no process ran a schedule: enqueue
	                       the latest once (default), or one job per missed tick
	--health-addr HOST:PORT
	                       serve this process's probes and metrics while it runs
	                       (default off; port 0 picks one, logged at info):
	                       /healthz  200 while the process runs
	                       /readyz   200 when CouchDB answered within three
	                                 heartbeats and the changes feed is
	                                 connected, else 503 with the reason
	                       /metrics  Prometheus metrics couchq_worker_* (see
	                                 the README) and the Go runtime's
	                       No authentication: keep it on loopback or behind a
	                       firewall (other addresses print a warning)

	--config FILE          run the job types of a TOML file, each with its own
	                       settings (below); flags given as well override the
	                       file for every type, and --type picks some of its types
	--check                with --config: validate the file, print the effective
	                       settings (never a password) and exit

The file (unknown keys and bad values are errors naming the file, line
and key; every key is optional but a type's handler):

	[couchdb]
	url = ["http://couch1:5984", "http://couch2:5984"]   # or one string
	user = "couchq-worker"
	password_file = "/run/secrets/couchq"   # or password_env = "VAR";
	ca_file = "/etc/couchq/ca.pem"          # never the password itself
	db = "couchq"

	[worker]
	shutdown_timeout = "30s"
	log_level = "info"
	health_addr = "127.0.0.1:8081"   # as --health-addr

	[defaults]            # for every type; same keys as a type's table
	concurrency = 4

	[types.email]
	handler = "exec"      # exec, http-check, noop or webhook
	exec = "/usr/local/bin/send-mail"
	concurrency = 8
	lease = "1m"
	max_attempts = 5
	retry_delay = "30s"   # fixed; without it attempt^4 s backoff
	delete_done = true
	rate = "10/s"
	fleet_concurrency = 20
	http_timeout = "10s"
	# and heartbeat, sweep_interval, feed_timeout, query_timeout, fallback_poll

	[[periodic]]
	type = "report"
	schedule = "0 7 * * 1-5"
	timezone = "Europe/Berlin"
	catch_up = "once"
	priority = 2          # of its jobs: 1 (first) to 5, default 3

Timings, mostly for tests and demos:

	--heartbeat D          lease renewal and registry update interval
	                       (default lease/3; must be shorter than the lease)
	--sweep-interval D     how often this process sweeps expired leases
	                       (default lease/2; negative disables its sweeper)
	--feed-timeout D       how long one _changes long-poll waits (default 60s)
	--query-timeout D      give up on a due-view query or a sweep after this
	                       long and ask again (default 30s)
	--fallback-poll D      look for due work at least this often even when the
	                       feed is quiet (default 30s)
	--retry-delay D        a fixed delay before every retry, instead of
	                       attempt^4 seconds plus jitter
`

// minLease is the shortest --lease: below it the heartbeat (lease/3) and
// the sweep (lease/2) would round to nothing, and no server answers fast
// enough to renew such a lease anyway.
const minLease = 100 * time.Millisecond

// workerFlags are couchq worker's own flags, validated by check.
type workerFlags struct {
	types           string
	handler         string
	exec            string
	httpTimeout     time.Duration
	concurrency     int
	lease           time.Duration
	drain           bool
	deleteDone      bool
	maxAttempts     int
	shutdownTimeout time.Duration
	heartbeat       time.Duration
	sweepInterval   time.Duration
	feedTimeout     time.Duration
	queryTimeout    time.Duration
	fallbackPoll    time.Duration
	retryDelay      time.Duration
	periodic        repeatedFlag
	rates           repeatedFlag
	fleet           repeatedFlag
	// fleetLimits is --fleet-concurrency parsed.
	fleetLimits map[string]int
	// rateLimits is --rate parsed.
	rateLimits map[string]protocol.RateLimit
	periodicTZ string
	catchUp    string
	// healthAddr is --health-addr; healthHost its host, checked.
	healthAddr string
	healthHost string
	// schedules is --periodic parsed.
	schedules []protocol.Periodic

	// set records which flags were given, for those whose zero value is
	// meaningful (--retry-delay 0 retries at once).
	set map[string]bool
	// typeList is --type split and checked.
	typeList []string
	// argv is --exec split into words.
	argv []string
}

func (m *Main) runWorker(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("worker", workerUsage)
	conn := addConnFlags(fs)
	// Operators watching a worker want to see its claims and failures.
	conn.logLevel = "info"
	f := &workerFlags{}
	fs.StringVar(&f.types, "type", "", "job types")
	fs.StringVar(&f.handler, "handler", "", "built-in handler")
	fs.StringVar(&f.exec, "exec", "", "command for the exec handler")
	fs.DurationVar(&f.httpTimeout, "http-timeout", handlers.DefaultHTTPTimeout, "HTTP request timeout")
	fs.IntVar(&f.concurrency, "concurrency", worker.ConcurrencyDefault, "jobs of each type at once")
	fs.DurationVar(&f.lease, "lease", worker.LeaseDurationDefault, "lease duration")
	fs.BoolVar(&f.drain, "drain", false, "exit when no due work remains")
	fs.BoolVar(&f.deleteDone, "delete-done", false, "delete finished jobs")
	fs.IntVar(&f.maxAttempts, "max-attempts", protocol.MaxAttemptsDefault, "default attempts per job")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", worker.ShutdownTimeoutDefault, "grace for running jobs")
	fs.DurationVar(&f.heartbeat, "heartbeat", 0, "heartbeat interval")
	fs.DurationVar(&f.sweepInterval, "sweep-interval", 0, "sweep interval")
	fs.DurationVar(&f.feedTimeout, "feed-timeout", worker.FeedTimeoutDefault, "changes long-poll timeout")
	fs.DurationVar(&f.queryTimeout, "query-timeout", worker.QueryTimeoutDefault, "due query and sweep timeout")
	fs.DurationVar(&f.fallbackPoll, "fallback-poll", worker.FallbackPollDefault, "fallback poll interval")
	fs.DurationVar(&f.retryDelay, "retry-delay", 0, "fixed retry delay")
	fs.Var(&f.periodic, "periodic", "periodic schedule TYPE=SPEC")
	fs.Var(&f.rates, "rate", "rate limit TYPE=N/PER")
	fs.Var(&f.fleet, "fleet-concurrency", "fleet-wide concurrency TYPE=K")
	fs.StringVar(&f.periodicTZ, "periodic-tz", "UTC", "time zone of cron schedules")
	fs.StringVar(&f.catchUp, "catch-up", "once", "missed ticks: once or all")
	var configFile string
	var checkOnly bool
	fs.StringVar(&configFile, "config", "", "worker configuration file (TOML)")
	fs.BoolVar(&checkOnly, "check", false, "validate --config, print the effective settings and exit")
	fs.StringVar(&f.healthAddr, "health-addr", "", "where to serve /healthz, /readyz and /metrics")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return cli.Usagef("unexpected argument %q (quote the --exec command as one argument)", rest[0])
	}
	f.set = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	given := map[string]bool{}
	for name := range f.set {
		given[name] = true
	}
	delete(f.set, "config")
	delete(f.set, "check")
	for _, name := range []string{"url", "db", "user", "password-file", "ca-file", "json", "log-level"} {
		delete(f.set, name) // connection flags, not the worker's
	}
	var specs []*workerFlags
	if configFile != "" {
		for _, name := range []string{"periodic", "periodic-tz", "catch-up"} {
			if f.set[name] {
				return cli.Usagef("--%s with --config: put schedules in the file's [[periodic]] tables", name)
			}
		}
		wf, src, err := loadWorkerFile(configFile)
		if err != nil {
			return err
		}
		if err := applyFileConn(m, configFile, src, conn, given, wf.CouchDB); err != nil {
			return err
		}
		if !given["log-level"] && wf.Worker.LogLevel != "" {
			conn.logLevel = wf.Worker.LogLevel
		}
		if specs, err = workerSpecs(configFile, wf, src, f); err != nil {
			return err
		}
	} else {
		if checkOnly {
			return cli.Usagef("--check needs --config FILE")
		}
		if err := f.check(); err != nil {
			return err
		}
		specs = []*workerFlags{f}
	}
	if err := conn.resolve(m); err != nil {
		return err
	}
	if checkOnly {
		return printWorkerCheck(m.Stdout, conn, specs)
	}
	log = log.Level(conn.level)
	return m.runWorkerSpecs(ctx, log, conn, specs)
}

// runWorkerSpecs runs one worker per spec (one spec without a config file,
// one per job type with one) in this process until ctx ends or one fails.
func (m *Main) runWorkerSpecs(ctx context.Context, log zerolog.Logger, conn *connFlags, specs []*workerFlags) error {
	// Handlers are built before connecting so that a command that cannot
	// run (exec of a missing program) is a usage error, not a failed job.
	hs := make([]worker.Handler, len(specs))
	for i, f := range specs {
		h, err := handlers.New(f.handler, handlers.Options{HTTPTimeout: f.httpTimeout, Exec: f.argv})
		if err != nil {
			if len(specs) > 1 {
				err = fmt.Errorf("type %s: %w", f.types, err)
			}
			return &cli.UsageError{Err: err}
		}
		hs[i] = h
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
	if specs[0].healthAddr != "" {
		metrics = worker.NewMetrics()
	}
	for i, f := range specs {
		q, err := srv.Open(ctx, conn.DB, protocol.Config{Logger: log, MaxAttempts: f.maxAttempts})
		if err != nil {
			return cli.ServerError(conn.URL, err)
		}
		cfg := f.config(hs[i], log)
		cfg.Metrics = metrics
		if workers[i], err = worker.New(q, cfg); err != nil {
			return &cli.UsageError{Err: err} // check covers what New rejects; kept as a backstop
		}
		log.Info().Str("url", conn.URL).Str("db", conn.DB).Str("types", f.types).Str("handler", f.handler).
			Str("vendor", srv.Caps.Vendor).Bool("selector_feed", srv.Caps.SelectorFilter).Msg("connected")
	}
	if specs[0].healthAddr != "" {
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
			log.Info().Dur("shutdown_timeout", specs[0].shutdownTimeout).
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

// check validates the flags before anything connects.
func (f *workerFlags) check() error {
	if f.types == "" {
		return cli.Usagef("--type is required: name the job types to run, e.g. --type email,sms")
	}
	seen := map[string]bool{}
	for _, t := range strings.Split(f.types, ",") {
		t = strings.TrimSpace(t)
		if t == "" {
			return cli.Usagef("invalid --type %q: empty job type", f.types)
		}
		if !seen[t] {
			seen[t] = true
			f.typeList = append(f.typeList, t)
		}
	}
	if f.handler == "" {
		return cli.Usagef("--handler is required: one of %s", strings.Join(handlers.Names(), ", "))
	}
	if f.exec != "" {
		if f.handler != handlers.NameExec {
			return cli.Usagef("--exec is only for --handler %s", handlers.NameExec)
		}
		argv, err := splitWords(f.exec)
		if err != nil {
			return cli.Usagef("invalid --exec %q: %v", f.exec, err)
		}
		f.argv = argv
	}
	switch {
	case f.concurrency < 1:
		return cli.Usagef("invalid --concurrency %d: must be at least 1", f.concurrency)
	case f.lease < minLease:
		return cli.Usagef("invalid --lease %s: must be at least %s", f.lease, minLease)
	case f.maxAttempts < 1:
		return cli.Usagef("invalid --max-attempts %d: must be at least 1", f.maxAttempts)
	case f.shutdownTimeout <= 0:
		return cli.Usagef("invalid --shutdown-timeout %s: must be positive", f.shutdownTimeout)
	case f.httpTimeout <= 0:
		return cli.Usagef("invalid --http-timeout %s: must be positive", f.httpTimeout)
	case f.feedTimeout <= 0:
		return cli.Usagef("invalid --feed-timeout %s: must be positive", f.feedTimeout)
	case f.queryTimeout <= 0:
		return cli.Usagef("invalid --query-timeout %s: must be positive", f.queryTimeout)
	case f.fallbackPoll <= 0:
		return cli.Usagef("invalid --fallback-poll %s: must be positive", f.fallbackPoll)
	case f.retryDelay < 0:
		return cli.Usagef("invalid --retry-delay %s: must not be negative", f.retryDelay)
	case f.set["heartbeat"] && f.heartbeat <= 0:
		return cli.Usagef("invalid --heartbeat %s: must be positive", f.heartbeat)
	case f.set["sweep-interval"] && f.sweepInterval == 0:
		return cli.Usagef("invalid --sweep-interval 0: leave it out for lease/2, or make it negative to disable sweeping")
	}
	if hb := f.heartbeatInterval(); hb >= f.lease {
		return cli.Usagef("invalid --heartbeat %s: must be shorter than the lease %s, which it renews", hb, f.lease)
	}
	if f.healthAddr != "" {
		host, err := cli.CheckListenAddr("health-addr", f.healthAddr, "127.0.0.1:8081")
		if err != nil {
			return err
		}
		f.healthHost = host
	}
	if err := f.checkRates(); err != nil {
		return err
	}
	if err := f.checkFleet(); err != nil {
		return err
	}
	return f.checkPeriodic()
}

// checkFleet parses --fleet-concurrency.
func (f *workerFlags) checkFleet() error {
	for _, v := range f.fleet {
		typ, k, ok := strings.Cut(v, "=")
		typ = strings.TrimSpace(typ)
		n, err := strconv.Atoi(strings.TrimSpace(k))
		switch {
		case !ok || typ == "" || err != nil:
			return cli.Usagef("invalid --fleet-concurrency %q: want TYPE=K, e.g. 'webhook=10'", v)
		case !slices.Contains(f.typeList, typ):
			return cli.Usagef("invalid --fleet-concurrency %q: %s is not one of --type %s", v, typ, f.types)
		case n < 1 || n > protocol.MaxRateSlots:
			return cli.Usagef("invalid --fleet-concurrency %q: K must be from 1 to %d", v, protocol.MaxRateSlots)
		}
		if _, dup := f.fleetLimits[typ]; dup {
			return cli.Usagef("invalid --fleet-concurrency %q: a limit for %s is already given", v, typ)
		}
		if f.fleetLimits == nil {
			f.fleetLimits = map[string]int{}
		}
		f.fleetLimits[typ] = n
	}
	return nil
}

// checkRates parses --rate.
func (f *workerFlags) checkRates() error {
	for _, v := range f.rates {
		typ, spec, ok := strings.Cut(v, "=")
		typ = strings.TrimSpace(typ)
		if !ok || typ == "" {
			return cli.Usagef("invalid --rate %q: want TYPE=N/PER, e.g. 'webhook=10/s'", v)
		}
		if !slices.Contains(f.typeList, typ) {
			return cli.Usagef("invalid --rate %q: %s is not one of --type %s", v, typ, f.types)
		}
		rl, err := protocol.ParseRate(spec)
		if err != nil {
			return cli.Usagef("invalid --rate %q: %v", v, err)
		}
		if _, dup := f.rateLimits[typ]; dup {
			return cli.Usagef("invalid --rate %q: a limit for %s is already given", v, typ)
		}
		if f.rateLimits == nil {
			f.rateLimits = map[string]protocol.RateLimit{}
		}
		f.rateLimits[typ] = rl
	}
	return nil
}

// checkPeriodic parses --periodic, --periodic-tz and --catch-up.
func (f *workerFlags) checkPeriodic() error {
	loc, err := time.LoadLocation(f.periodicTZ)
	if err != nil {
		return cli.Usagef("invalid --periodic-tz %q: %v", f.periodicTZ, err)
	}
	var catchUp protocol.CatchUp
	switch f.catchUp {
	case "once":
		catchUp = protocol.CatchUpOnce
	case "all":
		catchUp = protocol.CatchUpAll
	default:
		return cli.Usagef("invalid --catch-up %q: want once or all", f.catchUp)
	}
	seen := map[string]bool{}
	for _, v := range f.periodic {
		typ, spec, ok := strings.Cut(v, "=")
		typ, spec = strings.TrimSpace(typ), strings.TrimSpace(spec)
		if !ok || typ == "" || spec == "" {
			return cli.Usagef("invalid --periodic %q: want TYPE=SPEC, e.g. 'report=0 7 * * *' or 'ping=@every 5m'", v)
		}
		if seen[typ] {
			return cli.Usagef("invalid --periodic %q: a schedule for %s is already given", v, typ)
		}
		seen[typ] = true
		p := protocol.Periodic{Name: typ, Schedule: spec, Location: loc, Job: protocol.NewJob{Worker: typ}, CatchUp: catchUp}
		if _, err := protocol.CheckPeriodic(p); err != nil {
			return cli.Usagef("invalid --periodic %q: %v", v, err)
		}
		f.schedules = append(f.schedules, p)
	}
	return nil
}

// repeatedFlag collects every value of a flag given more than once.
type repeatedFlag []string

func (r *repeatedFlag) String() string { return strings.Join(*r, ", ") }

func (r *repeatedFlag) Set(v string) error {
	*r = append(*r, v)
	return nil
}

// heartbeatInterval is --heartbeat or the worker's default for the lease.
func (f *workerFlags) heartbeatInterval() time.Duration {
	if f.heartbeat > 0 {
		return f.heartbeat
	}
	return f.lease / worker.HeartbeatFractionDefault
}

// config is the worker configuration the flags describe; every type runs
// the one handler h.
func (f *workerFlags) config(h worker.Handler, log zerolog.Logger) worker.Config {
	h = loggingHandler{next: h, log: log}
	cfg := worker.Config{
		Handlers:          map[string]worker.Handler{},
		Concurrency:       f.concurrency,
		LeaseDuration:     f.lease,
		HeartbeatInterval: f.heartbeat,
		SweepInterval:     f.sweepInterval,
		ShutdownTimeout:   f.shutdownTimeout,
		FeedTimeout:       f.feedTimeout,
		QueryTimeout:      f.queryTimeout,
		FallbackPoll:      f.fallbackPoll,
		Drain:             f.drain,
		Periodic:          f.schedules,
		RateLimits:        f.rateLimits,
		FleetConcurrency:  f.fleetLimits,
		Logger:            log,
	}
	for _, t := range f.typeList {
		cfg.Handlers[t] = h
	}
	if f.deleteDone {
		cfg.DeleteDone = map[string]bool{}
		for _, t := range f.typeList {
			cfg.DeleteDone[t] = true
		}
	}
	if f.set["retry-delay"] {
		d := f.retryDelay
		cfg.Retry = func(int) time.Duration { return d }
	}
	return cfg
}

// healthWriteTimeout bounds writing one answer of --health-addr: the
// probes make no request and the metrics are in memory.
const healthWriteTimeout = 30 * time.Second

// serveHealth serves w's probes and metrics on --health-addr for as long as
// the worker runs, draining included (/readyz then says it is stopping);
// the returned function shuts the server down.
func serveHealth(ctx context.Context, ws []*worker.Worker, f *workerFlags, log zerolog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", f.healthAddr)
	if err != nil {
		return nil, fmt.Errorf("listening on --health-addr %s: %w", f.healthAddr, err)
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

// splitWords splits s into words the way a POSIX shell does, without any
// expansion: whitespace separates words, single quotes keep everything
// literally, double quotes keep everything but backslash escapes of " \ $
// and `, and a backslash outside quotes escapes the next character.
func splitWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	const (
		none = iota
		single
		double
	)
	quote := none
	runes := []rune(s)
	for i := 0; i < len(runes); i++ {
		r := runes[i]
		switch quote {
		case single:
			if r == '\'' {
				quote = none
			} else {
				cur.WriteRune(r)
			}
			continue
		case double:
			switch {
			case r == '"':
				quote = none
			case r == '\\' && i+1 < len(runes) && strings.ContainsRune(`"\$`+"`", runes[i+1]):
				i++
				cur.WriteRune(runes[i])
			default:
				cur.WriteRune(r)
			}
			continue
		}
		switch {
		case unicode.IsSpace(r):
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case r == '\'':
			quote, inWord = single, true
		case r == '"':
			quote, inWord = double, true
		case r == '\\':
			if i+1 == len(runes) {
				return nil, errors.New("trailing backslash")
			}
			i++
			cur.WriteRune(runes[i])
			inWord = true
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != none {
		return nil, errors.New("unterminated quote")
	}
	if inWord {
		words = append(words, cur.String())
	}
	if len(words) == 0 {
		return nil, errors.New("no command")
	}
	return words, nil
}
