package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/forms"
	"github.com/couchq/couchq/internal/protocol"
)

const lsUsage = `Usage: couchq ls [--type TYPE] [--status STATUS] [--limit N] [flags]

Lists jobs ordered by type, status and id, as a table or, with --json, as
an array of the stored documents.

	--type TYPE       only jobs of this type
	--status STATUS   only jobs in this status: queued, running, done, failed or cancelled
	--limit N         at most N jobs (default 100)
`

// lastErrorWidth is how much of a job's last error the table shows.
const lastErrorWidth = 50

func (m *Main) runLs(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("ls", lsUsage)
	conn := addConnFlags(fs)
	var opts protocol.ListOptions
	var status string
	fs.StringVar(&opts.Worker, "type", "", "job type")
	fs.StringVar(&status, "status", "", "job status")
	fs.IntVar(&opts.Limit, "limit", 100, "maximum number of jobs")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageErrorf("unexpected argument %q (filter with --type and --status)", rest[0])
	}
	if err := conn.resolve(m); err != nil {
		return err
	}
	log = log.Level(conn.level)
	if opts.Status, err = forms.ParseStatus(status); err != nil {
		return flagError(err)
	}
	if opts.Limit < 1 {
		return usageErrorf("invalid --limit %d: must be at least 1", opts.Limit)
	}
	q, closeQueue, err := m.openQueue(ctx, conn, log)
	if err != nil {
		return err
	}
	defer closeQueue()
	batch, err := q.List(ctx, opts)
	if err != nil {
		return err
	}
	if err := printJobs(m.Stdout, q, batch, opts.Limit, m.Now(), conn.json); err != nil || conn.json {
		return err
	}
	return printPaused(ctx, m.Stdout, q, opts.Worker)
}

// printPaused says which job types are paused (only typ, when given): their
// queued jobs wait on purpose.
func printPaused(ctx context.Context, w io.Writer, q *protocol.Client, typ string) error {
	var only []string
	if typ != "" {
		only = []string{typ}
	}
	paused, err := q.Paused(ctx, only...)
	if err != nil || len(paused) == 0 {
		return err
	}
	types := make([]string, 0, len(paused))
	for t := range paused {
		types = append(types, t)
	}
	sort.Strings(types)
	_, err = fmt.Fprintf(w, "paused: %s (their workers claim nothing; 'couchq resume TYPE')\n", strings.Join(types, ", "))
	return err
}

// printJobs writes batch as a table, or with asJSON as /api/jobs serves
// it (forms.Jobs).
func printJobs(w io.Writer, q *protocol.Client, batch *protocol.Batch, limit int, now time.Time, asJSON bool) error {
	if asJSON {
		return writeJSON(w, forms.Jobs(batch))
	}
	n := len(batch.Items) + len(batch.Malformed)
	if n == 0 {
		_, err := fmt.Fprintln(w, "no jobs")
		return err
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tTYPE\tSTATUS\tATTEMPTS\tDUE\tLAST ERROR")
	for _, it := range batch.Items {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\n", it.ID, it.Worker, it.Status, it.Attempts,
			q.MaxAttempts(it), dueString(it, now), oneLine(it.LastError, lastErrorWidth))
	}
	for _, bad := range batch.Malformed {
		fmt.Fprintf(tw, "%s\t?\tmalformed\t-\t-\t%s\n", bad.ID, oneLine(bad.Err.Field+" "+bad.Err.Reason, lastErrorWidth))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if n >= limit {
		_, err := fmt.Fprintf(w, "(first %d jobs; --limit shows more)\n", n)
		return err
	}
	return nil
}

// dueString says when a job is due, relative to now when that is close.
func dueString(it *protocol.WorkItem, now time.Time) string {
	if it.Date == 0 {
		return "now"
	}
	return relTime(it.DueAt(), now)
}

// relTime renders t as "in 2s" or "5m0s ago" within a day of now, and as a
// UTC date and time further away.
func relTime(t, now time.Time) string {
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

// oneLine shortens s to its first line and at most width characters.
func oneLine(s string, width int) string {
	s, _, cut := strings.Cut(strings.TrimSpace(s), "\n")
	s = strings.TrimSpace(s)
	if utf8.RuneCountInString(s) > width {
		r := []rune(s)
		return string(r[:width-1]) + "…"
	}
	if cut {
		return s + " …"
	}
	return s
}

// trimmedTable is a tabwriter that drops the padding left at the end of
// lines whose last cell is empty.
type trimmedTable struct {
	buf bytes.Buffer
	*tabwriter.Writer
	out io.Writer
}

func newTable(w io.Writer) *trimmedTable {
	t := &trimmedTable{out: w}
	t.Writer = tabwriter.NewWriter(&t.buf, 0, 0, 2, ' ', 0)
	return t
}

// Flush aligns the table and writes it out.
func (t *trimmedTable) Flush() error {
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
