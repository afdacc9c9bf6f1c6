package worker

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/protocol"
)

// never is a waited func for ownFirst: no job was left to its owner before.
func never(string) time.Duration { return 0 }

// slotOf is the peerSlot of rank among n peers that each run take jobs.
func slotOf(rank, n, take int) peerSlot {
	s := peerSlot{rank: rank, names: make([]string, n), takes: make([]int, n)}
	for i := range n {
		s.names[i], s.takes[i] = fmt.Sprintf("host/1/w%02d", i), take
	}
	return s
}

// The pick among the first K never lets a lower priority overtake a
// higher one among the jobs a worker may claim, with or without peers.
func TestOwnFirstKeepsPriorityOrder(t *testing.T) {
	var listed []protocol.DueCandidate
	for i, p := range []int{1, 1, 1, 2, 3, 3, 3, 3, 5} {
		listed = append(listed, protocol.DueCandidate{ID: fmt.Sprint("job-", i), Priority: p})
	}
	for round := range 100 {
		items := slices.Clone(listed)
		peers := 1 + round%3
		claimable := ownFirst(items, slotOf(round%peers, peers, 1), func(string) time.Duration { return time.Hour }, time.Second)
		for i := 1; i < claimable; i++ {
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
	var all []protocol.DueCandidate
	for i := range 200 {
		all = append(all, protocol.DueCandidate{ID: fmt.Sprintf("job:%04d", i), Priority: protocol.PriorityDefault})
	}
	taken := map[string]int{}
	for rank := range peers {
		// Each saw a different window of the queue (views lag).
		items := append([]protocol.DueCandidate(nil), all[rank*5:rank*5+120]...)
		s := slotOf(rank, peers, 4)
		ownFirst(items, s, never, time.Second)
		own := 0
		for own < len(items) {
			if o, _ := s.choices(items[own].ID); o != rank {
				break
			}
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

// Peers that read the same rows claim disjoint jobs, however few are due:
// no two race for a job. An owner's next rounds (its oldest jobs,
// zoneRounds times as many as it runs at once) are its own; its later jobs
// are its thief's too. A job left to a busy owner for StealAfter becomes
// its thief's too, for twice that its third choice's, and for three times
// that anyone's.
func TestOwnFirstNeverRacesPeersThatAgree(t *testing.T) {
	const stealAfter = time.Second
	for _, rows := range []int{1, 3, 10, 40, 200} {
		for _, peers := range []int{2, 3, 16} {
			var all []protocol.DueCandidate
			for i := range rows {
				all = append(all, protocol.DueCandidate{ID: fmt.Sprintf("job:%d:%d:%04d", rows, peers, i), Priority: 1 + i%2})
			}
			for _, tc := range []struct {
				waited  time.Duration
				takers  int // how many peers may claim a job in an owner's next round
				zoneLen int // the jobs of each owner in its next round
			}{{0, 1, 4}, {stealAfter, 2, 4}, {2 * stealAfter, min(3, peers), 4}, {3 * stealAfter, peers, 4}} {
				claimers := map[string]int{} // may claim it
				claimed := map[string]int{}  // claim it in a round with every slot free
				for rank := range peers {
					items := slices.Clone(all)
					n := ownFirst(items, slotOf(rank, peers, tc.zoneLen), func(string) time.Duration { return tc.waited }, stealAfter)
					for i, it := range items[:n] {
						claimers[it.ID]++
						if i < tc.zoneLen {
							claimed[it.ID]++
						}
					}
					if got := slices.SortedFunc(slices.Values(items), func(a, b protocol.DueCandidate) int { return strings.Compare(a.ID, b.ID) }); !slices.Equal(got, all) {
						t.Fatalf("rank %d: ownFirst lost or made up rows", rank)
					}
				}
				// Each owner's oldest jobs, two rounds' worth: those its
				// next rounds take, from rows that may still list its last
				// round's claims.
				zone := map[string]bool{}
				seen := make([]int, peers)
				for _, it := range all {
					if o, _ := slotOf(0, peers, 0).choices(it.ID); seen[o] < 2*tc.zoneLen {
						seen[o]++
						zone[it.ID] = true
					}
				}
				for _, it := range all {
					want := min(2, peers) // its owner and its thief
					if zone[it.ID] {
						want = tc.takers
					}
					if tc.waited == 0 && claimed[it.ID] > 1 {
						t.Fatalf("%d rows, %d peers: job %s claimed by %d peers in one round", rows, peers, it.ID, claimed[it.ID])
					}
					if claimers[it.ID] != want {
						t.Fatalf("%d rows, %d peers, left %s: job %s (zone %v) claimable by %d peers, want %d",
							rows, peers, tc.waited, it.ID, zone[it.ID], claimers[it.ID], want)
					}
				}
			}
		}
	}
}

// A thief takes an owner's newest jobs first: the owner takes its oldest.
func TestStealOrderTakesNewestFirstFromEachOwner(t *testing.T) {
	byOwner := [][]protocol.DueCandidate{
		{{ID: "a1"}, {ID: "a2"}, {ID: "a3"}},
		{{ID: "b1"}},
		nil,
	}
	got := stealOrder(byOwner)
	pos := map[string]int{}
	for i, c := range got {
		pos[c.ID] = i
	}
	if len(got) != 4 || pos["a3"] > pos["a2"] || pos["a2"] > pos["a1"] {
		t.Fatalf("steal order %v: want all four, a3 before a2 before a1", got)
	}
	if pos["b1"] > 1 {
		t.Fatalf("steal order %v: one job of each owner in turn, want b1 among the first two", got)
	}
}

// A worker's rank counts the live workers of its type, itself included
// even before its own registry document can be read.
func TestPeerSlots(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	live := func(claimant string, types ...string) *protocol.WorkerInfo {
		return &protocol.WorkerInfo{Claimant: claimant, Types: types, LastHeartbeat: protocol.ToUnix(now), HeartbeatInterval: 1}
	}
	dead := live("h/1/dead", "email")
	dead.LastHeartbeat -= 60
	infos := []*protocol.WorkerInfo{live("h/1/a", "email", "sms"), live("h/1/c", "email"), dead, live("h/1/d", "sms"), live("h/1/b", "email")}
	infos[0].Concurrency = 8 // h/1/a
	got := peerSlots(infos, "h/1/b", 2, []string{"email", "sms", "fax"}, now)
	abc := []string{"h/1/a", "h/1/b", "h/1/c"}
	want := map[string]peerSlot{
		"email": {rank: 1, names: abc, takes: []int{8, 2, 1}}, // a, b (self), c (no concurrency recorded: 1)
		"sms":   {rank: 1, names: []string{"h/1/a", "h/1/b", "h/1/d"}, takes: []int{8, 2, 1}},
		"fax":   {rank: 0, names: []string{"h/1/b"}, takes: []int{2}},
	}
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

// Jobs spread evenly over peers, and a peer joining takes about one job in
// n from the others and moves no other: workers that have not heard of it
// yet disagree on those jobs alone.
func TestOwnersMoveLittleWhenAPeerJoins(t *testing.T) {
	const jobs, peers = 4000, 16
	before, after := slotOf(0, peers-1, 1), slotOf(0, peers, 1) // after adds host/1/w15
	owned := make([]int, peers)
	moved := 0
	for i := range jobs {
		id := fmt.Sprintf("job:%06d", i)
		o1, t1 := before.choices(id)
		o2, t2 := after.choices(id)
		if o1 == t1 || o2 == t2 {
			t.Fatalf("job %s: owner and thief are the same peer", id)
		}
		owned[o2]++
		if before.names[o1] != after.names[o2] {
			moved++
			if after.names[o2] != "host/1/w15" {
				t.Fatalf("job %s moved from %s to %s, not to the newcomer", id, before.names[o1], after.names[o2])
			}
		}
	}
	if share := jobs / peers; moved > 2*share || moved < share/2 {
		t.Fatalf("%d of %d jobs moved to the 16th peer, want about %d", moved, jobs, share)
	}
	for rank, n := range owned {
		if share := jobs / peers; n < share/2 || n > 3*share/2 {
			t.Fatalf("peer %d owns %d of %d jobs, want about %d (%v)", rank, n, jobs, share, owned)
		}
	}
}

// With a negative StealAfter no job is left to its owner: every peer may
// claim every job.
func TestOwnFirstWithoutLeavingJobsToOwners(t *testing.T) {
	var items []protocol.DueCandidate
	for i := range 50 {
		items = append(items, protocol.DueCandidate{ID: fmt.Sprint("job-", i), Priority: protocol.PriorityDefault})
	}
	for rank := range 5 {
		if n := ownFirst(slices.Clone(items), slotOf(rank, 5, 1), never, -1); n != len(items) {
			t.Fatalf("rank %d may claim %d of %d jobs, want all", rank, n, len(items))
		}
	}
}

// A worker that joined lately takes none of the jobs that the peers that
// have not heard of it take in their next round, and none of their later
// jobs as a thief; once settled it takes its own jobs at once.
func TestOwnFirstLeavesANewcomersJobsToPeersThatDoNotKnowIt(t *testing.T) {
	const peers, take = 8, 4
	var all []protocol.DueCandidate
	for i := range 200 {
		all = append(all, protocol.DueCandidate{ID: fmt.Sprintf("job:%04d", i), Priority: protocol.PriorityDefault})
	}
	newcomer := slotOf(peers-1, peers, take) // host/1/w07 joined
	before := slotOf(0, peers-1, take)       // what the others still see
	// The jobs the others take next, as they see them: each one's oldest
	// take of its own.
	next := map[string]bool{}
	seen := make([]int, peers-1)
	for _, it := range all {
		if o, _ := before.choices(it.ID); seen[o] < take {
			seen[o]++
			next[it.ID] = true
		}
	}
	claimable := func(s peerSlot) []protocol.DueCandidate {
		items := slices.Clone(all)
		return items[:ownFirst(items, s, never, time.Second)]
	}
	joining := newcomer
	joining.joining = true
	got := claimable(joining)
	if len(got) == 0 {
		t.Fatal("a joining worker may claim none of its jobs")
	}
	for _, it := range got {
		if next[it.ID] {
			t.Fatalf("the joining worker may claim %s, which a peer that does not know it takes next", it.ID)
		}
		if o, _ := newcomer.choices(it.ID); o != newcomer.rank {
			t.Fatalf("the joining worker may claim %s, another's job, before it was left for StealAfter", it.ID)
		}
	}
	raced := 0
	for _, it := range claimable(newcomer) {
		if next[it.ID] {
			raced++
		}
	}
	if raced == 0 {
		t.Fatal("settled, the newcomer still leaves its jobs to the peers that owned them before")
	}
}

// Alone, a worker takes the oldest jobs first; once it lost claims (to
// claimants it does not know of) it picks among them at random.
func TestOwnFirstAloneTakesOldestUnlessContended(t *testing.T) {
	var all []protocol.DueCandidate
	for i := range 32 {
		all = append(all, protocol.DueCandidate{ID: fmt.Sprintf("job:%04d", i), Priority: protocol.PriorityDefault})
	}
	items := slices.Clone(all)
	if n := ownFirst(items, peerSlot{}, never, time.Second); n != len(all) || !slices.Equal(items, all) {
		t.Fatalf("alone: %d claimable, order changed: %v", n, items[:4])
	}
	shuffled := false
	for range 20 {
		items := slices.Clone(all)
		ownFirst(items, peerSlot{spread: true}, never, time.Second)
		shuffled = shuffled || !slices.Equal(items, all)
	}
	if !shuffled {
		t.Fatal("alone after lost claims: never picked at random")
	}
}

// A thief waits StealAfter, or three of its own claim rounds when a loaded
// server makes those slower, but not much longer.
func TestStealAfterFollowsSlowRounds(t *testing.T) {
	r := &runner{w: &Worker{cfg: Config{StealAfter: 500 * time.Millisecond}}}
	if got := r.stealAfter(); got != 500*time.Millisecond {
		t.Fatalf("no round yet: %s, want StealAfter", got)
	}
	for range 50 {
		r.noteRound(320 * time.Millisecond)
	}
	if got := r.stealAfter(); got != 960*time.Millisecond {
		t.Fatalf("rounds of 320 ms: %s, want 960ms", got)
	}
	r.noteRound(time.Minute)
	if got := r.stealAfter(); got != 4*time.Second {
		t.Fatalf("after a stalled round: %s, want at most 8 × StealAfter", got)
	}
	r.w.cfg.StealAfter = -1
	if got := r.stealAfter(); got >= 0 {
		t.Fatalf("StealAfter < 0: %s, want it kept", got)
	}
}
