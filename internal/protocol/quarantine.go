package protocol

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

// ErrUnrepairable means a malformed document cannot be quarantined: it is
// not a WorkItem couchq can bring into shape, or the server refused the
// repaired version (an application's own validate_doc_update, say).
var ErrUnrepairable = errors.New("malformed WorkItem cannot be quarantined")

// Quarantine marks one malformed WorkItem failed; see QuarantineMany.
func (c *Client) Quarantine(ctx context.Context, m Malformed, by string) error {
	return c.QuarantineMany(ctx, []Malformed{m}, by)[0]
}

// QuarantineMany marks malformed WorkItems (typically written before
// validate_doc_update existed) failed, in one _bulk_docs request, so that
// they stop sitting at the front of the due or leases view and an operator
// finds them in the failed list. Nothing is lost: each offending value
// moves, as it was, under "invalid.<field>" (an "invalid" field the
// document already had moves under "invalid.invalid" unless it is an
// object), an earlier last_error moves to "previous_last_error", and
// last_error says what was wrong. The errors are in the order of ms; a
// document someone else rewrote meanwhile (409) counts as done, a
// document that cannot be repaired gets ErrUnrepairable.
func (c *Client) QuarantineMany(ctx context.Context, ms []Malformed, by string) []error {
	errs := make([]error, len(ms))
	docs := make([]any, 0, len(ms))
	ids := make([]string, 0, len(ms))
	index := make([]int, 0, len(ms))
	for i, m := range ms {
		it, cause, err := c.repair(m, by)
		switch {
		case err != nil:
			errs[i] = err
		case it == nil: // well-formed after all (rewritten since it was read)
		default:
			docs = append(docs, it)
			ids = append(ids, it.ID)
			index = append(index, i)
			c.log.Warn().Str("job", m.ID).Str("reason", cause).Msg("quarantining malformed WorkItem as failed")
		}
	}
	if len(docs) == 0 {
		return errs
	}
	results, err := c.db.BulkDocs(ctx, docs, c.bulkOpts()...)
	for k, r := range c.resendUnexplained(ctx, docs, ids, results, err) {
		i := index[k]
		switch {
		case r.Error == nil, isStatus(r.Error, http.StatusConflict):
		case isStatus(r.Error, http.StatusForbidden), isStatus(r.Error, http.StatusBadRequest):
			errs[i] = fmt.Errorf("quarantining %s: %w: the server refused the repaired document: %w", ms[i].ID, ErrUnrepairable, r.Error)
		default:
			errs[i] = fmt.Errorf("quarantining %s: %w", ms[i].ID, r.Error)
		}
	}
	return errs
}

// repair builds the quarantined version of a malformed document, or nil
// when it turns out well-formed.
func (c *Client) repair(m Malformed, by string) (*WorkItem, string, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(m.Raw, &doc); err != nil {
		return nil, "", fmt.Errorf("quarantining %s: %w: not a JSON object: %w", m.ID, ErrUnrepairable, err)
	}
	invalid := map[string]json.RawMessage{}
	if prev, ok := doc["invalid"]; ok {
		if json.Unmarshal(prev, &invalid) != nil || invalid == nil {
			invalid = map[string]json.RawMessage{"invalid": prev}
		}
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
			return nil, "", fmt.Errorf("quarantining %s: %w: %w", m.ID, ErrUnrepairable, bad)
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
		return nil, "", nil
	}
	cause := "malformed WorkItem: " + strings.Join(reasons, "; ")
	var prevErr string
	if json.Unmarshal(doc["last_error"], &prevErr) == nil && prevErr != "" {
		doc["previous_last_error"] = doc["last_error"]
	}
	doc["invalid"] = mustJSON(invalid)
	doc["status"] = json.RawMessage(`"failed"`)
	doc["claimed"] = json.RawMessage(`false`)
	doc["last_error"] = mustJSON(truncate(cause))
	doc["finished_at"] = mustJSON(ToUnix(c.now()))
	var it WorkItem
	if err := json.Unmarshal(mustJSON(doc), &it); err != nil {
		return nil, "", fmt.Errorf("quarantining %s: %w: still malformed after moving %d fields aside: %w",
			m.ID, ErrUnrepairable, len(reasons), err)
	}
	c.record(&it, EventFailed, by, cause)
	it.Rev = m.Rev
	return &it, cause, nil
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
