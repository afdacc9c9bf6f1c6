package main

import (
	"context"
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
	if before != nil && before.Status == protocol.StatusRunning && before.ClaimedBy != "" && !force {
		alive, registered, age, err := claimantAlive(ctx, q, before.ClaimedBy, m.Now())
		if err != nil {
			return cli.ServerError(conn.URL, fmt.Errorf("requeueing job %s: checking its worker: %w", id, err))
		}
		if alive {
			return fmt.Errorf("requeueing job %s: %w: its worker %s is alive (last heartbeat %s ago); requeueing would run it twice at once (--force to do it anyway)",
				id, protocol.ErrWrongState, before.ClaimedBy, fmtSeconds(age))
		}
		// A claimant with no heartbeat of its own (an agent, which claims
		// through couchq claim or the agents' API) is alive for all anyone
		// knows until its lease runs out.
		if left := before.Lease().Sub(m.Now()); !registered && left > 0 {
			return fmt.Errorf("requeueing job %s: %w: its claimant %s has no worker heartbeat (an agent, say) and its lease runs %s more; requeueing would run it twice at once (wait for the lease, or --force to do it anyway)",
				id, protocol.ErrWrongState, before.ClaimedBy, fmtSeconds(left.Seconds()))
		}
	}
	it, err := q.Requeue(ctx, id, q.Config().Actor)
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	if before != nil && before.ClaimedBy != "" {
		return printActed(m.Stdout, it, conn.json, "requeued %s (it was claimed by %s; attempt %d stays counted)", it.ID, before.ClaimedBy, it.Attempts)
	}
	return printActed(m.Stdout, it, conn.json, "requeued %s", it.ID)
}
