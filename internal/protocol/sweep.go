package protocol

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"time"

	"github.com/go-kivik/kivik/v4"
)

// SweepResult counts what one sweep did.
type SweepResult struct {
	// Requeued claims went back to queued for another attempt.
	Requeued int
	// Failed claims had used up their attempts and now stay failed.
	Failed int
	// Lost races: another sweeper, or the claimant itself, wrote first.
	Lost int
	// Malformed claimed documents that could not be quarantined (logged).
	Malformed int
	// Settled jobs had conflicting revisions (a cluster, or revisions
	// from another site) and were made whole; the sites document counts
	// as one when its branches were merged.
	Settled int
	// Requests counts the other sites' requests (a cancel, a retry) it
	// applied or refused for jobs this site owns.
	Requests int
	// UnknownSite counts jobs failed because the site they name is not
	// one of the queue's (the default site's sweeper fails them).
	UnknownSite int
	// Released counts waiting jobs whose dependencies had finished with
	// no one releasing them (released, or cancelled or failed per their
	// policy).
	Released int
}

// Sweep returns claims whose lease ran out before now to the queue: each
// goes back to queued (its attempt was charged when it was claimed) with a
// lease-expired entry naming the claimant presumed dead, or to failed when
// its attempts are used up. A claim its claimant conceded
// (EventClaimConceded) goes back to queued as it was, uncharged. It reads at most limit expired leases per call.
// Any number of sweepers may run at once: every write carries the _rev that
// was read, so a claim renewed or swept in between is left alone.
//
// It also settles up to limit jobs with stored conflicts (the conflicts
// view) once no lease on them is live: a cluster can store two writes of
// one revision, and a conflict between two finished branches has no
// expired claim to lead the sweeper to it.
func (c *Client) Sweep(ctx context.Context, by string, limit int) (SweepResult, error) {
	return c.SweepHolding(ctx, by, limit, nil)
}

// SweepHolding is Sweep by a worker that holds jobs itself: an expired
// claim for which holds(id, claimant) is true is left alone. A worker
// whose lease ran out while CouchDB was down still holds the job, and
// writes its outcome (or renews it) once CouchDB answers again: its own
// sweep must not return it to the queue as a dead claimant's first, which
// would run it again.
func (c *Client) SweepHolding(ctx context.Context, by string, limit int, holds func(id, claimant string) bool) (SweepResult, error) {
	if limit <= 0 {
		limit = 500
	}
	res, err := c.sweepLeases(ctx, by, limit, holds)
	if err != nil {
		return res, err
	}
	if err := c.settleConflicts(ctx, by, limit, &res); err != nil {
		return res, err
	}
	// The sites document's conflict is tried again next sweep when this
	// one cannot settle it (another site's merge came first, say): the
	// sweep's other work goes on.
	if settled, err := c.settleSites(ctx); err != nil {
		c.log.Warn().Err(err).Msg("settling the sites document; trying again next sweep")
	} else if settled {
		res.Settled++
	}
	if res.Requests, err = c.applyRequests(ctx, by); err != nil {
		return res, err
	}
	if res.UnknownSite, err = c.failUnknownSites(ctx, by); err != nil {
		return res, err
	}
	res.Released, err = c.SweepWaiting(ctx, by, limit)
	return res, err
}

// settleConflicts settles the jobs the conflicts view lists (see settle).
// A job it cannot read is logged and left for the next sweep.
func (c *Client) settleConflicts(ctx context.Context, by string, limit int, res *SweepResult) error {
	rows := c.view(ctx, "conflicts", kivik.Param("limit", limit))
	defer rows.Close()
	var ids []string
	for rows.Next() {
		id, err := rows.ID()
		if err != nil {
			return fmt.Errorf("listing conflicted jobs: %w", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("listing conflicted jobs: %w", err)
	}
	if len(ids) == 0 {
		return nil
	}
	all, err := c.leavesMany(ctx, ids) // one _bulk_get on Apache CouchDB
	if err != nil {
		c.log.Warn().Err(err).Int("jobs", len(ids)).Msg("cannot read the conflicted jobs' revisions; settling them next sweep")
		return nil
	}
	for _, id := range ids {
		if !c.ownsLeaves(all[id]) {
			continue // another site's job: its owner settles it
		}
		if n, _ := c.settle(ctx, id, all[id], by); n > 0 {
			res.Settled++
		}
	}
	return nil
}

// sweepLeases is Sweep's first half: expired and malformed claims.
func (c *Client) sweepLeases(ctx context.Context, by string, limit int, holds func(id, claimant string) bool) (SweepResult, error) {
	var res SweepResult
	now := c.now()
	// Malformed claims sort first (a lease that is not a number reads as
	// 0). Each round quarantines the ones on its page, which unclaims them;
	// a few rounds reach the real expired leases behind them.
	for range sweepRounds {
		rows := c.view(ctx, "leases", kivik.Params(map[string]any{
			"endkey":       ToUnix(now),
			"include_docs": true,
			"conflicts":    true, // a conflicted job is settled before it is requeued
			"limit":        limit,
		}))
		batch, err := c.scan(rows, "listing expired leases")
		if err != nil {
			return res, err
		}
		repaired := 0
		if !c.ownsUnsited() {
			batch.Malformed = nil // the default site's sweeper quarantines them
		}
		for _, err := range c.QuarantineMany(ctx, batch.Malformed, by) {
			if err != nil {
				res.Malformed++
				c.log.Warn().Err(err).Msg("cannot quarantine a malformed claim; it stays in the leases view")
				continue
			}
			repaired++
		}
		items := batch.Items
		if holds != nil {
			items = slices.DeleteFunc(slices.Clone(items), func(it *WorkItem) bool { return holds(it.ID, it.ClaimedBy) })
		}
		if err := c.sweepItems(ctx, by, now, items, &res); err != nil {
			return res, err
		}
		if len(batch.Items) > 0 || repaired == 0 || len(batch.Malformed) < limit {
			return res, nil
		}
	}
	return res, nil
}

// sweepRounds bounds how many pages of malformed claims one Sweep repairs
// before it returns.
const sweepRounds = 10

// sweepItems returns each expired claim of a page to the queue.
func (c *Client) sweepItems(ctx context.Context, by string, now time.Time, items []*WorkItem, res *SweepResult) error {
	var majority majorityCheck
	expired := func(it *WorkItem) bool { return it.Claimed && it.LeaseUntil <= ToUnix(now) }
	var all map[string][]Leaf
	// The expired claim may be one branch of a conflicted job (on a
	// cluster, between sites, or a revision replicated in by hand):
	// requeueing it would make a second live branch, and run again a job
	// that is done on another. A job is settled first and requeued once
	// whole. On a cluster every page's leaves are read (its copies may
	// not yet hold a conflict another copy has), elsewhere those of the
	// jobs CouchDB reports conflicted; together, in one _bulk_get on
	// Apache CouchDB.
	checked := func(it *WorkItem) bool { return c.confirming() || len(it.Conflicts) > 0 }
	var ids []string
	for _, it := range items {
		if expired(it) && c.owns(it) == nil && checked(it) {
			ids = append(ids, it.ID)
		}
	}
	if len(ids) > 0 {
		var err error
		if all, err = c.leavesMany(ctx, ids); err != nil {
			return err
		}
	}
	// Every worker's sweeper reads the same page in the same order; each
	// walks it in its own order, so that sweepers running at once return
	// different jobs rather than lose races for the same ones (each a
	// 409): with workers killed every 2 s, the expired claims of the dead
	// piled up faster than sweepers in step returned them.
	items = slices.Clone(items)
	rand.Shuffle(len(items), func(i, j int) { items[i], items[j] = items[j], items[i] })
	for _, it := range items {
		if !expired(it) {
			continue // renewed since the view was built
		}
		if c.owns(it) != nil {
			// Another site's job: its lease runs on that site's clock,
			// and only that site may return it to the queue.
			continue
		}
		if checked(it) {
			leaves := all[it.ID]
			if !whole(leaves, it.Rev) {
				if n, _ := c.settle(ctx, it.ID, leaves, by); n > 0 {
					res.Settled++
				}
				continue
			}
		}
		if it.Status.Terminal() {
			// Finished, yet claimed: written so by hand (couchq unclaims
			// every job it finishes). It ran; returning it to the queue
			// would run it again. Only the claim goes.
			err := c.transition(ctx, "clearing the claim of the finished job", it, func(next *WorkItem) {
				c.unclaim(next)
				c.record(next, EventClaimCleared, by, fmt.Sprintf("the job is %s: only its claim by %s was cleared", it.Status, cmp.Or(it.ClaimedBy, "no one")))
			})
			switch {
			case errors.Is(err, ErrClaimLost):
				res.Lost++
			case err != nil:
				return err
			}
			continue
		}
		if it.Conceded() {
			// The claimant gave the claim up without running it: the job
			// goes back as it was (the concession restored its attempts),
			// and its history already says why. Not from a node cut off
			// from the majority, though: there every claim is conceded,
			// and requeueing them would only make them claimed and
			// conceded again, over and over, until the partition heals.
			if !majority.ok(ctx, c) {
				continue
			}
			err := c.transition(ctx, "requeueing the conceded claim of", it, func(next *WorkItem) {
				c.unclaim(next)
				next.Status = StatusQueued
			})
			switch {
			case errors.Is(err, ErrClaimLost):
				res.Lost++
			case err != nil:
				return err
			default:
				res.Requeued++
				c.log.Debug().Str("job", it.ID).Msg("requeued a conceded claim")
			}
			continue
		}
		dead := it.ClaimedBy
		cause := fmt.Sprintf("lease expired at %s; claimant %s presumed dead",
			FromUnix(it.LeaseUntil).Format("2006-01-02T15:04:05.000Z07:00"), cmp.Or(dead, "(unnamed)"))
		err := c.transition(ctx, "sweeping", it, func(next *WorkItem) {
			c.unclaim(next)
			next.LastError = truncate(cause)
			c.record(next, EventLeaseExpired, by, cause)
			if next.Attempts >= c.maxAttempts(next) {
				next.Status = StatusFailed
				next.FinishedAt = ToUnix(now)
				// Failed for good, as a handler's last failed attempt is:
				// the counters and stats count failed entries.
				c.record(next, EventFailed, by, cause+"; no attempts left")
			} else {
				next.Status = StatusQueued
			}
		})
		switch {
		case errors.Is(err, ErrClaimLost):
			res.Lost++
		case err != nil:
			return err
		case it.Status == StatusFailed:
			res.Failed++
			c.log.Warn().Str("job", it.ID).Str("claimant", dead).Msg("lease expired with no attempts left; job failed")
		default:
			res.Requeued++
			c.log.Info().Str("job", it.ID).Str("claimant", dead).Msg("lease expired; job requeued")
		}
	}
	return nil
}

// majorityCheck asks once, when first needed, whether the node answering
// reaches a majority of the cluster. Off a cluster it always does; a user
// who may not read the membership is taken to reach it, so that conceded
// claims are still requeued.
type majorityCheck struct {
	asked, reached bool
}

func (m *majorityCheck) ok(ctx context.Context, c *Client) bool {
	if c.n <= 1 {
		return true
	}
	if !m.asked {
		m.asked = true
		ok, err := c.coordinatorInMajority(ctx)
		s := kivik.HTTPStatus(err)
		m.reached = ok || s == http.StatusUnauthorized || s == http.StatusForbidden
		if !m.reached {
			c.log.Debug().Err(err).Msg("this node cannot show it reaches a majority of the cluster; conceded claims stay until it does")
		}
	}
	return m.reached
}
