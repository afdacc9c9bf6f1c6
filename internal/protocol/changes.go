package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/designdocs"
)

// grace is how long past the server-side timeout the client waits for a
// long-poll to end by itself. Some servers (PouchDB Server) ignore the
// timeout parameter; the client deadline ends the request there. A read
// that does not wait (timeout 0) gets the most: its answer is all it is.
func grace(timeout time.Duration) time.Duration {
	if timeout <= 0 {
		return 5 * time.Second
	}
	return min(5*time.Second, timeout/4+100*time.Millisecond)
}

// FeedChanges is what one long-poll of the changes feed brought.
type FeedChanges struct {
	// Jobs is how many changes of claimable WorkItems arrived.
	Jobs int
	// Controls are the job types whose control document changed (a pause
	// or a resume, see TypeControl).
	Controls []string
	// Joined is how many worker processes of these types registered
	// (WorkerInfo.Joined): the peers a worker shares its jobs with changed.
	Joined int
	// Due are the jobs due now among those Jobs counts, by job type, with
	// the documents the feed included (WaitForWork with docs): an idle
	// worker claims them through FetchCandidates without reading the due
	// view first. Jobs scheduled for later are not among them.
	Due map[string][]DueCandidate
}

// WaitForChanges long-polls the _changes feed from since ("now" for only
// future changes) for claimable WorkItems (unclaimed, not running or
// finished) of the given types (all types when empty) and their control
// documents, and returns how many changes arrived and the sequence to
// continue from. It returns (0, since, nil) when timeout passes with no
// change.
func (c *Client) WaitForChanges(ctx context.Context, since string, types []string, timeout time.Duration) (int, string, error) {
	fc, last, err := c.WaitForWork(ctx, since, types, timeout, false)
	return fc.Jobs + len(fc.Controls), last, err
}

// WaitForWork is WaitForChanges telling job changes and control changes
// apart: what a worker follows. With docs the feed includes the claimable
// jobs' documents (FeedChanges.Due); the server reads each one for it, which
// only an idle worker gains from.
func (c *Client) WaitForWork(ctx context.Context, since string, types []string, timeout time.Duration, docs bool) (FeedChanges, string, error) {
	if since == "now" || since == "" {
		// Resolve "now" to a real sequence: a feed that ends by the client's
		// deadline (a server that ignores timeout) returns no last_seq, and
		// polling from "now" again would lose the changes in between.
		seq, err := c.UpdateSeq(ctx)
		if err != nil {
			return FeedChanges{}, since, err
		}
		since = seq
	}
	changed, last, err := c.pollChanges(ctx, since, types, timeout, docs)
	var fc FeedChanges
	for _, ch := range changed {
		if typ, ok := isControlID(ch.ID); ok {
			fc.Controls = append(fc.Controls, typ)
		} else if strings.HasPrefix(ch.ID, workerIDPrefix) {
			fc.Joined++
		} else {
			fc.Jobs++
			if typ, cand, ok := fedCandidate(ch, c.now()); ok {
				if fc.Due == nil {
					fc.Due = map[string][]DueCandidate{}
				}
				fc.Due[typ] = append(fc.Due[typ], cand)
			}
		}
	}
	return fc, last, err
}

// feedRecheck is how long a long poll of the changes feed has waited when
// pollChanges looks once more without waiting.
const feedRecheck = 100 * time.Millisecond

// pollChanges long-polls the changes feed from since, and closes a gap in
// CouchDB's long poll: the server starts the poll's update listener beside
// its first read of the changes (fabric_view_changes:go spawns
// fabric_db_update_listener, which registers on every node by message), so
// a change written after that read and before the listener is up wakes
// nobody, and the poll sleeps to its timeout (a minute by default). Seen
// when a worker registered as a peer's first poll began: the peer counted
// itself alone until its next heartbeat. So once the poll has waited
// feedRecheck, the changes since are read once without waiting (feed=normal,
// which has no listener); any found end the poll. An idle worker pays one
// more request per wait; a busy one's polls return at once.
func (c *Client) pollChanges(ctx context.Context, since string, types []string, timeout time.Duration, docs bool) ([]change, string, error) {
	read := c.waitForChangesFilter
	if c.couch != nil {
		read = c.waitForChangesSelector
	}
	if timeout <= feedRecheck {
		return read(ctx, since, types, timeout, docs)
	}
	type answer struct {
		changed []change
		last    string
		err     error
	}
	pollCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	polled := make(chan answer, 1)
	go func() {
		changed, last, err := read(pollCtx, since, types, timeout, docs)
		polled <- answer{changed, last, err}
	}()
	recheck := time.NewTimer(feedRecheck)
	defer recheck.Stop()
	select {
	case a := <-polled:
		return a.changed, a.last, a.err
	case <-recheck.C:
	}
	if changed, last, err := read(ctx, since, types, 0, docs); err == nil && len(changed) > 0 {
		cancel()
		<-polled
		return changed, last, nil
	}
	a := <-polled
	return a.changed, a.last, a.err
}

// change is one row of a changes feed: the document's id, and the document
// when the feed included it.
type change struct {
	ID  string          `json:"id"`
	Doc json.RawMessage `json:"doc"`
}

// fedCandidate is a claimable job the feed included, as the due view would
// list it at now: its type and its priority as the view keys it (a
// malformed one at PriorityHighest, so that FetchCandidates finds it
// malformed at once). A row without a document, whose document names no
// type, or which is due later, is none.
func fedCandidate(ch change, now time.Time) (typ string, cand DueCandidate, ok bool) {
	if len(ch.Doc) == 0 || string(ch.Doc) == "null" {
		return "", DueCandidate{}, false
	}
	var head struct {
		Worker   string          `json:"worker"`
		Priority json.RawMessage `json:"priority"`
		Date     json.RawMessage `json:"date"`
	}
	if json.Unmarshal(ch.Doc, &head) != nil || head.Worker == "" {
		return "", DueCandidate{}, false
	}
	var date float64
	if json.Unmarshal(head.Date, &date) == nil && date > ToUnix(now) {
		return "", DueCandidate{}, false // scheduled: the view tells when
	}
	cand = DueCandidate{ID: ch.ID, Priority: PriorityDefault, doc: string(ch.Doc)}
	if len(head.Priority) > 0 && string(head.Priority) != "null" {
		var p int
		if json.Unmarshal(head.Priority, &p) != nil || p < PriorityHighest || p > PriorityLowest {
			p = PriorityHighest
		}
		cand.Priority = p
	}
	return head.Worker, cand, true
}

// waitForChangesFilter follows the feed through the design document's work
// filter (servers without _selector) and returns the changed ids.
func (c *Client) waitForChangesFilter(ctx context.Context, since string, types []string, timeout time.Duration, docs bool) ([]change, string, error) {
	reqCtx, cancel := context.WithTimeout(ctx, timeout+grace(timeout))
	defer cancel()
	params := map[string]any{
		"feed":    "longpoll",
		"since":   since,
		"timeout": timeout.Milliseconds(),
		"filter":  designdocs.Name + "/work",
	}
	if timeout <= 0 { // a look that does not wait
		params["feed"] = "normal"
		delete(params, "timeout")
	}
	if len(types) > 0 {
		params["types"] = strings.Join(types, ",")
	}
	if docs {
		params["include_docs"] = true
	}
	if c.cfg.Site != "" {
		params["site"] = c.cfg.Site
		if st := c.siteView(); !st.multi || st.def == c.cfg.Site {
			params["unsited"] = "mine"
		}
	}
	changes := c.db.Changes(reqCtx, kivik.Params(params))
	defer changes.Close()
	var changed []change
	// Rows are read through Iterator, not Next and ScanDoc: ScanDoc checks
	// the iterator's state without its lock, which kivik's own goroutine
	// writes when reqCtx ends, and pollChanges ends it mid-read.
	for row, err := range changes.Iterator() {
		if err != nil {
			break // changes.Err says which
		}
		ch := change{ID: row.ID}
		if docs {
			_ = row.ScanDoc(&ch.Doc) // none: a wake-up without a document
		}
		changed = append(changed, ch)
	}
	if err := changes.Err(); err != nil {
		if ctx.Err() == nil && errors.Is(reqCtx.Err(), context.DeadlineExceeded) {
			return nil, since, nil // our own deadline: a quiet feed
		}
		return nil, since, fmt.Errorf("following changes since %s: %w", since, err)
	}
	last := since
	if meta, err := changes.Metadata(); err == nil && meta.LastSeq != "" {
		last = meta.LastSeq
	}
	return changed, last, nil
}

// UpdateSeq is the database's current update sequence: where a changes
// feed that must miss nothing written from now on starts.
func (c *Client) UpdateSeq(ctx context.Context) (string, error) {
	st, err := c.db.Stats(ctx)
	if err != nil {
		return "", fmt.Errorf("reading the update sequence of %s: %w", c.db.Name(), err)
	}
	return st.UpdateSeq, nil
}
