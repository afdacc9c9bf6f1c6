package worker

import (
	"fmt"
	"testing"

	"github.com/couchq/couchq/couchq"
)

// The random pick among the first K never lets a lower priority overtake
// a higher one.
func TestShuffleWithinPriorityKeepsPriorityOrder(t *testing.T) {
	var items []*couchq.WorkItem
	for _, p := range []int{1, 1, 1, 2, 0, 0, 3, 3, 5} { // 0 is the default, 3
		items = append(items, &couchq.WorkItem{Priority: p})
	}
	for range 100 {
		shuffleWithinPriority(items)
		for i := 1; i < len(items); i++ {
			if items[i].EffectivePriority() < items[i-1].EffectivePriority() {
				t.Fatalf("priority %d after %d at %d", items[i].EffectivePriority(), items[i-1].EffectivePriority(), i)
			}
		}
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
