package main

import (
	"context"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
)

const showUsage = `Usage: couchq show [flags] ID

Shows one job: its fields, the payload and result pretty-printed, and its
history as a timeline. With --json it prints the stored document as it is.
The "job:" prefix of generated ids may be left out.
`

func (m *Main) runShow(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("show", showUsage)
	conn := addConnFlags(fs)
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(rest) == 0:
		return cli.Usagef("missing job ID")
	case len(rest) > 1:
		return cli.Usagef("want one job ID, got %d arguments", len(rest))
	case rest[0] == "":
		return cli.Usagef("empty job ID")
	}
	q, _, closeQueue, err := m.connect(ctx, conn, log)
	if err != nil {
		return err
	}
	defer closeQueue()
	return cli.ShowJob(ctx, m.Stdout, q, rest[0], m.Now(), conn.json)
}
