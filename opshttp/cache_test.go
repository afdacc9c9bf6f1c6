package opshttp

import (
	"testing"
	"time"

	"github.com/couchq/couchq/internal/opstest"
)

func TestResponseCache(t *testing.T) {
	t.Parallel()
	clk := opstest.NewClock(time.Unix(1000, 0))
	c := &responseCache{ttl: 5 * time.Second, now: clk.Now}
	calls := 0
	compute := func() ([]byte, error) { calls++; return []byte{byte(calls)}, nil }
	get := func(key string) byte {
		b, err := c.get(key, compute)
		if err != nil {
			t.Fatal(err)
		}
		return b[0]
	}
	first, again := get("a"), get("a") // the second from the cache
	if first != 1 || again != 1 || get("b") != 2 {
		t.Fatalf("cache did not hold within its ttl (calls %d)", calls)
	}
	clk.Set(time.Unix(1005, 0))
	if get("a") != 3 {
		t.Errorf("cache held past its ttl")
	}
	for i := range responseCacheMax + 1 {
		get(string(rune('c' + i)))
	}
	if len(c.entries) > responseCacheMax {
		t.Errorf("cache grew to %d entries", len(c.entries))
	}
}
