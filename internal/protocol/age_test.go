package protocol

import (
	"testing"
	"time"
)

func TestParseAge(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{
		"1h": time.Hour, "6h": 6 * time.Hour, "24h": 24 * time.Hour, "7d": 7 * 24 * time.Hour,
		"1.5d": 36 * time.Hour, "1d12h": 36 * time.Hour, "90s": 90 * time.Second, "0s": 0, "0d": 0,
	} {
		if got, err := ParseAge(in); err != nil || got != want {
			t.Errorf("ParseAge(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "d", "7", "soon", "-1h", "7d-1h", "1w", "d7", "1e9d"} {
		if got, err := ParseAge(in); err == nil {
			t.Errorf("ParseAge(%q) = %v, want an error", in, got)
		}
	}
}
