package main

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
)

const pauseUsage = `Usage: couchq pause TYPE [--reason TEXT] [--at SITE] [flags]

Pauses a job type: every worker of TYPE stops claiming it within a moment
(they follow the type's control document, control:TYPE, through the
changes feed they already hold) and finishes the jobs it holds. Jobs can
still be enqueued; they wait. 'couchq stats' and 'ls' show paused types,
and a paused type's due jobs do not count as late. Pausing a paused type
changes nothing. 'couchq resume TYPE' undoes it.

In a queue of several sites a pause stops the workers of one site: this
one's (--site), or with --at another's, through a request that site's
workers apply when the links bring it (couchq sites requests). A pause or
resume made at that site after the request wins over it.

	--reason TEXT   why, kept on the control document and shown by stats
	--at SITE       pause it at SITE
`

const resumeUsage = `Usage: couchq resume TYPE [--at SITE] [flags]

Resumes a paused job type: its workers claim its due jobs again at once.
Resuming a type that is not paused changes nothing. In a queue of several
sites, --at resumes it at another site, as 'couchq pause --at' pauses it.

	--at SITE       resume it at SITE
`

// pauseResult is what pause and resume print with --json.
type pauseResult struct {
	Type   string `json:"type"`
	Paused bool   `json:"paused"`
}

func (m *Main) runPause(ctx context.Context, log zerolog.Logger, args []string) error {
	return m.setPaused(ctx, log, args, true)
}

func (m *Main) runResume(ctx context.Context, log zerolog.Logger, args []string) error {
	return m.setPaused(ctx, log, args, false)
}

func (m *Main) setPaused(ctx context.Context, log zerolog.Logger, args []string, paused bool) error {
	name, usage := "resume", resumeUsage
	if paused {
		name, usage = "pause", pauseUsage
	}
	fs := m.newFlagSet(name, usage)
	conn := addConnFlags(fs)
	var reason, at string
	if paused {
		fs.StringVar(&reason, "reason", "", "why")
	}
	fs.StringVar(&at, "at", "", "the site to act at")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(rest) == 0:
		return cli.Usagef("missing job TYPE")
	case len(rest) > 1:
		return cli.Usagef("want one job TYPE, got %d", len(rest))
	case cli.CheckTypeName(rest[0]) != nil:
		return &cli.UsageError{Err: cli.CheckTypeName(rest[0])}
	case rest[0] == "":
		return cli.Usagef("the job TYPE must not be empty")
	}
	typ := rest[0]
	if at != "" && !protocol.ValidSiteName(at) {
		return cli.Usagef("invalid --at %q: want a site name, %s", at, protocol.SiteNameRule)
	}
	q, _, closeQueue, err := m.connect(ctx, conn, log)
	if err != nil {
		return err
	}
	defer closeQueue()
	if paused && at == "" {
		m.noteUnknownType(ctx, q, typ)
	}
	if paused {
		err = q.PauseAt(ctx, at, typ, q.Config().Actor, reason)
	} else {
		err = q.ResumeAt(ctx, at, typ, q.Config().Actor)
	}
	if fwd := (*protocol.ForwardedError)(nil); errors.As(err, &fwd) {
		if conn.json {
			return cli.WriteJSON(m.Stdout, fwd.Request)
		}
		_, err = fmt.Fprintf(m.Stdout, "%s of %s requested from site %s, which applies it when the request reaches it (request %s; couchq sites requests)\n",
			fwd.Request.Action, typ, fwd.Request.Site, fwd.Request.ID)
		return err
	}
	if at != "" && errors.Is(err, protocol.ErrNotFound) {
		return &cli.UsageError{Err: err} // a site the sites document does not list
	}
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	if conn.json {
		return cli.WriteJSON(m.Stdout, pauseResult{Type: typ, Paused: paused})
	}
	if paused {
		_, err = fmt.Fprintf(m.Stdout, "paused %s: its workers stop claiming it; the jobs they hold finish\n", typ)
	} else {
		_, err = fmt.Fprintf(m.Stdout, "resumed %s\n", typ)
	}
	return err
}

// noteUnknownType says on stderr when no job and no worker of typ is
// known here: a pause of a misspelt type would otherwise pass unnoticed.
// Pausing it still goes ahead (a type may be paused before its first
// job); a failed look says nothing.
func (m *Main) noteUnknownType(ctx context.Context, q *protocol.Client, typ string) {
	if b, err := q.List(ctx, protocol.ListOptions{Worker: typ, Limit: 1}); err != nil || len(b.Items)+len(b.Malformed) > 0 {
		return
	}
	workers, err := q.Workers(ctx)
	if err != nil {
		return
	}
	for _, w := range workers {
		if slices.Contains(w.Types, typ) {
			return
		}
	}
	fmt.Fprintf(m.Stderr, "note: no job and no worker of type %s is known here (a typo?); pausing it anyway, so that its jobs wait once they come\n", typ)
}
