package designdocs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"
)

// Outcome says what Install did.
type Outcome string

const (
	// Created: the database had no couchq design document.
	Created Outcome = "created"
	// Upgraded: an older or different design document was replaced.
	Upgraded Outcome = "upgraded"
	// Unchanged: the stored document already runs the same functions.
	Unchanged Outcome = "unchanged"
	// KeptNewer: the stored document comes from a newer couchq and was left alone.
	KeptNewer Outcome = "kept-newer"
	// KeptStored: the stored document has this couchq's schema but other
	// functions (another build), and the caller may not write design
	// documents: it is used as it is. Only a database admin installs.
	KeptStored Outcome = "kept-stored"
)

// ErrNeedsAdmin means the database needs its design document installed or
// upgraded and the caller is not allowed to: CouchDB lets only admins write
// design documents. A database admin runs couchq init.
var ErrNeedsAdmin = errors.New("run `couchq init` as an admin")

// ErrNoMangoValidation means the server does not run validate_doc_update
// written as a Mango selector, which ValidationMango needs: Apache CouchDB
// 3.5 and earlier and PouchDB Server do not. Init changed nothing.
var ErrNoMangoValidation = errors.New("the server does not run validate_doc_update written as a Mango selector (Apache CouchDB after 3.5 does): use --validation on")

// installAttempts bounds the read-compare-write loop. Each lost race means
// another installer wrote in between; a handful of rounds always settles.
const installAttempts = 10

// Install makes db carry want, idempotently: unchanged content is not
// rewritten, a design document from a newer schema is kept, and concurrent
// installers all succeed because a 409 is answered by reading again.
// validation turns validate_doc_update on or off, leaves it to
// _design/couchq-validate (ValidationMango; Init installs that one), or
// (ValidationKept) keeps the stored document's choice.
func Install(ctx context.Context, db *kivik.DB, want *Doc, validation Validation, log zerolog.Logger) (Outcome, error) {
	for range installAttempts {
		have, err := fetch(ctx, db, want.ID)
		if err != nil {
			return "", err
		}
		outcome := Created
		v := validation
		if v == ValidationKept && have != nil && have.ValidationOf() != ValidationOn {
			v = have.ValidationOf()
		}
		want := want.WithValidation(v)
		doc := *want
		doc.Rev = ""
		if have != nil {
			switch {
			case have.Couchq.Schema > want.Couchq.Schema:
				log.Warn().Int("stored_schema", have.Couchq.Schema).Int("our_schema", want.Couchq.Schema).
					Msg("design document comes from a newer couchq; leaving it in place")
				return KeptNewer, nil
			case have.Couchq.Schema == want.Couchq.Schema && have.contentHash() == want.Couchq.Hash:
				return Unchanged, nil
			}
			outcome = Upgraded
			doc.Rev = have.Rev
		}
		if _, err := db.Put(ctx, want.ID, &doc); err != nil {
			switch kivik.HTTPStatus(err) {
			case http.StatusConflict:
				continue // another installer won this round: compare again
			case http.StatusUnauthorized, http.StatusForbidden:
				return needsAdmin(have, want, err, log)
			}
			return "", fmt.Errorf("writing design document %s: %w", want.ID, err)
		}
		log.Info().Str("design_doc", want.ID).Str("outcome", string(outcome)).Int("schema", want.Couchq.Schema).Str("hash", want.Couchq.Hash).
			Str("validation", string(want.Couchq.Validation)).Msg("installed design document")
		return outcome, nil
	}
	return "", fmt.Errorf("installing design document %s: still conflicting after %d attempts", want.ID, installAttempts)
}

// needsAdmin is Install's answer when the caller may not write the design
// document have should be replaced by.
func needsAdmin(have, want *Doc, err error, log zerolog.Logger) (Outcome, error) {
	switch {
	case have == nil:
		return "", fmt.Errorf("%w: the database has no couchq design document (%s), and only an admin may install it: %w", ErrNeedsAdmin, want.ID, err)
	case have.Couchq.Schema < want.Couchq.Schema:
		return "", fmt.Errorf("%w: the database's design document %s is out of date (schema %d, this couchq needs %d), and only an admin may upgrade it: %w",
			ErrNeedsAdmin, want.ID, have.Couchq.Schema, want.Couchq.Schema, err)
	}
	// Same schema, same meaning: another build of couchq installed it (a
	// rolling deploy). Carry on with it rather than stop every worker.
	log.Warn().Str("design_doc", want.ID).Int("schema", want.Couchq.Schema).Str("stored_hash", have.Couchq.Hash).Str("our_hash", want.Couchq.Hash).
		Msg("design document differs from this couchq's (same schema) and only an admin may replace it: using it; run `couchq init` as an admin to install this version")
	return KeptStored, nil
}

// Exists reports whether db has a couchq design document: commands that
// read views check it first, so that a database nobody ran couchq init on
// gets that advice rather than a bare "missing".
func Exists(ctx context.Context, db *kivik.DB) (bool, error) {
	if _, err := db.GetRev(ctx, ID); err != nil {
		if kivik.HTTPStatus(err) == http.StatusNotFound {
			return false, nil
		}
		return false, fmt.Errorf("looking for design document %s: %w", ID, err)
	}
	return true, nil
}

// Stored reads db's claim design document, nil when there is none.
func Stored(ctx context.Context, db *kivik.DB) (*Doc, error) { return fetch(ctx, db, ID) }

// fetch reads the stored design document id, nil when there is none.
func fetch(ctx context.Context, db *kivik.DB, id string) (*Doc, error) {
	row := db.Get(ctx, id)
	var raw json.RawMessage
	if err := row.ScanDoc(&raw); err != nil {
		if kivik.HTTPStatus(err) == http.StatusNotFound {
			return nil, nil
		}
		return nil, fmt.Errorf("reading design document %s: %w", id, err)
	}
	var have Doc
	if err := json.Unmarshal(raw, &have); err != nil {
		// A hand-mangled design document is replaced, not fatal: keep its rev.
		var rev struct {
			Rev string `json:"_rev"`
		}
		if json.Unmarshal(raw, &rev) != nil || rev.Rev == "" {
			return nil, fmt.Errorf("decoding design document %s: %w", id, err)
		}
		return &Doc{Rev: rev.Rev}, nil
	}
	if have.Language == "" {
		have.Language = string(JavaScript)
	}
	return &have, nil
}

// Remove deletes the design document id from db when it is there, as
// couchq init does with _design/couchq-validate when the database's
// validation is no longer mango.
func Remove(ctx context.Context, db *kivik.DB, id string, log zerolog.Logger) error {
	for range installAttempts {
		rev, err := db.GetRev(ctx, id)
		if kivik.HTTPStatus(err) == http.StatusNotFound {
			return nil
		}
		if err != nil {
			return fmt.Errorf("looking for design document %s: %w", id, err)
		}
		if _, err := db.Delete(ctx, id, rev); err != nil {
			switch kivik.HTTPStatus(err) {
			case http.StatusConflict:
				continue // rewritten meanwhile: look again
			case http.StatusNotFound:
				return nil
			case http.StatusUnauthorized, http.StatusForbidden:
				return fmt.Errorf("%w: design document %s no longer belongs in the database, and only an admin may remove it: %w", ErrNeedsAdmin, id, err)
			}
			return fmt.Errorf("removing design document %s: %w", id, err)
		}
		log.Info().Str("design_doc", id).Msg("removed design document")
		return nil
	}
	return fmt.Errorf("removing design document %s: still conflicting after %d attempts", id, installAttempts)
}
