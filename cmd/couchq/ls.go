package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/forms"
	"github.com/couchq/couchq/internal/protocol"
)

const lsUsage = `Usage: couchq ls [--type TYPE] [--status STATUS] [--limit N] [flags]

Lists jobs ordered by type, status and id, as a table or, with --json, as
an array of the stored documents.

	--type TYPE       only jobs of this type
	--status STATUS   only jobs in this status: waiting, queued, running, done,
	                  failed or cancelled
	--limit N         at most N jobs (default 100)
`

func (m *Main) runLs(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("ls", lsUsage)
	conn := addConnFlags(fs)
	var opts protocol.ListOptions
	var status string
	fs.StringVar(&opts.Worker, "type", "", "job type")
	fs.StringVar(&status, "status", "", "job status")
	fs.IntVar(&opts.Limit, "limit", 100, "maximum number of jobs")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return cli.Usagef("unexpected argument %q (filter with --type and --status)", rest[0])
	}
	if err := conn.resolve(m); err != nil {
		return err
	}
	log = log.Level(conn.level)
	if opts.Status, err = forms.ParseStatus(status); err != nil {
		return flagError(err)
	}
	if opts.Limit < 1 {
		return cli.Usagef("invalid --limit %d: must be at least 1", opts.Limit)
	}
	q, closeQueue, err := conn.OpenQueue(ctx, log, m.Now)
	if err != nil {
		return err
	}
	defer closeQueue()
	ask := opts
	ask.Limit++ // one more than shown tells whether there are more
	batch, err := q.List(ctx, ask)
	if err != nil {
		return err
	}
	if err := cli.PrintJobs(ctx, m.Stdout, q, batch, opts.Limit, m.Now(), conn.json); err != nil || conn.json {
		return err
	}
	return printPaused(ctx, m.Stdout, q, opts.Worker)
}

// printPaused says which job types are paused (only typ, when given): their
// queued jobs wait on purpose.
func printPaused(ctx context.Context, w io.Writer, q *protocol.Client, typ string) error {
	var only []string
	if typ != "" {
		only = []string{typ}
	}
	paused, err := q.Paused(ctx, only...)
	if err != nil || len(paused) == 0 {
		return err
	}
	types := make([]string, 0, len(paused))
	for t := range paused {
		types = append(types, t)
	}
	sort.Strings(types)
	_, err = fmt.Fprintf(w, "paused: %s (their workers claim nothing; 'couchq resume TYPE')\n", strings.Join(types, ", "))
	return err
}
