package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
)

const workersUsage = `Usage: couchq workers [flags]

Lists the worker registry: one document per worker process, refreshed on
every heartbeat and removed when the process exits cleanly. A worker is
alive while its last heartbeat is at most three heartbeat intervals old;
a dead one was killed, froze or lost the server, and the sweeper returns
its jobs to the queue once their leases run out. With --json it prints the
registry documents with heartbeat_age (seconds) and alive added.

Columns: CLAIMANT (host/pid/worker-id, as in claimed_by), TYPES,
CONCURRENCY (jobs of each type at once), RUNNING (jobs in flight at the
last heartbeat), HEARTBEAT (how long ago) and STATE (alive or dead).

A dead worker's document stays, so that it is seen (couchq_workers_dead),
until it is forgotten:

	--forget-dead AGE   remove the documents of dead workers whose last
	                    heartbeat is older than AGE (e.g. 24h; 0 for every
	                    dead worker), then list the rest; their jobs are the
	                    sweeper's either way
`

// workerRow is one registry document as printed with --json.
type workerRow struct {
	*protocol.WorkerInfo
	HeartbeatAge float64 `json:"heartbeat_age"`
	Alive        bool    `json:"alive"`
}

func (m *Main) runWorkers(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("workers", workersUsage)
	conn := addConnFlags(fs)
	var forget time.Duration
	fs.DurationVar(&forget, "forget-dead", 0, "remove dead workers' documents older than this")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return cli.Usagef("unexpected argument %q", rest[0])
	}
	if forget < 0 {
		return cli.Usagef("invalid --forget-dead %s: must not be negative", forget)
	}
	forgetting := false // --forget-dead 0 forgets every dead worker
	fs.Visit(func(f *flag.Flag) { forgetting = forgetting || f.Name == "forget-dead" })
	q, _, closeQueue, err := m.connect(ctx, conn, log)
	if err != nil {
		return err
	}
	defer closeQueue()
	infos, err := q.Workers(ctx)
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	rows := make([]workerRow, 0, len(infos))
	for _, info := range infos {
		row := newWorkerRow(info, m.Now())
		if forgetting && !row.Alive && row.HeartbeatAge >= forget.Seconds() {
			if err := q.DeleteWorker(ctx, info); err != nil {
				return cli.ServerError(conn.URL, err)
			}
			fmt.Fprintf(m.Stderr, "forgot dead worker %s (last heartbeat %s ago)\n", info.Claimant, roundAge(time.Duration(row.HeartbeatAge*float64(time.Second))))
			continue
		}
		rows = append(rows, row)
	}
	if conn.json {
		return cli.WriteJSON(m.Stdout, rows)
	}
	return printWorkers(m.Stdout, rows)
}

func newWorkerRow(info *protocol.WorkerInfo, now time.Time) workerRow {
	if info.Running == nil {
		info.Running = []string{} // [] rather than null in --json
	}
	// The one rule for alive, shared with couchq stats and serve.
	alive, age := info.Liveness(now)
	return workerRow{WorkerInfo: info, HeartbeatAge: age, Alive: alive}
}

func printWorkers(w io.Writer, rows []workerRow) error {
	if len(rows) == 0 {
		_, err := fmt.Fprintln(w, "no workers")
		return err
	}
	tw := cli.NewTable(w)
	fmt.Fprintln(tw, "CLAIMANT\tTYPES\tCONCURRENCY\tRUNNING\tHEARTBEAT\tSTATE")
	for _, r := range rows {
		state := "alive"
		if !r.Alive {
			state = "dead"
		}
		age := time.Duration(r.HeartbeatAge * float64(time.Second))
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s ago\t%s\n", r.Claimant, strings.Join(r.Types, ","),
			r.Concurrency, len(r.Running), roundAge(age), state)
	}
	return tw.Flush()
}

// roundAge keeps an age readable: tenths of a second below a minute,
// whole seconds above.
func roundAge(d time.Duration) time.Duration {
	if d < time.Minute {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}
