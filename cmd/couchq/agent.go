package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// Agents: claimants that are not worker processes (a script, a crawler in
// another language, a person) claim, finish, fail, extend and release
// jobs by name. Every command but claim acts on one job and refuses, with
// exit status 3, a job the agent does not hold.

const agentFlagsUsage = `	--as NAME        the agent (required): recorded as the job's claimed_by
`

const claimUsage = `Usage: couchq claim --type T --as NAME [--count N] [--lease D] [flags]

Claims up to N due jobs of type T for the agent NAME (highest priority,
then oldest due first) and prints them, one per line (with --json, as a
JSON array of the stored documents). Jobs the agent already holds come
first and count towards N: an agent that restarts gets its own work back.
A paused type gives no new jobs. The claims hold for the lease; renew with
'couchq extend', finish with 'couchq complete' or 'couchq fail', give back
with 'couchq release'. A lease that runs out returns the job to the queue.

	--type T         job type (required)
` + agentFlagsUsage + `	--count N        at most this many jobs (default 1)
	--lease D        how long the claims hold (default 1h)
`

const completeUsage = `Usage: couchq complete ID --as NAME [--result JSON] [flags]

Marks a job the agent holds done, with an optional result (any JSON).
Exit status 3 when the agent does not hold it.

` + agentFlagsUsage + `	--result JSON    the job's result
`

const failUsage = `Usage: couchq fail ID --as NAME --error MSG [--no-retry] [flags]

Records a failed attempt of a job the agent holds: it is retried after a
backoff (attempt^4 seconds) while attempts remain, else it stays failed
with MSG. Exit status 3 when the agent does not hold it.

` + agentFlagsUsage + `	--error MSG      what went wrong (required)
	--no-retry       fail the job for good now
`

const extendUsage = `Usage: couchq extend ID --as NAME [--lease D] [flags]

Renews the lease of a job the agent holds to now + D. Exit status 3 when
the agent does not hold it.

` + agentFlagsUsage + `	--lease D        the new lease from now (default 1h)
`

const progressUsage = `Usage: couchq progress ID --as NAME --done N [--total M] [--note TEXT] [flags]

Records how far the agent got with a job it holds: N out of M units (M 0
or left out when unknown), with a short note ("page 40"). couchq show and
ls and the dashboard show it. Each call writes once; the lease stays as it
is (renew it with 'couchq extend'). Exit status 3 when the agent does not
hold the job.

` + agentFlagsUsage + `	--done N         units done (required)
	--total M        units in all (default 0: unknown)
	--note TEXT      what the agent is at (at most 200 bytes kept)
`

const releaseUsage = `Usage: couchq release ID --as NAME [flags]

Gives a job the agent holds back to the queue, due now, without charging
the attempt. Exit status 3 when the agent does not hold it.

` + agentFlagsUsage

// agentLeaseDefault is an agent's lease: a person reviewing takes a while.
const agentLeaseDefault = time.Hour

func (m *Main) runClaim(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("claim", claimUsage)
	conn := addConnFlags(fs)
	var typ, agent string
	var count int
	var lease time.Duration
	fs.StringVar(&typ, "type", "", "job type")
	fs.StringVar(&agent, "as", "", "agent")
	fs.IntVar(&count, "count", 1, "jobs")
	fs.DurationVar(&lease, "lease", agentLeaseDefault, "lease")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(rest) > 0:
		return cli.Usagef("unexpected argument %q", rest[0])
	case typ == "":
		return cli.Usagef("--type is required")
	case agent == "":
		return cli.Usagef("--as NAME is required: the agent the jobs are claimed for")
	case count < 1 || count > 1000:
		return cli.Usagef("invalid --count %d: from 1 to 1000", count)
	case lease <= 0:
		return cli.Usagef("invalid --lease %s: must be positive", lease)
	}
	q, log, closeQueue, err := m.connect(ctx, conn, log)
	if err != nil {
		return err
	}
	defer closeQueue()
	got, err := q.ClaimForAgent(ctx, typ, count, agent, lease)
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	if got.Paused {
		log.Warn().Str("type", typ).Msg("the type is paused: no new jobs claimed")
	}
	if got.CatchingUp {
		log.Warn().Str("site", q.Site()).Msg("this site came back after an outage and its workers wait to hear from the other sites (a takeover of its jobs may be on its way): no new jobs claimed; ask again shortly")
	}
	jobs := got.Jobs()
	if conn.json {
		return cli.WriteJSON(m.Stdout, jobs)
	}
	for _, it := range jobs {
		payload := string(it.Payload)
		if payload == "" {
			payload = "null"
		}
		if _, err := fmt.Fprintf(m.Stdout, "%s\t%s\tuntil %s\t%s\n", it.ID, it.Worker,
			protocol.FromUnix(it.LeaseUntil).UTC().Format(time.RFC3339), payload); err != nil {
			return err
		}
	}
	return nil
}

// agentJob parses an agent command's flags and returns the job the agent
// holds.
func (m *Main) agentJob(ctx context.Context, log zerolog.Logger, name, usage string, args []string,
	extra func(fs *flag.FlagSet), check func() error) (q *protocol.Client, it *protocol.WorkItem, conn *connFlags, done func() error, err error) {
	fs := m.newFlagSet(name, usage)
	conn = addConnFlags(fs)
	var agent string
	fs.StringVar(&agent, "as", "", "agent")
	if extra != nil {
		extra(fs)
	}
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	switch {
	case len(rest) == 0:
		return nil, nil, nil, nil, cli.Usagef("missing job id")
	case len(rest) > 1:
		return nil, nil, nil, nil, cli.Usagef("unexpected argument %q (one job at a time)", rest[1])
	case agent == "":
		return nil, nil, nil, nil, cli.Usagef("--as NAME is required: the agent that holds the job")
	}
	if check != nil {
		if err := check(); err != nil {
			return nil, nil, nil, nil, err
		}
	}
	q, _, done, err = m.connect(ctx, conn, log)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	it, err = q.HeldJob(ctx, rest[0], agent)
	if err != nil {
		done()
		return nil, nil, nil, nil, cli.ServerError(conn.URL, err)
	}
	return q, it, conn, done, nil
}

// agentDone prints what an agent command did.
func (m *Main) agentDone(conn *connFlags, it *protocol.WorkItem, what string) error {
	if conn.json {
		return cli.WriteJSON(m.Stdout, it)
	}
	_, err := fmt.Fprintf(m.Stdout, "%s %s\n", what, it.ID)
	return err
}

func (m *Main) runComplete(ctx context.Context, log zerolog.Logger, args []string) error {
	var result string
	q, it, conn, done, err := m.agentJob(ctx, log, "complete", completeUsage, args,
		func(fs *flag.FlagSet) {
			fs.StringVar(&result, "result", "", "result JSON")
		},
		func() error {
			if result != "" && !json.Valid([]byte(result)) {
				return cli.Usagef("invalid --result: not JSON")
			}
			return nil
		})
	if err != nil {
		return err
	}
	defer done()
	var raw json.RawMessage
	if result != "" {
		raw = json.RawMessage(result)
	}
	if err := q.Complete(ctx, it, raw); err != nil {
		return cli.ServerError(conn.URL, notHeldIfLost(err))
	}
	q.AfterFinish(ctx, it, q.Config().Actor)
	return m.agentDone(conn, it, "completed")
}

func (m *Main) runFail(ctx context.Context, log zerolog.Logger, args []string) error {
	var msg string
	var noRetry bool
	q, it, conn, done, err := m.agentJob(ctx, log, "fail", failUsage, args,
		func(fs *flag.FlagSet) {
			fs.StringVar(&msg, "error", "", "error message")
			fs.BoolVar(&noRetry, "no-retry", false, "fail for good")
		},
		func() error {
			if msg == "" {
				return cli.Usagef("--error MSG is required: say what went wrong")
			}
			return nil
		})
	if err != nil {
		return err
	}
	defer done()
	opts := protocol.FailOptions{Final: noRetry, RetryAfter: worker.DefaultRetry(it.Attempts)}
	if err := q.Fail(ctx, it, msg, opts); err != nil {
		return cli.ServerError(conn.URL, notHeldIfLost(err))
	}
	q.AfterFinish(ctx, it, q.Config().Actor)
	what := "failed"
	if it.Status == protocol.StatusQueued {
		what = "failed (retried at " + protocol.FromUnix(it.Date).UTC().Format(time.RFC3339) + ")"
	}
	return m.agentDone(conn, it, what)
}

func (m *Main) runExtend(ctx context.Context, log zerolog.Logger, args []string) error {
	var lease time.Duration
	q, it, conn, done, err := m.agentJob(ctx, log, "extend", extendUsage, args,
		func(fs *flag.FlagSet) {
			fs.DurationVar(&lease, "lease", agentLeaseDefault, "lease")
		},
		func() error {
			if lease <= 0 {
				return cli.Usagef("invalid --lease %s: must be positive", lease)
			}
			return nil
		})
	if err != nil {
		return err
	}
	defer done()
	if err := q.Extend(ctx, it, lease); err != nil {
		return cli.ServerError(conn.URL, notHeldIfLost(err))
	}
	return m.agentDone(conn, it, "extended to "+protocol.FromUnix(it.LeaseUntil).UTC().Format(time.RFC3339))
}

func (m *Main) runProgress(ctx context.Context, log zerolog.Logger, args []string) error {
	var done, total int
	var note string
	q, it, conn, closeQueue, err := m.agentJob(ctx, log, "progress", progressUsage, args,
		func(fs *flag.FlagSet) {
			fs.IntVar(&done, "done", math.MinInt, "units done")
			fs.IntVar(&total, "total", 0, "units in all")
			fs.StringVar(&note, "note", "", "note")
		},
		func() error {
			switch {
			case done == math.MinInt: // not given
				return cli.Usagef("--done N is required: the units done, 0 or more")
			case done < 0:
				return cli.Usagef("invalid --done %d: the units done, 0 or more", done)
			case total < 0:
				return cli.Usagef("invalid --total %d: 0 (unknown) or more", total)
			case total > 0 && done > total:
				return cli.Usagef("--done %d is more than --total %d", done, total)
			}
			return nil
		})
	if err != nil {
		return err
	}
	defer closeQueue()
	if err := q.ReportProgress(ctx, it, done, total, note); err != nil {
		return cli.ServerError(conn.URL, notHeldIfLost(err))
	}
	return m.agentDone(conn, it, "progress "+it.Progress.String()+" of")
}

func (m *Main) runRelease(ctx context.Context, log zerolog.Logger, args []string) error {
	q, it, conn, done, err := m.agentJob(ctx, log, "release", releaseUsage, args, nil, nil)
	if err != nil {
		return err
	}
	defer done()
	if err := q.Release(ctx, it, "released by agent "+it.ClaimedBy); err != nil {
		return cli.ServerError(conn.URL, notHeldIfLost(err))
	}
	return m.agentDone(conn, it, "released")
}

// notHeldIfLost turns a claim lost between reading the job and writing it
// (swept, cancelled) into ErrNotHeld, the agent's exit status 3.
func notHeldIfLost(err error) error {
	if errors.Is(err, protocol.ErrClaimLost) {
		return fmt.Errorf("%w: %w", protocol.ErrNotHeld, err)
	}
	return err
}
