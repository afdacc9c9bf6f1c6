package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/protocol"
)

const showUsage = `Usage: couchq show [flags] ID

Shows one job: its fields, the payload and result pretty-printed, and its
history as a timeline. With --json it prints the stored document as it is.
The "job:" prefix of generated ids may be left out.
`

// errJobNotFound is the message for a missing job; it exits 1.
var errJobNotFound = errors.New("not found")

func (m *Main) runShow(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("show", showUsage)
	conn := addConnFlags(fs)
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(rest) == 0:
		return usageErrorf("missing job ID")
	case len(rest) > 1:
		return usageErrorf("want one job ID, got %d arguments", len(rest))
	case rest[0] == "":
		return usageErrorf("empty job ID")
	}
	q, _, closeQueue, err := m.connect(ctx, conn, log)
	if err != nil {
		return err
	}
	defer closeQueue()
	return showJob(ctx, m.Stdout, q, rest[0], m.Now(), conn.json)
}

// showJob prints job id: the raw document with asJSON, else readable.
func showJob(ctx context.Context, w io.Writer, q *protocol.Client, id string, now time.Time, asJSON bool) error {
	raw, id, err := readDoc(ctx, q.DB(), id)
	if err != nil {
		return err
	}
	if asJSON {
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "  "); err != nil {
			return fmt.Errorf("formatting job %s: %w", id, err)
		}
		buf.WriteByte('\n')
		_, err := w.Write(buf.Bytes())
		return err
	}
	var it protocol.WorkItem
	if err := json.Unmarshal(raw, &it); err != nil {
		// Show what is there: this is how an operator finds out what is
		// wrong with a document the workers set aside.
		fmt.Fprintf(w, "%s\n  not a valid job: %v\n\n", id, err)
		return writeIndented(w, "document", raw)
	}
	return printJob(w, q, &it, now)
}

// readDoc reads a document, trying "job:"+id when id alone is missing so
// that the bare uuid of a generated id is enough.
func readDoc(ctx context.Context, db *kivik.DB, id string) (json.RawMessage, string, error) {
	var raw json.RawMessage
	err := db.Get(ctx, id).ScanDoc(&raw)
	if isNotFound(err) && !strings.HasPrefix(id, "job:") {
		var raw2 json.RawMessage
		if err2 := db.Get(ctx, "job:"+id).ScanDoc(&raw2); err2 == nil {
			return raw2, "job:" + id, nil
		}
	}
	switch {
	case err == nil:
		return raw, id, nil
	case isNotFound(err):
		return nil, id, fmt.Errorf("job %s %w", id, errJobNotFound)
	}
	return nil, id, fmt.Errorf("reading job %s: %w", id, err)
}

func isNotFound(err error) bool {
	return err != nil && !isNetError(err) && kivik.HTTPStatus(err) == http.StatusNotFound
}

// printJob writes it in readable form.
func printJob(w io.Writer, q *protocol.Client, it *protocol.WorkItem, now time.Time) error {
	fmt.Fprintln(w, it.ID)
	tw := newTable(w)
	field := func(name, value string) { fmt.Fprintf(tw, "  %s\t%s\n", name, value) }
	field("type", it.Worker)
	field("status", string(it.Status))
	due := "now"
	if it.Date != 0 {
		due = timeAndAgo(it.DueAt(), now)
	}
	field("due", due)
	field("attempts", fmt.Sprintf("%d of %d", it.Attempts, q.MaxAttempts(it)))
	if it.Priority != 0 {
		field("priority", fmt.Sprintf("%d (1 runs first, 5 last)", it.Priority))
	}
	if it.UniqueKey != "" {
		field("unique key", it.UniqueKey)
	}
	if it.CreatedAt != 0 {
		field("created", timeAndAgo(protocol.FromUnix(it.CreatedAt), now))
	}
	if it.Claimed {
		field("claimed by", it.ClaimedBy)
		if it.ClaimedAt != 0 {
			field("claimed", timeAndAgo(protocol.FromUnix(it.ClaimedAt), now))
		}
		if it.LeaseUntil != 0 {
			field("lease until", timeAndAgo(it.Lease(), now))
		}
	}
	if it.FinishedAt != 0 {
		field("finished", timeAndAgo(protocol.FromUnix(it.FinishedAt), now))
	}
	if it.LastError != "" {
		field("last error", strings.ReplaceAll(strings.TrimSpace(it.LastError), "\n", "\n  \t"))
	}
	if len(it.Conflicts) > 0 {
		field("conflicts", strings.Join(it.Conflicts, ", "))
	}
	field("revision", it.Rev)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if err := writeIndented(w, "payload", it.Payload); err != nil {
		return err
	}
	if len(it.Result) > 0 {
		if err := writeIndented(w, "result", it.Result); err != nil {
			return err
		}
	}
	fmt.Fprintln(w, "history")
	if len(it.History) == 0 {
		fmt.Fprintln(w, "  (none)")
		return nil
	}
	tw = newTable(w)
	for _, e := range it.History {
		at := e.At
		if t, err := time.Parse(time.RFC3339Nano, e.At); err == nil {
			at = t.UTC().Format("2006-01-02 15:04:05.000Z")
		}
		var detail []string
		if e.By != "" {
			detail = append(detail, "by "+e.By)
		}
		if e.Attempt > 0 {
			detail = append(detail, fmt.Sprintf("attempt %d", e.Attempt))
		}
		if e.Error != "" {
			detail = append(detail, "error: "+oneLine(e.Error, 100))
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", at, e.Event, strings.Join(detail, ", "))
	}
	return tw.Flush()
}

// writeIndented writes a titled JSON value, pretty-printed and indented.
func writeIndented(w io.Writer, title string, v json.RawMessage) error {
	if len(v) == 0 {
		_, err := fmt.Fprintf(w, "%s\n  (none)\n\n", title)
		return err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, v, "  ", "  "); err != nil {
		buf.Reset()
		buf.Write(v)
	}
	_, err := fmt.Fprintf(w, "%s\n  %s\n\n", title, buf.String())
	return err
}

// timeAndAgo renders t in UTC with its distance from now.
func timeAndAgo(t, now time.Time) string {
	abs := t.UTC().Format("2006-01-02 15:04:05Z")
	if t.Sub(now).Abs() < 24*time.Hour {
		return abs + " (" + relTime(t, now) + ")"
	}
	return abs
}
