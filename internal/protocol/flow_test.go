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

// The jobs a lagging batches view counts as unfinished move to the count
// of the state they were read in when they have finished; the others,
// and documents of another batch, stay where the view put them.
func TestBatchRecount(t *testing.T) {
	b := &BatchStatus{ID: "b", Done: 5, Failed: 1, Pending: 5, FailedIDs: []string{"job:f"}}
	job := func(batch string, st Status) jobState {
		return jobState{exists: true, item: &WorkItem{Batch: batch, Status: st}}
	}
	jobs := map[string]jobState{
		"job:1": job("b", StatusDone),
		"job:2": job("b", StatusFailed),
		"job:3": job("b", StatusCancelled),
		"job:4": job("b", StatusRunning),
		"job:5": job("other", StatusDone),
	}
	b.recount([]string{"job:1", "job:2", "job:3", "job:4", "job:5", "job:6"}, jobs)
	if b.Done != 6 || b.Failed != 2 || b.Cancelled != 1 || b.Pending != 2 {
		t.Fatalf("recounted: %+v", b)
	}
	if len(b.FailedIDs) != 2 || b.FailedIDs[0] != "job:2" || b.FailedIDs[1] != "job:f" {
		t.Fatalf("failed ids: %v", b.FailedIDs)
	}
}
