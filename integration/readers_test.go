package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// A job finished on one branch while CouchDB's pick among its branches is
// a claim conceded on another (as after a partition of a cluster, or a
// link between sites, heals) reads as it will be settled — done — in every
// reader: Get, List, Counts, Stats and Queues; and a sweep settles it and
// says so.
func TestReadersShowAConflictedJobAsItWillBeSettled(t *testing.T) {
	cb := setupConflict(t)
	it, err := cb.client.Enqueue(cb.ctx, protocol.NewJob{Worker: "r"})
	if err != nil {
		t.Fatal(err)
	}
	claimed := cb.claimDirectly(t, it, "host/1/w1")
	if err := cb.client.Complete(cb.ctx, claimed, nil); err != nil {
		t.Fatal(err)
	}
	// The other branch, three revisions deep over the enqueued one, so
	// that it is CouchDB's pick: claimed by w2, who conceded it.
	other := it.Clone()
	other.Claimed, other.Status, other.ClaimedBy, other.Attempts = true, protocol.StatusRunning, "host/2/w2", 1
	other.LeaseUntil = protocol.ToUnix(cb.clock.Now().Add(-time.Minute))
	other.History = append(other.History,
		protocol.Event{At: cb.clock.Now().UTC().Format(protocol.HistoryTimeFormat), Event: protocol.EventClaimed, By: "host/2/w2", Attempt: 1},
		protocol.Event{At: cb.clock.Now().UTC().Format(protocol.HistoryTimeFormat), Event: protocol.EventClaimConceded, By: "host/2/w2", Attempt: 1})
	rev := it.Rev
	for range 3 {
		doc := asDoc(t, other)
		doc["_id"] = it.ID
		rev = cb.child(t, rev, doc)
	}
	var winner protocol.WorkItem
	if err := cb.db.Get(cb.ctx, it.ID).ScanDoc(&winner); err != nil || winner.Status != protocol.StatusRunning {
		t.Fatalf("the test needs the conceded claim to be CouchDB's pick: %+v %v", winner, err)
	}

	if got, err := cb.client.Get(cb.ctx, it.ID); err != nil || got.Status != protocol.StatusDone {
		t.Errorf("Get: %+v %v", got, err)
	}
	running, err := cb.client.List(cb.ctx, protocol.ListOptions{Worker: "r", Status: protocol.StatusRunning})
	if err != nil || len(running.Items) != 0 {
		t.Errorf("List running: %+v %v", running, err)
	}
	all, err := cb.client.List(cb.ctx, protocol.ListOptions{Worker: "r"})
	if err != nil || len(all.Items) != 1 || all.Items[0].Status != protocol.StatusDone {
		t.Errorf("List all: %+v %v", all, err)
	}
	counts, err := cb.client.Counts(cb.ctx)
	if err != nil || counts["r"][protocol.StatusDone] != 1 || counts["r"][protocol.StatusRunning] != 0 {
		t.Errorf("Counts: %v %v", counts, err)
	}
	stats, err := cb.client.Stats(cb.ctx, protocol.StatsOptions{Worker: "r"})
	if err != nil || len(stats.Types) != 1 || stats.Types[0].Queue.Done != 1 || stats.Types[0].Queue.Running != 0 {
		t.Errorf("Stats: %+v %v", stats, err)
	}
	queues, err := cb.client.Queues(cb.ctx)
	if err != nil || len(queues) != 1 || queues[0].Done != 1 || queues[0].Running != 0 {
		t.Errorf("Queues: %+v %v", queues, err)
	}
	res, err := cb.client.Sweep(cb.ctx, "test", 0)
	if err != nil || res.Settled != 1 {
		t.Errorf("Sweep: %+v %v", res, err)
	}
	if err := cb.db.Get(cb.ctx, it.ID).ScanDoc(&winner); err != nil || winner.Status != protocol.StatusDone {
		t.Errorf("after the sweep, CouchDB's own pick is %+v (%v); want the settled branch, done", winner, err)
	}
}

// A job finished on one branch while CouchDB's pick is a queued branch
// (as a requeue by a site that no longer owned it would leave) is not due:
// Queues and Stats count it done, not waiting to run.
func TestQueuesDoNotCountAConflictedFinishedJobAsDue(t *testing.T) {
	cb := setupConflict(t)
	it, err := cb.client.Enqueue(cb.ctx, protocol.NewJob{Worker: "q"})
	if err != nil {
		t.Fatal(err)
	}
	claimed := cb.claimDirectly(t, it, "host/1/w1")
	if err := cb.client.Complete(cb.ctx, claimed, nil); err != nil {
		t.Fatal(err)
	}
	// The other branch, three revisions deep over the enqueued one:
	// queued and due, CouchDB's pick.
	rev := it.Rev
	for range 3 {
		doc := asDoc(t, it.Clone())
		doc["_id"] = it.ID
		rev = cb.child(t, rev, doc)
	}
	var winner protocol.WorkItem
	if err := cb.db.Get(cb.ctx, it.ID).ScanDoc(&winner); err != nil || winner.Status != protocol.StatusQueued {
		t.Fatalf("the test needs the queued branch to be CouchDB's pick: %+v %v", winner, err)
	}
	queues, err := cb.client.Queues(cb.ctx)
	if err != nil || len(queues) != 1 || queues[0].Done != 1 || queues[0].Due != 0 {
		t.Errorf("Queues: %+v %v", queues, err)
	}
	stats, err := cb.client.Stats(cb.ctx, protocol.StatsOptions{Worker: "q"})
	if err != nil || len(stats.Types) != 1 || stats.Types[0].Queue.Done != 1 || stats.Types[0].Queue.Due != 0 {
		t.Errorf("Stats: %+v %v", stats, err)
	}
}

// A job of site A taken over by B, while A — cut off, not down — returned
// an expired claim of it to the queue, so that A's requeued branch is
// CouchDB's pick: every reader at either site shows it as B's, A's workers
// do not run it, B's run it once, and B's sweep keeps B's branch.
func TestSitesOldOwnersRequeueMeetsTheTakeover(t *testing.T) {
	cb := setupConflict(t)
	ctx := cb.ctx
	for _, s := range []string{"A", "B"} {
		if _, err := cb.client.AddSite(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	siteClient := func(site string) *protocol.Client {
		c, err := protocol.New(ctx, cb.db, protocol.Config{Site: site, AlwaysConfirm: true, Now: cb.clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.RefreshSites(ctx); err != nil {
			t.Fatal(err)
		}
		return c
	}
	atA, atB := siteClient("A"), siteClient("B")
	it, err := atA.Enqueue(ctx, protocol.NewJob{Worker: "t", Site: "A"})
	if err != nil {
		t.Fatal(err)
	}
	stamp := func() string { return cb.clock.Now().UTC().Format(protocol.HistoryTimeFormat) }
	// B's branch: the takeover.
	moved := it.Clone()
	moved.Site = "B"
	moved.History = append(moved.History, protocol.Event{At: stamp(), Event: protocol.EventSiteTakeover, By: "B/ops"})
	cb.child(t, it.Rev, asDoc(t, moved))
	// A's branch, two revisions deep so that it is CouchDB's pick: claimed,
	// then returned to the queue when its lease ran out.
	cb.clock.Add(time.Second)
	claimed := it.Clone()
	claimed.Claimed, claimed.Status, claimed.ClaimedBy, claimed.Attempts = true, protocol.StatusRunning, "hostA/1/w", 1
	claimed.History = append(claimed.History, protocol.Event{At: stamp(), Event: protocol.EventClaimed, By: "hostA/1/w", Attempt: 1})
	rev := cb.child(t, it.Rev, asDoc(t, claimed))
	requeued := claimed.Clone()
	requeued.Claimed, requeued.Status, requeued.ClaimedBy = false, protocol.StatusQueued, ""
	requeued.History = append(requeued.History, protocol.Event{At: stamp(), Event: protocol.EventLeaseExpired, By: "hostA/1/sweeper", Attempt: 1})
	cb.child(t, rev, asDoc(t, requeued))
	var winner protocol.WorkItem
	if err := cb.db.Get(ctx, it.ID).ScanDoc(&winner); err != nil || winner.Site != "A" || winner.Status != protocol.StatusQueued {
		t.Fatalf("the test needs A's requeued branch to be CouchDB's pick: %+v %v", winner, err)
	}

	for site, c := range map[string]*protocol.Client{"A": atA, "B": atB} {
		if got, err := c.Get(ctx, it.ID); err != nil || got.Site != "B" {
			t.Errorf("Get at %s: %+v %v; want B's", site, got, err)
		}
	}
	var mu sync.Mutex
	ran := map[string]int{}
	drain := func(c *protocol.Client, site string) {
		t.Helper()
		w, err := worker.New((*couchq.Client)(c), worker.Config{
			Drain: true, ID: site,
			Handlers: map[string]worker.Handler{"t": worker.HandlerFunc(func(context.Context, *worker.Job) error {
				mu.Lock()
				defer mu.Unlock()
				ran[site]++
				return nil
			})},
			Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel),
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Run(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A's worker runs nothing: its claim meets B's branch, and it settles
	// the job on B's (or B's sweep does); B's worker then runs it.
	drain(atA, "A")
	if _, err := atB.Sweep(ctx, "B/sweeper", 0); err != nil {
		t.Fatal(err)
	}
	if got, err := atA.Get(ctx, it.ID); err != nil || got.Site != "B" || got.Status != protocol.StatusQueued {
		t.Fatalf("after A's worker and B's sweep: %+v %v", got, err)
	}
	drain(atB, "B")
	if ran["A"] != 0 || ran["B"] != 1 {
		t.Fatalf("runs: %v; want once, at B", ran)
	}
	if err := cb.db.Get(ctx, it.ID, kivik.Param("conflicts", true)).ScanDoc(&winner); err != nil || winner.Site != "B" || winner.Status != protocol.StatusDone {
		t.Errorf("after B's sweep CouchDB's pick is %+v (%v); want B's, done", winner, err)
	}
}
