package main

import (
	"context"
	"strings"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/demo"
)

const demoUsage = `Usage: couchq demo [--keep] [flags]

Shows couchq end to end in a few seconds. Without --url or $COUCHDB_URL it
starts a throwaway server: a single Apache CouchDB node from the local
release at $COUCHQ_COUCHDB_HOME (else /opt/couchdb) when there is one, else
PouchDB Server (installing it with npm the first time), and says which and
why; otherwise it uses that server. It then creates a fresh database, enqueues
a few jobs, lists them, starts two workers in-process that run them all
(one fails once and is retried), lists them again, shows the retried one
with its history, and tells you where to look.

The database is couchq_demo unless --db names another one starting with
couchq_demo; it is deleted and created again on every run.

	--keep   leave the local server running until Ctrl-C, to explore it
`

func (m *Main) runDemo(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("demo", demoUsage)
	conn := addConnFlags(fs)
	var keep bool
	fs.BoolVar(&keep, "keep", false, "keep the local server running until Ctrl-C")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return cli.Usagef("unexpected argument %q", rest[0])
	}
	useLocal := conn.URL == "" && m.Getenv("COUCHDB_URL") == ""
	if conn.DB == "" {
		// Not $COUCHQ_DB: that names the real queue, which the demo resets.
		conn.DB = demo.DBPrefix
	}
	if !strings.HasPrefix(conn.DB, demo.DBPrefix) {
		return cli.Usagef("invalid --db %q: the demo deletes its database, so the name must start with %s", conn.DB, demo.DBPrefix)
	}
	if !useLocal { // else the URL is the local server's, once it listens
		if err := conn.ResolveURL(m.Getenv); err != nil {
			return err
		}
		if err := conn.ResolveCredentials(m.Getenv, m.addSecret); err != nil {
			return err
		}
	}
	if err := conn.ResolveDB(m.Getenv); err != nil {
		return err
	}
	if err := conn.resolveLevel(); err != nil {
		return err
	}
	return demo.Run(ctx, demo.Options{Conn: &conn.Conn, Local: useLocal, Getenv: m.Getenv, Keep: keep, Out: m.output(conn), Now: m.Now, Log: log.Level(conn.level)})
}
