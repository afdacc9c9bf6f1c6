package worker

import (
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
