package couchq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/designdocs"
)

// grace is how long past the server-side timeout the client waits for a
// long-poll to end by itself. Some servers (PouchDB Server) ignore the
// timeout parameter; the client deadline ends the request there.
func grace(timeout time.Duration) time.Duration {
	return min(5*time.Second, timeout/4+100*time.Millisecond)
}

// WaitForChanges long-polls the _changes feed from since ("now" for only
// future changes) for claimable WorkItems (unclaimed, not running or
// finished) of the given types (all types when empty) and returns how many
// changes arrived and the sequence to continue from.
// It returns (0, since, nil) when timeout passes with no change.
func (c *Client) WaitForChanges(ctx context.Context, since string, types []string, timeout time.Duration) (int, string, error) {
	if since == "now" || since == "" {
		// Resolve "now" to a real sequence: a feed that ends by the client's
		// deadline (a server that ignores timeout) returns no last_seq, and
		// polling from "now" again would lose the changes in between.
		seq, err := c.UpdateSeq(ctx)
		if err != nil {
			return 0, since, err
		}
		since = seq
	}
	if c.selectorFeed != nil {
		return c.waitForChangesSelector(ctx, since, types, timeout)
	}
	reqCtx, cancel := context.WithTimeout(ctx, timeout+grace(timeout))
	defer cancel()
	params := map[string]any{
		"feed":    "longpoll",
		"since":   since,
		"timeout": timeout.Milliseconds(),
		"filter":  designdocs.Name + "/work",
	}
	if len(types) > 0 {
		params["types"] = strings.Join(types, ",")
	}
	changes := c.db.Changes(reqCtx, kivik.Params(params))
	defer changes.Close()
	n := 0
	for changes.Next() {
		n++
	}
	if err := changes.Err(); err != nil {
		if ctx.Err() == nil && errors.Is(reqCtx.Err(), context.DeadlineExceeded) {
			return 0, since, nil // our own deadline: a quiet feed
		}
		return 0, since, fmt.Errorf("following changes since %s: %w", since, err)
	}
	last := since
	if meta, err := changes.Metadata(); err == nil && meta.LastSeq != "" {
		last = meta.LastSeq
	}
	return n, last, nil
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
