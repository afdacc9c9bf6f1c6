package couchq

import (
	"context"
	"fmt"
	"net/http"

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
	ranges := make([]map[string]any, 0, PriorityLowest)
	for p := PriorityHighest; p <= PriorityLowest; p++ {
		ranges = append(ranges, map[string]any{
			"startkey":     []any{worker, p},
			"endkey":       []any{worker, p, ToUnix(now)},
			"include_docs": true,
			"reduce":       false,
			"limit":        limit,
		})
	}
	what := fmt.Sprintf("listing due %s jobs by priority", worker)
	if !c.singleQueries.Load() {
		b, err := c.dueMulti(ctx, ranges)
		switch {
		case err == nil:
			b.At = now
			return b, nil
		case !multiUnsupported(err):
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		c.singleQueries.Store(true)
		c.log.Info().Err(err).Msg("the server has no multi-range view queries; asking range by range")
	}
	b := &Batch{At: now}
	for _, r := range ranges {
		part, err := c.scan(c.view(ctx, "due_priority", kivik.Params(r)), what)
		if err != nil {
			return nil, err
		}
		b.Items = append(b.Items, part.Items...)
		b.Malformed = append(b.Malformed, part.Malformed...)
		if len(b.Items)+len(b.Malformed) >= limit {
			break
		}
	}
	return b, nil
}

// dueMulti reads every range of the due_priority view in one request.
func (c *Client) dueMulti(ctx context.Context, ranges []map[string]any) (*Batch, error) {
	rows := c.view(ctx, "due_priority", kivik.Param("queries", ranges))
	defer rows.Close()
	b := &Batch{}
	for rows.NextResultSet() {
		for rows.Next() {
			if err := c.scanRow(rows, b); err != nil {
				return nil, err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return b, nil
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
