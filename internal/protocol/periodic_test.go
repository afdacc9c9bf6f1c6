package protocol

import (
	"testing"
	"time"
)

// Catching up once keeps the ticks of the last lateGrace (a process that
// woke late), but of a schedule whose ticks come more often than that only
// those within one interval: the rest of an outage's ticks run as one.
func TestCollapseMissedTicks(t *testing.T) {
	var c Client
	now := time.Date(2030, 1, 1, 0, 0, 24, 0, time.UTC)
	at := func(secs ...int) []time.Time {
		var out []time.Time
		for _, s := range secs {
			out = append(out, time.Date(2030, 1, 1, 0, 0, s, 0, time.UTC))
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		due, want []time.Time
	}{
		{"every 5 s after an outage: the latest alone", at(5, 10, 15, 20), at(20)},
		{"every 5 s, a few seconds late: the latest alone", at(15, 20), at(20)},
		{"every 2 s, all within 10 s: the latest alone", at(16, 18, 20, 22), at(22)},
		{"every 15 s: a late tick and a missed one", at(0, 15), at(15)},
	} {
		got := c.collapseMissed("s", tc.due, now)
		if len(got) != len(tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
			continue
		}
		for i := range got {
			if !got[i].Equal(tc.want[i]) {
				t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
			}
		}
	}
	// Ticks a minute apart, one missed and the next 5 s late: the late one
	// covers the missed one.
	late := time.Date(2030, 1, 1, 0, 1, 5, 0, time.UTC)
	if got := c.collapseMissed("s", []time.Time{late.Add(-65 * time.Second), late.Add(-5 * time.Second)}, late); len(got) != 1 {
		t.Errorf("a minute apart, one missed: %v, want the latest", got)
	}
}
