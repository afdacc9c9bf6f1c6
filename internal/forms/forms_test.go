package forms

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/protocol"
)

func TestStatsOptions(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 8, 0, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"7d":                        time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC),
		"2029-12-31T23:00:00Z":      time.Date(2029, 12, 31, 23, 0, 0, 0, time.UTC),
		"2030-01-07T01:00:00+01:00": time.Date(2030, 1, 7, 0, 0, 0, 0, time.UTC),
	} {
		opts, err := StatsOptions("mail", in, "", now)
		if err != nil || !opts.Since.Equal(want) || !opts.Until.Equal(now) || opts.Worker != "mail" {
			t.Errorf("StatsOptions(since %q) = %+v, %v; want since %v", in, opts, err, want)
		}
	}
	if opts, err := StatsOptions("", "", "", now); err != nil || !opts.Since.Equal(now.Add(-24*time.Hour)) {
		t.Errorf("default window: %+v, %v", opts, err)
	}

	var pe *ParamError
	_, err := StatsOptions("", "-2h", "", now)
	if !errors.As(err, &pe) || pe.Param != "since" || pe.Value != "-2h" || !strings.Contains(err.Error(), "negative") {
		t.Errorf("since -2h: %v", err)
	}
	_, err = StatsOptions("", "", "soon", now)
	if !errors.As(err, &pe) || pe.Param != "until" || !strings.HasPrefix(err.Error(), `invalid until "soon": want an age`) {
		t.Errorf("until soon: %v", err)
	}
	var we *WindowError
	_, err = StatsOptions("", "2030-01-02T00:00:00Z", "2030-01-01T00:00:00Z", now)
	if !errors.As(err, &we) || err.Error() != "since 2030-01-02T00:00:00Z is not before until 2030-01-01T00:00:00Z" {
		t.Errorf("empty window: %v", err)
	}
}

func TestParseStatus(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]protocol.Status{"": "", "done": protocol.StatusDone, "queued": protocol.StatusQueued} {
		if got, err := ParseStatus(in); err != nil || got != want {
			t.Errorf("ParseStatus(%q) = %q, %v", in, got, err)
		}
	}
	var pe *ParamError
	if _, err := ParseStatus("stuck"); !errors.As(err, &pe) || pe.Param != "status" ||
		err.Error() != `invalid status "stuck": want one of waiting, queued, running, done, failed, cancelled` {
		t.Errorf("ParseStatus(stuck): %v", err)
	}
}
