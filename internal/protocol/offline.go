package protocol

import "time"

// Offline is a client without a database, for building the documents a
// job goes through as a real client would (couchqtest runs handlers on
// them). Only Draft, DraftClaim and MaxAttempts may be called on it.
func Offline(cfg Config) *Client {
	cfg = cfg.WithDefaults()
	return &Client{cfg: cfg, log: cfg.Logger, n: 1}
}

// Draft is the document enqueueing j stores.
func (c *Client) Draft(j NewJob) (*WorkItem, error) { return c.item(j) }

// DraftClaim is what claiming it for by, with lease, stores (a copy).
func (c *Client) DraftClaim(it *WorkItem, by string, lease time.Duration) *WorkItem {
	return c.claimed(it, by, lease, c.now())
}
