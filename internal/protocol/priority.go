package protocol

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/go-kivik/kivik/v4"
)

// Priority levels of a job (the WorkItem's "priority" field): 1 runs
// first, 5 last; a job without one is PriorityDefault, in the middle.
// Among the due jobs of a type a higher priority always starts first, and
// within a priority the oldest due.
const (
	PriorityHighest = 1
	PriorityDefault = 3
	PriorityLowest  = 5
)

// EffectivePriority is the job's priority level, PriorityDefault when it
// has none.
func (w *WorkItem) EffectivePriority() int {
	if w.Priority == 0 {
		return PriorityDefault
	}
	return w.Priority
}

// DueFirst returns up to limit due jobs of type worker in the order workers
// start them: highest priority first, and within a priority oldest due
// first (the due_priority view, keyed [worker, priority, date]). It reads
// every priority's range in one multi-range request where the server has
// one (CouchDB's .../queries), else range by range until limit is reached.
func (c *Client) DueFirst(ctx context.Context, worker string, limit int) (*Batch, error) {
	if limit <= 0 {
		limit = 100
	}
	now := c.now()
	b := &Batch{At: now}
	err := c.dueRanges(ctx, dueRanges(c.queueKeys(worker), now, limit, true), fmt.Sprintf("listing due %s jobs by priority", worker),
		func(rows *kivik.ResultSet) (bool, error) {
			for rows.Next() {
				if err := c.scanRow(rows, b); err != nil {
					return false, err
				}
			}
			return len(b.Items)+len(b.Malformed) >= limit, nil
		})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// DueCandidate is a row of the due_priority view: a job that was due and
// not claimed when the view was read, without its document.
type DueCandidate struct {
	ID string
	// Priority is the job's level as the view keys it (a malformed
	// priority is keyed PriorityHighest, so that it is seen first).
	Priority int
	// doc is the job's document as the view included it
	// (DueCandidatesWithDocs); FetchCandidates reads none for it. A string
	// keeps DueCandidate comparable.
	doc string
}

// DueCandidates lists up to limit due jobs of type worker in DueFirst's
// order, from the same view but without their documents, and the time
// they were listed up to. Reading a job's document costs the server about
// as much as the rest of the query: a worker that picks a few among many
// candidates reads only the documents of those it picked (FetchDue).
//
// With stale, Apache CouchDB answers from the view as it stands and
// indexes the changes since it was last brought up to date after
// answering (update=lazy), instead of before: the rows may then list jobs
// claimed since, which FetchDue leaves out, and miss jobs made due since.
// A worker working through a backlog reads it so, its rounds no longer
// waiting for the index to take its own last claims and outcomes. Other
// servers always index first.
func (c *Client) DueCandidates(ctx context.Context, worker string, limit int, stale bool) ([]DueCandidate, time.Time, error) {
	return c.dueCandidates(ctx, worker, limit, stale, false)
}

// DueCandidatesWithDocs is DueCandidates reading the view brought up to
// date, with each job's document: FetchCandidates then reads none, one
// request fewer before a claim. It suits a worker that expects to find
// few jobs (an idle one woken by the feed), for whom that request is a
// large share of the wake-up; through a backlog, reading every listed
// job's document costs more than the request saved.
//
// On a cluster it lists them without: a view's rows and their documents
// come from one copy of each shard, which may not hold a claim a majority
// of the copies took, and a claim of that older revision would be stored
// on the lagging copy as a second branch. FetchCandidates reads the
// documents by id instead, as FetchDue does: CouchDB answers with the
// newest revision among the copies it asks.
func (c *Client) DueCandidatesWithDocs(ctx context.Context, worker string, limit int) ([]DueCandidate, time.Time, error) {
	return c.dueCandidates(ctx, worker, limit, false, c.n <= 1)
}

func (c *Client) dueCandidates(ctx context.Context, worker string, limit int, stale, docs bool) ([]DueCandidate, time.Time, error) {
	if limit <= 0 {
		limit = 100
	}
	now := c.now()
	var opts []kivik.Option
	if stale && c.couch != nil {
		opts = append(opts, kivik.Param("update", "lazy"))
	}
	var cands []DueCandidate
	err := c.dueRanges(ctx, dueRanges(c.queueKeys(worker), now, limit, docs), fmt.Sprintf("listing due %s jobs by priority", worker),
		func(rows *kivik.ResultSet) (bool, error) {
			for rows.Next() {
				var key []json.RawMessage
				id, _ := rows.ID()
				if err := rows.ScanKey(&key); err != nil || len(key) != 3 || id == "" {
					continue // not a row the map emits
				}
				cand := DueCandidate{ID: id, Priority: PriorityHighest}
				_ = json.Unmarshal(key[1], &cand.Priority)
				if docs {
					var doc json.RawMessage
					if err := rows.ScanDoc(&doc); err != nil {
						return false, err
					}
					cand.doc = string(doc)
				}
				cands = append(cands, cand)
			}
			return len(cands) >= limit, nil
		}, opts...)
	if err != nil {
		return nil, time.Time{}, err
	}
	return cands, now, nil
}

// FetchDue reads the documents of due jobs listed by DueCandidates, in
// one request, and returns those still due and unclaimed as a Batch in the
// order of ids, setting malformed documents aside as DueFirst does. A job
// claimed, finished, deleted or rescheduled since it was listed is left
// out (claiming it would only earn a 409), and the claimant of each one
// claimed is in the Batch's ClaimedBy.
func (c *Client) FetchDue(ctx context.Context, ids []string) (*Batch, error) {
	cands := make([]DueCandidate, len(ids))
	for i, id := range ids {
		cands[i].ID = id
	}
	return c.FetchCandidates(ctx, cands)
}

// FetchCandidates is FetchDue for candidates as DueCandidates (or
// DueCandidatesWithDocs) listed them: it reads, in one request, only the
// documents of those listed without theirs.
func (c *Client) FetchCandidates(ctx context.Context, cands []DueCandidate) (*Batch, error) {
	now := c.now()
	b := &Batch{At: now}
	var missing []string
	for _, cand := range cands {
		if cand.doc == "" {
			missing = append(missing, cand.ID)
		}
	}
	read := make(map[string]json.RawMessage, len(missing))
	if len(missing) > 0 {
		what := fmt.Sprintf("reading %d due jobs", len(missing))
		rows := c.db.AllDocs(ctx, kivik.Params(map[string]any{"keys": missing, "include_docs": true}))
		defer rows.Close()
		for rows.Next() {
			// A job deleted since it was listed has a deleted stub for a
			// value, and an id never stored an error row without one.
			var stub struct {
				Rev     string `json:"rev"`
				Deleted bool   `json:"deleted"`
			}
			if err := rows.ScanValue(&stub); err != nil || stub.Rev == "" || stub.Deleted {
				continue
			}
			id, _ := rows.ID()
			var raw json.RawMessage
			if err := rows.ScanDoc(&raw); err != nil {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
			read[id] = raw
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
	}
	for _, cand := range cands {
		raw := json.RawMessage(cand.doc)
		if cand.doc == "" {
			if raw = read[cand.ID]; raw == nil {
				continue // deleted, or never stored
			}
		}
		c.addDoc(b, cand.ID, raw)
	}
	b.Items = slices.DeleteFunc(b.Items, func(it *WorkItem) bool {
		if it.Claimed && it.ClaimedBy != "" && !slices.Contains(b.ClaimedBy, it.ClaimedBy) {
			b.ClaimedBy = append(b.ClaimedBy, it.ClaimedBy)
		}
		return !it.dueAt(now)
	})
	return b, nil
}

// dueAt reports whether the due_priority view lists the job at now: not
// claimed, not waiting for other jobs, not running or finished, and its
// date come.
func (w *WorkItem) dueAt(now time.Time) bool {
	switch w.Status {
	case StatusWaiting, StatusRunning, StatusDone, StatusFailed, StatusCancelled:
		return false
	}
	return !w.Claimed && w.Date <= ToUnix(now)
}

// dueRanges are the due_priority view's ranges of worker's jobs due by now,
// one per priority, highest first.
func dueRanges(queues []any, now time.Time, limit int, docs bool) []map[string]any {
	ranges := make([]map[string]any, 0, PriorityLowest*len(queues))
	for p := PriorityHighest; p <= PriorityLowest; p++ {
		for _, q := range queues {
			r := map[string]any{
				"startkey": []any{q, p},
				"endkey":   []any{q, p, ToUnix(now)},
				"reduce":   false,
				"limit":    limit,
			}
			if docs {
				r["include_docs"] = true
			}
			ranges = append(ranges, r)
		}
	}
	return ranges
}

// dueRanges reads ranges of the due_priority view in order (viewRanges).
func (c *Client) dueRanges(ctx context.Context, ranges []map[string]any, what string, each func(*kivik.ResultSet) (enough bool, err error), opts ...kivik.Option) error {
	return c.viewRanges(ctx, "due_priority", ranges, what, func(_ int, rows *kivik.ResultSet) (bool, error) {
		return each(rows)
	}, opts...)
}
