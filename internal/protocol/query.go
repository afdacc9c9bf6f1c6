package protocol

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/designdocs"
)

// Batch is a page of jobs read from a view.
type Batch struct {
	// Items are the well-formed jobs, in view order.
	Items []*WorkItem
	// Malformed are documents couchq cannot run (each already logged).
	// Workers quarantine them so they stop blocking the queue.
	Malformed []Malformed
	// At is the "now" a Due query listed jobs up to.
	At time.Time
	// ClaimedBy are, for FetchDue, the claimants of the jobs it left out
	// because they were claimed since they were listed (once each): who
	// else claims these jobs.
	ClaimedBy []string
}

// Malformed is a stored WorkItem that failed to decode.
type Malformed struct {
	ID  string
	Rev string
	Err *MalformedError
	Raw json.RawMessage
}

// Due lists up to limit jobs of type worker that may run now, oldest due
// first, read from the due view with their documents.
func (c *Client) Due(ctx context.Context, worker string, limit int) (*Batch, error) {
	if limit <= 0 {
		limit = 100
	}
	// [worker] sorts before every [worker, date], so negative dates are
	// found too.
	now := c.now()
	rows := c.view(ctx, "due", kivik.Params(map[string]any{
		"startkey":     []any{worker},
		"endkey":       []any{worker, ToUnix(now)},
		"include_docs": true,
		"reduce":       false,
		"limit":        limit,
	}))
	b, err := c.scan(rows, fmt.Sprintf("listing due %s jobs", worker))
	if b != nil {
		b.At = now
	}
	return b, err
}

// Next returns when the first job of type worker due at or after `after`
// is due; ok is false when none is scheduled. Pass the time a Due query
// used, so that a job falling due between the two queries is not missed.
//
// It reads the due_priority view, which workers keep up to date with their
// claims, rather than the due view (an ops view, indexed when read): the
// first row of each priority's range after `after`, in one multi-range
// request where the server has one, and the earliest of them.
func (c *Client) Next(ctx context.Context, worker string, after time.Time) (at time.Time, ok bool, err error) {
	from := ToUnix(after)
	ranges := make([]map[string]any, 0, PriorityLowest)
	for p := PriorityHighest; p <= PriorityLowest; p++ {
		for _, q := range c.queueKeys(worker) {
			ranges = append(ranges, map[string]any{
				"startkey": []any{q, p, from},
				"endkey":   []any{q, p, map[string]any{}},
				"reduce":   false,
				"limit":    1,
			})
		}
	}
	var first float64
	found := func(rows *kivik.ResultSet) {
		for rows.Next() {
			var key []json.RawMessage
			if err := rows.ScanKey(&key); err != nil || len(key) != 3 {
				continue
			}
			var date float64
			if json.Unmarshal(key[2], &date) != nil {
				continue
			}
			if !ok || date < first {
				first, ok = date, true
			}
		}
	}
	err = c.dueRanges(ctx, ranges, fmt.Sprintf("finding next scheduled %s job", worker), func(rows *kivik.ResultSet) (bool, error) {
		found(rows)
		return false, nil
	})
	if err != nil {
		return time.Time{}, false, err
	}
	return FromUnix(first), ok, nil
}

// Get reads one job. A job with a stored conflict (two claims through
// different nodes of a cluster) is read as the sweeper will settle it
// (Settle): the claim holding a live lease, else the leaf that went
// furthest. So a job finished on one branch reads as finished while a
// claim conceded on another is still CouchDB's winner.
func (c *Client) Get(ctx context.Context, id string) (*WorkItem, error) {
	if id == "" || strings.HasPrefix(id, "_") {
		// CouchDB's own endpoints (_all_docs) and design documents: a GET
		// would answer something else than a document, or a design.
		return nil, &describedError{fmt.Sprintf("reading job %q: not a job's id (ids starting with _ are CouchDB's own)", id), ErrNotFound}
	}
	var raw map[string]json.RawMessage
	if err := c.db.Get(ctx, id, kivik.Param("conflicts", true)).ScanDoc(&raw); err != nil {
		if missingDoc(err) {
			return nil, fmt.Errorf("reading job %s: %w (%w)", id, ErrNotFound, err)
		}
		return nil, fmt.Errorf("reading job %s: %w", id, err)
	}
	if t, typ := raw["type"], ""; json.Unmarshal(t, &typ) != nil || typ != DocType {
		// Another kind of document (a control, a worker's registry entry,
		// an application's own): no job of that id exists.
		return nil, &describedError{fmt.Sprintf("reading job %s: %s is not a job: its type is %s, not %q", id, id, describeType(t), DocType), ErrNotFound}
	}
	conflicted := len(raw["_conflicts"]) > 0
	delete(raw, "_conflicts") // not the job's: never written back
	doc, err := json.Marshal(raw)
	if err != nil {
		return nil, fmt.Errorf("reading job %s: %w", id, err)
	}
	var it WorkItem
	if err := json.Unmarshal(doc, &it); err != nil {
		var m *MalformedError
		if errors.As(err, &m) {
			if m.ID == "" {
				m.ID = id
			}
			return nil, fmt.Errorf("reading job %s: %w", id, m)
		}
		return nil, fmt.Errorf("reading job %s: %w", id, err)
	}
	if conflicted {
		if kept := c.asSettled(ctx, id); kept != nil {
			return kept, nil
		}
	}
	return &it, nil
}

// statusNames lists the statuses, comma-separated.
func statusNames() string {
	names := make([]string, 0, len(Statuses()))
	for _, s := range Statuses() {
		names = append(names, string(s))
	}
	return strings.Join(names, ", ")
}

// describeType says what a document's type field holds.
func describeType(t json.RawMessage) string {
	if t == nil {
		return "missing"
	}
	return string(t)
}

// asSettled is the leaf of a conflicted job that settling it keeps, read
// from a majority of the copies: a claim holding a live lease (its holder
// may be running it), else the live leaf of the highest settleRank, ties
// to CouchDB's winner. It is nil when the leaves cannot be read, or when
// the job was deleted on a branch (settling deletes it).
func (c *Client) asSettled(ctx context.Context, id string) *WorkItem {
	leaves, err := c.Leaves(ctx, id)
	if err != nil {
		c.log.Debug().Err(err).Str("job", id).Msg("could not read a conflicted job's leaves; reading its winner")
		return nil
	}
	return c.settledOf(leaves)
}

// settledOf is the job as the sweeper will settle it, from its leaves; nil
// when its winner already is (a deletion, or no live leaf that decodes).
func (c *Client) settledOf(leaves []Leaf) *WorkItem {
	now := ToUnix(c.now())
	var live []Leaf
	for _, l := range leaves {
		switch {
		case l.finishedTombstone():
			return nil
		case l.Deleted || l.Item == nil:
		case l.live(now):
			return l.Item
		default:
			live = append(live, l)
		}
	}
	if len(live) == 0 {
		return nil
	}
	return live[c.keptLeafOf(live)].Item
}

// ListOptions narrow List.
type ListOptions struct {
	Worker string // job type; empty for all
	Status Status // empty for all
	Limit  int    // 0 for 100
}

// List returns jobs by type and status: from the by_status view when a
// status is given (so a status across all types is one range), from the
// status view otherwise.
func (c *Client) List(ctx context.Context, opts ListOptions) (*Batch, error) {
	b, _, err := c.listFrom(ctx, opts, 0)
	return b, err
}

// listFrom is List from the skip-th row of the view, and says how many
// rows the view gave: conflicted jobs that will not settle as opts.Status
// are left out of the batch but still take a row.
func (c *Client) listFrom(ctx context.Context, opts ListOptions, skip int) (*Batch, int, error) {
	if opts.Status != "" && !opts.Status.Valid() {
		return nil, 0, fmt.Errorf("listing jobs: status %q is none of %s", opts.Status, statusNames())
	}
	if opts.Limit <= 0 {
		opts.Limit = 100
	}
	view := "status"
	params := map[string]any{"include_docs": true, "limit": opts.Limit}
	switch {
	case opts.Status != "" && opts.Worker != "":
		view = "by_status"
		params["startkey"] = []any{string(opts.Status), opts.Worker}
		params["endkey"] = []any{string(opts.Status), opts.Worker, map[string]any{}}
	case opts.Status != "":
		view = "by_status"
		params["startkey"] = []any{string(opts.Status)}
		params["endkey"] = []any{string(opts.Status), map[string]any{}}
	case opts.Worker != "":
		params["startkey"] = []any{opts.Worker}
		params["endkey"] = []any{opts.Worker, map[string]any{}}
	}
	if view == "status" {
		params["reduce"] = false // by_status has no reduce to turn off
	}
	// A conflicted job (two claims through a cluster's nodes, or another
	// site's revision) is listed as it will be settled, not as CouchDB's
	// pick among its branches, which may be a conceded claim that reads
	// running while the job is done.
	params["conflicts"] = true
	if skip > 0 {
		params["skip"] = skip
	}
	rows := c.view(ctx, view, kivik.Params(params))
	b, err := c.scan(rows, "listing jobs")
	if err != nil {
		return nil, 0, err
	}
	listed := len(b.Items)
	kept := b.Items[:0]
	for _, it := range b.Items {
		if len(it.Conflicts) > 0 {
			if settled := c.asSettled(ctx, it.ID); settled != nil {
				it = settled
			}
			if opts.Status != "" && it.Status != opts.Status {
				continue
			}
		}
		kept = append(kept, it)
	}
	b.Items = kept
	return b, listed, nil
}

// conflictShifts says how the views' counts by type and status, which
// count a conflicted job under CouchDB's pick among its branches, change
// when each is counted as it will be settled: minus one under its pick,
// plus one under its settled status. It reads at most maxConflictShifts
// conflicted jobs.
func (c *Client) conflictShifts(ctx context.Context) (map[string]map[Status]int64, error) {
	ids, err := rowIDs(c.view(ctx, "conflicts", kivik.Param("limit", maxConflictShifts)))
	if err != nil {
		return nil, fmt.Errorf("listing conflicted jobs: %w", err)
	}
	shifts := map[string]map[Status]int64{}
	if len(ids) == 0 {
		return shifts, nil
	}
	all, err := c.leavesMany(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("reading conflicted jobs: %w", err)
	}
	for _, id := range ids {
		leaves := all[id]
		pick, settled := couchWinner(leaves), c.settledOf(leaves)
		if pick == nil || settled == nil || pick.Status == settled.Status && pick.Worker == settled.Worker {
			continue
		}
		for _, d := range []struct {
			it *WorkItem
			n  int64
		}{{pick, -1}, {settled, 1}} {
			if shifts[d.it.Worker] == nil {
				shifts[d.it.Worker] = map[Status]int64{}
			}
			shifts[d.it.Worker][d.it.Status] += d.n
		}
	}
	return shifts, nil
}

// maxConflictShifts bounds the conflicted jobs one count reads.
const maxConflictShifts = 1000

// couchWinner is the leaf CouchDB shows as the document: a live one before
// a deleted one, then the longest revision path, then the greatest
// revision id.
func couchWinner(leaves []Leaf) *WorkItem {
	best := winnerLeaf(leaves)
	if best == nil || best.Deleted {
		return nil
	}
	return best.Item
}

// winnerLeaf is the leaf CouchDB shows as the document (see couchWinner);
// nil when there is none.
func winnerLeaf(leaves []Leaf) *Leaf {
	var best *Leaf
	better := func(a, b *Leaf) bool {
		if a.Deleted != b.Deleted {
			return !a.Deleted
		}
		pa, _ := strconv.Atoi(strings.SplitN(a.Rev, "-", 2)[0])
		pb, _ := strconv.Atoi(strings.SplitN(b.Rev, "-", 2)[0])
		if pa != pb {
			return pa > pb
		}
		return a.Rev > b.Rev
	}
	for i := range leaves {
		if best == nil || better(&leaves[i], best) {
			best = &leaves[i]
		}
	}
	return best
}

// view queries one of couchq's views, mostly from a stable set of shard
// copies: one copy of each range, the same one from every node while it is
// up. Without stable, CouchDB asks every copy and each brings its index up
// to date before answering, so on a cluster of n copies every query made
// the JavaScript view server index each change n times (couchq-bench,
// 3-node cluster: couchjs CPU per job 21 ms without, 6 with). But the
// chosen copy can lag for minutes — a node that restarted gets the writes
// it missed from the others later — and a job it lacks would be missed by
// every query; so at least every freshViewInterval a query of each view
// asks every copy again (each range answered by whichever copy is first),
// as CouchDB does by default. Servers without shards ignore stable.
func (c *Client) view(ctx context.Context, view string, opts ...kivik.Option) *kivik.ResultSet {
	now := time.Now().UnixNano()
	v, ok := c.fullViews.Load(view)
	if !ok {
		v, _ = c.fullViews.LoadOrStore(view, new(atomic.Int64))
	}
	lastFull := v.(*atomic.Int64)
	last := lastFull.Load()
	if now-last < int64(freshViewInterval) || !lastFull.CompareAndSwap(last, now) {
		opts = append(opts, kivik.Param("stable", true))
	}
	return c.db.Query(ctx, designdocs.DocFor(view), "_view/"+view, opts...)
}

// viewRanges reads ranges of view in order, in one multi-range request
// where the server has one (CouchDB's .../queries), else range by range
// until each reports it has enough; each is given the range's index, and
// opts apply to every range.
func (c *Client) viewRanges(ctx context.Context, view string, ranges []map[string]any, what string, each func(i int, rows *kivik.ResultSet) (enough bool, err error), opts ...kivik.Option) error {
	if len(ranges) == 0 {
		return nil
	}
	if !c.singleQueries.Load() {
		rows := c.view(ctx, view, append(slices.Clip(opts), kivik.Param("queries", ranges))...)
		var scanErr error
		read := 0
		for scanErr == nil && rows.NextResultSet() {
			if read == len(ranges) {
				// kivik ends with a result set of no rows: its Next
				// finds the end of the answer.
				if rows.Next() {
					scanErr = fmt.Errorf("more answers than the %d ranges asked", len(ranges))
				}
				break
			}
			_, scanErr = each(read, rows)
			read++
		}
		err := rows.Err()
		_ = rows.Close()
		switch {
		case scanErr != nil:
			return fmt.Errorf("%s: %w", what, scanErr)
		case err == nil && read == len(ranges):
			return nil
		case err == nil:
			return fmt.Errorf("%s: the server answered %d of %d ranges", what, read, len(ranges))
		case !multiUnsupported(err):
			return fmt.Errorf("%s: %w", what, err)
		}
		c.singleQueries.Store(true)
		c.log.Info().Err(err).Msg("the server has no multi-range view queries; asking range by range")
	}
	for i, r := range ranges {
		rows := c.view(ctx, view, append(slices.Clip(opts), kivik.Params(r))...)
		enough, scanErr := each(i, rows)
		err := rows.Err()
		_ = rows.Close()
		if err = cmp.Or(scanErr, err); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if enough {
			break
		}
	}
	return nil
}

// multiUnsupported reports an answer that means "no multi-range queries
// here" rather than a failure of the request.
func multiUnsupported(err error) bool {
	switch kivik.HTTPStatus(err) {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotImplemented:
		return true
	}
	return false
}

// freshViewInterval is the longest time between two view queries of a
// client that ask every copy (see view).
const freshViewInterval = 5 * time.Second

// rowIDs reads the ids of rows and closes it: the ids of the rows read
// before an error, and the error.
func rowIDs(rows *kivik.ResultSet) ([]string, error) {
	defer rows.Close()
	var ids []string
	for rows.Next() {
		if id, err := rows.ID(); err == nil {
			ids = append(ids, id)
		}
	}
	return ids, rows.Err()
}

// scan decodes view rows that carry documents, setting aside (and logging)
// the ones that are not well-formed WorkItems.
func (c *Client) scan(rows *kivik.ResultSet, what string) (*Batch, error) {
	defer rows.Close()
	b := &Batch{}
	for rows.Next() {
		if err := c.scanRow(rows, b); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return b, nil
}

// scanRow adds the current row's document to b: a job, a malformed one, or
// nothing when the document is gone.
func (c *Client) scanRow(rows *kivik.ResultSet, b *Batch) error {
	var raw json.RawMessage
	if err := rows.ScanDoc(&raw); err != nil {
		return err
	}
	id, _ := rows.ID()
	c.addDoc(b, id, raw)
	return nil
}

// addDoc adds the document raw of the row for id to b: a job, a malformed
// one, or nothing when the document is gone.
func (c *Client) addDoc(b *Batch, id string, raw json.RawMessage) {
	if gone(raw) {
		// Every view couchq reads emits WorkItems only, so a row whose
		// document is missing, deleted or no longer a WorkItem was
		// indexed from a revision that has since been replaced: on a
		// cluster the index and the document come from different
		// copies. The job is gone from this view, not malformed.
		c.log.Debug().Str("job", id).Msg("view row's document is gone; skipping")
		return
	}
	var it WorkItem
	if err := json.Unmarshal(raw, &it); err != nil {
		m := &MalformedError{Field: "document", Reason: err.Error()}
		errors.As(err, &m)
		if m.ID == "" {
			m.ID = id
		}
		var meta struct {
			Rev string `json:"_rev"`
		}
		_ = json.Unmarshal(raw, &meta)
		c.log.Info().Str("job", m.ID).Str("field", m.Field).Str("reason", m.Reason).
			Msg("skipping malformed WorkItem")
		b.Malformed = append(b.Malformed, Malformed{ID: m.ID, Rev: meta.Rev, Err: m, Raw: raw})
		return
	}
	b.Items = append(b.Items, &it)
}

// gone reports whether a view row's included document is not (or no
// longer) a WorkItem: null (deleted since it was indexed), a deletion
// stub, or a document whose type is no longer "WorkItem".
func gone(raw json.RawMessage) bool {
	var head struct {
		Deleted bool            `json:"_deleted"`
		Type    json.RawMessage `json:"type"`
	}
	if len(raw) == 0 || string(raw) == "null" || json.Unmarshal(raw, &head) != nil {
		return len(raw) == 0 || string(raw) == "null"
	}
	return head.Deleted || string(head.Type) != `"`+DocType+`"`
}
