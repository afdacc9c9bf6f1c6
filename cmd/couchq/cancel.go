package main

import (
	"context"
	"errors"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
)

const cancelUsage = `Usage: couchq cancel [--reason TEXT] [flags] ID

Cancels a queued or running job for good: it will not run (again). A
running job's worker finds out at its next lease renewal, stops the
handler, and its result is refused. A job that is already done, failed or
cancelled is refused (exit 1). 'couchq retry' brings a cancelled job back.

	--reason TEXT   why, recorded as the job's last error and in its history
	                (default "cancelled by operator")

With --json: the cancelled job's document.
`

func (m *Main) runCancel(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("cancel", cancelUsage)
	conn := addConnFlags(fs)
	var reason string
	fs.StringVar(&reason, "reason", "", "why the job is cancelled")
	q, id, before, closeQueue, err := m.openJob(ctx, fs, conn, args, log)
	if err != nil {
		return err
	}
	defer closeQueue()
	it, err := q.CancelJob(ctx, id, q.Config().Actor, reason)
	if fwd := (*protocol.ForwardedError)(nil); errors.As(err, &fwd) {
		return printForwarded(m.Stdout, fwd, conn.json)
	}
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	if before != nil && before.Status == protocol.StatusRunning {
		return printActed(m.Stdout, it, conn.json, "cancelled %s (it was running on %s, which stops it at its next lease renewal)", it.ID, before.ClaimedBy)
	}
	return printActed(m.Stdout, it, conn.json, "cancelled %s", it.ID)
}
