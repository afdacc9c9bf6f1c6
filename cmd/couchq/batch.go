package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
)

const batchUsage = `Usage: couchq batch show ID [flags]
       couchq batch cancel ID [--reason TEXT] [flags]

A batch is jobs enqueued together (Client.EnqueueBatch) with a callback job
that runs once after every one of them has finished (see docs/workflows.md).

	show     the batch's progress: its jobs done, failed, cancelled and not
	         finished yet, the failed ones' ids, and its callback
	cancel   cancels the batch's jobs that have not finished; the callback
	         then runs with them counted cancelled

	--reason TEXT   why, recorded in each cancelled job (default "batch ID
	                cancelled by operator")

With --json: show prints the progress as JSON; cancel {"cancelled": N}.
`

func (m *Main) runBatch(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("batch", batchUsage)
	conn := addConnFlags(fs)
	var reason string
	fs.StringVar(&reason, "reason", "", "why the batch is cancelled")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 2 || rest[1] == "" {
		return cli.Usagef("want 'couchq batch show|cancel ID'")
	}
	sub, id := rest[0], strings.TrimPrefix(rest[1], "job:batch:")
	if sub != "show" && sub != "cancel" {
		return cli.Usagef("unknown subcommand %q: want show or cancel", sub)
	}
	q, _, closeQueue, err := m.connect(ctx, conn, log)
	if err != nil {
		return err
	}
	defer closeQueue()
	if sub == "cancel" {
		n, err := q.CancelBatch(ctx, id, q.Config().Actor, reason)
		if err != nil {
			return cli.ServerError(conn.URL, err)
		}
		if n == 0 {
			if _, err := q.Batch(ctx, id); errors.Is(err, protocol.ErrNotFound) {
				return fmt.Errorf("batch %s: no such batch", id)
			}
		}
		if conn.json {
			return cli.WriteJSON(m.Stdout, map[string]int{"cancelled": n})
		}
		_, err = fmt.Fprintf(m.Stdout, "cancelled %d jobs of batch %s\n", n, id)
		return err
	}
	b, err := q.Batch(ctx, id)
	if errors.Is(err, protocol.ErrNotFound) {
		return fmt.Errorf("batch %s: no such batch", id)
	}
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	if conn.json {
		out := struct {
			*protocol.BatchStatus
			CallbackID     string `json:"callback_id"`
			CallbackStatus string `json:"callback_status,omitempty"`
		}{BatchStatus: b, CallbackID: protocol.BatchCallbackID(id)}
		if b.Callback != nil {
			out.CallbackStatus = string(b.Callback.Status)
		}
		return cli.WriteJSON(m.Stdout, out)
	}
	tw := cli.NewTable(m.Stdout)
	fmt.Fprintf(tw, "batch\t%s\n", id)
	jobs := fmt.Sprint(b.Finished() + b.Pending)
	if b.Callback != nil && b.Size != b.Finished()+b.Pending {
		jobs += fmt.Sprintf(" (its callback counts %d)", b.Size)
	}
	fmt.Fprintf(tw, "jobs\t%s\n", jobs)
	fmt.Fprintf(tw, "finished\t%d (done %d, failed %d, cancelled %d)\n", b.Finished(), b.Done, b.Failed, b.Cancelled)
	fmt.Fprintf(tw, "pending\t%d\n", b.Pending)
	if len(b.FailedIDs) > 0 {
		fmt.Fprintf(tw, "failed\t%s\n", strings.Join(b.FailedIDs, ", "))
	}
	callback := "missing"
	if b.Callback != nil {
		callback = string(b.Callback.Status)
	}
	fmt.Fprintf(tw, "callback\t%s (%s)\n", protocol.BatchCallbackID(id), callback)
	return tw.Flush()
}
