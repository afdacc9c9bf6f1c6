package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/go-kivik/kivik/v4/couchdb/chttp"
)

// HistoryTimeFormat is the ISO-8601 form of Event.At: UTC with
// milliseconds, which every JavaScript engine's Date.parse reads (the
// metrics views parse it).
const HistoryTimeFormat = "2006-01-02T15:04:05.000Z"

// maxErrorLen bounds stored error messages so a chatty failure cannot grow
// a document without limit.
const maxErrorLen = 4096

// queryParam is a kivik option that lands in the request's query string
// whatever the call (kivik's Param goes into the body for _bulk_docs).
type queryParam struct{ key, value string }

func (q queryParam) Apply(target any) {
	if o, ok := target.(*chttp.Options); ok {
		if o.Query == nil {
			o.Query = url.Values{}
		}
		o.Query.Set(q.key, q.value)
	}
}

func (q queryParam) String() string { return q.key + "=" + q.value }

// errLostRace marks a write CouchDB accepted whose revision did not win.
var errLostRace = errors.New("write accepted but another revision won")

// ClaimResult is the outcome of claiming one job with ClaimMany.
type ClaimResult struct {
	// Item is the claimed job (its Rev is the claim's revision) when Err is nil.
	Item *WorkItem
	// Err is ErrClaimConflict when another claimant won.
	Err error
	// Unrun is set with Err when the claim was stored but must not run (on
	// a cluster: it reached fewer than a majority of the copies, or the job
	// was live or finished on another branch). It holds the job until its
	// lease runs out unless the claimant gives it up with Concede.
	Unrun *UnrunClaim
}

// Claim claims one job read from the due view: the job's Rev must be the
// revision that was read. by names the claimant (host/pid/worker-id) and
// lease is how long the claim holds without renewal. On success it returns
// the claimed job; ErrClaimConflict means another claimant has it.
func (c *Client) Claim(ctx context.Context, item *WorkItem, by string, lease time.Duration) (*WorkItem, error) {
	return c.ClaimMany(ctx, []*WorkItem{item}, by, lease)[0].unpack()
}

func (r ClaimResult) unpack() (*WorkItem, error) { return r.Item, r.Err }

// ClaimMany claims several jobs in one _bulk_docs round trip; each wins or
// loses on its own. Results are in the order of items.
func (c *Client) ClaimMany(ctx context.Context, items []*WorkItem, by string, lease time.Duration) []ClaimResult {
	results, _ := c.ClaimManyBefore(ctx, items, by, lease, time.Time{})
	return results
}

// ClaimManyBefore is ClaimMany for claims that must be stamped (claimed_at)
// before deadline, such as claims that use a rate limit's start slots,
// which count in their window only. A caller that checked the clock first
// could still stamp them later, after a stall (the cluster tier once saw a
// window of a 5/s limit with 8 claims stamped in it). When the clock has
// reached deadline nothing is written and ok is false. A zero deadline
// never passes.
func (c *Client) ClaimManyBefore(ctx context.Context, items []*WorkItem, by string, lease time.Duration, deadline time.Time) (results []ClaimResult, ok bool) {
	now := c.now()
	if !deadline.IsZero() && !now.Before(deadline) {
		return nil, false
	}
	return c.claimMany(ctx, items, by, lease, now), true
}

func (c *Client) claimMany(ctx context.Context, items []*WorkItem, by string, lease time.Duration, now time.Time) []ClaimResult {
	results := make([]ClaimResult, len(items))
	docs := make([]any, 0, len(items))
	index := make([]int, 0, len(items))
	for i, it := range items {
		if it.Claimed || it.Status != StatusQueued {
			// The due view lags the document: someone got here first.
			results[i].Err = fmt.Errorf("claiming %s: %w (status %s)", it.ID, ErrClaimConflict, it.Status)
			continue
		}
		if err := c.owns(it); err != nil {
			// Another site's job (a takeover the view has not caught up
			// with), or a worker without a site in a database of sites.
			results[i].Err = err
			continue
		}
		next := c.claimed(it, by, lease, now)
		results[i].Item = next
		docs = append(docs, next)
		index = append(index, i)
	}
	if len(docs) == 0 {
		return results
	}
	wctx, trace := c.traced(ctx)
	began := time.Now()
	ids := make([]string, len(index))
	for k, i := range index {
		ids[k] = items[i].ID
	}
	aligned := c.writeClaims(wctx, ids, docs)
	wait := min(max(concedeWaitFactor*time.Since(began), concedeWaitMin), concedeWaitMax)
	c.claimAgain(ctx, items, index, docs, aligned, trace)
	// Claims that were stored but will not run are reported (Unrun).
	stored := make(map[int]*WorkItem, len(index))
	for k, i := range index {
		r := aligned[k]
		if r.Error == nil {
			results[i].Item.Rev = r.Rev
			stored[i] = results[i].Item
		}
		if r.Error == nil && trace.uncommitted(r.ID, r.Rev) {
			// Another claim of the same revision may hold the majority.
			// What was stored never runs: the committed claimant, if
			// any, withdraws it; else it is conceded, or swept.
			c.log.Debug().Str("job", r.ID).Str("rev", r.Rev).Msg("claim reached a minority of the copies; not running it")
			r.Error = errNoMajority
		}
		if r.Error != nil {
			results[i] = ClaimResult{Err: c.claimError(items[i].ID, r.Error)}
		}
	}
	if c.confirming() {
		c.confirmClaims(ctx, results, items, index)
	}
	for _, i := range index {
		err := results[i].Err
		if claim := stored[i]; claim != nil && (errors.Is(err, errNoMajority) || errors.Is(err, errBranchLive)) {
			results[i].Unrun = &UnrunClaim{claim: claim, parent: items[i], reason: concessionReason(err), Wait: wait}
		}
	}
	return results
}

// claimed is what claiming it stores: running, held by by until now +
// lease, its attempt charged.
func (c *Client) claimed(it *WorkItem, by string, lease time.Duration, now time.Time) *WorkItem {
	next := it.Clone()
	next.Claimed = true
	next.Status = StatusRunning
	next.ClaimedBy = by
	next.ClaimedAt = ToUnix(now)
	next.LeaseUntil = ToUnix(now.Add(lease))
	next.Attempts++
	if next.StartedAt == 0 {
		next.StartedAt = next.ClaimedAt
	}
	c.recordAt(next, now, EventClaimed, by, "")
	return next
}

// concessionReason says in a conceded claim's history why it did not run.
func concessionReason(err error) string {
	if errors.Is(err, errNoMajority) {
		return "the claim reached fewer than a majority of the copies (another claim of the same revision may hold the rest); it did not run"
	}
	return "the job was live or finished on another revision branch when the claim was confirmed; it did not run"
}

// claimOpts is the w of claims: always a majority, whatever
// Config.ReadYourWrites says, since a claim's 201 must mean exactly that.
func (c *Client) claimOpts(bulk bool) []kivik.Option {
	switch {
	case c.n <= 1:
		return nil
	case bulk:
		return []kivik.Option{queryParam{key: "w", value: fmt.Sprint(c.quorum())}}
	default:
		return []kivik.Option{kivik.Param("w", c.quorum())}
	}
}

func (c *Client) claimError(id string, err error) error {
	if isStatus(err, http.StatusConflict) || errors.Is(err, errLostRace) ||
		errors.Is(err, errNoMajority) || errors.Is(err, errBranchLive) {
		return fmt.Errorf("claiming %s: %w (%w)", id, ErrClaimConflict, err)
	}
	if isStatus(err, http.StatusRequestEntityTooLarge) {
		return fmt.Errorf("claiming %s: the job with its claim is larger than the server stores (CouchDB's max_document_size, 8 MB by default): "+
			"it cannot run until it is made smaller or the limit raised: %w", id, err)
	}
	return fmt.Errorf("claiming %s: %w", id, err)
}

// confirmClaims confirms committed claims (see confirmClaim): their
// leaves are read together (leavesMany), then each claim is judged on its
// own, concurrently, since a judgement may withdraw revisions.
func (c *Client) confirmClaims(ctx context.Context, results []ClaimResult, items []*WorkItem, index []int) {
	var ids []string
	for _, i := range index {
		if results[i].Err == nil {
			ids = append(ids, results[i].Item.ID)
		}
	}
	if len(ids) == 0 {
		return
	}
	leaves, err := c.leavesMany(ctx, ids)
	var wg sync.WaitGroup
	for _, i := range index {
		if results[i].Err != nil {
			continue
		}
		r, parent := &results[i], items[i].Rev
		id := r.Item.ID
		if err != nil {
			*r = ClaimResult{Err: fmt.Errorf("confirming claim of %s: %w", id, err)}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.judgeClaim(ctx, r.Item, parent, leaves[id])
			switch {
			case errors.Is(err, errBranchLive) || errors.Is(err, errLostRace):
				*r = ClaimResult{Err: c.claimError(id, err)}
			case err != nil:
				*r = ClaimResult{Err: fmt.Errorf("confirming claim of %s: %w", id, err)}
			}
		}()
	}
	wg.Wait()
}

// put writes next over the held revision (through the write batcher). On
// a cluster a write that reached fewer than a majority of the copies is
// read back: it is a lost claim when a sweep or an operator wrote over the
// same revision. On success next carries its new Rev.
func (c *Client) put(ctx context.Context, next *WorkItem) error {
	parent := next.Rev
	rev, err := c.write(ctx, next)
	if errors.Is(err, errNoMajority) {
		if err = c.settleHeldWrite(ctx, next.ID, parent, rev); err != nil {
			return err
		}
	}
	if err != nil {
		return err
	}
	next.Rev = rev
	return nil
}

// settleHeldWrite turns a holder's write answered 202 into success when it
// stands (see HeldWriteStands), and into ErrClaimLost otherwise.
func (c *Client) settleHeldWrite(ctx context.Context, id, parent, rev string) error {
	stands, err := c.HeldWriteStands(ctx, id, parent, rev)
	switch {
	case err != nil:
		return fmt.Errorf("%w (and reading it back: %w)", errNoMajority, err)
	case !stands:
		return fmt.Errorf("%w: %w", ErrClaimLost, errNoMajority)
	}
	c.log.Debug().Str("job", id).Str("rev", rev).Msg("write reached a minority of the copies, and nothing contests it")
	return nil
}

// transition applies change to a copy of a held job, writes it with the
// held revision and, on success, updates item in place. A 409 (or a lost
// confirmation) is ErrClaimLost: the job's stored state is left as it is.
func (c *Client) transition(ctx context.Context, what string, item *WorkItem, change func(next *WorkItem)) error {
	if !item.Claimed {
		// Every transition is a holder's. An item that is not claimed was
		// read without a claim (Get) or already finished through this very
		// item: writing over its revision would finish a job nobody ran, or
		// run a finished one again.
		return fmt.Errorf("%s %s: %w: it is %s and nobody holds it", what, item.ID, ErrNotHeld, item.Status)
	}
	next := item.Clone()
	change(next)
	if err := c.put(ctx, next); err != nil {
		return wrapLost(what, item.ID, err)
	}
	*item = *next
	return nil
}

// Complete marks a claimed job done with its result (any JSON, or nil).
func (c *Client) Complete(ctx context.Context, item *WorkItem, result json.RawMessage) error {
	if result != nil && !json.Valid(result) {
		return fmt.Errorf("completing %s: result is not valid JSON", item.ID)
	}
	return c.transition(ctx, "completing", item, func(next *WorkItem) {
		now := ToUnix(c.now())
		next.Status = StatusDone
		next.Result = nonNull(result)
		next.FinishedAt = now
		c.unclaim(next)
		c.record(next, "done", item.ClaimedBy, "")
	})
}

// FailOptions steer Fail.
type FailOptions struct {
	// RetryAfter is the delay before the next attempt while attempts remain.
	RetryAfter time.Duration
	// Final fails the job now whatever attempts remain.
	Final bool
}

// Fail records a failed attempt. While attempts remain (and opts.Final is
// not set) the job goes back to queued, due after opts.RetryAfter;
// otherwise it stays failed with its error.
func (c *Client) Fail(ctx context.Context, item *WorkItem, cause string, opts FailOptions) error {
	return c.transition(ctx, "failing", item, func(next *WorkItem) {
		now := c.now()
		// The attempts this failure is counted against, written down: a
		// reader's default need not be the worker's (--max-attempts).
		next.MaxAttempts = c.maxAttempts(next)
		next.LastError = truncate(cause)
		by := item.ClaimedBy
		c.unclaim(next)
		if opts.Final || next.Attempts >= c.maxAttempts(next) {
			next.Status = StatusFailed
			next.FinishedAt = ToUnix(now)
			c.record(next, "failed", by, cause)
			return
		}
		next.Status = StatusQueued
		next.Date = ToUnix(now.Add(opts.RetryAfter))
		c.record(next, "retry-scheduled", by, cause)
	})
}

// Snooze puts a claimed job back to queued, due after d, without charging
// the attempt it was running.
func (c *Client) Snooze(ctx context.Context, item *WorkItem, d time.Duration) error {
	return c.transition(ctx, "snoozing", item, func(next *WorkItem) {
		by := item.ClaimedBy
		c.unclaim(next)
		next.Status = StatusQueued
		next.Date = ToUnix(c.now().Add(d))
		next.Attempts = max(next.Attempts-1, 0)
		c.record(next, "snoozed", by, "")
	})
}

// Release gives a claimed job back to the queue, due now, without charging
// the attempt (graceful shutdown).
func (c *Client) Release(ctx context.Context, item *WorkItem, reason string) error {
	return c.transition(ctx, "releasing", item, func(next *WorkItem) {
		by := item.ClaimedBy
		c.unclaim(next)
		next.Status = StatusQueued
		// The entry names the attempt released; the job's attempts then
		// go back to what they were: a released attempt is not charged.
		c.record(next, EventReleased, by, reason)
		next.Attempts = max(next.Attempts-1, 0)
	})
}

// Cancel stops a claimed job for good.
func (c *Client) Cancel(ctx context.Context, item *WorkItem, reason string) error {
	return c.transition(ctx, "cancelling", item, func(next *WorkItem) {
		by := item.ClaimedBy
		c.unclaim(next)
		next.Status = StatusCancelled
		next.LastError = truncate(reason)
		next.FinishedAt = ToUnix(c.now())
		c.record(next, "cancelled", by, reason)
	})
}

// Extend renews a claim's lease to now + lease, which must be positive.
func (c *Client) Extend(ctx context.Context, item *WorkItem, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("extending lease of %s: %w: a lease must be positive, got %s", item.ID, ErrInvalidJob, lease)
	}
	return c.ExtendWithProgress(ctx, item, lease, nil)
}

// ExtendWithProgress renews a claim's lease to now + lease (lease 0 leaves
// it as it is) and, when p is not nil, stores p as the job's progress, in
// one write: a worker's progress rides on its lease renewals. A 409 is
// ErrClaimLost, as for Extend.
func (c *Client) ExtendWithProgress(ctx context.Context, item *WorkItem, lease time.Duration, p *Progress) error {
	what := "extending lease of"
	if p != nil {
		what = "reporting progress of"
	}
	return c.transition(ctx, what, item, func(next *WorkItem) {
		if lease > 0 {
			next.LeaseUntil = ToUnix(c.now().Add(lease))
		}
		if p != nil {
			next.Progress = p
		}
	})
}

// ReportProgress stores how far a held job got (see NewProgress), stamped
// now, without touching its lease: what an agent reports.
func (c *Client) ReportProgress(ctx context.Context, item *WorkItem, done, total int, note string) error {
	p, err := NewProgress(done, total, note, c.now())
	if err != nil {
		return err
	}
	return c.ExtendWithProgress(ctx, item, 0, p)
}

func (c *Client) unclaim(next *WorkItem) {
	next.Claimed = false
	next.ClaimedBy = ""
	next.ClaimedAt = 0
	next.LeaseUntil = 0
}

func (c *Client) maxAttempts(it *WorkItem) int {
	if it.MaxAttempts > 0 {
		return it.MaxAttempts
	}
	return c.cfg.MaxAttempts
}

// MaxAttempts is the number of attempts the job gets.
func (c *Client) MaxAttempts(it *WorkItem) int { return c.maxAttempts(it) }

// record appends to the job's activity log, keeping it bounded: the oldest
// entries are dropped but the first "enqueued" stays, so a job's age is
// never lost.
func (c *Client) record(it *WorkItem, event, by, errMsg string) {
	c.recordAt(it, c.now(), event, by, errMsg)
}

// recordAt is record with the event's time given: a claim's event carries
// its claimed_at, so that the history shows the window a rate limit
// counted it in.
func (c *Client) recordAt(it *WorkItem, at time.Time, event, by, errMsg string) {
	it.History = append(it.History, Event{
		At: at.UTC().Format(HistoryTimeFormat), Event: event, By: by,
		Attempt: it.Attempts, Error: truncate(errMsg),
	})
	limit := c.cfg.HistoryLimit
	if len(it.History) <= limit {
		return
	}
	keepFirst := it.History[0].Event == "enqueued"
	tail := it.History[len(it.History)-limit:]
	if keepFirst {
		tail = it.History[len(it.History)-(limit-1):]
		it.History = append([]Event{it.History[0]}, tail...)
		return
	}
	it.History = append([]Event(nil), tail...)
}

func truncate(s string) string {
	if len(s) <= maxErrorLen {
		return s
	}
	return strings.ToValidUTF8(s[:maxErrorLen-3], "") + "..."
}

// DeleteFinished deletes a claimed job that finished, for job types that
// keep no record of done work. A 409 is ErrClaimLost, as for Complete. The
// tombstone keeps the job's type, worker and status, so that a stale
// branch of the job on a cluster is seen to come after its end.
func (c *Client) DeleteFinished(ctx context.Context, item *WorkItem) error {
	tomb := map[string]any{
		"_id": item.ID, "_rev": item.Rev, "_deleted": true, "type": "WorkItem",
		"worker": item.Worker, "status": StatusDone, "finished_at": ToUnix(c.now()),
	}
	wctx, trace := c.traced(ctx)
	rev, err := c.db.Put(wctx, item.ID, tomb, c.writeOpts()...)
	if err == nil && trace.uncommitted(item.ID, rev) {
		err = c.settleHeldWrite(ctx, item.ID, item.Rev, rev)
	}
	if err != nil {
		return wrapLost("deleting finished job", item.ID, err)
	}
	item.Rev = rev
	item.Status = StatusDone
	item.Claimed = false
	return nil
}

// writeClaims writes docs (the documents of ids) with the w of claims, in
// a plain PUT for one (cheaper for the server than a one-document batch)
// or one _bulk_docs for more, and returns a result for each id, in order.
func (c *Client) writeClaims(ctx context.Context, ids []string, docs []any) []kivik.BulkResult {
	if len(docs) == 1 {
		rev, err := c.db.Put(ctx, ids[0], docs[0], c.claimOpts(false)...)
		return []kivik.BulkResult{{ID: ids[0], Rev: rev, Error: err}}
	}
	bulk, err := c.db.BulkDocs(ctx, docs, c.claimOpts(true)...)
	if isStatus(err, http.StatusRequestEntityTooLarge) {
		// One claim made the request too large (a job within a claim's few
		// hundred bytes of the server's max_document_size): claimed one by
		// one, only that one fails, not every job of the round beside it.
		out := make([]kivik.BulkResult, len(docs))
		for k := range docs {
			rev, err := c.db.Put(ctx, ids[k], docs[k], c.claimOpts(false)...)
			out[k] = kivik.BulkResult{ID: ids[k], Rev: rev, Error: err}
		}
		return out
	}
	return alignBulk(ids, bulk, err)
}

// alignBulk matches _bulk_docs results to the documents sent, by id. CouchDB
// answers in request order, but nothing in the protocol should depend on
// it (PouchDB Server, for one, reorders). Ids repeated in one request are
// matched in order. A document with no result gets an error.
func alignBulk(ids []string, results []kivik.BulkResult, reqErr error) []kivik.BulkResult {
	out := make([]kivik.BulkResult, len(ids))
	if reqErr != nil {
		for k := range out {
			out[k] = kivik.BulkResult{ID: ids[k], Error: reqErr}
		}
		return out
	}
	byID := make(map[string][]kivik.BulkResult, len(results))
	for _, r := range results {
		byID[r.ID] = append(byID[r.ID], r)
	}
	for k, id := range ids {
		if rs := byID[id]; len(rs) > 0 {
			out[k], byID[id] = rs[0], rs[1:]
			continue
		}
		out[k] = kivik.BulkResult{ID: id, Error: fmt.Errorf("server returned no result for document %s", id)}
	}
	return out
}
