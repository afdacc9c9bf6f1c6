package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
)

// The cluster protocol's decisions, proven on one server: the revision
// trees a cluster makes (a claim stored on a minority of the copies, a
// branch that split off earlier, a job deleted on one branch) are built
// with new_edits=false, and the claimant's check and the sweeper's
// settling are run on them with Config.AlwaysConfirm. The cluster tier
// (cluster_test.go) proves the same against three nodes.

// conflictBundle is a testBundle with a clock, for leases that run out.
type conflictBundle struct {
	*testBundle
	clock *opstest.Clock
}

func setupConflict(t *testing.T) *conflictBundle {
	t.Helper()
	clk := opstest.NewClock(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC))
	return &conflictBundle{testBundle: setup(t, protocol.Config{AlwaysConfirm: true, Now: clk.Now}), clock: clk}
}

// child injects a revision of doc written over parent (as another copy of
// the shard would have stored it) and returns its rev.
func (cb *conflictBundle) child(t *testing.T, parent string, doc map[string]any) string {
	t.Helper()
	pos, hash, _ := strings.Cut(parent, "-")
	var n int
	fmt.Sscan(pos, &n)
	id := fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
	rev := fmt.Sprintf("%d-%s", n+1, id)
	doc["_rev"] = rev
	doc["_revisions"] = map[string]any{"start": n + 1, "ids": []string{id, hash}}
	cb.injectRevision(t, doc)
	return rev
}

// asDoc is a job as a plain document, for injected revisions.
func asDoc(t *testing.T, it *protocol.WorkItem) map[string]any {
	t.Helper()
	b, err := json.Marshal(it)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// claimDirectly writes a claim of it the way ClaimMany does, without the
// confirming read, and returns the claimed job.
func (cb *conflictBundle) claimDirectly(t *testing.T, it *protocol.WorkItem, by string) *protocol.WorkItem {
	t.Helper()
	next := it.Clone()
	next.Claimed, next.Status, next.ClaimedBy = true, protocol.StatusRunning, by
	next.LeaseUntil = protocol.ToUnix(cb.clock.Now().Add(time.Minute))
	next.Attempts++
	rev, err := cb.db.Put(cb.ctx, next.ID, next)
	if err != nil {
		t.Fatal(err)
	}
	next.Rev = rev
	return next
}

// doneBy enqueues a job of worker, and claims and completes it as by: the
// job as enqueued, and as completed.
func (cb *conflictBundle) doneBy(t *testing.T, worker, by string) (enqueued, done *protocol.WorkItem) {
	t.Helper()
	enqueued = cb.enqueued(t, worker)
	done = cb.claimDirectly(t, enqueued, by)
	if err := cb.client.Complete(cb.ctx, done, nil); err != nil {
		t.Fatal(err)
	}
	return enqueued, done
}

func (cb *conflictBundle) enqueued(t *testing.T, worker string) *protocol.WorkItem {
	t.Helper()
	job, err := cb.client.Enqueue(cb.ctx, protocol.NewJob{Worker: worker})
	if err != nil {
		t.Fatal(err)
	}
	it, err := cb.client.Get(cb.ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	return it
}

// branched makes a job edited on the majority (a claim goes there) and a
// stale copy's branch of its first revision holding other.
func (cb *conflictBundle) branched(t *testing.T, other map[string]any) (moved *protocol.WorkItem, otherRev string) {
	t.Helper()
	it := cb.enqueued(t, "branch")
	edited := asDoc(t, it)
	edited["note"] = "edited"
	if _, err := cb.db.Put(cb.ctx, it.ID, edited); err != nil {
		t.Fatal(err)
	}
	moved, err := cb.client.Get(cb.ctx, it.ID)
	if err != nil {
		t.Fatal(err)
	}
	doc := asDoc(t, it)
	for k, v := range other {
		doc[k] = v
	}
	return moved, cb.child(t, it.Rev, doc)
}

// A claim committed on a majority stands against another claim of the
// same revision (which reached only a minority, and never runs): whichever
// of the two CouchDB shows as the winner, the committed one keeps the job,
// the other is withdrawn, and the withdrawn claimant is in the history.
func TestCommittedClaimWithdrawsSiblingClaims(t *testing.T) {
	cb := setupConflict(t)
	for i := range 8 {
		it := cb.enqueued(t, "sib")
		a := cb.claimDirectly(t, it, "host-a/1/a")
		b := asDoc(t, it)
		b["claimed"], b["status"], b["claimed_by"], b["attempts"] = true, "running", "host-b/2/b", 1
		revB := cb.child(t, it.Rev, b)
		if len(liveLeaves(t, cb.ctx, cb.client, it.ID)) != 2 {
			t.Fatalf("job %d: the injected claim did not make a conflict", i)
		}
		if err := cb.client.ConfirmClaim(cb.ctx, a, it.Rev); err != nil {
			t.Fatalf("job %d: the committed claim did not stand (B's rev %s): %v", i, revB, err)
		}
		live := liveLeaves(t, cb.ctx, cb.client, it.ID)
		if len(live) != 1 || live[0].Rev != a.Rev {
			t.Fatalf("job %d: leaves after confirming %+v, want only %s", i, live, a.Rev)
		}
		// The holder's next write carries the withdrawn claim into the history.
		if err := cb.client.Complete(cb.ctx, a, nil); err != nil {
			t.Fatal(err)
		}
		stored, err := cb.client.Get(cb.ctx, it.ID)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, e := range stored.History {
			found = found || (e.Event == protocol.EventClaimWithdrawn && e.By == "host-b/2/b")
		}
		if !found || stored.Status != protocol.StatusDone {
			t.Fatalf("job %d: %s, history %+v", i, stored.Status, stored.History)
		}
	}
}

// A committed claim whose job has another branch that split off earlier:
// a branch nobody can be running (queued, or a claim whose lease ran out)
// is stale, withdrawn, and the claim runs; a branch with a live claim makes
// the claimant back off. Once that lease runs out the sweeper settles the
// job on the branch that went furthest, and the job runs once more.
func TestClaimOverAnotherBranch(t *testing.T) {
	cb := setupConflict(t)
	branches := func(other map[string]any) (*protocol.WorkItem, string) {
		t.Helper()
		return cb.branched(t, other)
	}

	// A stale queued branch: withdrawn, the claim stands.
	moved, staleRev := branches(map[string]any{"note": "stale branch"})
	a := cb.claimDirectly(t, moved, "host-a/1/a")
	if err := cb.client.ConfirmClaim(cb.ctx, a, moved.Rev); err != nil {
		t.Fatalf("claim over a stale queued branch (%s): %v", staleRev, err)
	}
	if live := liveLeaves(t, cb.ctx, cb.client, a.ID); len(live) != 1 || live[0].Rev != a.Rev {
		t.Fatalf("leaves after the claim: %+v, want only the claim", live)
	}
	if err := cb.client.Complete(cb.ctx, a, nil); err != nil {
		t.Fatal(err)
	}

	// A branch with a live claim of someone else: back off.
	moved, _ = branches(map[string]any{"claimed": true, "status": "running", "claimed_by": "host-b/2/b",
		"lease_until": protocol.ToUnix(cb.clock.Now().Add(30 * time.Second))})
	a = cb.claimDirectly(t, moved, "host-a/1/a")
	if err := cb.client.ConfirmClaim(cb.ctx, a, moved.Rev); !errors.Is(err, protocol.ErrClaimConflict) {
		t.Fatalf("claim over a job with a live claim on another branch: %v, want ErrClaimConflict", err)
	}
	// Two live leases: the sweeper waits for them.
	res, err := cb.client.Sweep(cb.ctx, "sweeper", 100)
	if err != nil || res.Settled != 0 || len(liveLeaves(t, cb.ctx, cb.client, a.ID)) != 2 {
		t.Fatalf("sweep with live leases: %+v %v, leaves %d", res, err, len(liveLeaves(t, cb.ctx, cb.client, a.ID)))
	}
	cb.clock.Add(2 * time.Minute)
	if settled, err := cb.client.Settle(cb.ctx, a.ID, "sweeper"); err != nil || !settled {
		t.Fatalf("settle after the leases ran out: %v %v", settled, err)
	}
	live := liveLeaves(t, cb.ctx, cb.client, a.ID)
	if len(live) != 1 {
		t.Fatalf("after settling: %+v, want one leaf", live)
	}
	// The withdrawn branch's claim shows in the history of the kept one.
	kept, err := cb.client.Get(cb.ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	loser := map[string]string{"host-a/1/a": "host-b/2/b", "host-b/2/b": "host-a/1/a"}[kept.ClaimedBy]
	traced := false
	for _, e := range kept.History {
		traced = traced || (e.Event == protocol.EventClaimWithdrawn && e.By == loser && strings.Contains(e.Error, "settled"))
	}
	if loser == "" || !traced {
		t.Fatalf("kept branch (claimed by %q) has no trace of the withdrawn claim of %q: %+v", kept.ClaimedBy, loser, kept.History)
	}
	// One expired claim is left: a sweep requeues it and the job runs.
	if res, err := cb.client.Sweep(cb.ctx, "sweeper", 100); err != nil || res.Requeued != 1 {
		t.Fatalf("sweep after settling: %+v %v", res, err)
	}
	batch, err := cb.client.Due(cb.ctx, "branch", 10)
	if err != nil || len(batch.Items) != 1 {
		t.Fatalf("due after settling: %v %+v", err, batch)
	}
	if _, err := cb.client.Claim(cb.ctx, batch.Items[0], "host-d/4/d", time.Minute); err != nil {
		t.Fatalf("claim after settling: %v", err)
	}
}

// A job deleted when it finished (delete-done) stays deleted: an expired
// claim on a stale branch is withdrawn by the sweeper, never requeued, and
// a claim made over a stale branch backs off.
func TestDeletedJobStaysDeletedOverAStaleBranch(t *testing.T) {
	cb := setupConflict(t)
	it := cb.enqueued(t, "gone")
	a := cb.claimDirectly(t, it, "host-a/1/a")
	if err := cb.client.DeleteFinished(cb.ctx, a); err != nil {
		t.Fatal(err)
	}
	// A stale copy's claim of the first revision, never run, lease ran out.
	b := asDoc(t, it)
	b["claimed"], b["status"], b["claimed_by"], b["attempts"] = true, "running", "host-b/2/b", 1
	b["lease_until"] = protocol.ToUnix(cb.clock.Now().Add(-time.Second))
	cb.child(t, it.Rev, b)
	if _, err := cb.client.Get(cb.ctx, it.ID); err != nil {
		t.Fatalf("the stale claim should show as the winner now: %v", err)
	}
	res, err := cb.client.Sweep(cb.ctx, "sweeper", 100)
	if err != nil {
		t.Fatal(err)
	}
	if res.Requeued != 0 || res.Settled != 1 {
		t.Fatalf("sweep: %+v, want the stale claim settled, nothing requeued", res)
	}
	if _, err := cb.client.Get(cb.ctx, it.ID); !errors.Is(err, protocol.ErrNotFound) {
		t.Fatalf("job after settling: %v, want not found", err)
	}

	// The same, caught by the claimant: a queued stale branch is claimed.
	it2 := cb.enqueued(t, "gone")
	a2 := cb.claimDirectly(t, it2, "host-a/1/a")
	if err := cb.client.DeleteFinished(cb.ctx, a2); err != nil {
		t.Fatal(err)
	}
	stale := asDoc(t, it2)
	stale["note"] = "stale"
	staleRev := cb.child(t, it2.Rev, stale)
	staleItem, err := cb.client.Get(cb.ctx, it2.ID)
	if err != nil || staleItem.Rev != staleRev {
		t.Fatalf("stale branch: %v %+v", err, staleItem)
	}
	if _, err := cb.client.Claim(cb.ctx, staleItem, "host-c/3/c", time.Minute); !errors.Is(err, protocol.ErrClaimConflict) {
		t.Fatalf("claim of a deleted job's stale branch: %v, want ErrClaimConflict", err)
	}
}

// Leaves reads every leaf, tombstones included, in CouchDB's order.
func TestLeavesListsEveryBranch(t *testing.T) {
	cb := setupConflict(t)
	it := cb.enqueued(t, "leaves")
	if leaves, err := cb.client.Leaves(cb.ctx, it.ID); err != nil || len(leaves) != 1 || leaves[0].Rev != it.Rev || leaves[0].Status != protocol.StatusQueued {
		t.Fatalf("one revision: %+v %v", leaves, err)
	}
	a := cb.claimDirectly(t, it, "host-a/1/a")
	b := asDoc(t, it)
	b["_deleted"] = true
	cb.child(t, it.Rev, b)
	leaves, err := cb.client.Leaves(cb.ctx, it.ID)
	if err != nil || len(leaves) != 2 {
		t.Fatalf("two leaves: %+v %v", leaves, err)
	}
	if leaves[0].Rev != a.Rev || !leaves[0].Claimed || leaves[0].ClaimedBy != "host-a/1/a" || leaves[0].Parent != it.Rev {
		t.Fatalf("first leaf: %+v", leaves[0])
	}
	if !leaves[1].Deleted || leaves[1].Withdrawn || leaves[1].Parent != it.Rev {
		t.Fatalf("second leaf: %+v", leaves[1])
	}
	if l, err := cb.client.Leaves(cb.ctx, "no-such-job"); err != nil || l != nil {
		t.Fatalf("missing job: %+v %v", l, err)
	}
}

// LeavesMany reads the leaves of several jobs at once (one _bulk_get on
// CouchDB) and finds what Leaves finds for each: every branch, tombstones,
// and nothing for a job that does not exist.
func TestLeavesManyReadsAsLeavesDoes(t *testing.T) {
	cb := setupConflict(t)
	plain := cb.enqueued(t, "leaves")
	conflicted, _ := cb.branched(t, map[string]any{"claimed": true, "status": "running", "claimed_by": "host-b/2/b"})
	deleted := cb.enqueued(t, "leaves")
	if _, err := cb.db.Delete(cb.ctx, deleted.ID, deleted.Rev); err != nil {
		t.Fatal(err)
	}
	ids := []string{plain.ID, conflicted.ID, deleted.ID, "job:no-such-job"}
	many, err := cb.client.LeavesMany(cb.ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		one, err := cb.client.Leaves(cb.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		got := many[id]
		if len(got) != len(one) {
			t.Fatalf("%s: %d leaves read together, %d alone: %+v vs %+v", id, len(got), len(one), got, one)
		}
		for k := range one {
			if got[k].Rev != one[k].Rev || got[k].Parent != one[k].Parent || got[k].Deleted != one[k].Deleted ||
				got[k].Status != one[k].Status || got[k].ClaimedBy != one[k].ClaimedBy {
				t.Fatalf("%s leaf %d: read together %+v, alone %+v", id, k, got[k], one[k])
			}
		}
	}
	if n := len(many[conflicted.ID]); n != 2 {
		t.Fatalf("the conflicted job has %d leaves, want 2", n)
	}
	if l := many[deleted.ID]; len(l) != 1 || !l[0].Deleted {
		t.Fatalf("the deleted job: %+v, want its tombstone", l)
	}
}

// ClaimMany reads a round's leaves together and judges each claim on its own:
// a plain job runs, a claim over a stale queued branch withdraws it and
// runs, and a claim over a branch with a live claim backs off.
func TestClaimManyJudgesEachBranch(t *testing.T) {
	cb := setupConflict(t)
	plain := cb.enqueued(t, "branch")
	stale, _ := cb.branched(t, map[string]any{"note": "stale branch"})
	held, _ := cb.branched(t, map[string]any{"claimed": true, "status": "running", "claimed_by": "host-b/2/b",
		"lease_until": protocol.ToUnix(cb.clock.Now().Add(30 * time.Second))})
	res := cb.client.ClaimMany(cb.ctx, []*protocol.WorkItem{plain, stale, held}, "host-a/1/a", time.Minute)
	for k, want := range []bool{true, true, false} {
		it, err := res[k].Item, res[k].Err
		if want && (err != nil || it == nil) {
			t.Fatalf("claim %d: %v, want it to stand", k, err)
		}
		if !want && !errors.Is(err, protocol.ErrClaimConflict) {
			t.Fatalf("claim %d: %v, want ErrClaimConflict", k, err)
		}
		if want {
			if live := liveLeaves(t, cb.ctx, cb.client, it.ID); len(live) != 1 || live[0].Rev != it.Rev {
				t.Fatalf("claim %d: live leaves %+v, want only the claim %s", k, live, it.Rev)
			}
		}
	}
	if live := liveLeaves(t, cb.ctx, cb.client, held.ID); len(live) != 2 {
		t.Fatalf("the job with a live claim elsewhere has %d live leaves, want both kept for the sweeper", len(live))
	}
	// The claim that backed off is reported unrun and conceded: its lease
	// ends at once and it charges no attempt; the other branch's live
	// claim still holds the job, so sweeps leave it alone until that lease
	// runs out.
	for k, r := range res {
		if (r.Unrun != nil) != (k == 2) {
			t.Fatalf("claim %d: unrun %+v", k, r.Unrun)
		}
	}
	if n := cb.client.Concede(cb.ctx, "host-a/1/a", []*protocol.UnrunClaim{res[2].Unrun}); n != 1 {
		t.Fatalf("conceded %d of 1", n)
	}
	var conceded *protocol.Leaf
	for _, l := range liveLeaves(t, cb.ctx, cb.client, held.ID) {
		if l.Item != nil && l.Item.Conceded() {
			conceded = &l
		}
	}
	if conceded == nil || conceded.Item.Attempts != held.Attempts || conceded.Item.LeaseUntil > protocol.ToUnix(cb.clock.Now()) {
		t.Fatalf("conceded leaf %+v: want the claim given up, its lease ended, attempts %d", conceded, held.Attempts)
	}
	// Its entry carries the job's attempts as they were, and says which
	// attempt the claim that did not run would have been.
	last := conceded.Item.History[len(conceded.Item.History)-1]
	if want := fmt.Sprintf("it did not run (the claim of attempt %d)", held.Attempts+1); last.Event != protocol.EventClaimConceded || !strings.HasSuffix(last.Error, want) {
		t.Fatalf("the conceded claim's entry %+v, want it to end %q", last, want)
	}
	if _, err := cb.client.Sweep(cb.ctx, "sweeper", 100); err != nil {
		t.Fatal(err)
	}
	if live := liveLeaves(t, cb.ctx, cb.client, held.ID); len(live) != 2 {
		t.Fatalf("a sweep while the other branch's lease is live left %d live leaves, want both", len(live))
	}
	// Once that lease ran out the job is settled on the branch that ran
	// (it keeps the attempt its claimant was charged), then requeued.
	cb.clock.Add(31 * time.Second)
	for range 2 {
		if _, err := cb.client.Sweep(cb.ctx, "sweeper", 100); err != nil {
			t.Fatal(err)
		}
	}
	live := liveLeaves(t, cb.ctx, cb.client, held.ID)
	if len(live) != 1 || live[0].Claimed || live[0].Status != protocol.StatusQueued || live[0].Item.Conceded() {
		t.Fatalf("after the other lease ran out: %+v, want one queued leaf", live)
	}
}

// concededDoc is a claim of parent by `by` that its claimant gave up, as
// ClaimMany writes it over the claim: the job as it was, still held, with
// a lease that ended when it was claimed.
func (cb *conflictBundle) concededDoc(t *testing.T, parent *protocol.WorkItem, by string) map[string]any {
	t.Helper()
	doc := asDoc(t, parent)
	now := protocol.ToUnix(cb.clock.Now())
	doc["claimed"], doc["status"], doc["claimed_by"], doc["claimed_at"], doc["lease_until"] = true, "running", by, now, now
	doc["history"] = append(doc["history"].([]any), map[string]any{
		"at": cb.clock.Now().UTC().Format(protocol.HistoryTimeFormat), "event": protocol.EventClaimConceded,
		"by": by, "attempt": parent.Attempts, "error": "reached a minority of the copies"})
	return doc
}

// Claims split between the copies (a node down: each claim on one live
// copy, neither committed) are conceded by their claimants. The sweeper
// does not wait for their leases: a job conceded on its only branch is
// requeued, and one conceded on two is settled and requeued in the same
// sweep, with no attempt charged and nothing counted as a run.
func TestSweepRequeuesConcededClaims(t *testing.T) {
	cb := setupConflict(t)

	whole := cb.enqueued(t, "conceded")
	a := cb.claimDirectly(t, whole, "host-a/1/a")
	cb.child(t, a.Rev, cb.concededDoc(t, whole, "host-a/1/a"))

	split := cb.enqueued(t, "conceded")
	a2 := cb.claimDirectly(t, split, "host-a/1/a")
	b := asDoc(t, split)
	b["claimed"], b["status"], b["claimed_by"], b["attempts"] = true, "running", "host-b/2/b", 1
	b["lease_until"] = protocol.ToUnix(cb.clock.Now().Add(time.Hour))
	revB := cb.child(t, split.Rev, b)
	cb.child(t, a2.Rev, cb.concededDoc(t, split, "host-a/1/a"))
	cb.child(t, revB, cb.concededDoc(t, split, "host-b/2/b"))
	if n := len(liveLeaves(t, cb.ctx, cb.client, split.ID)); n != 2 {
		t.Fatalf("the split job has %d live leaves, want 2", n)
	}

	res, err := cb.client.Sweep(cb.ctx, "sweeper", 100)
	if err != nil {
		t.Fatal(err)
	}
	if res.Requeued != 1 || res.Settled != 1 || res.Failed != 0 {
		t.Fatalf("sweep: %+v, want the whole job requeued and the split one settled", res)
	}
	for _, id := range []string{whole.ID, split.ID} {
		live := liveLeaves(t, cb.ctx, cb.client, id)
		if len(live) != 1 || live[0].Item == nil {
			t.Fatalf("job %s: live leaves %+v, want one", id, live)
		}
		it := live[0].Item
		if it.Claimed || it.Status != protocol.StatusQueued || it.Attempts != 0 || it.LastError != "" {
			t.Fatalf("job %s after the sweep: claimed %v, %s, attempts %d, last error %q; want queued, uncharged",
				id, it.Claimed, it.Status, it.Attempts, it.LastError)
		}
		for _, e := range it.History {
			if e.Event == protocol.EventClaimed || e.Event == protocol.EventLeaseExpired {
				t.Fatalf("job %s: history %+v counts a run that never happened", id, it.History)
			}
		}
	}
	// And it runs: claimable again from the due view.
	batch, err := cb.client.Due(cb.ctx, "conceded", 10)
	if err != nil {
		t.Fatal(err)
	}
	claimed := 0
	for _, r := range cb.client.ClaimMany(cb.ctx, batch.Items, "host-c/3/c", time.Minute) {
		if r.Err == nil {
			claimed++
		}
	}
	if claimed != 2 {
		t.Fatalf("claimed %d of the 2 requeued jobs", claimed)
	}
}

// A claim that could not withdraw a stale branch does not run: the
// withdrawal reached fewer than a majority of the copies, so it may land a
// moment later or never. Its claimant concedes, and the sweep that follows
// must keep the concession, not that branch: it kept the branch and
// withdrew the concession, and when the first withdrawal landed nothing of
// the job was left (TestClusterPeriodicOneJobPerTick missed a tick: two
// creations of the tick's job, one claimed, both leaves withdrawn). Here the
// stale branch is a second creation of the job, queued.
func TestSettleKeepsAConcessionOverTheBranchItsClaimWithdrew(t *testing.T) {
	cb := setupConflict(t)
	it := cb.enqueued(t, "dup")
	root := fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
	other := asDoc(t, it)
	other["_rev"], other["_revisions"] = "1-"+root, map[string]any{"start": 1, "ids": []string{root}}
	cb.injectRevision(t, other)
	a := cb.claimDirectly(t, it, "host-a/1/a")
	conceded := cb.child(t, a.Rev, cb.concededDoc(t, it, "host-a/1/a"))
	if n := len(liveLeaves(t, cb.ctx, cb.client, it.ID)); n != 2 {
		t.Fatalf("the job has %d live leaves, want 2", n)
	}
	if _, err := cb.client.Sweep(cb.ctx, "sweeper", 100); err != nil {
		t.Fatal(err)
	}
	leaves, err := cb.client.Leaves(cb.ctx, it.ID)
	if err != nil {
		t.Fatal(err)
	}
	kept := 0
	for _, l := range leaves {
		onOther := l.Rev == "1-"+root || l.Parent == "1-"+root
		switch {
		case onOther && !(l.Deleted && l.Withdrawn):
			t.Errorf("the other creation's branch was kept: %s over %s, %s", l.Rev, l.Parent, l.Status)
		case !l.Deleted && (l.Rev == conceded || l.Parent == conceded):
			kept++
			if l.Item == nil || l.Item.Claimed || l.Item.Status != protocol.StatusQueued || l.Item.Attempts != 0 {
				t.Errorf("the concession was kept but not requeued uncharged: %+v", l.Item)
			}
		}
	}
	if kept != 1 {
		for _, l := range leaves {
			t.Logf("leaf %s over %s: deleted %v, withdrawn %v, %s", l.Rev, l.Parent, l.Deleted, l.Withdrawn, l.Status)
		}
		t.Fatalf("want the concession's branch kept, requeued")
	}
}

// A committed claim treats a sibling claim its claimant already conceded
// as what it was, a claim of the same revision: it withdraws it and runs.
func TestCommittedClaimWithdrawsAConcededSibling(t *testing.T) {
	cb := setupConflict(t)
	it := cb.enqueued(t, "sib")
	a := cb.claimDirectly(t, it, "host-a/1/a")
	b := asDoc(t, it)
	b["claimed"], b["status"], b["claimed_by"], b["attempts"] = true, "running", "host-b/2/b", 1
	revB := cb.child(t, it.Rev, b)
	cb.child(t, revB, cb.concededDoc(t, it, "host-b/2/b"))
	if err := cb.client.ConfirmClaim(cb.ctx, a, it.Rev); err != nil {
		t.Fatalf("the committed claim did not stand beside a conceded sibling: %v", err)
	}
	if live := liveLeaves(t, cb.ctx, cb.client, it.ID); len(live) != 1 || live[0].Rev != a.Rev {
		t.Fatalf("leaves after confirming %+v, want only %s", live, a.Rev)
	}
	// As a sibling claim, not a stale branch: its claimant is named in the
	// history the holder writes next.
	if err := cb.client.Complete(cb.ctx, a, nil); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range a.History {
		found = found || (e.Event == protocol.EventClaimWithdrawn && e.By == "host-b/2/b")
	}
	if !found {
		t.Fatalf("the conceded sibling's claimant is not in the history: %+v", a.History)
	}
}

// A holder's write that reached only a minority of the copies (202) stands
// when nothing else continued from the held revision — slow copies answer
// 202 too — and is a lost claim when a sweep or an operator did.
func TestHeldWriteStandsUnlessContested(t *testing.T) {
	cb := setupConflict(t)
	it := cb.enqueued(t, "held")
	c := cb.claimDirectly(t, it, "host-a/1/a")
	renewed := c.Clone()
	renewed.LeaseUntil += 60
	d, err := cb.db.Put(cb.ctx, c.ID, renewed)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := cb.client.HeldWriteStands(cb.ctx, c.ID, c.Rev, d); err != nil || !ok {
		t.Fatalf("an uncontested write: stands %v, %v", ok, err)
	}
	// A sweep of the held revision, stored by other copies.
	swept := asDoc(t, c)
	swept["claimed"], swept["status"], swept["claimed_by"] = false, "queued", nil
	cb.child(t, c.Rev, swept)
	if ok, err := cb.client.HeldWriteStands(cb.ctx, c.ID, c.Rev, d); err != nil || ok {
		t.Fatalf("a write contested by a sweep: stands %v, %v", ok, err)
	}
	// A revision the write never produced does not stand.
	if ok, err := cb.client.HeldWriteStands(cb.ctx, c.ID, c.Rev, "9-00000000000000000000000000000000"); err != nil || ok {
		t.Fatalf("a revision that is not a leaf: stands %v, %v", ok, err)
	}
}

// A job finished on two branches (a partition's two sides each ran it) has
// no expired claim to lead the sweeper to it: the conflicts view does. The
// sweep keeps one branch, and the other's run shows in its history.
func TestSweepSettlesAJobFinishedOnTwoBranches(t *testing.T) {
	cb := setupConflict(t)
	it, _ := cb.doneBy(t, "twice", "host-a/1/a")
	other := asDoc(t, it)
	other["status"], other["attempts"], other["finished_at"] = "done", 1, protocol.ToUnix(cb.clock.Now())
	other["history"] = append(other["history"].([]any),
		map[string]any{"at": cb.clock.Now().Add(-time.Second).UTC().Format(protocol.HistoryTimeFormat), "event": "claimed", "by": "host-b/2/b", "attempt": 1},
		map[string]any{"at": cb.clock.Now().UTC().Format(protocol.HistoryTimeFormat), "event": "done", "by": "host-b/2/b", "attempt": 1})
	cb.child(t, it.Rev, other)

	rows := cb.db.Query(cb.ctx, designdocs.DocFor("conflicts"), "_view/conflicts", kivik.Param("key", "twice"))
	listed := 0
	for rows.Next() {
		id, _ := rows.ID()
		var v struct {
			Status    string   `json:"status"`
			Conflicts []string `json:"conflicts"`
		}
		if err := rows.ScanValue(&v); err != nil {
			t.Fatal(err)
		}
		if id != it.ID || v.Status != "done" || len(v.Conflicts) != 1 {
			t.Fatalf("conflicts view row %s: %+v", id, v)
		}
		listed++
	}
	if err := rows.Err(); err != nil || listed != 1 {
		t.Fatalf("conflicts view: %d rows (%v), want 1", listed, err)
	}

	h := cb.sweepSettlesDone(t, it.ID)
	var keptBy string
	done := 0
	for _, e := range h {
		if e.Event == protocol.EventDone {
			done++ // the withdrawn branch's events are listed, not copied
			keptBy = e.By
		}
	}
	otherBy := map[string]string{"host-a/1/a": "host-b/2/b", "host-b/2/b": "host-a/1/a"}[keptBy]
	traced := false
	for _, e := range h {
		traced = traced || (e.Event == protocol.EventClaimWithdrawn && e.By == otherBy && strings.Contains(e.Error, "done by "+otherBy))
	}
	if !traced || done != 1 {
		t.Fatalf("history of the kept branch: want one done and a claim-withdrawn entry listing %q's run: %+v", otherBy, h)
	}
	for i := 1; i < len(h); i++ {
		if h[i].At < h[i-1].At {
			t.Fatalf("history out of order at %d: %+v", i, h)
		}
	}
	if res, err := cb.client.Sweep(cb.ctx, "sweeper", 100); err != nil || res.Settled != 0 {
		t.Fatalf("second sweep: %+v %v, want nothing left to settle", res, err)
	}
}

// A job finished on one branch while a claim conceded on another is still
// CouchDB's winner (the two claims went through different nodes; the
// sweeper has not settled it yet) reads as finished: Get reads a stored
// conflict as the sweeper will settle it, not as CouchDB's winner.
func TestGetReadsAConflictAsItWillBeSettled(t *testing.T) {
	cb := setupConflict(t)
	it, a := cb.doneBy(t, "settle-read", "host-a/1/a")
	b := asDoc(t, it)
	b["claimed"], b["status"], b["claimed_by"], b["attempts"] = true, "running", "host-b/2/b", 1
	revB := cb.child(t, it.Rev, b)
	// Grown to the done branch's length, the concession is CouchDB's winner
	// when its revision id sorts higher: make it so.
	pos, parentHash, _ := strings.Cut(revB, "-")
	if pos != "2" || !strings.HasPrefix(a.Rev, "3-") {
		t.Fatalf("claim branch %s, done branch %s: want generations 2 and 3", revB, a.Rev)
	}
	var hash string
	for hash == "" || "3-"+hash <= a.Rev {
		hash = fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
	}
	conceded := "3-" + hash
	doc := cb.concededDoc(t, it, "host-b/2/b")
	doc["_rev"] = conceded
	doc["_revisions"] = map[string]any{"start": 3, "ids": []string{hash, parentHash}}
	cb.injectRevision(t, doc)
	winner := map[string]any{}
	if err := cb.db.Get(cb.ctx, it.ID).ScanDoc(&winner); err != nil {
		t.Fatal(err)
	}
	if winner["_rev"] != conceded {
		t.Fatalf("CouchDB's winner is %v, want the concession %s (the done branch is %s)", winner["_rev"], conceded, a.Rev)
	}
	got, err := cb.client.Get(cb.ctx, it.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != protocol.StatusDone || got.Claimed || got.Rev != a.Rev {
		t.Fatalf("Get read %s (claimed %v, rev %s), want the done branch %s", got.Status, got.Claimed, got.Rev, a.Rev)
	}
	if _, ok := got.Extra("_conflicts"); ok {
		t.Fatal("Get kept _conflicts in the job, which a write would send back")
	}
}

// A job done on one branch and cancelled on another written over the same
// claim (a cancel made through a copy that had not seen the outcome yet)
// reads and settles as done, though CouchDB picks the cancel: the handler
// ran to the end, and the cancel was made of a job already run.
func TestSettleKeepsDoneOverACancelOfTheSameClaim(t *testing.T) {
	cb := setupConflict(t)
	it := cb.enqueued(t, "done-or-cancelled")
	claimed := cb.claimDirectly(t, it, "host-a/1/a")
	done := claimed.Clone()
	if err := cb.client.Complete(cb.ctx, done, nil); err != nil {
		t.Fatal(err)
	}
	cancelled := claimed.Clone()
	cancelled.Claimed, cancelled.ClaimedBy, cancelled.ClaimedAt, cancelled.LeaseUntil = false, "", 0, 0
	cancelled.Status, cancelled.FinishedAt = protocol.StatusCancelled, protocol.ToUnix(cb.clock.Now())
	cancelled.History = append(cancelled.History, protocol.Event{
		At: cb.clock.Now().UTC().Format(protocol.HistoryTimeFormat), Event: protocol.EventCancelled, By: "ops"})
	doc := asDoc(t, cancelled)
	pos, claimHash, _ := strings.Cut(claimed.Rev, "-")
	if pos != "2" || !strings.HasPrefix(done.Rev, "3-") {
		t.Fatalf("claim %s, done %s: want generations 2 and 3", claimed.Rev, done.Rev)
	}
	var hash string
	for hash == "" || "3-"+hash <= done.Rev {
		hash = fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
	}
	doc["_rev"] = "3-" + hash
	doc["_revisions"] = map[string]any{"start": 3, "ids": []string{hash, claimHash}}
	cb.injectRevision(t, doc)
	winner := map[string]any{}
	if err := cb.db.Get(cb.ctx, it.ID).ScanDoc(&winner); err != nil {
		t.Fatal(err)
	}
	if winner["status"] != "cancelled" {
		t.Fatalf("CouchDB's winner is %v (%v), want the cancel", winner["_rev"], winner["status"])
	}
	if got, err := cb.client.Get(cb.ctx, it.ID); err != nil || got.Status != protocol.StatusDone || got.Rev != done.Rev {
		t.Fatalf("Get: %+v %v, want the done branch %s", got, err, done.Rev)
	}
	h := cb.sweepSettlesDone(t, it.ID)
	withdrawn := false
	for _, e := range h {
		withdrawn = withdrawn || (e.Event == protocol.EventClaimWithdrawn && strings.Contains(e.Error, "cancelled"))
	}
	if !withdrawn {
		t.Fatalf("the kept branch's history does not list the withdrawn cancel: %+v", h)
	}
}

// sweepSettlesDone sweeps, wanting the conflicted job id settled as done
// on one branch, and returns that branch's history.
func (cb *conflictBundle) sweepSettlesDone(t *testing.T, id string) []protocol.Event {
	t.Helper()
	res, err := cb.client.Sweep(cb.ctx, "sweeper", 100)
	if err != nil || res.Settled != 1 {
		t.Fatalf("sweep: %+v %v, want one job settled", res, err)
	}
	live := liveLeaves(t, cb.ctx, cb.client, id)
	if len(live) != 1 || live[0].Status != protocol.StatusDone {
		t.Fatalf("leaves after the sweep: %+v, want one done", live)
	}
	return live[0].Item.History
}

// A job done on one branch, while a stale copy of its claim on another
// (one renewal further, so CouchDB picks it) holds a lease that then runs
// out: on a single node too, the sweep settles the job, done, rather than
// requeue the stale claim and run the job again.
func TestSweepSettlesAnExpiredClaimBesideADoneBranch(t *testing.T) {
	tb := setup(t, protocol.Config{})
	job := mustEnqueue(t, tb, protocol.NewJob{Worker: "stale"})
	claimed, err := tb.client.Claim(tb.ctx, job, "host-a/1/a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	stale, claimRev := asDoc(t, claimed), claimed.Rev
	if err := tb.client.Complete(tb.ctx, claimed, nil); err != nil {
		t.Fatal(err)
	}
	// Two renewals of the claim, on a branch of their own.
	pos, hash, _ := strings.Cut(claimRev, "-")
	var n int
	fmt.Sscan(pos, &n)
	stale["_rev"] = fmt.Sprintf("%d-%032x", n+2, 2)
	stale["_revisions"] = map[string]any{"start": n + 2, "ids": []string{fmt.Sprintf("%032x", 2), fmt.Sprintf("%032x", 1), hash}}
	stale["lease_until"] = protocol.ToUnix(time.Now().Add(time.Second))
	tb.injectRevision(t, stale)
	if got := rawDocOf(t, tb, job.ID); got["status"] != "running" {
		t.Fatalf("CouchDB picks the %v branch, not the stale claim: the test proves nothing", got["status"])
	}
	time.Sleep(1500 * time.Millisecond)
	res, err := tb.client.Sweep(tb.ctx, "sweeper", 100)
	if err != nil {
		t.Fatal(err)
	}
	// Requeued first and settled after, the job would have been claimable
	// (and claimed by a worker the feed woke) in between.
	if res.Requeued != 0 || res.Settled != 1 {
		t.Fatalf("sweep: %+v, want the job settled and nothing requeued", res)
	}
	live := liveLeaves(t, tb.ctx, tb.client, job.ID)
	if len(live) != 1 || live[0].Status != protocol.StatusDone || live[0].Item.Attempts != 1 {
		t.Fatalf("leaves after the sweep: %d, the first %s, attempts %d; want the done one alone", len(live), live[0].Status, live[0].Item.Attempts)
	}
}

// rawDocOf reads a document of the bundle's database as CouchDB's winner.
func rawDocOf(t *testing.T, tb *testBundle, id string) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := tb.db.Get(tb.ctx, id).ScanDoc(&doc); err != nil {
		t.Fatal(err)
	}
	return doc
}
