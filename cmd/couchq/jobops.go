package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
)

// Helpers shared by the commands that act on one job: retry, cancel and
// requeue.

// oneJobID checks that the positional arguments are exactly one job id.
func oneJobID(rest []string) (string, error) {
	switch {
	case len(rest) == 0:
		return "", cli.Usagef("missing job ID")
	case len(rest) > 1:
		return "", cli.Usagef("want one job ID, got %d arguments", len(rest))
	case rest[0] == "":
		return "", cli.Usagef("empty job ID")
	}
	return rest[0], nil
}

// findJob reads the job an operator named, accepting a generated id
// without its "job:" prefix as show does. A missing job is "job X not
// found". The job is nil when the document is not a valid WorkItem: the
// action then reports why, naming the field.
func findJob(ctx context.Context, q *protocol.Client, id string) (string, *protocol.WorkItem, error) {
	raw, id, err := cli.ReadDoc(ctx, q.DB(), id)
	if err != nil {
		return id, nil, err
	}
	var it protocol.WorkItem
	if json.Unmarshal(raw, &it) != nil {
		return id, nil, nil
	}
	return id, &it, nil
}

// printActed reports the job an action left behind: the stored document
// with --json (as show --json prints it), else the sentence given.
func printActed(w io.Writer, it *protocol.WorkItem, asJSON bool, format string, args ...any) error {
	if asJSON {
		return cli.WriteJSON(w, it)
	}
	_, err := fmt.Fprintf(w, format+"\n", args...)
	return err
}

// openJob is how every one-job command (cancel, requeue) starts: parse the
// flags, take the job ID, connect, and read the job as it is now.
func (m *Main) openJob(ctx context.Context, fs *flag.FlagSet, conn *connFlags, args []string, log zerolog.Logger) (
	q *protocol.Client, id string, before *protocol.WorkItem, closeQueue func() error, err error) {
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return nil, "", nil, nil, err
	}
	if id, err = oneJobID(rest); err != nil {
		return nil, "", nil, nil, err
	}
	q, _, closeQueue, err = m.connect(ctx, conn, log)
	if err != nil {
		return nil, "", nil, nil, err
	}
	if id, before, err = findJob(ctx, q, id); err != nil {
		closeQueue()
		return nil, "", nil, nil, cli.ServerError(conn.URL, err)
	}
	return q, id, before, closeQueue, nil
}
