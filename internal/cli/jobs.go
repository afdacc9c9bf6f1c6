package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/internal/forms"
	"github.com/couchq/couchq/internal/protocol"
)

// lastErrorWidth is how much of a job's last error the table shows.
const lastErrorWidth = 50

// PrintJobs writes batch as a table, or with asJSON as /api/jobs serves it
// (forms.Jobs). limit is the most to show: a listing asks for one more, so
// that a batch of more than limit says there are more, and one of exactly
// limit does not. The table has a
// SITE column, each job's owner, when a listed job has one: when the
// database has sites (read here, for the default site's name), or a job
// names a site all the same.
func PrintJobs(ctx context.Context, w io.Writer, q *protocol.Client, batch *protocol.Batch, limit int, now time.Time, asJSON bool) error {
	more := len(batch.Items)+len(batch.Malformed) > limit
	if more {
		trimmed := *batch
		trimmed.Items = batch.Items[:min(len(batch.Items), limit)]
		trimmed.Malformed = batch.Malformed[:min(len(batch.Malformed), limit-len(trimmed.Items))]
		batch = &trimmed
	}
	if asJSON {
		return WriteJSON(w, forms.Jobs(batch))
	}
	n := len(batch.Items) + len(batch.Malformed)
	if n == 0 {
		_, err := fmt.Fprintln(w, "no jobs")
		return err
	}
	if err := q.RefreshSites(ctx); err != nil {
		return err
	}
	sites := false
	for _, it := range batch.Items {
		sites = sites || q.Owner(it) != ""
	}
	tw := NewTable(w)
	// row writes a line of cells; the third, the site, only when the
	// table has that column, so that a single database's table reads as
	// it always has.
	row := func(cells ...string) {
		if !sites {
			cells = slices.Delete(cells, 2, 3)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	row("ID", "TYPE", "SITE", "STATUS", "ATTEMPTS", "DUE", "LAST ERROR")
	for _, it := range batch.Items {
		owner := q.Owner(it)
		if owner == "" {
			owner = "-" // a single database's: any worker's
		}
		row(Printable(it.ID), it.Worker, owner, statusCell(it), fmt.Sprintf("%d/%d", it.Attempts, q.MaxAttempts(it)),
			dueString(it, now), OneLine(it.LastError, lastErrorWidth))
	}
	for _, bad := range batch.Malformed {
		row(Printable(bad.ID), "?", "?", "malformed", "-", "-", OneLine(bad.Err.Field+" "+bad.Err.Reason, lastErrorWidth))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if more {
		if _, err := fmt.Fprintf(w, "(first %d jobs; --limit shows more)\n", n); err != nil {
			return err
		}
	}
	return printUnrunSites(w, q, batch)
}

// printUnrunSites says why the listed unfinished jobs of a site no worker
// here runs wait, as show does for one job: the database has no sites (a
// producer's, not yet linked), or the site is not one of the queue's.
func printUnrunSites(w io.Writer, q *protocol.Client, batch *protocol.Batch) error {
	var unrun []string
	haveSites := false
	for _, it := range batch.Items {
		if it.Site == "" || it.Status.Terminal() {
			continue
		}
		listed, multi := q.SiteListed(it.Site)
		haveSites = multi
		if !listed && !slices.Contains(unrun, it.Site) {
			unrun = append(unrun, it.Site)
		}
	}
	if len(unrun) == 0 {
		return nil
	}
	slices.Sort(unrun)
	why := "this database has no sites: no worker here runs them until a link carries them to their site (couchq sites link)"
	if haveSites {
		why = "not one of the queue's sites (couchq sites): the default site's sweep fails them"
	}
	_, err := fmt.Fprintf(w, "jobs of site %s: %s\n", strings.Join(unrun, ", "), why)
	return err
}

// statusCell is a job's status, with how far it got while it runs
// ("running 40/120").
func statusCell(it *protocol.WorkItem) string {
	p := it.Progress
	if it.Status != protocol.StatusRunning || p == nil {
		return string(it.Status)
	}
	if p.Total > 0 {
		return fmt.Sprintf("%s %d/%d", it.Status, p.Done, p.Total)
	}
	return fmt.Sprintf("%s %d", it.Status, p.Done)
}

// dueString says when a job is due, relative to now when that is close.
func dueString(it *protocol.WorkItem, now time.Time) string {
	if it.Date == 0 {
		return "now"
	}
	return RelTime(it.DueAt(), now)
}

// ErrJobNotFound is the message for a missing job; it exits 1.
var ErrJobNotFound = errors.New("not found")

// ShowJob prints job id: the raw document with asJSON, else readable.
func ShowJob(ctx context.Context, w io.Writer, q *protocol.Client, id string, now time.Time, asJSON bool) error {
	raw, id, err := ReadDoc(ctx, q.DB(), id)
	if err != nil {
		return err
	}
	// A document that is no job at all (a design, control or worker
	// document) is shown, and said to be no job: exit 1, as for one that
	// is missing. A malformed WorkItem is a job, shown as it is.
	var kind struct {
		Type any `json:"type"`
	}
	_ = json.Unmarshal(raw, &kind)
	var notJob error
	if kind.Type != "WorkItem" {
		notJob = fmt.Errorf("%s is not a job: its type is %s, not \"WorkItem\"", id, typeOf(kind.Type))
	}
	if asJSON {
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "  "); err != nil {
			return fmt.Errorf("formatting job %s: %w", id, err)
		}
		buf.WriteByte('\n')
		if _, err := w.Write(buf.Bytes()); err != nil {
			return err
		}
		return notJob
	}
	var it protocol.WorkItem
	if err := json.Unmarshal(raw, &it); err != nil || notJob != nil {
		// Show what is there: this is how an operator finds out what is
		// wrong with a document the workers set aside.
		if notJob == nil {
			fmt.Fprintf(w, "%s\n  not a valid job: %v\n\n", id, err)
		}
		if err := writeIndented(w, "document", raw); err != nil {
			return err
		}
		return notJob
	}
	// The default site, owner of the jobs that name none, is the sites
	// document's.
	if err := q.RefreshSites(ctx); err != nil {
		return err
	}
	var open []protocol.SiteRequest
	if _, haveSites := q.SiteListed(""); haveSites {
		// A cancel or retry issued at another site waits for the owner to
		// apply it: say so, or the job reads as if nobody had asked.
		reqs, err := q.Requests(ctx, it.ID)
		if err != nil {
			return err
		}
		open = slices.DeleteFunc(reqs, func(r protocol.SiteRequest) bool { return r.State == protocol.RequestApplied })
	}
	return printJob(w, q, &it, open, now)
}

// ReadDoc reads a document, trying "job:"+id when id alone is missing so
// that the bare uuid of a generated id is enough. It returns the id found.
func ReadDoc(ctx context.Context, db *kivik.DB, id string) (json.RawMessage, string, error) {
	if strings.HasPrefix(id, "_") && !strings.HasPrefix(id, "_design/") && !strings.HasPrefix(id, "_local/") {
		// A CouchDB endpoint (_all_docs, _changes): its GET answers no
		// document.
		return nil, id, fmt.Errorf("reading job %q: not a job's id (ids starting with _ are CouchDB's own): %w", id, ErrJobNotFound)
	}
	var raw json.RawMessage
	err := db.Get(ctx, id).ScanDoc(&raw)
	if IsNotFound(err) && !strings.HasPrefix(id, "job:") {
		var raw2 json.RawMessage
		if err2 := db.Get(ctx, "job:"+id).ScanDoc(&raw2); err2 == nil {
			return raw2, "job:" + id, nil
		}
	}
	switch {
	case err == nil:
		return raw, id, nil
	case IsNotFound(err):
		return nil, id, fmt.Errorf("job %s %w", id, ErrJobNotFound)
	}
	return nil, id, fmt.Errorf("reading job %s: %w", id, err)
}

// printJob writes it in readable form, with open, the requests other
// sites made for it that its owner has not applied (pending or refused).
func printJob(w io.Writer, q *protocol.Client, it *protocol.WorkItem, open []protocol.SiteRequest, now time.Time) error {
	fmt.Fprintln(w, it.ID)
	tw := NewTable(w)
	// Every value is the document's, written by anyone who may write it:
	// its control characters are shown escaped (Printable).
	field := func(name, value string) { fmt.Fprintf(tw, "  %s\t%s\n", name, Printable(value)) }
	field("type", it.Worker)
	field("status", string(it.Status))
	if owner := q.Owner(it); owner != "" {
		listed, haveSites := q.SiteListed(owner)
		switch {
		case it.Site == "":
			owner += " (default)" // the sites document's default owns it
		case it.Status.Terminal():
		case !haveSites:
			owner += " (this database has no sites: no worker here runs it until a link carries it to its site)"
		case !listed:
			owner += " (not one of the queue's sites: the default site's sweep fails it)"
		}
		field("site", owner)
	}
	due := "now"
	if it.Date != 0 {
		due = TimeAndAgo(it.DueAt(), now)
	}
	field("due", due)
	attempts := fmt.Sprintf("%d of %d", it.Attempts, q.MaxAttempts(it))
	if it.MaxAttempts == 0 {
		// The job names none: the worker that runs it applies its own
		// default, which this command cannot know.
		attempts += " (a default: the worker that runs it may have another)"
	}
	field("attempts", attempts)
	if p := it.Progress; p != nil {
		progress := p.String()
		if p.At != 0 {
			progress += ", reported " + TimeAndAgo(protocol.FromUnix(p.At), now)
		}
		field("progress", progress)
	}
	if it.Priority != 0 {
		field("priority", fmt.Sprintf("%d (1 runs first, 5 last)", it.Priority))
	}
	if it.UniqueKey != "" {
		field("unique key", it.UniqueKey)
	}
	if tp := it.Trace["traceparent"]; tp != "" {
		field("trace", tp) // the W3C traceparent: the trace id is its second part
	}
	if len(it.After) > 0 {
		policy := it.OnDependencyFailure
		if policy == "" {
			policy = protocol.DependencyCancel
		}
		field("after", strings.Join(it.After, ", ")+" (if one fails: "+policy+")")
	}
	if it.ReleasedAt != 0 {
		field("released", TimeAndAgo(protocol.FromUnix(it.ReleasedAt), now))
	}
	if it.Batch != "" {
		field("batch", it.Batch)
	}
	if it.CallbackOf != "" {
		field("callback of", fmt.Sprintf("batch %s (%d jobs)", it.CallbackOf, it.BatchSize))
	}
	if it.ChildOf != "" {
		field("child of", it.ChildOf)
	}
	if it.Continuation {
		field("continuation", "yes: it waited for the children its handler enqueued")
	}
	if it.CreatedAt != 0 {
		field("created", TimeAndAgo(protocol.FromUnix(it.CreatedAt), now))
	}
	if it.Claimed {
		field("claimed by", it.ClaimedBy)
		if it.ClaimedAt != 0 {
			field("claimed", TimeAndAgo(protocol.FromUnix(it.ClaimedAt), now))
		}
		if it.LeaseUntil != 0 {
			field("lease until", TimeAndAgo(it.Lease(), now))
		}
	}
	if it.FinishedAt != 0 {
		field("finished", TimeAndAgo(protocol.FromUnix(it.FinishedAt), now))
	}
	if it.LastError != "" {
		lines := strings.Split(strings.TrimSpace(it.LastError), "\n")
		for i, l := range lines {
			lines[i] = Printable(l)
		}
		fmt.Fprintf(tw, "  %s\t%s\n", "last error", strings.Join(lines, "\n  \t"))
	}
	if len(it.Conflicts) > 0 {
		field("conflicts", strings.Join(it.Conflicts, ", "))
	}
	for _, r := range open {
		from := ""
		if r.From != "" {
			from = " at site " + r.From
		}
		state := "pending: site " + r.Site + " applies it when the request reaches it"
		if r.State == protocol.RequestRefused {
			state = "refused by site " + r.Site + ": " + r.Result
		}
		field("requested", fmt.Sprintf("%s by %s%s, %s; %s (%s)", r.Action, r.By, from,
			TimeAndAgo(protocol.FromUnix(r.CreatedAt), now), state, r.ID))
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
	tw = NewTable(w)
	for _, e := range it.History {
		at := e.At
		if t, err := time.Parse(time.RFC3339Nano, e.At); err == nil {
			at = t.UTC().Format("2006-01-02 15:04:05.000Z")
		}
		var detail []string
		if e.By != "" {
			detail = append(detail, "by "+Printable(e.By))
		}
		if e.Attempt > 0 {
			detail = append(detail, fmt.Sprintf("attempt %d", e.Attempt))
		}
		if e.Error != "" {
			// Only a failure's text is an error; the others say why
			// (a cancel's reason, a takeover, a withdrawn branch's story).
			label := "note: "
			switch e.Event {
			case protocol.EventFailed, protocol.EventRetryScheduled, protocol.EventLeaseExpired:
				label = "error: "
			}
			detail = append(detail, label+OneLine(e.Error, 400))
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", Printable(at), Printable(e.Event), strings.Join(detail, ", "))
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

// typeOf is a document's type field as a message shows it.
func typeOf(v any) string {
	if v == nil {
		return "missing"
	}
	b, _ := json.Marshal(v)
	return string(b)
}
