package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
)

const retryUsage = `Usage:
	couchq retry [flags] ID
	couchq retry --failed --type TYPE [flags]

Puts a failed or cancelled job back in the queue, due now, with its
attempts reset; its history records "requeued". A job in any other status
is refused (exit 1): a running job whose worker is gone is requeued with
'couchq requeue'.

	--failed      retry every failed job of --type
	--type TYPE   the job type --failed retries (required with --failed)

With --json: the retried job's document, or {"type": ..., "retried": N}.
`

func (m *Main) runRetry(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("retry", retryUsage)
	conn := addConnFlags(fs)
	var failed bool
	var typ string
	fs.BoolVar(&failed, "failed", false, "retry every failed job of --type")
	fs.StringVar(&typ, "type", "", "job type")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	var id string
	switch {
	case failed && len(rest) > 0:
		return cli.Usagef("give either a job ID or --failed --type TYPE, not both")
	case failed && typ == "":
		return cli.Usagef("--failed needs --type: failed jobs are retried one type at a time")
	case !failed && typ != "":
		return cli.Usagef("--type goes with --failed (to retry one job, give its ID)")
	case !failed:
		if id, err = oneJobID(rest); err != nil {
			return err
		}
	}
	q, _, closeQueue, err := m.connect(ctx, conn, log)
	if err != nil {
		return err
	}
	defer closeQueue()

	if failed {
		n, err := q.RetryFailed(ctx, typ, q.Config().Actor, nil)
		if err != nil {
			return fmt.Errorf("retrying failed %s jobs (%d retried before this): %w", typ, n, cli.ServerError(conn.URL, err))
		}
		if conn.json {
			return cli.WriteJSON(m.Stdout, map[string]any{"type": typ, "retried": n})
		}
		_, err = fmt.Fprintf(m.Stdout, "retried %d failed %s %s\n", n, typ, cli.Plural(n, "job", "jobs"))
		return err
	}

	id, _, err = findJob(ctx, q, id)
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	it, err := q.Retry(ctx, id, q.Config().Actor)
	if fwd := (*protocol.ForwardedError)(nil); errors.As(err, &fwd) {
		return printForwarded(m.Stdout, fwd, conn.json)
	}
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	switch it.Status {
	case protocol.StatusWaiting:
		return printActed(m.Stdout, it, conn.json, "retried %s: waiting for the jobs it waits for, attempts reset (max %d)", it.ID, q.MaxAttempts(it))
	case protocol.StatusQueued:
		return printActed(m.Stdout, it, conn.json, "retried %s: queued, due now, attempts reset (max %d)", it.ID, q.MaxAttempts(it))
	}
	// Checked at once, it ended again: a job it waits for still stands failed.
	return printActed(m.Stdout, it, conn.json, "retried %s, which is %s again: %s", it.ID, it.Status, it.LastError)
}
