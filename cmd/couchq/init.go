package main

import (
	"context"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
)

const initUsage = `Usage: couchq init [--workers LIST] [--producers LIST] [--validation MODE] [--language LANG] [--shards N] [flags]

Creates the database when it does not exist and installs the design
documents (_design/couchq: claim views, changes filter, validation;
_design/couchq-ops: the views of stats, ls and serve; _design/couchq-validate
with validation mango), upgrading older ones.
Safe to run again and from many processes at once. Run it as a server or
database admin: only admins may write design documents and _security.

	--workers LIST     users and roles that run workers: they may claim,
	                   finish, cancel, retry, pause and sweep jobs
	--producers LIST   users and roles that enqueue: they may create jobs
	                   and edit jobs that never ran, nothing else
	--validation on|mango|off|auto
	                   how CouchDB checks every write: on, couchq's
	                   JavaScript validate_doc_update (says why a job is
	                   refused, enforces the roles); mango, the same
	                   checks as a Mango selector CouchDB runs without
	                   JavaScript, on servers that have it (Apache CouchDB
	                   after 3.5), enforcing no roles; off; or auto, mango
	                   where the server has it and no roles are set, else
	                   on (default: keep the database's choice; auto for a
	                   new database)
	--language javascript|javascript_quickjs
	                   the JavaScript engine of the design documents'
	                   functions: javascript, the server's default engine,
	                   or javascript_quickjs, CouchDB's QuickJS (3.4 and
	                   later), which ran couchq 67-112 % faster
	                   (default: keep the database's choice; for a new
	                   database, QuickJS where the server has it)
	--shards N         the number of shards (CouchDB's q) of the database
	                   when init creates it; CouchDB fixes it then, so
	                   another number for a database that exists is refused
	                   (default: 1 on a cluster, where every request pays
	                   for each shard's copy on every node; the server's
	                   own on a single node, where two shards validate a
	                   bulk enqueue on two cores)

A LIST is comma-separated user names and role:NAME roles, e.g.
--workers role:couchq-workers,ci-bot. Either flag sets the database's
_security: its members become the workers and producers (plus members
added by hand; admins are untouched), so nobody else can read or write it,
and the design document's validation enforces the two roles. Running init
again with the flags replaces both lists; without them, _security is left
as it is.

Validation costs most of CouchDB's write capacity: every document written
goes through CouchDB's JavaScript server. --validation off is for
high-volume queues whose writers are trusted: malformed jobs are then
stored and workers quarantine them (failed, with the reason) when they
meet them, and roles are not enforced, so it cannot go with --workers or
--producers. --validation mango keeps the checks of malformed jobs
at a fraction of the cost where the server runs it, but refuses them
with CouchDB's bare "document is not valid" and enforces no roles either.
Workers never change the choice, nor the language.
`

// maxShards bounds init --shards.
const maxShards = 64

func (m *Main) runInit(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("init", initUsage)
	conn := addConnFlags(fs)
	var workers, producers, validation, language string
	fs.StringVar(&workers, "workers", "", "users and roles that run workers")
	fs.StringVar(&producers, "producers", "", "users and roles that enqueue")
	fs.StringVar(&validation, "validation", "", "on, mango, off or auto")
	fs.StringVar(&language, "language", "", "javascript or javascript_quickjs")
	var shards int
	fs.IntVar(&shards, "shards", 0, "shards of a new database (0: couchq's choice)")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return cli.Usagef("unexpected argument %q", rest[0])
	}
	if shards < 0 {
		return cli.Usagef("invalid --shards %d: the number of shards must be positive", shards)
	}
	if shards > maxShards {
		// CouchDB makes every shard's file on every node at once: a
		// mistyped 100000 ran for minutes and left a database unusable.
		return cli.Usagef("invalid --shards %d: at most %d (a queue gains nothing from more: every request pays for each shard)", shards, maxShards)
	}
	opts := protocol.InitOptions{Shards: shards}
	if validation != "" {
		if opts.Validation, err = designdocs.ParseValidation(validation); err != nil {
			return cli.Usagef("invalid --validation: %v", err)
		}
	}
	if language != "" {
		if opts.Language, err = designdocs.ParseLanguage(language); err != nil {
			return cli.Usagef("invalid --language: %v", err)
		}
	}
	var roles protocol.Roles
	if roles.Workers, err = protocol.ParseAccess(workers); err != nil {
		return cli.Usagef("invalid --workers: %v", err)
	}
	if roles.Producers, err = protocol.ParseAccess(producers); err != nil {
		return cli.Usagef("invalid --producers: %v", err)
	}
	setRoles := workers != "" || producers != ""
	if setRoles && roles.Workers.Empty() && roles.Producers.Empty() {
		return cli.Usagef("--workers and --producers name nobody: give user names or role:NAME")
	}
	if setRoles && (opts.Validation == designdocs.ValidationOff || opts.Validation == designdocs.ValidationMango) {
		return cli.Usagef("--validation %s cannot go with --workers/--producers: only validation on enforces the roles", opts.Validation)
	}
	opts.Roles = setRoles
	if err := conn.resolve(m); err != nil {
		return err
	}
	log = log.Level(conn.level)
	client, err := conn.Dial(log)
	if err != nil {
		return err
	}
	defer client.Close()
	if !opts.Roles && opts.Validation == designdocs.ValidationAuto {
		// Roles set earlier need validation on. (Without the flag, auto
		// applies only to a database without couchq's design documents,
		// which init has not given roles.)
		opts.Roles = m.hasRoles(ctx, conn, log)
	}
	if !setRoles && (opts.Validation == designdocs.ValidationOff || opts.Validation == designdocs.ValidationMango) && m.hasRoles(ctx, conn, log) {
		// As with the flags: the roles stored earlier would silently stop
		// being enforced.
		return cli.Usagef("--validation %s on %s, whose _security names couchq's workers and producers, would leave those roles unenforced: only validation on enforces them (to give them up, remove the \"couchq\" section of the database's _security first)", opts.Validation, conn.DB)
	}
	res, err := cli.InitDB(ctx, client, &conn.Conn, opts, log)
	if err != nil {
		return err
	}
	if setRoles && res.Validation != designdocs.ValidationOn {
		return fmt.Errorf("not setting --workers/--producers on %s: its validation is %s, which would leave the roles unenforced; add --validation on", conn.DB, res.Validation)
	}
	if setRoles {
		sec, err := m.setRoles(ctx, conn, roles, log)
		if err != nil {
			if cli.IsNetError(err) {
				return cli.ServerError(conn.URL, err)
			}
			// A member's attempt is not always a 403: CouchDB 3.5 answers
			// 500 no_majority when every shard refuses it.
			return fmt.Errorf("setting who may use %s (only an admin may write _security: connect as a server or database admin): %w", conn.DB, err)
		}
		res.Security = sec
	}
	return cli.PrintInit(m.Stdout, res, conn.json)
}

// hasRoles reports whether the database's _security has couchq's roles;
// false when it cannot be read (a new database has none).
func (m *Main) hasRoles(ctx context.Context, conn *connFlags, log zerolog.Logger) bool {
	srv, err := conn.Connect(ctx, log)
	if err != nil {
		return false
	}
	sec, err := srv.Security(ctx, conn.DB)
	return err == nil && sec.Couchq != nil
}

// setRoles writes who may use the database into its _security.
func (m *Main) setRoles(ctx context.Context, conn *connFlags, roles protocol.Roles, log zerolog.Logger) (*protocol.SecurityObject, error) {
	srv, err := conn.Connect(ctx, log)
	if err != nil {
		return nil, err
	}
	defer srv.Client.Close()
	return srv.SetRoles(ctx, conn.DB, roles)
}
