package worker

import (
	"fmt"
	"testing"
	"time"

	"github.com/couchq/couchq/couchq"
)

// The pick among the first K never lets a lower priority overtake a
// higher one, with or without peers.
func TestOwnFirstKeepsPriorityOrder(t *testing.T) {
	var items []couchq.DueCandidate
	for i, p := range []int{1, 1, 1, 2, 3, 3, 3, 3, 5} {
		items = append(items, couchq.DueCandidate{ID: fmt.Sprint("job-", i), Priority: p})
	}
	for round := range 100 {
		ownFirst(items, round%3, 1+round%3)
		for i := 1; i < len(items); i++ {
			if items[i].Priority < items[i-1].Priority {
				t.Fatalf("priority %d after %d at %d", items[i].Priority, items[i-1].Priority, i)
			}
		}
	}
}

// Workers that agree on who is live take disjoint jobs first, each its own
// oldest first, whatever rows their due queries returned.
func TestOwnFirstSplitsJobsAmongPeers(t *testing.T) {
	const peers = 4
	var all []couchq.DueCandidate
	for i := range 200 {
		all = append(all, couchq.DueCandidate{ID: fmt.Sprintf("job:%04d", i), Priority: couchq.PriorityDefault})
	}
	taken := map[string]int{}
	for rank := range peers {
		// Each saw a different window of the queue (views lag).
		items := append([]couchq.DueCandidate(nil), all[rank*5:rank*5+120]...)
		ownFirst(items, rank, peers)
		own := 0
		for own < len(items) && jobSlot(items[own].ID, peers) == rank {
			own++
		}
		if own < 15 {
			t.Fatalf("rank %d: %d own jobs in 120 rows, want about 30", rank, own)
		}
		for i := 1; i < own; i++ {
			if items[i].ID < items[i-1].ID {
				t.Fatalf("rank %d: own jobs not oldest first: %s after %s", rank, items[i].ID, items[i-1].ID)
			}
		}
		for _, it := range items[:own] {
			if prev, ok := taken[it.ID]; ok {
				t.Fatalf("job %s is own to ranks %d and %d", it.ID, prev, rank)
			}
			taken[it.ID] = rank
		}
	}
}

// A worker's rank counts the live workers of its type, itself included
// even before its own registry document can be read.
func TestPeerSlots(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	live := func(claimant string, types ...string) *couchq.WorkerInfo {
		return &couchq.WorkerInfo{Claimant: claimant, Types: types, LastHeartbeat: couchq.ToUnix(now), HeartbeatInterval: 1}
	}
	dead := live("h/1/dead", "email")
	dead.LastHeartbeat -= 60
	infos := []*couchq.WorkerInfo{live("h/1/a", "email", "sms"), live("h/1/c", "email"), dead, live("h/1/d", "sms"), live("h/1/b", "email")}
	got := peerSlots(infos, "h/1/b", []string{"email", "sms", "fax"}, now)
	want := map[string]peerSlot{"email": {rank: 1, n: 3}, "sms": {rank: 1, n: 3}, "fax": {rank: 0, n: 1}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("slots %v, want %v", got, want)
	}
}

// K widens while rounds lose claims, up to eight times PickAmong, and
// narrows back to PickAmong once they stop.
func TestWidenPick(t *testing.T) {
	r := &runner{w: &Worker{cfg: Config{PickAmong: 32}}}
	var seen []int
	for range 5 {
		r.widenPick(3)
		seen = append(seen, r.pick)
	}
	if want := []int{64, 128, 256, 256, 256}; fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("K after rounds that lost claims: %v, want %v", seen, want)
	}
	rounds := 0
	for r.pick > 32 {
		r.widenPick(0)
		rounds++
		if rounds > 100 {
			t.Fatalf("K stuck at %d", r.pick)
		}
	}
	if r.pick != 32 || rounds < 8 {
		t.Fatalf("K back to %d after %d quiet rounds, want 32 after several", r.pick, rounds)
	}
	r.w.cfg.PickAmong = 600
	r.widenPick(1)
	if r.pick != maxDueLimit {
		t.Fatalf("K = %d, want at most one due page (%d)", r.pick, maxDueLimit)
	}
}
