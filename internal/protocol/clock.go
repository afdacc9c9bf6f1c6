package protocol

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// ClockSkew estimates how far the client's clock (Config.Now) is ahead of
// the server's, negative when it is behind, from the Date header of a
// request to the server's root. The header counts whole seconds, so the
// estimate is good to about half a second plus half the request's round
// trip. ok is false when the client cannot read the header: it was not
// opened through a Server on Apache CouchDB (Server.Open), or the server
// sent no date.
//
// couchq keeps no shared clock: leases, schedules and heartbeats are
// written and judged on the clocks of the processes that write and read
// them. The server's clock is the one every process can compare its own
// with.
func (c *Client) ClockSkew(ctx context.Context) (skew time.Duration, ok bool, err error) {
	if c.couch == nil {
		return 0, false, nil
	}
	before := c.now()
	resp, err := c.couch.DoReq(ctx, http.MethodGet, "/", nil)
	after := c.now()
	if err != nil {
		return 0, false, fmt.Errorf("reading the server's clock: %w", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	date, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		return 0, false, nil
	}
	// The server's second began at date: on average it was half a second
	// on when the server answered, half way through the request.
	mid := before.Add(after.Sub(before) / 2)
	return mid.Sub(date.Add(500 * time.Millisecond)), true, nil
}
