package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/go-kivik/kivik/v4"
)

// RunSlot is one of the K slots of a fleet-wide concurrency limit (at most
// K jobs of a type running at once across every worker process): the
// document "runslot:<type>:<k>", held by one claimant with a lease like a
// claim's. A holder that dies leaves it to run out.
type RunSlot struct {
	ID         string  `json:"_id"`
	Rev        string  `json:"_rev,omitempty"`
	Type       string  `json:"type"`
	Worker     string  `json:"worker"`
	Holder     string  `json:"holder,omitempty"`
	Job        string  `json:"job,omitempty"`
	LeaseUntil float64 `json:"lease_until"`
}

// RunSlotDocType is the type of a concurrency limit's slot documents.
const RunSlotDocType = "RunSlot"

// RunSlotID is the id of slot k of a type's fleet-wide concurrency limit.
func RunSlotID(worker string, k int) string { return "runslot:" + worker + ":" + strconv.Itoa(k) }

// AcquireRunSlots takes up to want of the limit free run slots of type
// worker (never held, released, or with their lease run out) for holder,
// with a lease. One read and one _bulk_docs write; on a cluster only the
// slots a majority of the copies took and that no other leaf holds count
// (confirmSlots).
func (c *Client) AcquireRunSlots(ctx context.Context, worker string, limit, want int, holder string, lease time.Duration) ([]*RunSlot, error) {
	if want <= 0 {
		return nil, nil
	}
	now := ToUnix(c.now())
	keys := make([]string, limit)
	for k := range keys {
		keys[k] = RunSlotID(worker, k)
	}
	rows := c.db.AllDocs(ctx, kivik.Params(map[string]any{"keys": keys, "include_docs": true}))
	seen := map[string]bool{}
	var free []*RunSlot
	for rows.Next() {
		id, _ := rows.ID()
		var s RunSlot
		if err := rows.ScanDoc(&s); err != nil || s.Type != RunSlotDocType {
			continue
		}
		seen[id] = true
		if s.Holder == "" || s.LeaseUntil < now {
			free = append(free, &RunSlot{ID: id, Rev: s.Rev})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the run slots of %s: %w", worker, err)
	}
	for _, id := range keys {
		if !seen[id] {
			free = append(free, &RunSlot{ID: id})
		}
	}
	spreadSlots(free, limit, holder, func(d any) string { return d.(*RunSlot).ID })
	free = free[:min(want, len(free))]
	if len(free) == 0 {
		return nil, nil
	}
	docs := make([]any, len(free))
	for i, s := range free {
		s.Type, s.Worker, s.Holder, s.LeaseUntil = RunSlotDocType, worker, holder, now+lease.Seconds()
		docs[i] = s
	}
	tctx, trace := c.traced(ctx)
	res, err := c.db.BulkDocs(tctx, docs, c.claimOpts(true)...)
	if err != nil {
		return nil, fmt.Errorf("taking run slots of %s: %w", worker, err)
	}
	byID := map[string]*RunSlot{}
	for _, s := range free {
		byID[s.ID] = s
	}
	committed := c.committedSlots(ctx, res, trace)
	for id, rev := range committed {
		byID[id].Rev = rev
	}
	// Another leaf holds the slot when its lease has not run out.
	stands := c.confirmSlots(ctx, committed, func(doc json.RawMessage) bool {
		var s RunSlot
		return json.Unmarshal(doc, &s) == nil && s.Holder != "" && s.LeaseUntil >= now
	})
	var got []*RunSlot
	for _, s := range free {
		if stands[s.ID] {
			got = append(got, s)
		}
	}
	return got, nil
}

// ErrRunSlotLost is a run slot's renewal that found the slot taken by
// another holder (its lease ran out while the holder could not renew it).
var ErrRunSlotLost = errors.New("run slot taken by another holder")

// RenewRunSlot extends a held slot's lease (for job, when it runs one).
// ErrRunSlotLost when another holder has taken it.
func (c *Client) RenewRunSlot(ctx context.Context, s *RunSlot, job string, lease time.Duration) error {
	next := *s
	next.Job, next.LeaseUntil = job, ToUnix(c.now())+lease.Seconds()
	rev, err := c.db.Put(ctx, next.ID, &next, c.writeOpts()...)
	if isStatus(err, http.StatusConflict) {
		var stored RunSlot
		if gerr := c.db.Get(ctx, s.ID, c.readOpts()...).ScanDoc(&stored); gerr != nil {
			return fmt.Errorf("renewing run slot %s: %w (and reading it: %w)", s.ID, err, gerr)
		}
		if stored.Holder != s.Holder || stored.Job != job {
			holder := stored.Holder
			if stored.Job != "" {
				holder += " for job " + stored.Job
			}
			return fmt.Errorf("renewing run slot %s: %w: %s holds it", s.ID, ErrRunSlotLost, holder)
		}
		// An earlier renewal of ours, applied although its answer was
		// lost: renew over it.
		next.Rev = stored.Rev
		rev, err = c.db.Put(ctx, next.ID, &next, c.writeOpts()...)
	}
	if err != nil {
		return fmt.Errorf("renewing run slot %s: %w", s.ID, err)
	}
	next.Rev = rev
	*s = next
	return nil
}

// ReleaseRunSlots gives held slots back at once. A slot that moved on (its
// lease ran out and another holder took it) is left alone.
func (c *Client) ReleaseRunSlots(ctx context.Context, slots []*RunSlot) error {
	if len(slots) == 0 {
		return nil
	}
	docs := make([]any, len(slots))
	for i, s := range slots {
		next := *s
		next.Holder, next.Job, next.LeaseUntil = "", "", 0
		docs[i] = &next
	}
	res, err := c.db.BulkDocs(ctx, docs, c.bulkOpts()...)
	if err != nil {
		return fmt.Errorf("releasing %d run slots: %w", len(slots), err)
	}
	for _, r := range res {
		if r.Error != nil && kivik.HTTPStatus(r.Error) != http.StatusConflict {
			return fmt.Errorf("releasing run slot %s: %w", r.ID, r.Error)
		}
	}
	return nil
}
