package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // the server or the file system failed, or a job was missing
	exitUsage   = 2 // the command line or its input (flags, JSON, times) is wrong
	exitNotHeld = 3 // an agent acted on a job it does not hold (lost lease, someone else's)
)

// Main is one invocation of the couchq command. Its fields are the
// process's environment so that tests can run commands in-process, in
// parallel, without touching the real one.
type Main struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Getenv reads configuration variables (COUCHDB_URL, COUCHDB_USER,
	// COUCHDB_PASSWORD, COUCHQ_DB).
	Getenv func(string) string
	// Now is the clock behind --in and the relative due times.
	Now func() time.Time
	// IsTerminal decides between human-friendly and machine-friendly stderr
	// (coloured logs, the progress bar).
	IsTerminal func(w io.Writer) bool

	// stderrTTY is IsTerminal(Stderr) taken before Run wraps Stderr.
	stderrTTY bool
}

// NewMain returns a Main that uses the process environment.
func NewMain(stdin io.Reader, stdout, stderr io.Writer) *Main {
	return &Main{
		Stdin: stdin, Stdout: stdout, Stderr: stderr,
		Getenv: os.Getenv, Now: time.Now, IsTerminal: isTerminal,
	}
}

// command is one subcommand. run gets the arguments after its name and a
// logger at the default level; it returns an error made by usageErrorf for
// mistakes on the command line (exit 2) and any other error for failures
// (exit 1).
type command struct {
	name    string
	summary string
	usage   string
	run     func(m *Main, ctx context.Context, log zerolog.Logger, args []string) error
}

func commands() []command {
	return []command{
		{"init", "create the database and install or upgrade the design document", initUsage, (*Main).runInit},
		{"enqueue", "add jobs to the queue, one from flags or many from a JSON Lines file", enqueueUsage, (*Main).runEnqueue},
		{"ls", "list jobs by type and status", lsUsage, (*Main).runLs},
		{"show", "show one job: its fields, payload and history", showUsage, (*Main).runShow},
		{"worker", "run jobs of some types with a built-in handler until stopped (or drained)", workerUsage, (*Main).runWorker},
		{"sweep", "return the jobs of dead workers (expired leases) to the queue, once", sweepUsage, (*Main).runSweep},
		{"workers", "list the worker registry: who runs what, alive or dead", workersUsage, (*Main).runWorkers},
		{"stats", "report throughput, wait and run times, queue depth and workers", statsUsage, (*Main).runStats},
		{"retry", "put a failed or cancelled job (or all failed jobs of a type) back in the queue", retryUsage, (*Main).runRetry},
		{"cancel", "cancel a queued or running job", cancelUsage, (*Main).runCancel},
		{"batch", "show a batch's progress, or cancel its unfinished jobs", batchUsage, (*Main).runBatch},
		{"requeue", "return a running job whose worker is gone to the queue", requeueUsage, (*Main).runRequeue},
		{"pause", "stop the workers of a job type from claiming it (running jobs finish)", pauseUsage, (*Main).runPause},
		{"resume", "let the workers of a paused job type claim it again", resumeUsage, (*Main).runResume},
		{"periodic", "list the periodic schedules (last and next tick), or remove one", periodicUsage, (*Main).runPeriodic},
		{"claim", "claim due jobs for a named agent (a script, a person): held ones first", claimUsage, (*Main).runClaim},
		{"complete", "finish a job an agent holds, with an optional result", completeUsage, (*Main).runComplete},
		{"fail", "fail a job an agent holds: retried while attempts remain", failUsage, (*Main).runFail},
		{"extend", "renew the lease of a job an agent holds", extendUsage, (*Main).runExtend},
		{"progress", "record how far an agent got with a job it holds", progressUsage, (*Main).runProgress},
		{"release", "give a job an agent holds back to the queue", releaseUsage, (*Main).runRelease},
		{"slots", "reserve, release and list the slots of a sequence (serials, invoice numbers)", slotsUsage, (*Main).runSlots},
		{"purge", "delete old done, failed or cancelled jobs in bulk", purgeUsage, (*Main).runPurge},
		{"serve", "serve Prometheus metrics and a JSON API over HTTP", serveUsage, (*Main).runServe},
		{"sites", "list, add, link and take over the sites of a queue linked by replication", sitesUsage, (*Main).runSites},
		{"demo", "start a server (or use $COUCHDB_URL), enqueue a few jobs and look at them", demoUsage, (*Main).runDemo},
	}
}

func lookup(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// Run runs the command line args (without the program name) and returns
// the process exit code.
func (m *Main) Run(ctx context.Context, args []string) int {
	m = m.forRun(args)
	log := newLogger(m.Stderr, m.stderrTTY)

	if len(args) == 0 {
		m.printUsage(m.Stderr)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		return m.runHelp(args[1:])
	}
	cmd, ok := lookup(name)
	if !ok {
		fmt.Fprintf(m.Stderr, "couchq: unknown command %q (run 'couchq help' for usage)\n", name)
		return exitUsage
	}
	return m.exit(name, cmd.run(m, ctx, log, args[1:]))
}

// forRun returns the copy of m that one Run works with: defaults filled
// in, and stderr wrapped so that everything written to it (errors, logs,
// flag messages) passes through the scrubber, which keeps a password given
// in --url or the environment out even of messages nobody foresaw.
func (m *Main) forRun(args []string) *Main {
	r := *m
	r.fillDefaults()
	r.stderrTTY = r.IsTerminal(r.Stderr)
	r.Stderr = &scrubWriter{w: r.Stderr, secrets: secretsIn(args, r.Getenv)}
	return &r
}

func (m *Main) fillDefaults() {
	if m.Stdin == nil {
		m.Stdin = strings.NewReader("")
	}
	if m.Stdout == nil {
		m.Stdout = io.Discard
	}
	if m.Stderr == nil {
		m.Stderr = io.Discard
	}
	if m.Getenv == nil {
		m.Getenv = func(string) string { return "" }
	}
	if m.Now == nil {
		m.Now = time.Now
	}
	if m.IsTerminal == nil {
		m.IsTerminal = func(io.Writer) bool { return false }
	}
}

// exit prints err, if any, as one line prefixed with the command, and maps
// it to an exit code.
func (m *Main) exit(name string, err error) int {
	var ue *cli.UsageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(m.Stderr, "couchq %s: %v (run 'couchq help %s' for usage)\n", name, ue.Err, name)
		return exitUsage
	case errors.Is(err, protocol.ErrNotHeld):
		fmt.Fprintf(m.Stderr, "couchq %s: %s\n", name, cli.DescribeError(err))
		return exitNotHeld
	default:
		fmt.Fprintf(m.Stderr, "couchq %s: %s\n", name, cli.DescribeError(err))
		return exitFailure
	}
}

func (m *Main) runHelp(args []string) int {
	if len(args) == 0 {
		m.printUsage(m.Stdout)
		return exitOK
	}
	cmd, ok := lookup(args[0])
	if !ok {
		fmt.Fprintf(m.Stderr, "couchq help: unknown command %q (run 'couchq help' for usage)\n", args[0])
		return exitUsage
	}
	fmt.Fprint(m.Stdout, commandUsage(cmd.usage))
	return exitOK
}

func (m *Main) printUsage(w io.Writer) {
	fmt.Fprint(w, `couchq is a job queue whose only moving part is CouchDB.

Usage:

	couchq <command> [flags]

Commands:

`)
	for _, c := range commands() {
		fmt.Fprintf(w, "	%-8s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Every command takes the connection flags:

`+connUsage+`
Run 'couchq help <command>' or 'couchq <command> -h' for a command's flags.
Exit status: 0 success, 1 a server or job failure, 2 a usage or input error,
3 an agent acted on a job it does not hold (complete, fail, extend, progress,
release).
`)
}
