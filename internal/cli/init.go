package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/protocol"
)

// InitResult is what couchq init did, as printed with --json.
type InitResult struct {
	URL       string             `json:"url"`
	Database  string             `json:"database"`
	DBCreated bool               `json:"database_created"`
	DesignDoc designdocs.Outcome `json:"design_doc"`
	Schema    int                `json:"schema"`
	// Validation is how the database validates writes: on, mango or off.
	Validation designdocs.Validation `json:"validation"`
	// Language is the design documents' language (the engine of their
	// functions): javascript or javascript_quickjs.
	Language string `json:"language"`
	// Shards and Copies are CouchDB's q and n for a database init created,
	// where the server says (not PouchDB Server).
	Shards int `json:"shards,omitempty"`
	Copies int `json:"copies,omitempty"`
	// Security is the database's _security after --workers/--producers.
	Security *protocol.SecurityObject `json:"security,omitempty"`
	// Restored names the design documents init installed again beside a
	// claim design document that was up to date: someone had deleted them.
	Restored []string `json:"restored,omitempty"`
	// schemaBefore is the claim design document's schema before init, 0
	// when there was none: an upgrade within one schema is a rewrite for
	// another validation or language, and said so.
	schemaBefore int
}

// InitDB runs protocol.Init and reports whether it had to create the database.
func InitDB(ctx context.Context, client *kivik.Client, conn *Conn, opts protocol.InitOptions, log zerolog.Logger) (*InitResult, error) {
	res := &InitResult{URL: conn.URL, Database: conn.DB, Schema: designdocs.SchemaVersion}
	// Asked separately only to report it: Init itself copes with a
	// database created concurrently.
	exists, err := client.DBExists(ctx, conn.DB)
	if err != nil {
		return nil, ServerError(conn.URL, fmt.Errorf("checking database %s: %w", conn.DB, err))
	}
	before, err := designdocs.Stored(ctx, client.DB(conn.DB))
	if err != nil && exists {
		return nil, ServerError(conn.URL, err)
	}
	if before != nil {
		res.schemaBefore = before.Couchq.Schema
	}
	if opts.Validation == designdocs.ValidationKept && before == nil {
		// A new database gets the cheapest validation the server runs.
		opts.Validation = designdocs.ValidationAuto
	}
	var missing []string
	if exists {
		if missing, err = missingDesignDocs(ctx, client.DB(conn.DB), designdocs.ID, designdocs.SweepID, designdocs.OpsID); err != nil {
			return nil, ServerError(conn.URL, err)
		}
	}
	outcome, err := protocol.InitWith(ctx, client, conn.DB, opts, log)
	if err != nil {
		return nil, ServerError(conn.URL, err)
	}
	res.DBCreated = !exists
	res.DesignDoc = outcome
	if outcome == designdocs.Unchanged && len(missing) > 0 {
		// The outcome is the claim document's: say what else init put back.
		res.Restored = missing
	}
	// Read back rather than assumed: a newer couchq's document may have
	// been kept as it is.
	stored, err := designdocs.Stored(ctx, client.DB(conn.DB))
	if err != nil || stored == nil {
		if err == nil {
			err = fmt.Errorf("design document %s vanished", designdocs.ID)
		}
		return nil, ServerError(conn.URL, err)
	}
	res.Language = stored.Language
	res.Validation = stored.ValidationOf()
	if outcome == designdocs.KeptStored {
		// A change asked for and not made is no success.
		asked := opts.Validation != designdocs.ValidationKept && opts.Validation != designdocs.ValidationAuto && opts.Validation != res.Validation
		if asked || (opts.Language != "" && string(opts.Language) != res.Language) {
			return nil, fmt.Errorf("the design documents of %s were not changed: they keep validation %s and language %s, since only an admin may write design documents (connect as a server or database admin)",
				conn.DB, res.Validation, res.Language)
		}
	}
	if res.DBCreated {
		// Only said, so a failed read is no failed init.
		if info, err := client.DB(conn.DB).Stats(ctx); err == nil && info.Cluster != nil {
			res.Shards, res.Copies = info.Cluster.Shards, info.Cluster.Replicas
		}
	}
	return res, nil
}

// missingDesignDocs names the design documents of ids that db lacks
// (deleted, say, from Fauxton).
func missingDesignDocs(ctx context.Context, db *kivik.DB, ids ...string) ([]string, error) {
	var missing []string
	for _, id := range ids {
		if _, err := db.GetRev(ctx, id); err != nil {
			if kivik.HTTPStatus(err) != http.StatusNotFound {
				return nil, fmt.Errorf("looking for design document %s: %w", id, err)
			}
			missing = append(missing, id)
		}
	}
	return missing, nil
}

// PrintInit prints what init did, as JSON with asJSON.
func PrintInit(w io.Writer, res *InitResult, asJSON bool) error {
	if asJSON {
		return WriteJSON(w, res)
	}
	db := "using database " + res.Database
	if res.DBCreated {
		db = "created database " + res.Database
		if res.Shards > 0 {
			db += fmt.Sprintf(" (%s, %s)", count(res.Shards, "shard", "shards"), count(res.Copies, "copy", "copies"))
		}
	}
	var dd string
	all := fmt.Sprintf("%s, %s and %s", designdocs.ID, designdocs.SweepID, designdocs.OpsID)
	switch res.DesignDoc {
	case designdocs.Created:
		dd = fmt.Sprintf("installed design documents %s (schema %d)", all, res.Schema)
	case designdocs.Upgraded:
		dd = fmt.Sprintf("upgraded design documents %s to schema %d", all, res.Schema)
		if res.schemaBefore == res.Schema {
			dd = fmt.Sprintf("rewrote design documents %s (schema %d)", all, res.Schema)
		}
	case designdocs.Unchanged:
		dd = fmt.Sprintf("design documents %s are up to date (schema %d)", all, res.Schema)
		if len(res.Restored) > 0 {
			dd = fmt.Sprintf("installed missing design documents %s again (schema %d)", strings.Join(res.Restored, ", "), res.Schema)
		}
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
	switch res.Validation {
	case designdocs.ValidationOff:
		if _, err := fmt.Fprintln(w, "validation is off: CouchDB stores malformed jobs (workers mark them failed with the reason) and any member may write any document"); err != nil {
			return err
		}
	case designdocs.ValidationMango:
		if _, err := fmt.Fprintf(w, "validation is mango (%s): CouchDB refuses malformed jobs without running JavaScript, saying only \"document is not valid\", and enforces no roles\n", designdocs.ValidateID); err != nil {
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

// count is n with the noun for n.
func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// orNobody is an access list as init's flags take it, or "nobody".
func orNobody(a protocol.Access) string {
	if a.Empty() {
		return "nobody"
	}
	return a.String()
}
