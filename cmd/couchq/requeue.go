package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
)

const requeueUsage = `Usage: couchq requeue [--force] [flags] ID

Returns a running job whose worker is gone to the queue at once, without
waiting for its lease to run out (the sweeper would requeue it then). The
attempt it was running stays counted. A job that is not running is refused
(exit 1): failed and cancelled jobs are brought back with 'couchq retry'.

A job whose worker still heartbeats is refused too, since requeueing it
would run it twice at the same time, and so is one whose claimant has no
heartbeat (an agent) while its lease runs; --force requeues it anyway (the
claimant's result is then refused when it finishes).

	--force   requeue even though the job's worker is alive

With --json: the requeued job's document.
`

func (m *Main) runRequeue(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("requeue", requeueUsage)
	conn := addConnFlags(fs)
	var force bool
	fs.BoolVar(&force, "force", false, "requeue even though the worker is alive")
	q, id, before, closeQueue, err := m.openJob(ctx, fs, conn, args, log)
	if err != nil {
		return err
	}
	defer closeQueue()
	if before != nil && !force {
		if err := q.ClaimantGone(ctx, before); err != nil {
			if errors.Is(err, protocol.ErrWrongState) {
				return fmt.Errorf("requeueing job %s: %w (--force to do it anyway)", id, err)
			}
			return cli.ServerError(conn.URL, fmt.Errorf("requeueing job %s: %w", id, err))
		}
	}
	it, err := q.Requeue(ctx, id, q.Config().Actor)
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	if most := q.MaxAttempts(it); it.Attempts >= most && !conn.json {
		fmt.Fprintf(m.Stderr, "note: job %s has no attempts left (%d of %d): the worker that claims it fails it without running it; 'couchq retry %s' once it has failed counts its attempts afresh\n",
			it.ID, it.Attempts, most, it.ID)
	}
	if before != nil && before.ClaimedBy != "" {
		return printActed(m.Stdout, it, conn.json, "requeued %s (it was claimed by %s; attempt %d stays counted)", it.ID, before.ClaimedBy, it.Attempts)
	}
	return printActed(m.Stdout, it, conn.json, "requeued %s", it.ID)
}
