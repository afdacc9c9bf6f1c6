package protocol

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-kivik/kivik/v4"
)

// RateLimit bounds how many jobs of a type start per window, across every
// worker process together, with no coordinator: a window of Per (aligned
// to the Unix epoch) has N start slots, documents "ratelimit:<type>:<k>"
// for k < N, and starting a job takes one by writing the current window
// into it over the revision read. CouchDB's conflict check lets one writer
// take each slot per window; on a cluster only a write a majority of the
// copies took counts, as with claims.
type RateLimit struct {
	N   int
	Per time.Duration
}

// MaxRateSlots bounds RateLimit.N: each slot is a document read on every
// acquisition.
const MaxRateSlots = 1000

// ParseRate parses "N/s", "N/m", "N/h" or "N/<duration>" (e.g. "10/500ms").
func ParseRate(s string) (RateLimit, error) {
	n, per, ok := strings.Cut(strings.TrimSpace(s), "/")
	count, err := strconv.Atoi(strings.TrimSpace(n))
	if !ok || err != nil || count < 1 || count > MaxRateSlots {
		return RateLimit{}, fmt.Errorf("rate %q: want N/s, N/m, N/h or N/DURATION with N from 1 to %d", s, MaxRateSlots)
	}
	var d time.Duration
	switch per = strings.TrimSpace(per); per {
	case "s":
		d = time.Second
	case "m":
		d = time.Minute
	case "h":
		d = time.Hour
	default:
		if d, err = time.ParseDuration(per); err != nil {
			return RateLimit{}, fmt.Errorf("rate %q: unknown period %q (want s, m, h or a duration)", s, per)
		}
	}
	if d < 100*time.Millisecond {
		return RateLimit{}, fmt.Errorf("rate %q: the period must be at least 100ms", s)
	}
	return RateLimit{N: count, Per: d}, nil
}

func (r RateLimit) String() string { return fmt.Sprintf("%d/%s", r.N, r.Per) }

// Window is the start of the window t falls in.
func (r RateLimit) Window(t time.Time) time.Time {
	return time.Unix(0, t.UnixNano()/int64(r.Per)*int64(r.Per))
}

// RateSlotDocType is the type of a rate limit's slot documents.
const RateSlotDocType = "RateSlot"

// RateSlotID is the id of slot k of a type's rate limit.
func RateSlotID(worker string, k int) string { return "ratelimit:" + worker + ":" + strconv.Itoa(k) }

// rateSlot is a slot document: which window last took it.
type rateSlot struct {
	ID     string  `json:"_id"`
	Rev    string  `json:"_rev,omitempty"`
	Type   string  `json:"type"`
	Worker string  `json:"worker"`
	Window float64 `json:"window"`
	By     string  `json:"by,omitempty"`
}

// AcquireStarts takes up to want start slots of the current window for
// jobs of type worker. It returns how many it took and, when that is
// fewer than want because the window's slots are gone, when the next
// window begins. One read of the slots and one _bulk_docs write (and on a
// cluster one read confirming the slots taken: confirmSlots).
func (c *Client) AcquireStarts(ctx context.Context, worker string, r RateLimit, want int, by string) (got int, window, next time.Time, err error) {
	return c.AcquireStartsFor(ctx, worker, r, c.now(), want, by)
}

// AcquireStartsFor is AcquireStarts for the window at falls in, which may
// be a later one: a runner whose round of taking slots lasts longer than
// what is left of the window takes the next window's slots ahead, and
// claims once it begins. A slot taken for a later window is no longer free
// in the earlier one: still at most N starts per window.
func (c *Client) AcquireStartsFor(ctx context.Context, worker string, r RateLimit, at time.Time, want int, by string) (got int, window, next time.Time, err error) {
	window = r.Window(at)
	next = window.Add(r.Per)
	if want <= 0 {
		return 0, window, next, nil
	}
	keys := make([]string, r.N)
	for k := range keys {
		keys[k] = RateSlotID(worker, k)
	}
	rows := c.db.AllDocs(ctx, kivik.Params(map[string]any{"keys": keys, "include_docs": true}))
	taken := map[string]bool{}
	var free []any
	for rows.Next() {
		id, _ := rows.ID()
		var s rateSlot
		if err := rows.ScanDoc(&s); err == nil && s.Type == RateSlotDocType {
			if s.Window >= ToUnix(window) {
				taken[id] = true
				continue
			}
			free = append(free, &rateSlot{ID: id, Rev: s.Rev, Type: RateSlotDocType, Worker: worker, Window: ToUnix(window), By: by})
			taken[id] = true
		}
	}
	if err := rows.Err(); err != nil {
		return 0, window, next, fmt.Errorf("reading the rate limit slots of %s: %w", worker, err)
	}
	for _, id := range keys {
		if !taken[id] { // never used: created by the first taker
			free = append(free, &rateSlot{ID: id, Type: RateSlotDocType, Worker: worker, Window: ToUnix(window), By: by})
		}
	}
	if len(free) == 0 {
		return 0, window, next, nil
	}
	// Each holder starts from its own place among the slots, so that
	// processes take different slots: on a cluster two writes of one slot
	// through different nodes can both be answered 202, and then neither
	// counts.
	spreadSlots(free, r.N, by, func(d any) string { return d.(*rateSlot).ID })
	free = free[:min(want, len(free))]
	tctx, trace := c.traced(ctx)
	res, err := c.db.BulkDocs(tctx, free, c.claimOpts(true)...)
	if err != nil {
		return 0, window, next, fmt.Errorf("taking rate limit slots of %s: %w", worker, err)
	}
	committed := c.committedSlots(ctx, res, trace)
	// Another leaf holds the slot when it was taken for this window or a
	// later one.
	stands := c.confirmSlots(ctx, committed, func(doc json.RawMessage) bool {
		var s rateSlot
		return json.Unmarshal(doc, &s) == nil && s.Window >= ToUnix(window)
	})
	return len(stands), window, next, nil
}

// spreadSlots orders free slot documents (ids ending in ":k", k < n) from
// the holder's own starting place round the ring, so that holders try
// different slots first.
func spreadSlots[T any](free []T, n int, holder string, id func(any) string) {
	h := fnv.New32a()
	_, _ = h.Write([]byte(holder))
	start := int(h.Sum32() % uint32(n))
	pos := func(d T) int {
		raw := id(d)
		k, _ := strconv.Atoi(raw[strings.LastIndexByte(raw, ':')+1:])
		return (k - start + n) % n
	}
	sort.Slice(free, func(i, j int) bool { return pos(free[i]) < pos(free[j]) })
}
