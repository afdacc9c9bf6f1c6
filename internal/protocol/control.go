package protocol

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/go-kivik/kivik/v4"
)

// ControlDocType is the type of a job type's control document.
const ControlDocType = "TypeControl"

// controlPrefix starts every control document's id.
const controlPrefix = "control:"

// ControlID is the id of a job type's control document.
func ControlID(worker string) string { return controlPrefix + worker }

// TypeControl is a job type's control document ("control:<type>"): whether
// its workers claim it. Workers follow it through the changes feed they
// already hold, so a pause reaches every worker of the type within a feed
// round trip; what they hold runs to the end. Written by Pause and Resume,
// or by hand (validate_doc_update checks its shape).
type TypeControl struct {
	ID     string `json:"_id"`
	Rev    string `json:"_rev,omitempty"`
	Type   string `json:"type"`
	Worker string `json:"worker"`
	Paused bool   `json:"paused"`
	// ChangedAt (Unix seconds) and ChangedBy say who paused or resumed it
	// last, and Reason why.
	ChangedAt float64 `json:"changed_at,omitempty"`
	ChangedBy string  `json:"changed_by,omitempty"`
	Reason    string  `json:"reason,omitempty"`
}

// controlRounds bounds the retries of a pause or resume that races another.
const controlRounds = 5

// Pause stops every worker of typ from claiming it (see TypeControl). It is
// idempotent: pausing a paused type changes nothing.
func (c *Client) Pause(ctx context.Context, typ, by, reason string) error {
	return c.setPaused(ctx, typ, true, by, reason)
}

// Resume lets the workers of typ claim it again, at once.
func (c *Client) Resume(ctx context.Context, typ, by string) error {
	return c.setPaused(ctx, typ, false, by, "")
}

func (c *Client) setPaused(ctx context.Context, typ string, paused bool, by, reason string) error {
	what := map[bool]string{true: "pausing", false: "resuming"}[paused]
	if typ == "" {
		return fmt.Errorf("%s: %w: the job type is required", what, ErrInvalidJob)
	}
	for range controlRounds {
		ctl := TypeControl{ID: ControlID(typ), Type: ControlDocType, Worker: typ}
		err := c.db.Get(ctx, ctl.ID).ScanDoc(&ctl)
		switch {
		case isStatus(err, http.StatusNotFound):
			if !paused && !c.recordsEveryChange() {
				return nil // never paused
			}
		case err != nil:
			return fmt.Errorf("%s %s: reading its control document: %w", what, typ, err)
		case ctl.Type != ControlDocType || ctl.Worker != typ:
			// Written over, it would lose that document and pause nothing:
			// workers read only a control document as one.
			return fmt.Errorf("%s %s: the document %s is not its control document (type %q, worker %q); move it to another id first",
				what, typ, ctl.ID, ctl.Type, ctl.Worker)
		case ctl.Paused == paused && (ctl.Reason == reason || reason == ""):
			if !c.recordsEveryChange() {
				return nil
			}
			reason = ctl.Reason // a pause without a reason keeps the one given before
		}
		ctl.Paused, ctl.ChangedAt, ctl.ChangedBy, ctl.Reason = paused, ToUnix(c.now()), by, reason
		_, err = c.db.Put(ctx, ctl.ID, ctl, c.writeOpts()...)
		if isStatus(err, http.StatusConflict) {
			continue // changed in between: look again
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", what, typ, err)
		}
		c.log.Info().Str("type", typ).Bool("paused", paused).Str("by", by).Msg("job type " + map[bool]string{true: "paused", false: "resumed"}[paused])
		return nil
	}
	return fmt.Errorf("%s %s: its control document changed %d times under us; try again", what, typ, controlRounds)
}

// recordsEveryChange reports whether a pause or resume that changes
// nothing is recorded all the same: at a site of several, where a request
// from another site made before it must lose to it (applyTypeRequest
// judges by the control's last change), a resume of a type that is not
// paused is still this site's word on it.
func (c *Client) recordsEveryChange() bool {
	_, haveSites := c.SiteListed("")
	return c.cfg.Site != "" || haveSites
}

// Controls reads the control documents of types (every type's when none is
// given), by type. A type without one is not paused.
//
// Named types are read one document each with r = a majority of the
// copies: after a pause written with w = a majority, a worker that hears
// of it from the feed reads it back even through a node whose own copy is
// behind (_all_docs has no r).
func (c *Client) Controls(ctx context.Context, types ...string) (map[string]TypeControl, error) {
	out := map[string]TypeControl{}
	if len(types) > 0 {
		opts := c.readOpts()
		for _, t := range types {
			var ctl TypeControl
			err := c.db.Get(ctx, ControlID(t), opts...).ScanDoc(&ctl)
			switch {
			case isStatus(err, http.StatusNotFound):
			case err != nil:
				return nil, fmt.Errorf("reading the control document of %s: %w", t, err)
			case ctl.Type == ControlDocType && ctl.Worker == t:
				out[t] = ctl
			}
		}
		return out, nil
	}
	rows := c.db.AllDocs(ctx, kivik.Params(map[string]any{
		"include_docs": true, "startkey": controlPrefix, "endkey": controlPrefix + "\ufff0",
	}))
	defer rows.Close()
	for rows.Next() {
		var ctl TypeControl
		if err := rows.ScanDoc(&ctl); err != nil {
			// A missing key's row, or a deleted document: no control.
			continue
		}
		if ctl.Type == ControlDocType && strings.TrimPrefix(ctl.ID, controlPrefix) == ctl.Worker {
			out[ctl.Worker] = ctl
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading control documents: %w", err)
	}
	return out, nil
}

// Paused reports which of types are paused (every paused type when none is
// given).
func (c *Client) Paused(ctx context.Context, types ...string) (map[string]bool, error) {
	ctls, err := c.Controls(ctx, types...)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for t, ctl := range ctls {
		if ctl.Paused {
			out[t] = true
		}
	}
	return out, nil
}

// pausedWhy reports every paused type, and the reason its pause was
// given where it was.
func (c *Client) pausedWhy(ctx context.Context) (paused map[string]bool, reasons map[string]string, err error) {
	ctls, err := c.Controls(ctx)
	if err != nil {
		return nil, nil, err
	}
	paused, reasons = map[string]bool{}, map[string]string{}
	for t, ctl := range ctls {
		if ctl.Paused {
			paused[t] = true
			if ctl.Reason != "" {
				reasons[t] = ctl.Reason
			}
		}
	}
	return paused, reasons, nil
}

// isControlID reports whether a document id is a control document's, and
// for which type.
func isControlID(id string) (string, bool) {
	typ, ok := strings.CutPrefix(id, controlPrefix)
	return typ, ok && typ != ""
}
