package designdocs

import (
	"context"
	"encoding/json"
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
)

// installAttempts bounds the read-compare-write loop. Each lost race means
// another installer wrote in between; a handful of rounds always settles.
const installAttempts = 10

// Install makes db carry want, idempotently: unchanged content is not
// rewritten, a design document from a newer schema is kept, and concurrent
// installers all succeed because a 409 is answered by reading again.
func Install(ctx context.Context, db *kivik.DB, want *Doc, log zerolog.Logger) (Outcome, error) {
	for range installAttempts {
		have, err := fetch(ctx, db)
		if err != nil {
			return "", err
		}
		outcome := Created
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
		if _, err := db.Put(ctx, ID, &doc); err != nil {
			if kivik.HTTPStatus(err) == http.StatusConflict {
				continue // another installer won this round: compare again
			}
			return "", fmt.Errorf("writing design document %s: %w", ID, err)
		}
		log.Info().Str("outcome", string(outcome)).Int("schema", want.Couchq.Schema).Str("hash", want.Couchq.Hash).
			Msg("installed design document")
		return outcome, nil
	}
	return "", fmt.Errorf("installing design document %s: still conflicting after %d attempts", ID, installAttempts)
}

// fetch reads the stored design document, nil when there is none.
func fetch(ctx context.Context, db *kivik.DB) (*Doc, error) {
	row := db.Get(ctx, ID)
	var raw json.RawMessage
	if err := row.ScanDoc(&raw); err != nil {
		if kivik.HTTPStatus(err) == http.StatusNotFound {
			return nil, nil
		}
		return nil, fmt.Errorf("reading design document %s: %w", ID, err)
	}
	var have Doc
	if err := json.Unmarshal(raw, &have); err != nil {
		// A hand-mangled design document is replaced, not fatal: keep its rev.
		var rev struct {
			Rev string `json:"_rev"`
		}
		if json.Unmarshal(raw, &rev) != nil || rev.Rev == "" {
			return nil, fmt.Errorf("decoding design document %s: %w", ID, err)
		}
		return &Doc{Rev: rev.Rev}, nil
	}
	if have.Language == "" {
		have.Language = "javascript"
	}
	return &have, nil
}
