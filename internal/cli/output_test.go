package cli

import (
	"strings"
	"testing"
	"time"
)

func TestRelTime(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "now"},
		{400 * time.Millisecond, "now"},
		{2 * time.Second, "in 2s"},
		{-90 * time.Second, "1m30s ago"},
		{48 * time.Hour, "2030-01-04 03:04Z"},
	} {
		if got := RelTime(now.Add(tc.d), now); got != tc.want {
			t.Errorf("RelTime(now%+v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestOneLine(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"boom":                    "boom",
		"  boom\nstack trace\n":   "boom …",
		strings.Repeat("é", 60):   strings.Repeat("é", 9) + "…",
		"":                        "",
		"exactly ten":             "exactly t…",
		strings.Repeat("x", 10):   strings.Repeat("x", 10),
		"short\n" + "second line": "short …",
	} {
		if got := OneLine(in, 10); got != want {
			t.Errorf("OneLine(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPrintable(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"job:plain":                  "job:plain",
		"job:x\x1b[2J\x1b[HALL GOOD": `job:x\x1b[2J\x1b[HALL GOOD`,
		"tab\there":                  `tab\there`,
		"déjà vu":                    "déjà vu",
		"c1\u009b31m":                `c1\u009b31m`,
	} {
		if got := Printable(in); got != want {
			t.Errorf("Printable(%q) = %q, want %q", in, got, want)
		}
	}
	if got := OneLine("boom \x1b[31mred\x1b[0m", 40); got != `boom \x1b[31mred\x1b[0m` {
		t.Errorf("OneLine with escapes = %q", got)
	}
}

func TestIsLoopback(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]bool{
		"127.0.0.1": true, "::1": true, "localhost": true, "127.1.2.3": true,
		"": false, "0.0.0.0": false, "::": false, "10.0.0.1": false, "example.com": false,
	} {
		if got := IsLoopback(host); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", host, got, want)
		}
	}
}

type timeoutAnswer struct{}

func (timeoutAnswer) Error() string {
	return "Internal Server Error: The request could not be processed in a reasonable amount of time."
}
func (timeoutAnswer) HTTPStatus() int { return 500 }

// CouchDB's answer to a view read that waited too long says what it most
// often means.
func TestDescribeErrorOfAViewTimeout(t *testing.T) {
	got := DescribeError(timeoutAnswer{})
	if !strings.Contains(got, "(HTTP 500 Internal Server Error); CouchDB may still be indexing a large change") {
		t.Errorf("DescribeError: %q", got)
	}
}
