package couchq

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Claims that will not run give their job back at once instead of holding
// it for a whole lease.
//
// On a cluster with a node down two claimants of one revision, writing
// through different nodes, are each stored on one of the two live copies:
// both answered 202, neither is committed, neither runs (see the cluster
// protocol). Before these releases such a job waited for the claims'
// leases to run out and the sweeper, then often raced the same way again:
// the cluster tier saw jobs wait 15 s leases two and three times over with
// node 3 of 3 stopped (120 jobs in 18–48 s instead of 6). Likewise a
// committed claim that backs off because of another branch held its lease
// though it ran nothing, and as the deepest leaf it hid the job from the
// due view until then.
//
// Releasing is always safe: it writes over the claimant's own revision a
// queued copy of the job as it was before the claim, so it never runs
// anything, and whoever claims the released branch confirms against every
// other leaf as any claimant does (a committed claim on another branch,
// which a majority read cannot miss, makes it back off).

// MinorityClaim is a claim CouchDB stored on fewer than a majority of a
// cluster's copies (answered 202): it is not committed and never runs.
// ClaimMany reports one for each such claim (ClaimResult.Minority); the
// claimant hands it to ReleaseMinorityClaim a moment later.
type MinorityClaim struct {
	// Claim is the claim as stored: its Rev is the claim's revision.
	Claim *WorkItem
	// Parent is the job as the claimant read it, before the claim.
	Parent *WorkItem
}

// ReleaseMinorityClaim gives back a job held only by a claim that reached
// a minority of the copies. When the claim still stands as a leaf, it
// writes the job as it was before the claim over it (queued, due as
// before, the attempt not charged, a claim-withdrawn entry in the history)
// and settles the job when no leaf holds a live lease. When another branch
// went on from a write over the same revision (a holder renewed or
// finished: it is running the job, or ran it), it withdraws the claim
// instead. It reports whether it released the claim: false when the claim
// is gone already (the claimant of a committed competing claim withdrew
// it, or a sweep wrote over it) or was withdrawn.
//
// Call it MinorityReleaseDelay after the claim, not at once: the claimant
// of a committed competing claim withdraws this one as it confirms when it
// sees it, and otherwise has written once more by then (see
// MinorityReleaseDelay). A release beside a claim that runs is safe — whoever
// claims it backs off — but until the job is settled CouchDB may show the
// queued release as the job's revision next to the finished one.
func (c *Client) ReleaseMinorityClaim(ctx context.Context, m *MinorityClaim) (bool, error) {
	id := m.Claim.ID
	leaves, err := c.Leaves(ctx, id)
	if err != nil {
		return false, fmt.Errorf("releasing a minority claim of %s: %w", id, err)
	}
	var mine *Leaf
	onward := false
	for i := range leaves {
		l := &leaves[i]
		switch {
		case l.Rev == m.Claim.Rev:
			if !l.Deleted {
				mine = l
			}
		case !l.Deleted && l.wentOnFrom(m.Parent.Rev):
			onward = true
		}
	}
	switch {
	case mine == nil:
		return false, nil
	case onward:
		// Withdrawing it cannot delete the job: the other branch stands.
		if err := c.withdraw(ctx, id, *mine, m.Claim.ClaimedBy); err != nil && !isStatus(err, http.StatusConflict) && !errors.Is(err, errNoMajority) {
			return false, fmt.Errorf("withdrawing a minority claim of %s: %w", id, err)
		}
		return false, nil
	}
	released, err := c.releaseUnrun(ctx, m.Claim, m.Parent, m.Parent.Date,
		"the claim reached fewer than a majority of the copies and no competing claim withdrew it; released without running")
	if err != nil || !released {
		return released, err
	}
	c.settleAfterRelease(ctx, id, m.Claim.ClaimedBy)
	return true, nil
}

// wentOnFrom reports whether the leaf is two or more writes past rev: a
// write over rev (a claim) and another over that (a renewal, an outcome).
func (l *Leaf) wentOnFrom(rev string) bool {
	for _, r := range l.path[min(2, len(l.path)):] {
		if r == rev {
			return true
		}
	}
	return false
}

// releaseBackedOff gives back the job of a committed claim that must not
// run (the job is live or finished on another branch, or a stale branch
// could not be withdrawn, or its leaves could not be read): due when the
// latest live lease among the other leaves runs out, so that nobody claims
// it again while another claimant may be running it, and as before when
// none is live. leaves is nil when they could not be read.
func (c *Client) releaseBackedOff(ctx context.Context, claimed, parent *WorkItem, leaves []Leaf) {
	due := parent.Date
	now := ToUnix(c.now())
	for _, l := range leaves {
		if l.Rev != claimed.Rev && l.live(now) {
			due = max(due, l.LeaseUntil)
		}
	}
	why := "the claim was committed but the job is live or finished on another branch; released without running"
	if leaves == nil {
		why = "the claim was committed but could not be confirmed (the job's leaves could not be read); released without running"
	}
	released, err := c.releaseUnrun(ctx, claimed, parent, due, why)
	switch {
	case err != nil:
		c.log.Debug().Err(err).Str("job", claimed.ID).Msg("could not release a claim that backed off; its lease runs out instead")
	case released && leaves != nil:
		c.settleAfterRelease(ctx, claimed.ID, claimed.ClaimedBy)
	}
}

// releaseUnrun writes over claim (a claim that did not run) the job as it
// was before it, due at due. A 409 (someone wrote over the claim first) is
// not an error: it reports false.
func (c *Client) releaseUnrun(ctx context.Context, claim, parent *WorkItem, due float64, why string) (bool, error) {
	next := parent.Clone()
	next.Rev = claim.Rev
	next.Date = due
	c.record(next, EventClaimWithdrawn, claim.ClaimedBy, why)
	ctx, trace := c.traced(ctx)
	rev, err := c.db.Put(ctx, next.ID, next, c.claimOpts(false)...)
	switch {
	case isStatus(err, http.StatusConflict):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("releasing the claim %s of %s: %w", claim.Rev, claim.ID, err)
	}
	// Stored on a minority, the release still stands as a leaf beside
	// whatever the other copies hold: the claim no longer hides the job.
	c.log.Debug().Str("job", claim.ID).Str("rev", claim.Rev).Str("claimant", claim.ClaimedBy).
		Bool("majority", !trace.uncommitted(next.ID, rev)).Msg("released a claim that did not run")
	return true, nil
}

// settleAfterRelease settles the job when the release left it with
// several leaves and none holds a live lease (the last of two minority
// claimants to release it, say), so that it goes on as one branch.
func (c *Client) settleAfterRelease(ctx context.Context, id, by string) {
	if _, err := c.Settle(ctx, id, by); err != nil && !errors.Is(err, context.Canceled) {
		c.log.Debug().Err(err).Str("job", id).Msg("could not settle a job after releasing a claim; the sweeper will")
	}
}

// MinorityReleaseDelay is how long a claimant whose workers renew leases
// every heartbeat waits before releasing a claim that reached a minority
// of the copies (ReleaseMinorityClaim): a heartbeat and a quarter. By
// then the holder of a committed competing claim has withdrawn this one
// or written over its own claim at least once (a renewal, or the job's
// outcome), which ReleaseMinorityClaim sees; only claims that nobody runs
// are released. It is shorter than the lease (a third of it by default)
// that the job waited for before.
func MinorityReleaseDelay(heartbeat time.Duration) time.Duration {
	return max(heartbeat+heartbeat/4, 250*time.Millisecond)
}
