package main

import (
	"context"
	"fmt"
	"io"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/opshttp"
)

const initUsage = `Usage: couchq init [flags]

Creates the database when it does not exist and installs the design
document (views, changes filter, validation), upgrading an older one.
Safe to run again and from many processes at once.
`

// initResult is what init did, as printed with --json.
type initResult struct {
	URL       string             `json:"url"`
	Database  string             `json:"database"`
	DBCreated bool               `json:"database_created"`
	DesignDoc designdocs.Outcome `json:"design_doc"`
	Schema    int                `json:"schema"`
}

func (m *Main) runInit(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("init", initUsage)
	conn := addConnFlags(fs)
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageErrorf("unexpected argument %q", rest[0])
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
	res, err := initDB(ctx, client, conn, log)
	if err != nil {
		return err
	}
	return printInit(m.Stdout, res, conn.json)
}

// initDB runs couchq.Init and reports whether it had to create the database.
func initDB(ctx context.Context, client *kivik.Client, conn *connFlags, log zerolog.Logger) (*initResult, error) {
	res := &initResult{URL: conn.url, Database: conn.db, Schema: designdocs.SchemaVersion}
	// Asked separately only to report it: Init itself copes with a
	// database created concurrently.
	exists, err := client.DBExists(ctx, conn.db)
	if err != nil {
		return nil, serverError(conn.url, fmt.Errorf("checking database %s: %w", conn.db, err))
	}
	outcome, err := couchq.Init(ctx, client, conn.db, log)
	if err != nil {
		return nil, serverError(conn.url, err)
	}
	res.DBCreated = !exists
	res.DesignDoc = outcome
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
	switch res.DesignDoc {
	case designdocs.Created:
		dd = fmt.Sprintf("installed design document %s (schema %d)", designdocs.ID, res.Schema)
	case designdocs.Upgraded:
		dd = fmt.Sprintf("upgraded design document %s to schema %d", designdocs.ID, res.Schema)
	case designdocs.Unchanged:
		dd = fmt.Sprintf("design document %s is up to date (schema %d)", designdocs.ID, res.Schema)
	case designdocs.KeptNewer:
		dd = fmt.Sprintf("kept design document %s: it comes from a newer couchq (ours is schema %d)", designdocs.ID, res.Schema)
	default:
		dd = fmt.Sprintf("design document %s: %s", designdocs.ID, res.DesignDoc)
	}
	_, err := fmt.Fprintf(w, "%s on %s; %s\n", db, res.URL, dd)
	return err
}

// writeJSON writes v as every --json output is written: as the HTTP API
// writes its answers, so that stats --json and /api/stats are the same
// bytes.
func writeJSON(w io.Writer, v any) error { return opshttp.WriteJSON(w, v) }
