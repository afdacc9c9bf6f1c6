package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/internal/workerset"
)

const workerUsage = `Usage: couchq worker --type T[,T2...] --handler NAME [flags]
       couchq worker --config FILE [--type T,...] [--check] [flags]

Runs jobs of the given types with a built-in handler until it is stopped.
It creates the database and design document first if needed (as couchq
init does), wakes on the _changes feed, renews its leases while jobs run,
retries failures with backoff and sweeps the expired leases of dead
workers. Logs go to stderr, at info level unless --log-level says otherwise.

The first SIGINT, SIGTERM or SIGHUP stops claiming and lets running jobs finish
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
	                       (a batch's jobs, and unique jobs with a period, stay)
	--max-attempts N       attempts for jobs without their own max_attempts
	                       (default 25)
	--shutdown-timeout D   how long running jobs may finish after a stop signal
	                       (default 30s)
	--job-timeout D        how long one attempt may run: then the handler is
	                       cancelled (an exec command gets SIGTERM, then
	                       SIGKILL) and the attempt fails, to be retried
	                       (default 0: no bound)
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
	--take-over SITE       in a queue of several sites (couchq sites): take over
	                       SITE's unfinished jobs when its heartbeat has not
	                       been seen for --take-over-after D (at least three
	                       heartbeats), as couchq sites takeover does. Name one
	                       successor per site. Repeatable; off by default
	--take-over-after D    see --take-over
	--await-sites D        in a queue of several sites: a worker that starts after
	                       every worker of its site was stopped claims nothing
	                       until the other sites have been heard from twice
	                       through the links (so that a takeover of its jobs
	                       made meanwhile is here first), or D has passed
	                       (default 1m; 0 does not wait)
	--health-addr HOST:PORT
	                       serve this process's probes and metrics while it runs
	                       (default off; port 0 picks one, logged at info):
	                       /healthz  200 while the process runs
	                       /readyz   200 when CouchDB answered within three
	                                 heartbeats and the changes feed is
	                                 connected, else 503 with the reason
	                       /metrics  Prometheus metrics couchq_worker_* (see
	                                 docs/workers.md) and the Go runtime's
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
	job_timeout = "10m"   # as --job-timeout
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

func (m *Main) runWorker(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("worker", workerUsage)
	conn := addConnFlags(fs)
	// Operators watching a worker want to see its claims and failures.
	conn.logLevel = "info"
	f := workerset.NewSpec()
	fs.StringVar(&f.Types, "type", "", "job types")
	fs.StringVar(&f.Handler, "handler", "", "built-in handler")
	fs.StringVar(&f.Exec, "exec", "", "command for the exec handler")
	fs.DurationVar(&f.HTTPTimeout, "http-timeout", f.HTTPTimeout, "HTTP request timeout")
	fs.IntVar(&f.Concurrency, "concurrency", f.Concurrency, "jobs of each type at once")
	fs.DurationVar(&f.Lease, "lease", f.Lease, "lease duration")
	fs.BoolVar(&f.Drain, "drain", false, "exit when no due work remains")
	fs.BoolVar(&f.DeleteDone, "delete-done", false, "delete finished jobs")
	fs.IntVar(&f.MaxAttempts, "max-attempts", f.MaxAttempts, "default attempts per job")
	fs.DurationVar(&f.ShutdownTimeout, "shutdown-timeout", f.ShutdownTimeout, "grace for running jobs")
	fs.DurationVar(&f.Heartbeat, "heartbeat", 0, "heartbeat interval")
	fs.DurationVar(&f.SweepInterval, "sweep-interval", 0, "sweep interval")
	fs.DurationVar(&f.FeedTimeout, "feed-timeout", f.FeedTimeout, "changes long-poll timeout")
	fs.DurationVar(&f.QueryTimeout, "query-timeout", f.QueryTimeout, "due query and sweep timeout")
	fs.DurationVar(&f.FallbackPoll, "fallback-poll", f.FallbackPoll, "fallback poll interval")
	fs.DurationVar(&f.RetryDelay, "retry-delay", 0, "fixed retry delay")
	fs.DurationVar(&f.JobTimeout, "job-timeout", 0, "bound on one attempt")
	fs.Var(&f.Periodic, "periodic", "periodic schedule TYPE=SPEC")
	fs.Var(&f.Rates, "rate", "rate limit TYPE=N/PER")
	fs.Var(&f.Fleet, "fleet-concurrency", "fleet-wide concurrency TYPE=K")
	fs.Var(&f.TakeOver, "take-over", "a site to take over when its heartbeat stops")
	fs.DurationVar(&f.TakeOverAfter, "take-over-after", 0, "how long a site's heartbeat may be unseen")
	fs.DurationVar(&f.AwaitSites, "await-sites", f.AwaitSites, "how long a restarted site waits to hear from the others")
	fs.StringVar(&f.PeriodicTZ, "periodic-tz", f.PeriodicTZ, "time zone of cron schedules")
	fs.StringVar(&f.CatchUp, "catch-up", f.CatchUp, "missed ticks: once or all")
	var configFile string
	var checkOnly bool
	fs.StringVar(&configFile, "config", "", "worker configuration file (TOML)")
	fs.BoolVar(&checkOnly, "check", false, "validate --config, print the effective settings and exit")
	fs.StringVar(&f.HealthAddr, "health-addr", "", "where to serve /healthz, /readyz and /metrics")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return cli.Usagef("unexpected argument %q (quote the --exec command as one argument)", rest[0])
	}
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	for name := range given {
		switch name {
		case "config", "check", "url", "db", "user", "password-file", "ca-file", "json", "log-level":
			// not the worker's: the connection's, or the file's
		default:
			f.Set[name] = true
		}
	}
	var specs []*workerset.Spec
	if configFile != "" {
		for _, name := range []string{"periodic", "periodic-tz", "catch-up"} {
			if f.Set[name] {
				return cli.Usagef("--%s with --config: put schedules in the file's [[periodic]] tables", name)
			}
		}
		file, err := workerset.LoadFile(configFile)
		if err != nil {
			return err
		}
		if err := file.ApplyConn(&conn.Conn, given, m.Getenv, m.addSecret); err != nil {
			return err
		}
		if !given["log-level"] && file.LogLevel() != "" {
			conn.logLevel = file.LogLevel()
		}
		if specs, err = file.Specs(f, true); err != nil {
			return err
		}
	} else {
		if checkOnly {
			return cli.Usagef("--check needs --config FILE")
		}
		if err := f.Check(); err != nil {
			return err
		}
		specs = []*workerset.Spec{f}
	}
	if err := conn.resolve(m); err != nil {
		return err
	}
	if checkOnly {
		// What running would refuse before its first request.
		if err := workerset.Check(&conn.Conn, specs); err != nil {
			return err
		}
		return printWorkerCheck(m.Stdout, conn, specs)
	}
	return workerset.Run(ctx, log.Level(conn.level), &conn.Conn, specs)
}

// printWorkerCheck prints the effective settings of every type (no
// secrets: the password's source, never the password).
func printWorkerCheck(w io.Writer, conn *connFlags, specs []*workerset.Spec) error {
	pw := "none"
	switch {
	case conn.PasswordFile != "":
		pw = "from file " + conn.PasswordFile
	case conn.FixedPassword != "":
		pw = "from the environment"
	case conn.Password != "":
		pw = "from $COUCHDB_PASSWORD"
	}
	user := conn.User
	if user == "" {
		user = "(none)"
	}
	fmt.Fprintf(w, "couchdb: %s database %s user %s password %s", conn.URL, conn.DB, user, pw)
	if conn.CAFile != "" {
		fmt.Fprintf(w, " ca_file %s", conn.CAFile)
	}
	fmt.Fprintln(w)
	for _, f := range specs {
		retry := "backoff attempt^4 s"
		if f.Set["retry-delay"] {
			retry = "fixed " + f.RetryDelay.String()
		}
		fmt.Fprintf(w, "type %s: handler %s", f.Types, f.Handler)
		if f.Exec != "" {
			fmt.Fprintf(w, " exec %q", f.Exec)
		}
		fmt.Fprintf(w, ", concurrency %d, lease %s, heartbeat %s, max_attempts %d, retry %s, delete_done %v, http_timeout %s",
			f.Concurrency, f.Lease, f.HeartbeatInterval(), f.MaxAttempts, retry, f.DeleteDone, f.HTTPTimeout)
		if rl, ok := f.RateLimits[f.Types]; ok {
			fmt.Fprintf(w, ", rate %d/%s", rl.N, rl.Per)
		}
		if k, ok := f.FleetLimits[f.Types]; ok {
			fmt.Fprintf(w, ", fleet_concurrency %d", k)
		}
		if f.JobTimeout > 0 {
			fmt.Fprintf(w, ", job_timeout %s", f.JobTimeout)
		}
		fmt.Fprintln(w)
		for _, p := range f.Schedules {
			fmt.Fprintf(w, "periodic %s: %q in %s, catch up %s, priority %d", p.Name, p.Schedule, p.Location,
				map[protocol.CatchUp]string{protocol.CatchUpOnce: "once", protocol.CatchUpAll: "all"}[p.CatchUp], (&protocol.WorkItem{Priority: p.Job.Priority}).EffectivePriority())
			if raw, ok := p.Job.Payload.(json.RawMessage); ok {
				fmt.Fprintf(w, ", payload %s", raw)
			}
			fmt.Fprintln(w)
		}
	}
	_, err := fmt.Fprintf(w, "shutdown_timeout %s\n", specs[0].ShutdownTimeout)
	return err
}
