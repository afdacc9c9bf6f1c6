package integration

import (
	"testing"
	"time"

	"github.com/couchq/couchq/internal/protocol"
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
