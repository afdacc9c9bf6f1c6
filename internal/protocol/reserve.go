package protocol

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-kivik/kivik/v4"
)

// Slot reservations: the next free value of a sequence (a ticket serial,
// an invoice number, a seat) for jobs running concurrently. A reservation
// is a document whose id is derived from the sequence and the slot
// (SlotReservationID): creating it is taking the slot, and CouchDB answers
// 409 to everyone else. A reservation holds for a TTL; ReleaseSlot marks the
// slot used and moves the sequence's "last used" marker forward (never
// backward); AbandonSlot frees it for the next Reserve.

// SlotTTLDefault is a reservation's TTL when the Sequence gives none.
const SlotTTLDefault = time.Minute

// Document types of reservations and sequence markers.
const (
	SlotReservationDocType = "SlotReservation"
	SequenceDocType        = "Sequence"
)

// Slot states.
const (
	SlotReserved = "reserved"
	SlotUsed     = "used"
	SlotFree     = "free" // abandoned: the next Reserve takes it first
)

// Sequence describes a sequence of slots.
type Sequence struct {
	// Name identifies the sequence (part of every document id).
	Name string
	// Start is the first slot, where a sequence nothing is known of begins.
	Start func() string
	// Next is the candidate after slot; empty when slot is not one the
	// sequence makes (Reserve then refuses, rather than start again and
	// hand out slots a second time).
	Next func(slot string) string
	// TTL is how long a reservation holds without Release; default
	// SlotTTLDefault. A holder that dies leaves its slot reserved until
	// then; after, the slot can be taken again.
	TTL time.Duration
}

func (s Sequence) ttl() time.Duration {
	if s.TTL > 0 {
		return s.TTL
	}
	return SlotTTLDefault
}

// Validate reports what the sequence lacks.
func (s Sequence) Validate() error {
	switch {
	case s.Name == "" || strings.ContainsAny(s.Name, ":\x00"):
		return fmt.Errorf("%w: a sequence needs a name without ':'", ErrInvalidSequence)
	case s.Start == nil || s.Next == nil:
		return fmt.Errorf("%w: sequence %s needs Start and Next", ErrInvalidSequence, s.Name)
	}
	return nil
}

// NumberedSequence is a sequence of numbers from first, each written with
// format (fmt verbs: "AAAA-%04d" gives AAAA-0001, AAAA-0002, ...).
func NumberedSequence(name, format string, first int, ttl time.Duration) Sequence {
	return Sequence{
		Name:  name,
		Start: func() string { return fmt.Sprintf(format, first) },
		Next: func(slot string) string {
			var n int
			if _, err := fmt.Sscanf(slot, format, &n); err != nil || fmt.Sprintf(format, n) != slot {
				return "" // another format's slot
			}
			return fmt.Sprintf(format, n+1)
		},
		TTL: ttl,
	}
}

// SlotReservationID is the id of slot in sequence seq.
func SlotReservationID(seq, slot string) string { return "slot:" + seq + ":" + slot }

// SequenceID is the id of a sequence's marker document.
func SequenceID(seq string) string { return "sequence:" + seq }

// Reservation is a slot document: who holds which slot of a sequence.
type Reservation struct {
	ID       string `json:"_id"`
	Rev      string `json:"_rev,omitempty"`
	Type     string `json:"type"`
	Sequence string `json:"sequence"`
	Slot     string `json:"slot"`
	// Ordinal is the slot's place in the sequence (Start is 1): how the
	// marker knows forward from backward.
	Ordinal int64  `json:"ordinal"`
	State   string `json:"state"`
	Holder  string `json:"holder,omitempty"`
	// ExpiresAt ends a reservation (Unix seconds); 0 for used and free slots.
	ExpiresAt  float64 `json:"expires_at"`
	ReservedAt float64 `json:"reserved_at,omitempty"`
	UsedAt     float64 `json:"used_at,omitempty"`
}

// Expired reports whether a reserved slot's TTL ran out at now.
func (r *Reservation) Expired(now time.Time) bool {
	return r.State == SlotReserved && r.ExpiresAt <= ToUnix(now)
}

// sequenceMarker is the sequence's last used slot.
type sequenceMarker struct {
	ID       string `json:"_id"`
	Rev      string `json:"_rev,omitempty"`
	Type     string `json:"type"`
	Sequence string `json:"sequence"`
	LastUsed string `json:"last_used"`
	Ordinal  int64  `json:"ordinal"`
}

// ErrInvalidSequence means a Sequence or a Reserve call lacks what it needs.
var ErrInvalidSequence = errors.New("invalid sequence")

// ErrReservationLost means a reservation's slot is no longer the holder's:
// its TTL ran out and someone took it, or it was released already.
var ErrReservationLost = errors.New("reservation lost")

// reserveScanLimit bounds how many taken slots one Reserve steps over.
const reserveScanLimit = 100000

// Reserve finds the next free slot of seq and reserves it for holder:
// first a slot abandoned or whose reservation ran out (the sequence's
// free_slots view), else the first slot after the last used one that no
// one holds. On a cluster a reservation stored on fewer than a majority
// of the copies counts only when nothing contests it.
func (c *Client) Reserve(ctx context.Context, seq Sequence, holder string) (*Reservation, error) {
	if err := seq.Validate(); err != nil {
		return nil, err
	}
	if holder == "" {
		return nil, fmt.Errorf("%w: reserving a slot of %s needs a holder", ErrInvalidSequence, seq.Name)
	}
	if r, err := c.reuseSlot(ctx, seq, holder); r != nil || err != nil {
		return r, err
	}
	marker, err := c.readMarker(ctx, seq.Name)
	if err != nil {
		return nil, err
	}
	slot, ordinal := seq.Start(), int64(1)
	if marker != nil {
		slot, ordinal = seq.Next(marker.LastUsed), marker.Ordinal+1
		if slot == "" {
			return nil, fmt.Errorf("%w: the last slot used of %s, %q, is not one this sequence makes (another format?): reserve with the format its slots were made with, or the sequence would start again and give out slots twice",
				ErrInvalidSequence, seq.Name, marker.LastUsed)
		}
	}
	for range reserveScanLimit {
		r := c.newReservation(seq, slot, ordinal, holder)
		ok, err := c.takeSlot(ctx, r, "")
		if err != nil {
			return nil, err
		}
		if ok {
			return r, nil
		}
		// Taken: a live reservation or a used slot. One whose TTL ran out
		// is taken over.
		var have Reservation
		switch err := c.db.Get(ctx, r.ID, c.readOpts()...).ScanDoc(&have); {
		case kivik.HTTPStatus(err) == http.StatusNotFound:
			continue // deleted in between: try it again
		case err != nil:
			return nil, fmt.Errorf("reading slot %s of %s: %w", slot, seq.Name, err)
		case have.State == SlotFree || have.Expired(c.now()):
			r.Ordinal = max(have.Ordinal, 1)
			if ok, err := c.takeSlot(ctx, r, have.Rev); err != nil || ok {
				return okOrNil(r, ok), err
			}
		}
		if slot, ordinal = seq.Next(slot), ordinal+1; slot == "" {
			return nil, fmt.Errorf("%w: sequence %s made a slot its Next does not read", ErrInvalidSequence, seq.Name)
		}
	}
	return nil, fmt.Errorf("reserving a slot of %s: %d slots in a row are taken", seq.Name, reserveScanLimit)
}

func okOrNil(r *Reservation, ok bool) *Reservation {
	if ok {
		return r
	}
	return nil
}

func (c *Client) newReservation(seq Sequence, slot string, ordinal int64, holder string) *Reservation {
	now := c.now()
	return &Reservation{
		ID: SlotReservationID(seq.Name, slot), Type: SlotReservationDocType, Sequence: seq.Name, Slot: slot,
		Ordinal: ordinal, State: SlotReserved, Holder: holder,
		ExpiresAt: ToUnix(now.Add(seq.ttl())), ReservedAt: ToUnix(now),
	}
}

// reuseSlot takes an abandoned slot or one whose reservation ran out, the
// lowest first, so that the sequence has no gaps.
func (c *Client) reuseSlot(ctx context.Context, seq Sequence, holder string) (*Reservation, error) {
	now := ToUnix(c.now())
	rows := c.view(ctx, "free_slots", kivik.Params(map[string]any{
		"startkey": []any{seq.Name, 0}, "endkey": []any{seq.Name, now, map[string]any{}}, "include_docs": true, "limit": 20,
	}))
	defer rows.Close()
	var candidates []Reservation
	for rows.Next() {
		var have Reservation
		if err := rows.ScanDoc(&have); err == nil && have.Sequence == seq.Name {
			candidates = append(candidates, have)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("looking for free slots of %s: %w", seq.Name, err)
	}
	for _, have := range candidates {
		if have.State != SlotFree && !have.Expired(c.now()) {
			continue // a stale row
		}
		r := c.newReservation(seq, have.Slot, have.Ordinal, holder)
		ok, err := c.takeSlot(ctx, r, have.Rev)
		if err != nil {
			return nil, err
		}
		if ok {
			return r, nil
		}
	}
	return nil, nil
}

// takeSlot writes r over parent ("" creates it): true when r holds the
// slot, false when someone else does.
func (c *Client) takeSlot(ctx context.Context, r *Reservation, parent string) (bool, error) {
	r.Rev = parent
	rev, ok, err := c.casPut(ctx, r.ID, r, parent)
	if err != nil || !ok {
		r.Rev = ""
		return false, err
	}
	r.Rev = rev
	return true, nil
}

// casPut writes doc over parent with w = a majority: false on a conflict,
// or on a cluster when a write stored on fewer than a majority of the
// copies is contested (HeldWriteStands). One that cannot be shown to stand
// either way is an error (errUnconfirmed): counted as lost, a reservation
// would move on to the next slot, and reserve that one the same way, and
// the next.
func (c *Client) casPut(ctx context.Context, id string, doc any, parent string) (rev string, ok bool, err error) {
	tctx, trace := c.traced(ctx)
	rev, err = c.db.Put(tctx, id, doc, c.writeOpts()...)
	switch {
	case isStatus(err, http.StatusConflict):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("writing %s: %w", id, err)
	case trace.uncommitted(id, rev):
		stands, err := c.writeStands(ctx, id, parent, rev)
		if err != nil {
			return "", false, fmt.Errorf("reading %s back: %w", id, err)
		}
		return rev, stands, nil
	}
	return rev, true, nil
}

func (c *Client) readMarker(ctx context.Context, seq string) (*sequenceMarker, error) {
	var m sequenceMarker
	err := c.db.Get(ctx, SequenceID(seq), c.readOpts()...).ScanDoc(&m)
	switch {
	case kivik.HTTPStatus(err) == http.StatusNotFound:
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading the marker of sequence %s: %w", seq, err)
	}
	return &m, nil
}

// ReleaseSlot marks a reserved slot used (the job that took it succeeded) and
// moves the sequence's marker to it unless the marker is already further:
// releases arriving out of order never move it back. A release that failed
// may be tried again with the same r: a slot it already marked used (the
// server's answer lost, or the marker's write failed) is taken as done.
func (c *Client) ReleaseSlot(ctx context.Context, r *Reservation) error {
	return c.finishReservation(ctx, r, true)
}

// AbandonSlot frees a reserved slot (the job that took it failed): the next
// Reserve takes it, and the marker does not move.
func (c *Client) AbandonSlot(ctx context.Context, r *Reservation) error {
	return c.finishReservation(ctx, r, false)
}

func (c *Client) finishReservation(ctx context.Context, r *Reservation, used bool) error {
	what := "abandoning"
	if used {
		what = "releasing"
	}
	if used && r.State == SlotUsed && r.Rev != "" {
		// Released already, by this call's earlier try, whose move of
		// the marker failed: move it now.
		return c.advanceMarker(ctx, r)
	}
	if r.State != SlotReserved {
		return fmt.Errorf("%s slot %s of %s: %w: it is %s", what, r.Slot, r.Sequence, ErrReservationLost, r.State)
	}
	next := *r
	next.ExpiresAt = 0
	if used {
		next.State, next.UsedAt = SlotUsed, ToUnix(c.now())
	} else {
		next.State, next.Holder = SlotFree, ""
	}
	rev, ok, err := c.casPut(ctx, r.ID, &next, r.Rev)
	if err != nil {
		return fmt.Errorf("%s slot %s of %s: %w", what, r.Slot, r.Sequence, err)
	}
	if !ok && used {
		// A release tried again after an answer that never came may find
		// its own write stored: the slot used, by this holder.
		var stored Reservation
		gerr := c.db.Get(ctx, r.ID, c.readOpts()...).ScanDoc(&stored)
		switch {
		case gerr != nil && !isStatus(gerr, http.StatusNotFound):
			// Not known to be lost: the caller may try again.
			return fmt.Errorf("%s slot %s of %s: a conflict, and reading the slot: %w", what, r.Slot, r.Sequence, gerr)
		case gerr == nil && stored.State == SlotUsed && stored.Holder == r.Holder && stored.Ordinal == r.Ordinal:
			ok, rev, next = true, stored.Rev, stored
		}
	}
	if !ok {
		return fmt.Errorf("%s slot %s of %s: %w: its TTL ran out and someone took it", what, r.Slot, r.Sequence, ErrReservationLost)
	}
	next.Rev = rev
	*r = next
	if used {
		return c.advanceMarker(ctx, r)
	}
	return nil
}

// markerRounds bounds the marker's compare-and-set loop.
const markerRounds = 20

// advanceMarker moves the sequence's marker to r's slot unless it is
// already at or past it.
func (c *Client) advanceMarker(ctx context.Context, r *Reservation) error {
	for range markerRounds {
		m, err := c.readMarker(ctx, r.Sequence)
		if err != nil {
			return err
		}
		if m != nil && m.Ordinal >= r.Ordinal {
			return nil
		}
		next := sequenceMarker{ID: SequenceID(r.Sequence), Type: SequenceDocType, Sequence: r.Sequence, LastUsed: r.Slot, Ordinal: r.Ordinal}
		parent := ""
		if m != nil {
			next.Rev, parent = m.Rev, m.Rev
		}
		if _, ok, err := c.casPut(ctx, next.ID, &next, parent); err != nil || ok {
			return err
		}
	}
	return fmt.Errorf("moving the marker of sequence %s: still contested after %d rounds", r.Sequence, markerRounds)
}

// Reservations lists a sequence's slot documents, for couchq slots ls: at
// most limit, the first in id order, sorted in the sequence's order.
func (c *Client) Reservations(ctx context.Context, seq string, limit int) ([]Reservation, error) {
	prefix := SlotReservationID(seq, "")
	rows := c.db.AllDocs(ctx, kivik.Params(map[string]any{
		"startkey": prefix, "endkey": prefix + "\ufff0", "include_docs": true, "limit": limit,
	}))
	defer rows.Close()
	var out []Reservation
	for rows.Next() {
		var r Reservation
		if err := rows.ScanDoc(&r); err == nil && r.Type == SlotReservationDocType {
			out = append(out, r)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing the slots of %s: %w", seq, err)
	}
	// In the sequence's order, not the ids' (slot 10 before slot 2).
	slices.SortStableFunc(out, func(a, b Reservation) int { return cmp.Compare(a.Ordinal, b.Ordinal) })
	return out, nil
}

// LastUsed is the sequence's marker: its last used slot ("" for none).
func (c *Client) LastUsed(ctx context.Context, seq string) (string, error) {
	m, err := c.readMarker(ctx, seq)
	if err != nil || m == nil {
		return "", err
	}
	return m.LastUsed, nil
}

// GetReservation reads the reservation of one slot (ErrNotFound when the
// slot was never taken).
func (c *Client) GetReservation(ctx context.Context, seq, slot string) (*Reservation, error) {
	var r Reservation
	err := c.db.Get(ctx, SlotReservationID(seq, slot), c.readOpts()...).ScanDoc(&r)
	switch {
	case kivik.HTTPStatus(err) == http.StatusNotFound:
		return nil, &describedError{fmt.Sprintf("slot %s of %s: never reserved", slot, seq), ErrNotFound}
	case err != nil:
		return nil, fmt.Errorf("reading slot %s of %s: %w", slot, seq, err)
	case r.Type != SlotReservationDocType:
		return nil, fmt.Errorf("slot %s of %s: the document is a %q, not a reservation", slot, seq, r.Type)
	}
	return &r, nil
}
