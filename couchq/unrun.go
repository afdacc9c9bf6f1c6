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
// node 3 of 3 stopped (120 jobs in 19–48 s instead of 6). Likewise a
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
// and settles the job when no leaf holds a live lease. It reports whether
// it released the claim: false when the claim is gone already (the
// claimant of a committed competing claim withdrew it, or a sweep wrote
// over it).
//
// Call it a while after the claim, not at once: when a competing claim is
// committed, its claimant withdraws this one as it confirms, and a release
// racing that withdrawal would leave a queued branch beside the running
// one (safe, but another claimant would claim it and back off).
func (c *Client) ReleaseMinorityClaim(ctx context.Context, m *MinorityClaim) (bool, error) {
	id := m.Claim.ID
	leaves, err := c.Leaves(ctx, id)
	if err != nil {
		return false, fmt.Errorf("releasing a minority claim of %s: %w", id, err)
	}
	if !standsAsLeaf(leaves, m.Claim.Rev) {
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

// standsAsLeaf reports whether rev is a live (not deleted) leaf.
func standsAsLeaf(leaves []Leaf, rev string) bool {
	for _, l := range leaves {
		if l.Rev == rev {
			return !l.Deleted
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

// MinorityReleaseDelay is how long a claimant waits before releasing a
// claim that reached a minority of the copies (ReleaseMinorityClaim): long
// enough for the claimant of a committed competing claim to confirm and
// withdraw it (a few round trips), short against the lease it would
// otherwise hold the job for.
func MinorityReleaseDelay(lease time.Duration) time.Duration {
	return min(max(lease/10, 250*time.Millisecond), 3*time.Second)
}
