package main

import (
	"context"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
)

const periodicUsage = `Usage: couchq periodic ls [flags]
       couchq periodic rm NAME [flags]

	ls   lists the periodic schedules the workers run ('couchq worker
	     --periodic TYPE=SPEC', worker.Config.Periodic in Go): each one's
	     job type, schedule, last tick enqueued (or when the schedule was
	     first seen) and next tick, from its state document periodic:NAME
	rm   deletes the state document of a schedule no process runs any
	     more, so that it is no longer listed. A process that still runs
	     it writes it again and goes on from its next tick, without
	     catching up the ticks before it
`

func (m *Main) runPeriodic(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("periodic", periodicUsage)
	conn := addConnFlags(fs)
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(rest) == 0:
		return cli.Usagef("missing subcommand: want 'couchq periodic ls' or 'couchq periodic rm NAME'")
	case rest[0] == "rm" && (len(rest) != 2 || rest[1] == ""):
		return cli.Usagef("want 'couchq periodic rm NAME', one schedule's name")
	case rest[0] != "ls" && rest[0] != "rm":
		return cli.Usagef("unknown subcommand %q: want 'couchq periodic ls' or 'couchq periodic rm NAME'", rest[0])
	case rest[0] == "ls" && len(rest) > 1:
		return cli.Usagef("unexpected argument %q", rest[1])
	}
	q, _, closeQueue, err := m.connect(ctx, conn, log)
	if err != nil {
		return err
	}
	defer closeQueue()
	if rest[0] == "rm" {
		if err := q.RemovePeriodic(ctx, rest[1]); err != nil {
			return cli.ServerError(conn.URL, err)
		}
		if conn.json {
			return cli.WriteJSON(m.Stdout, map[string]string{"removed": rest[1]})
		}
		_, err := fmt.Fprintf(m.Stdout, "removed periodic schedule %s\n", rest[1])
		return err
	}
	states, err := q.PeriodicStates(ctx)
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	if conn.json {
		if states == nil {
			states = []protocol.PeriodicState{}
		}
		return cli.WriteJSON(m.Stdout, states)
	}
	if len(states) == 0 {
		_, err := fmt.Fprintln(m.Stdout, "no periodic schedules")
		return err
	}
	now := m.Now()
	tw := cli.NewTable(m.Stdout)
	fmt.Fprintln(tw, "NAME\tTYPE\tSCHEDULE\tLAST TICK\tNEXT TICK\tLAST JOB")
	for _, st := range states {
		lastJob := st.LastJob
		if lastJob == "" {
			lastJob = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", st.Name, st.Worker, st.Schedule,
			cli.TimeAndAgo(protocol.FromUnix(st.LastTick), now), cli.TimeAndAgo(protocol.FromUnix(st.NextTick), now), lastJob)
	}
	return tw.Flush()
}
