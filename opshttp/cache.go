package opshttp

import (
	"sync"
	"time"
)

// responseCacheMax bounds how many distinct queries the cache holds; past
// it the cache starts over rather than grow with every query string.
const responseCacheMax = 64

// responseCache keeps computed responses for ttl, so that a dashboard
// polling /api/stats does not load CouchDB. Concurrent requests for the
// same key wait for one computation.
type responseCache struct {
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	entries map[string]*cacheEntry
}

type cacheEntry struct {
	ready chan struct{}
	at    time.Time
	body  []byte
	err   error
}

func (c *responseCache) get(key string, compute func() ([]byte, error)) ([]byte, error) {
	now := c.now()
	c.mu.Lock()
	e := c.entries[key]
	if e != nil {
		select {
		case <-e.ready:
			if age := now.Sub(e.at); e.err != nil || age < 0 || age >= c.ttl {
				e = nil // stale or failed: compute again
			}
		default: // being computed: wait for it
		}
	}
	if e == nil {
		if c.entries == nil || len(c.entries) >= responseCacheMax {
			c.entries = map[string]*cacheEntry{}
		}
		e = &cacheEntry{ready: make(chan struct{}), at: now}
		c.entries[key] = e
		c.mu.Unlock()
		e.body, e.err = compute()
		close(e.ready)
		return e.body, e.err
	}
	c.mu.Unlock()
	<-e.ready
	return e.body, e.err
}

// clear forgets every response: after an action, the next poll shows its
// effect rather than figures from before it. A computation in flight
// finishes for those waiting on it but is not kept.
func (c *responseCache) clear() {
	c.mu.Lock()
	c.entries = nil
	c.mu.Unlock()
}
