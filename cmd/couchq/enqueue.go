package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"strings"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
)

const enqueueUsage = `Usage:
	couchq enqueue --type TYPE [--payload JSON] [--at TIME | --in DURATION]
	               [--max-attempts N] [--priority P] [--id ID | --unique-key KEY [--unique-for D]]
	               [--after ID,ID [--on-dependency-failure cancel|run]] [flags]
	couchq enqueue --file FILE [flags]

Adds a job and prints its id. The job is due now unless --at or --in
schedules it.

	--type TYPE         job type: the workers for TYPE run it (required)
	--payload JSON      any JSON value handed to the handler, e.g. '{"to":"ada@example.com"}'
	--at TIME           due at an RFC 3339 time, e.g. 2030-01-02T15:04:05Z
	--in DURATION       due after a Go duration, e.g. 90s, 10m, 2h
	--max-attempts N    attempts before the job stays failed (default: the workers')
	--priority P        1 (runs first) to 5 (last); default 3. Among due jobs of a type
	                    a higher priority always starts first, then the oldest due
	--id ID             document id (default: a time-ordered job:<uuid>)
	--unique-key KEY    at most one TYPE job per KEY while it is queued or running:
	                    enqueueing it again prints "already queued: ID" and exits 0.
	                    The id is job:unique:TYPE:KEY (write that id by hand for the
	                    same guarantee); a finished job is archived under ID~REV when
	                    the key is enqueued again
	--unique-for D      with --unique-key: one job per KEY per period D (from the Unix
	                    epoch, UTC), whatever became of it; the id ends in @PERIOD-START
	--after ID,ID       wait for these jobs: the job is "waiting" until every one has
	                    finished, then runs. Each must exist already
	--on-dependency-failure cancel|run
	                    when a job of --after fails for good or is cancelled: cancel
	                    this one (the default), or run it anyway once all finished
	--file FILE         enqueue every line of a JSON Lines file ('-' for stdin):
	                    {"type": "email", "payload": {...}, "at": "TIME" | "in": "10s",
	                     "max_attempts": 5, "id": "...", "unique_key": "K", "unique_for": "1h",
	                     "priority": 1, "after": ["ID"], "on_dependency_failure": "run",
	                     "site": "tokyo"}
	                    ("worker" may stand for "type"; "site" names the job's owner
	                    in a queue of sites, else --site does)
	                    The whole file is checked first, with the server (the jobs
	                    waited for exist, ids are free, sites are known): one bad
	                    line and nothing is enqueued. --type, --at/--in, --max-attempts, --priority,
	                    --after and --on-dependency-failure are defaults for lines
	                    that do not set them. Jobs go in batches of 500.
`

func (m *Main) runEnqueue(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("enqueue", enqueueUsage)
	conn := addConnFlags(fs)
	var spec cli.JobSpec
	var payload, file string
	var maxAttempts int
	fs.StringVar(&spec.Type, "type", "", "job type")
	fs.StringVar(&payload, "payload", "", "JSON payload")
	fs.StringVar(&spec.At, "at", "", "RFC 3339 due time")
	fs.StringVar(&spec.In, "in", "", "due after this duration")
	fs.IntVar(&maxAttempts, "max-attempts", 0, "attempts before failing for good")
	fs.StringVar(&spec.ID, "id", "", "document id")
	fs.StringVar(&spec.UniqueKey, "unique-key", "", "unique key")
	fs.StringVar(&spec.UniqueFor, "unique-for", "", "unique period")
	var priority int
	fs.IntVar(&priority, "priority", 0, "priority")
	fs.StringVar(&file, "file", "", "JSON Lines file, - for stdin")
	var after string
	fs.StringVar(&after, "after", "", "comma-separated ids of jobs to wait for")
	fs.StringVar(&spec.OnDependencyFailure, "on-dependency-failure", "", "cancel or run")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return cli.Usagef("unexpected argument %q (a payload goes in --payload)", rest[0])
	}
	if err := conn.resolve(m); err != nil {
		return err
	}
	log = log.Level(conn.level)
	if flagSet(fs, "priority") { // a default for lines of a --file too
		spec.Priority = &priority
	}
	if flagSet(fs, "max-attempts") { // else lines of a --file keep their own
		if maxAttempts < 0 {
			return cli.Usagef("invalid --max-attempts %d: must be >= 0 (0 means the workers' default)", maxAttempts)
		}
		spec.MaxAttempts = &maxAttempts
	}
	now := m.Now()
	if flagSet(fs, "unique-key") && spec.UniqueKey == "" {
		return cli.Usagef("--unique-key is empty: give the key, or leave the flag out for a job that is not unique")
	}
	if flagSet(fs, "after") {
		for _, id := range strings.Split(after, ",") {
			if id = strings.TrimSpace(id); id != "" {
				spec.After = append(spec.After, id)
			}
		}
		if len(spec.After) == 0 {
			return cli.Usagef("--after %q names no job: give the ids of the jobs to wait for, comma-separated", after)
		}
	}

	if file != "" {
		if payload != "" || spec.ID != "" || spec.UniqueKey != "" || spec.UniqueFor != "" {
			return cli.Usagef("--payload, --id and --unique-key name one job: with --file, put them on each line")
		}
		// Defaults are checked on their own so a bad flag is not blamed on a line.
		if _, err := spec.Schedule(now); err != nil {
			return &cli.UsageError{Err: errors.New(flagNames.Replace(err.Error()))}
		}
		jobs, err := cli.ReadJobFile(m.Stdin, m.Stderr, file, spec, now)
		if err != nil {
			return err
		}
		q, closeQueue, err := conn.OpenQueue(ctx, log, m.Now)
		if err != nil {
			return err
		}
		defer closeQueue()
		if err := cli.CheckFileJobs(ctx, q, file, jobs, m.Stderr); err != nil {
			return err
		}
		return cli.EnqueueFile(ctx, q, file, jobs, m.output(conn))
	}

	if payload != "" {
		spec.Payload = json.RawMessage(payload)
		if err := cli.CheckJSON(spec.Payload); err != nil {
			return cli.Usagef("invalid --payload: %v (want JSON, e.g. '{\"to\":\"ada@example.com\"}' or '\"text\"')", err)
		}
	}
	if spec.Type == "" {
		return cli.Usagef("--type is required (or --file)")
	}
	job, err := spec.NewJob(now)
	if err != nil {
		return &cli.UsageError{Err: errors.New(flagNames.Replace(err.Error()))}
	}
	q, closeQueue, err := conn.OpenQueue(ctx, log, m.Now)
	if err != nil {
		return err
	}
	defer closeQueue()
	it, dup, err := cli.EnqueueOne(ctx, q, job)
	if err != nil {
		return err
	}
	if !dup {
		cli.NoteNoSites(q, m.Stderr, it.Site)
	}
	return cli.PrintEnqueued(m.Stdout, it, dup, conn.json)
}

// flagNames turns the JSON field names in a JobSpec error into the flags
// they came from.
var flagNames = strings.NewReplacer(`"at"`, "--at", `"in"`, "--in", "max_attempts", "--max-attempts", `"id"`, "--id",
	`"unique_key"`, "--unique-key", `"unique_for"`, "--unique-for", `"priority"`, "--priority",
	`"on_dependency_failure"`, "--on-dependency-failure", `"after"`, "--after")

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
