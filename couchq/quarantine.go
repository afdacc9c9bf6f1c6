package couchq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// quarantineFields bounds how many bad fields one document may have moved
// aside before couchq gives up on it (and only skips it).
const quarantineFields = 16

// Quarantine marks a malformed WorkItem (typically written before
// validate_doc_update existed) failed, so that it stops sitting at the
// front of the due view and an operator finds it in the failed list. Nothing
// is lost: each offending value moves, as it was, under "invalid.<field>",
// and last_error says what was wrong. A 409 means someone else already
// rewrote the document, which is fine.
func (c *Client) Quarantine(ctx context.Context, m Malformed, by string) error {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(m.Raw, &doc); err != nil {
		return fmt.Errorf("quarantining %s: document is not a JSON object: %w", m.ID, err)
	}
	invalid := map[string]json.RawMessage{}
	if prev, ok := doc["invalid"]; ok {
		_ = json.Unmarshal(prev, &invalid) // an unusable "invalid" is itself moved below
	}
	var reasons []string
	for range quarantineFields {
		var it WorkItem
		err := json.Unmarshal(mustJSON(doc), &it)
		var bad *MalformedError
		if err == nil || !errors.As(err, &bad) {
			break
		}
		switch bad.Field {
		case "type", "_id", "document":
			// Not a WorkItem couchq can repair into shape: leave it be.
			return fmt.Errorf("quarantining %s: %w", m.ID, bad)
		case "worker":
			if w, ok := doc["worker"]; ok {
				invalid["worker"] = w
			}
			doc["worker"] = json.RawMessage(`"invalid"`)
		default:
			if v, ok := doc[bad.Field]; ok {
				invalid[bad.Field] = v
			}
			delete(doc, bad.Field)
		}
		reasons = append(reasons, bad.Field+" "+bad.Reason)
	}
	if len(reasons) == 0 {
		return nil // well-formed after all (rewritten since it was read)
	}
	now := c.now()
	cause := "malformed WorkItem: " + strings.Join(reasons, "; ")
	doc["invalid"] = mustJSON(invalid)
	doc["status"] = json.RawMessage(`"failed"`)
	doc["claimed"] = json.RawMessage(`false`)
	doc["last_error"] = mustJSON(truncate(cause))
	doc["finished_at"] = mustJSON(ToUnix(now))
	var it WorkItem
	if err := json.Unmarshal(mustJSON(doc), &it); err != nil {
		return fmt.Errorf("quarantining %s: still malformed after moving %d fields aside: %w", m.ID, len(reasons), err)
	}
	c.record(&it, "failed", by, cause)
	it.Rev = m.Rev
	if _, err := c.db.Put(ctx, it.ID, &it, c.writeOpts()...); err != nil {
		if isStatus(err, http.StatusConflict) {
			return nil
		}
		return fmt.Errorf("quarantining %s: %w", m.ID, err)
	}
	c.log.Warn().Str("job", m.ID).Str("reason", cause).Msg("quarantined malformed WorkItem as failed")
	return nil
}

// mustJSON encodes values that always encode (maps of raw JSON, strings,
// numbers).
func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("couchq: encoding %T: %v", v, err))
	}
	return b
}
