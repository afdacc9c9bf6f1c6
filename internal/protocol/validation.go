package protocol

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/designdocs"
)

// ErrNoMangoValidation is designdocs.ErrNoMangoValidation.
var ErrNoMangoValidation = designdocs.ErrNoMangoValidation

// chooseValidation resolves opts.Validation for db into on, off or mango:
// the stored choice when kept (on for a new database), and for auto mango
// where the server runs it and opts.Roles is false, else on. Mango is
// asked of the server once, unless the database already has it.
func chooseValidation(ctx context.Context, client *kivik.Client, db *kivik.DB, opts InitOptions, log zerolog.Logger) (designdocs.Validation, error) {
	have, err := designdocs.Stored(ctx, db)
	if err != nil {
		return "", err
	}
	stored := designdocs.ValidationOn
	if have != nil {
		stored = have.ValidationOf()
	}
	switch opts.Validation {
	case designdocs.ValidationKept:
		return stored, nil
	case designdocs.ValidationOn, designdocs.ValidationOff:
		return opts.Validation, nil
	case designdocs.ValidationMango:
		if have != nil && stored == designdocs.ValidationMango {
			return stored, nil
		}
		if err := mangoValidation(ctx, client); err != nil {
			return "", err
		}
		return designdocs.ValidationMango, nil
	case designdocs.ValidationAuto:
		if opts.Roles {
			return designdocs.ValidationOn, nil
		}
		if have != nil && stored == designdocs.ValidationMango {
			return stored, nil
		}
		if err := mangoValidation(ctx, client); err != nil {
			log.Info().Err(err).Msg("validation on: JavaScript validate_doc_update")
			return designdocs.ValidationOn, nil
		}
		log.Info().Msg("the server runs validate_doc_update written as a Mango selector: validation mango")
		return designdocs.ValidationMango, nil
	}
	return "", fmt.Errorf("unknown validation %q", opts.Validation)
}

// mangoProbeWait bounds how long the probe waits for its design document
// to reach the copy that validates (a cluster's node).
const mangoProbeWait = 5 * time.Second

// mangoValidation asks the server whether it runs validate_doc_update
// written as a Mango selector, in a scratch database of one copy: a
// document the selector refuses must get 403, one it accepts 201. It is
// never tried in the queue's own database: a server without the feature
// would fail every write there while the probe's design document stood.
// Nil means it does; otherwise the error says why not.
func mangoValidation(ctx context.Context, client *kivik.Client) error {
	var suffix [6]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return fmt.Errorf("naming a scratch database: %w", err)
	}
	name := "couchq_probe_" + hex.EncodeToString(suffix[:])
	if err := client.CreateDB(ctx, name, kivik.Params(map[string]any{"q": 1, "n": 1})); err != nil {
		return fmt.Errorf("%w (could not create a scratch database to ask: %w)", ErrNoMangoValidation, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = client.DestroyDB(dctx, name)
	}()
	db := client.DB(name)
	ddoc := map[string]any{
		"language":            designdocs.Query,
		"validate_doc_update": map[string]any{"newDoc": map[string]any{"probe": map[string]any{"$ne": "refused"}}},
	}
	if _, err := db.Put(ctx, "_design/probe", ddoc); err != nil {
		return fmt.Errorf("%w (it refused the design document: %w)", ErrNoMangoValidation, err)
	}
	deadline := time.Now().Add(mangoProbeWait)
	for i := 0; ; i++ {
		_, err := db.Put(ctx, fmt.Sprintf("refused-%d", i), map[string]any{"probe": "refused"})
		switch {
		case kivik.HTTPStatus(err) == http.StatusForbidden:
			if _, err := db.Put(ctx, "accepted", map[string]any{"probe": "accepted"}); err != nil {
				return fmt.Errorf("%w (it refused a document the selector accepts: %w)", ErrNoMangoValidation, err)
			}
			return nil
		case err != nil:
			return fmt.Errorf("%w (a write failed: %w)", ErrNoMangoValidation, err)
		case time.Now().After(deadline):
			return fmt.Errorf("%w (it stored a document the selector refuses)", ErrNoMangoValidation)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
