package cli

import (
	"bytes"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/couchq/couchq/internal/forms"
)

// Output is where a command writes, and how.
type Output struct {
	// Stdout takes the command's output.
	Stdout io.Writer
	// Stderr takes problems and progress.
	Stderr io.Writer
	// Terminal says Stderr is a terminal: progress bars are drawn there.
	Terminal bool
	// JSON asks for machine-readable output (--json).
	JSON bool
}

// WriteJSON writes v as every --json output is written: as the HTTP API
// writes its answers, so that stats --json and /api/stats are the same
// bytes.
func WriteJSON(w io.Writer, v any) error { return forms.WriteJSON(w, v) }

// RelTime renders t as "in 2s" or "5m0s ago" within a day of now, and as a
// UTC date and time further away.
func RelTime(t, now time.Time) string {
	d := t.Sub(now)
	switch {
	case d.Abs() < time.Second:
		return "now"
	case d.Abs() >= 24*time.Hour:
		return t.UTC().Format("2006-01-02 15:04Z")
	case d > 0:
		return "in " + d.Round(time.Second).String()
	default:
		return (-d).Round(time.Second).String() + " ago"
	}
}

// TimeAndAgo renders t in UTC with its distance from now.
func TimeAndAgo(t, now time.Time) string {
	abs := t.UTC().Format("2006-01-02 15:04:05Z")
	if t.Sub(now).Abs() < 24*time.Hour {
		return abs + " (" + RelTime(t, now) + ")"
	}
	return abs
}

// OneLine shortens s to its first line and at most width characters.
func OneLine(s string, width int) string {
	s, _, cut := strings.Cut(strings.TrimSpace(s), "\n")
	s = Printable(strings.TrimSpace(s))
	if utf8.RuneCountInString(s) > width {
		r := []rune(s)
		return string(r[:width-1]) + "…"
	}
	if cut {
		return s + " …"
	}
	return s
}

// Printable is s with its control characters (a terminal's escape, a
// tab, a carriage return) written as Go escapes (\x1b, \t, \r), so that
// what a document holds cannot move the cursor, clear the screen or break
// a table in the terminal of the operator who reads it.
func Printable(s string) string {
	if !strings.ContainsFunc(s, isControl) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if isControl(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 }

// Plural is one or many as n asks.
func Plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// Table is a tabwriter that drops the padding left at the end of lines
// whose last cell is empty.
type Table struct {
	buf bytes.Buffer
	*tabwriter.Writer
	out io.Writer
}

// NewTable returns a table written to w when flushed.
func NewTable(w io.Writer) *Table {
	t := &Table{out: w}
	t.Writer = tabwriter.NewWriter(&t.buf, 0, 0, 2, ' ', 0)
	return t
}

// Flush aligns the table and writes it out.
func (t *Table) Flush() error {
	if err := t.Writer.Flush(); err != nil {
		return err
	}
	var out bytes.Buffer
	for line := range strings.Lines(t.buf.String()) {
		out.WriteString(strings.TrimRight(line, " \n"))
		out.WriteByte('\n')
	}
	t.buf.Reset()
	_, err := t.out.Write(out.Bytes())
	return err
}
