package protocol

import (
	"testing"
	"time"
)

// Periods count from the Unix epoch in UTC, whatever the caller's zone:
// a week starts on a Thursday (1970-01-01 was one), 90 minutes on the
// multiples since then.
func TestUniqueIDPeriods(t *testing.T) {
	at := time.Date(2026, 11, 23, 11, 0, 0, 0, time.FixedZone("CET", 3600)) // 10:00 UTC
	for _, tc := range []struct {
		u    UniqueOpts
		want string
	}{
		{UniqueOpts{Key: "k"}, "job:unique:mail:k"},
		{UniqueOpts{Key: "k", For: 24 * time.Hour}, "job:unique:mail:k@2026-11-23T00:00:00Z"},
		{UniqueOpts{Key: "k", For: 7 * 24 * time.Hour}, "job:unique:mail:k@2026-11-19T00:00:00Z"},
		{UniqueOpts{Key: "k", For: 90 * time.Minute}, "job:unique:mail:k@2026-11-23T09:00:00Z"},
		{UniqueOpts{Key: "a b/ü", For: time.Hour}, "job:unique:mail:a b/ü@2026-11-23T10:00:00Z"},
	} {
		if got := UniqueID("mail", tc.u, at); got != tc.want {
			t.Errorf("UniqueID(%+v) = %q, want %q", tc.u, got, tc.want)
		}
	}
	if got := ArchiveID("job:unique:mail:k", "3-abc"); got != "job:unique:mail:k~3-abc" {
		t.Errorf("ArchiveID = %q", got)
	}
}
