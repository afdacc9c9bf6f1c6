package main

import (
	"context"
	"fmt"
	"io"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/forms"
	"github.com/couchq/couchq/internal/protocol"
)

const initUsage = `Usage: couchq init [--workers LIST] [--producers LIST] [--validation on|off] [--language LANG] [flags]

Creates the database when it does not exist and installs the design
documents (_design/couchq: claim views, changes filter, validation;
_design/couchq-ops: the views of stats, ls and serve), upgrading older ones.
Safe to run again and from many processes at once. Run it as a server or
database admin: only admins may write design documents and _security.

	--workers LIST     users and roles that run workers: they may claim,
	                   finish, cancel, retry, pause and sweep jobs
	--producers LIST   users and roles that enqueue: they may create jobs
	                   and edit jobs nobody holds, nothing else
	--validation on|off
	                   whether the design document's validate_doc_update
	                   checks every write (default: keep the database's
	                   choice; on for a new database)
	--language javascript|javascript_quickjs
	                   the JavaScript engine of the design documents'
	                   functions: javascript, the server's default engine,
	                   or javascript_quickjs, CouchDB's QuickJS (3.4 and
	                   later), which ran couchq 67-112 % faster
	                   (default: keep the database's choice; for a new
	                   database, QuickJS where the server has it)

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
--producers. Workers never change the choice, nor the language.
`

// initResult is what init did, as printed with --json.
type initResult struct {
	URL       string             `json:"url"`
	Database  string             `json:"database"`
	DBCreated bool               `json:"database_created"`
	DesignDoc designdocs.Outcome `json:"design_doc"`
	Schema    int                `json:"schema"`
	// Validation is whether the design document validates writes: on or off.
	Validation designdocs.Validation `json:"validation"`
	// Language is the design documents' language (the engine of their
	// functions): javascript or javascript_quickjs.
	Language string `json:"language"`
	// Security is the database's _security after --workers/--producers.
	Security *protocol.SecurityObject `json:"security,omitempty"`
}

func (m *Main) runInit(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("init", initUsage)
	conn := addConnFlags(fs)
	var workers, producers, validation, language string
	fs.StringVar(&workers, "workers", "", "users and roles that run workers")
	fs.StringVar(&producers, "producers", "", "users and roles that enqueue")
	fs.StringVar(&validation, "validation", "", "on or off")
	fs.StringVar(&language, "language", "", "javascript or javascript_quickjs")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageErrorf("unexpected argument %q", rest[0])
	}
	var opts protocol.InitOptions
	if validation != "" {
		if opts.Validation, err = designdocs.ParseValidation(validation); err != nil {
			return usageErrorf("invalid --validation: %v", err)
		}
	}
	if language != "" {
		if opts.Language, err = designdocs.ParseLanguage(language); err != nil {
			return usageErrorf("invalid --language: %v", err)
		}
	}
	var roles protocol.Roles
	if roles.Workers, err = protocol.ParseAccess(workers); err != nil {
		return usageErrorf("invalid --workers: %v", err)
	}
	if roles.Producers, err = protocol.ParseAccess(producers); err != nil {
		return usageErrorf("invalid --producers: %v", err)
	}
	setRoles := workers != "" || producers != ""
	if setRoles && roles.Workers.Empty() && roles.Producers.Empty() {
		return usageErrorf("--workers and --producers name nobody: give user names or role:NAME")
	}
	if setRoles && opts.Validation == designdocs.ValidationOff {
		return usageErrorf("--validation off cannot go with --workers/--producers: validation is what enforces the roles")
	}
	if err := conn.resolve(m); err != nil {
		return err
	}
	log = log.Level(conn.level)
	client, err := m.dial(conn, log)
	if err != nil {
		return err
	}
	defer client.Close()
	res, err := initDB(ctx, client, conn, opts, log)
	if err != nil {
		return err
	}
	if setRoles && res.Validation == designdocs.ValidationOff {
		return fmt.Errorf("not setting --workers/--producers on %s: its design document has validation off, which would leave the roles unenforced; add --validation on", conn.db)
	}
	if setRoles {
		sec, err := m.setRoles(ctx, conn, roles, log)
		if err != nil {
			if isNetError(err) {
				return serverError(conn.url, err)
			}
			// A member's attempt is not always a 403: CouchDB 3.5 answers
			// 500 no_majority when every shard refuses it.
			return fmt.Errorf("setting who may use %s (only an admin may write _security: connect as a server or database admin): %w", conn.db, err)
		}
		res.Security = sec
	}
	return printInit(m.Stdout, res, conn.json)
}

// initDB runs protocol.Init and reports whether it had to create the database.
func initDB(ctx context.Context, client *kivik.Client, conn *connFlags, opts protocol.InitOptions, log zerolog.Logger) (*initResult, error) {
	res := &initResult{URL: conn.url, Database: conn.db, Schema: designdocs.SchemaVersion}
	// Asked separately only to report it: Init itself copes with a
	// database created concurrently.
	exists, err := client.DBExists(ctx, conn.db)
	if err != nil {
		return nil, serverError(conn.url, fmt.Errorf("checking database %s: %w", conn.db, err))
	}
	outcome, err := protocol.InitWith(ctx, client, conn.db, opts, log)
	if err != nil {
		return nil, serverError(conn.url, err)
	}
	res.DBCreated = !exists
	res.DesignDoc = outcome
	// Read back rather than assumed: a newer couchq's document may have
	// been kept as it is.
	stored, err := designdocs.Stored(ctx, client.DB(conn.db))
	if err != nil || stored == nil {
		if err == nil {
			err = fmt.Errorf("design document %s vanished", designdocs.ID)
		}
		return nil, serverError(conn.url, err)
	}
	res.Language = stored.Language
	res.Validation = designdocs.ValidationOn
	if !stored.Validating() {
		res.Validation = designdocs.ValidationOff
	}
	return res, nil
}

func printInit(w io.Writer, res *initResult, asJSON bool) error {
	if asJSON {
		return writeJSON(w, res)
	}
	db := "using database " + res.Database
	if res.DBCreated {
		db = "created database " + res.Database
	}
	var dd string
	all := fmt.Sprintf("%s, %s and %s", designdocs.ID, designdocs.SweepID, designdocs.OpsID)
	switch res.DesignDoc {
	case designdocs.Created:
		dd = fmt.Sprintf("installed design documents %s (schema %d)", all, res.Schema)
	case designdocs.Upgraded:
		dd = fmt.Sprintf("upgraded design documents %s to schema %d", all, res.Schema)
	case designdocs.Unchanged:
		dd = fmt.Sprintf("design documents %s are up to date (schema %d)", all, res.Schema)
	case designdocs.KeptNewer:
		dd = fmt.Sprintf("kept design document %s: it comes from a newer couchq (ours is schema %d)", designdocs.ID, res.Schema)
	case designdocs.KeptStored:
		dd = fmt.Sprintf("kept design document %s: another couchq build installed it (schema %d) and only an admin may replace it", designdocs.ID, res.Schema)
	default:
		dd = fmt.Sprintf("design document %s: %s", designdocs.ID, res.DesignDoc)
	}
	if _, err := fmt.Fprintf(w, "%s on %s; %s; validation %s; language %s\n", db, res.URL, dd, res.Validation, res.Language); err != nil {
		return err
	}
	if res.Validation == designdocs.ValidationOff {
		if _, err := fmt.Fprintln(w, "validation is off: CouchDB stores malformed jobs (workers mark them failed with the reason) and any member may write any document"); err != nil {
			return err
		}
	}
	if sec := res.Security; sec != nil && sec.Couchq != nil {
		_, err := fmt.Fprintf(w, "workers: %s; producers: %s; members now: %s (admins unchanged: %s)\n",
			orNobody(sec.Couchq.Workers), orNobody(sec.Couchq.Producers), orNobody(sec.Members), orNobody(sec.Admins))
		return err
	}
	return nil
}

// setRoles writes who may use the database into its _security.
func (m *Main) setRoles(ctx context.Context, conn *connFlags, roles protocol.Roles, log zerolog.Logger) (*protocol.SecurityObject, error) {
	hc, err := m.httpClient(conn, log)
	if err != nil {
		return nil, err
	}
	srv, err := protocol.ConnectHTTP(ctx, conn.rawURL, conn.user, conn.password, hc)
	if err != nil {
		return nil, err
	}
	defer srv.Client.Close()
	return srv.SetRoles(ctx, conn.db, roles)
}

// orNobody is an access list as init's flags take it, or "nobody".
func orNobody(a protocol.Access) string {
	if a.Empty() {
		return "nobody"
	}
	return a.String()
}

// writeJSON writes v as every --json output is written: as the HTTP API
// writes its answers, so that stats --json and /api/stats are the same
// bytes.
func writeJSON(w io.Writer, v any) error { return forms.WriteJSON(w, v) }
