package protocol

import (
	"testing"
	"time"
)

// A read of a batch answers for it only while no queue could have
// finished what the read found unfinished, and never near the end.
func TestBatchReuse(t *testing.T) {
	for _, tc := range []struct {
		pending int64
		want    time.Duration
	}{
		{0, 0},
		{batchFreshBelow, 0},
		{batchDrainRate / 4, 250 * time.Millisecond},
		{batchDrainRate, time.Second},
		{100 * batchDrainRate, batchReuseMax},
	} {
		if got := batchReuse(tc.pending); got != tc.want {
			t.Errorf("batchReuse(%d) = %s, want %s", tc.pending, got, tc.want)
		}
	}
}
