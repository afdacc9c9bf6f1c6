// Package fleet runs a process's couchq workers from a worker configuration
// file, as `couchq worker --config FILE` does, so that a program of yours
// can run the same fleet with Go handlers of its own beside the file's
// built-in ones (exec, http-check, noop and webhook; see package handlers):
//
//	cfg, err := fleet.Load("workers.toml")
//	if err != nil {
//		return err
//	}
//	return fleet.Run(ctx, cfg, fleet.Options{
//		Handlers: map[string]worker.Handler{"email": sendEmail},
//		Logger:   log,
//	})
//
// Run creates the database and its design documents if needed, runs one
// worker per job type until ctx ends (then lets running jobs finish for
// the shutdown timeout and releases the rest) or one of them fails, and
// serves the process's probes and metrics when the file asks for them.
//
// # The file
//
// The file is TOML, read strictly: an unknown key or a bad value is an
// error naming the file, the line and the key. Every key is optional.
// [defaults] gives values for every type, and each [types.NAME] table is
// one job type to run with its own settings over them. A type's handler is
// the built-in handler that runs its jobs; leave it out for a type whose
// handler your program gives Run (couchq worker requires it).
//
//	[couchdb]
//	url = ["http://couch1:5984", "http://couch2:5984"]   # or one string
//	user = "couchq-worker"
//	password_file = "/run/secrets/couchq"   # or password_env = "VAR";
//	ca_file = "/etc/couchq/ca.pem"          # never the password itself
//	db = "couchq"
//	site = "berlin"   # in a queue of several sites: the one these workers run for
//
//	[worker]
//	shutdown_timeout = "30s"
//	log_level = "info"
//	health_addr = "127.0.0.1:8081"   # /healthz, /readyz and /metrics
//
//	[defaults]            # for every type; same keys as a type's table
//	concurrency = 4
//
//	[types.email]
//	handler = "exec"      # exec, http-check, noop or webhook
//	exec = "/usr/local/bin/send-mail"
//	concurrency = 8
//	lease = "1m"
//	max_attempts = 5
//	retry_delay = "30s"   # fixed; without it attempt^4 s backoff
//	job_timeout = "10m"   # bound on one attempt; without it none
//	delete_done = true
//	rate = "10/s"         # starts across every process together
//	fleet_concurrency = 20
//	http_timeout = "10s"
//	# and heartbeat, sweep_interval, feed_timeout, query_timeout, fallback_poll
//
//	[[periodic]]
//	type = "report"
//	schedule = "0 7 * * 1-5"
//	timezone = "Europe/Berlin"
//	catch_up = "once"
//	priority = 2          # of its jobs: 1 (first) to 5, default 3
//
// Each key is a field of Config, Type or Connection, which a program may
// also fill in itself, without a file. `couchq help worker` describes the
// keys as the flags of the same names.
//
// # The connection
//
// Connection says how to reach the queue. Load takes it from the file's
// [couchdb] table with the environment's settings over it, as the couchq
// command does: $COUCHDB_URL, $COUCHDB_USER, $COUCHDB_PASSWORD_FILE or
// $COUCHDB_PASSWORD, $COUCHQ_DB and $COUCHQ_SITE, so that a deployment overrides a
// shared file without editing it. ConnectionFromEnv is the environment's
// alone, and Connection.Open opens the queue for a program that enqueues.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/workerset"
	"github.com/couchq/couchq/worker"
)

// Config is what a worker configuration file says: how to reach the queue,
// the job types to run and the process's own settings.
type Config struct {
	// Connection is how to reach the queue ([couchdb]).
	Connection Connection
	// Types are the job types to run, one worker each, in the order of
	// their names in a loaded file ([types.NAME]).
	Types []Type
	// Periodic are the schedules the process enqueues jobs for
	// ([[periodic]]); see worker.Config.Periodic.
	Periodic []couchq.Periodic
	// ShutdownTimeout is how long running jobs may finish once Run's
	// context ends; zero means worker.ShutdownTimeoutDefault.
	ShutdownTimeout time.Duration
	// LogLevel is the level Run sets on its logger: debug, info, warn,
	// error or disabled; empty leaves the logger's own.
	LogLevel string
	// HealthAddr is where Run serves the process's probes and metrics
	// (worker.HealthHandler) as HOST:PORT; empty serves none. They have no
	// authentication: keep them on loopback or behind a firewall.
	HealthAddr string
}

// Type is one job type's settings ([types.NAME] over [defaults]). A zero
// duration or number means its default, as in worker.Config.
type Type struct {
	// Name is the job type.
	Name string
	// Handler names the built-in handler that runs the type's jobs (see
	// handlers.New); empty for a Go handler given to Run.
	Handler string
	// Exec is the exec handler's command, split into words as a shell
	// does (quotes, backslashes) but never run through one.
	Exec string
	// HTTPTimeout bounds each http-check and webhook request whose payload
	// gives no timeout; default handlers.DefaultHTTPTimeout.
	HTTPTimeout time.Duration
	// Concurrency is how many of the type's jobs run at once in the process.
	Concurrency int
	// Lease is how long a claim holds without renewal
	// (worker.Config.LeaseDuration).
	Lease time.Duration
	// MaxAttempts is how many attempts a job without its own max_attempts
	// gets; default 25.
	MaxAttempts int
	// RetryDelay, when not nil, is a fixed delay before every retry;
	// nil retries after worker.DefaultRetry's backoff.
	RetryDelay *time.Duration
	// JobTimeout bounds one attempt (worker.Config.JobTimeout); zero for
	// no bound.
	JobTimeout time.Duration
	// DeleteDone deletes finished jobs instead of keeping them as done.
	DeleteDone bool
	// Rate bounds how many jobs of the type start across every worker
	// process together, as N/PER: "10/s", "100/m", "5/30s"; empty for none.
	Rate string
	// FleetConcurrency bounds how many jobs of the type run at once across
	// every worker process together; zero for no bound.
	FleetConcurrency int
	// Heartbeat is worker.Config.HeartbeatInterval; SweepInterval,
	// FeedTimeout, QueryTimeout and FallbackPoll are worker.Config's
	// fields of the same names (SweepInterval negative disables the
	// process's sweeper).
	Heartbeat     time.Duration
	SweepInterval time.Duration
	FeedTimeout   time.Duration
	QueryTimeout  time.Duration
	FallbackPoll  time.Duration
}

// Options are what Run takes besides the configuration.
type Options struct {
	// Handlers are Go handlers by job type, for the types whose Handler is
	// empty.
	Handlers map[string]worker.Handler
	// Middleware wraps every handler call of every type (see
	// worker.Config.Middleware), built-in handlers included.
	Middleware []worker.Middleware
	// BeforeEnqueue hooks run on the periodic jobs the fleet enqueues (see
	// couchq.Config.BeforeEnqueue).
	BeforeEnqueue []func(ctx context.Context, job *couchq.NewJob) error
	// Logger receives the workers' logs, each job's claim and success at
	// info level. The zero value discards them.
	Logger zerolog.Logger
}

// Load reads the worker configuration file at path and checks it, with the
// environment's connection settings over the file's (see the package
// documentation).
func Load(path string) (*Config, error) {
	f, err := workerset.LoadFile(path)
	if err != nil {
		return nil, plain(err)
	}
	specs, err := f.Specs(nil, false)
	if err != nil {
		return nil, plain(err)
	}
	if err := f.CheckLogLevel(); err != nil {
		return nil, plain(err)
	}
	conn := ConnectionFromEnv().conn()
	if err := f.ApplyConn(conn, nil, os.Getenv, nil); err != nil {
		return nil, plain(err)
	}
	cfg := &Config{
		Connection: connectionOf(conn), Periodic: specs[0].Schedules, LogLevel: f.LogLevel(),
		ShutdownTimeout: specs[0].ShutdownTimeout, HealthAddr: specs[0].HealthAddr,
	}
	for _, s := range specs {
		cfg.Types = append(cfg.Types, typeOf(s))
	}
	return cfg, nil
}

// Run runs cfg's job types in this process until ctx ends or one of them
// fails, creating the database and its design documents first if needed.
// Once ctx ends, the workers claim nothing more and running jobs get
// cfg.ShutdownTimeout to finish; those still running then are cancelled
// and released back to the queue. Run returns nil after such a stop.
func Run(ctx context.Context, cfg *Config, opts Options) error {
	if cfg == nil {
		return errors.New("no configuration: load one with Load, or fill in a Config")
	}
	specs, err := cfg.specs(opts.Handlers)
	if err != nil {
		return err
	}
	for _, s := range specs {
		s.Middleware, s.BeforeEnqueue = opts.Middleware, opts.BeforeEnqueue
	}
	log := opts.Logger
	if cfg.LogLevel != "" {
		level, err := zerolog.ParseLevel(strings.ToLower(cfg.LogLevel))
		if err != nil {
			return fmt.Errorf("invalid log level %q: want debug, info, warn, error or disabled", cfg.LogLevel)
		}
		log = log.Level(level)
	}
	conn, err := cfg.Connection.resolve()
	if err != nil {
		return err
	}
	return plain(workerset.Run(ctx, log, conn, specs))
}

// specs are the workers cfg describes, checked, with own's handlers.
func (c *Config) specs(own map[string]worker.Handler) ([]*workerset.Spec, error) {
	if len(c.Types) == 0 {
		return nil, errors.New("no job types to run")
	}
	seen := map[string]bool{}
	var specs []*workerset.Spec
	for _, t := range c.Types {
		if t.Name == "" || strings.TrimSpace(t.Name) != t.Name || strings.Contains(t.Name, ",") {
			return nil, fmt.Errorf("invalid job type %q: a name without commas or surrounding spaces", t.Name)
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("job type %s is given twice", t.Name)
		}
		seen[t.Name] = true
		s := t.spec()
		switch h := own[t.Name]; {
		case h != nil && t.Handler != "":
			return nil, fmt.Errorf("type %s: handler %q and a Go handler: give one", t.Name, t.Handler)
		case h != nil:
			s.Handlers = map[string]worker.Handler{t.Name: h}
		case t.Handler == "":
			return nil, fmt.Errorf("type %s: no handler: name a built-in one or give a Go one in Options.Handlers", t.Name)
		}
		if c.ShutdownTimeout != 0 {
			s.ShutdownTimeout = c.ShutdownTimeout
		}
		s.HealthAddr = c.HealthAddr
		if err := s.Check(); err != nil {
			return nil, fmt.Errorf("type %s: %w", t.Name, plain(err))
		}
		specs = append(specs, s)
	}
	for name := range own {
		if !seen[name] {
			return nil, fmt.Errorf("a Go handler for %s, which is none of the configuration's types (Options.Handlers)", name)
		}
	}
	specs[0].Schedules = append(specs[0].Schedules, c.Periodic...)
	return specs, nil
}

// spec is t as the settings of its worker: zero fields keep their defaults.
func (t Type) spec() *workerset.Spec {
	s := workerset.NewSpec()
	s.Types, s.Handler, s.Exec, s.DeleteDone = t.Name, t.Handler, t.Exec, t.DeleteDone
	for _, d := range []struct {
		dst *time.Duration
		v   time.Duration
	}{
		{&s.HTTPTimeout, t.HTTPTimeout}, {&s.Lease, t.Lease}, {&s.FeedTimeout, t.FeedTimeout}, {&s.JobTimeout, t.JobTimeout},
		{&s.QueryTimeout, t.QueryTimeout}, {&s.FallbackPoll, t.FallbackPoll},
	} {
		if d.v != 0 {
			*d.dst = d.v
		}
	}
	if t.Concurrency != 0 {
		s.Concurrency = t.Concurrency
	}
	if t.MaxAttempts != 0 {
		s.MaxAttempts = t.MaxAttempts
	}
	s.Heartbeat, s.SweepInterval = t.Heartbeat, t.SweepInterval
	s.Set["heartbeat"], s.Set["sweep-interval"] = t.Heartbeat != 0, t.SweepInterval != 0
	if t.RetryDelay != nil {
		s.RetryDelay, s.Set["retry-delay"] = *t.RetryDelay, true
	}
	if t.Rate != "" {
		s.Rates = workerset.Repeated{t.Name + "=" + t.Rate}
	}
	if t.FleetConcurrency != 0 {
		s.Fleet = workerset.Repeated{fmt.Sprintf("%s=%d", t.Name, t.FleetConcurrency)}
	}
	return s
}

// typeOf is the Type of a loaded file's checked spec.
func typeOf(s *workerset.Spec) Type {
	t := Type{
		Name: s.Types, Handler: s.Handler, Exec: s.Exec, HTTPTimeout: s.HTTPTimeout, Concurrency: s.Concurrency,
		Lease: s.Lease, MaxAttempts: s.MaxAttempts, DeleteDone: s.DeleteDone, FleetConcurrency: s.FleetLimits[s.Types],
		Heartbeat: s.Heartbeat, SweepInterval: s.SweepInterval, FeedTimeout: s.FeedTimeout,
		QueryTimeout: s.QueryTimeout, FallbackPoll: s.FallbackPoll, JobTimeout: s.JobTimeout,
	}
	if s.Set["retry-delay"] {
		d := s.RetryDelay
		t.RetryDelay = &d
	}
	if len(s.Rates) > 0 {
		_, t.Rate, _ = strings.Cut(s.Rates[0], "=")
	}
	return t
}

// plain words a usage error for a program: the couchq command's messages
// name the settings as its flags (--lease), a program's as themselves.
func plain(err error) error {
	var ue *cli.UsageError
	if !errors.As(err, &ue) {
		return err
	}
	return &settingError{msg: strings.ReplaceAll(err.Error(), "--", ""), err: err}
}

// settingError is a mistake in the settings, worded for a program.
type settingError struct {
	msg string
	err error
}

func (e *settingError) Error() string { return e.msg }
func (e *settingError) Unwrap() error { return e.err }
