package protocol

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
}

// WaitForChanges long-polls the _changes feed from since ("now" for only
// future changes) for claimable WorkItems (unclaimed, not running or
// finished) of the given types (all types when empty) and their control
// documents, and returns how many changes arrived and the sequence to
// continue from. It returns (0, since, nil) when timeout passes with no
// change.
func (c *Client) WaitForChanges(ctx context.Context, since string, types []string, timeout time.Duration) (int, string, error) {
	fc, last, err := c.WaitForWork(ctx, since, types, timeout)
	return fc.Jobs + len(fc.Controls), last, err
}

// WaitForWork is WaitForChanges telling job changes and control changes
// apart: what a worker follows.
func (c *Client) WaitForWork(ctx context.Context, since string, types []string, timeout time.Duration) (FeedChanges, string, error) {
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
	var ids []string
	var err error
	last := since
	if c.couch != nil {
		ids, last, err = c.waitForChangesSelector(ctx, since, types, timeout)
	} else {
		ids, last, err = c.waitForChangesFilter(ctx, since, types, timeout)
	}
	var fc FeedChanges
	for _, id := range ids {
		if typ, ok := isControlID(id); ok {
			fc.Controls = append(fc.Controls, typ)
		} else if strings.HasPrefix(id, workerIDPrefix) {
			fc.Joined++
		} else {
			fc.Jobs++
		}
	}
	return fc, last, err
}

// waitForChangesFilter follows the feed through the design document's work
// filter (servers without _selector) and returns the changed ids.
func (c *Client) waitForChangesFilter(ctx context.Context, since string, types []string, timeout time.Duration) ([]string, string, error) {
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
	if c.cfg.Site != "" {
		params["site"] = c.cfg.Site
		if st := c.siteView(); !st.multi || st.def == c.cfg.Site {
			params["unsited"] = "mine"
		}
	}
	changes := c.db.Changes(reqCtx, kivik.Params(params))
	defer changes.Close()
	var ids []string
	for changes.Next() {
		ids = append(ids, changes.ID())
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
	return ids, last, nil
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
