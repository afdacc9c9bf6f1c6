package opshttp

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
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

// slowStats is a statsSource whose Stats takes six seconds of its clock.
type slowStats struct {
	mu    sync.Mutex
	now   time.Time
	stats atomic.Int64
}

func (s *slowStats) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now
}

func (s *slowStats) Stats(context.Context, protocol.StatsOptions) (*protocol.Stats, error) {
	s.stats.Add(1)
	time.Sleep(50 * time.Millisecond) // the other scrapes queue up meanwhile
	s.mu.Lock()
	s.now = s.now.Add(6 * time.Second)
	s.mu.Unlock()
	return &protocol.Stats{}, nil
}

func (s *slowStats) Counts(context.Context) (map[string]map[protocol.Status]int64, error) {
	return nil, nil
}

func (s *slowStats) ReadSites(context.Context) (*protocol.SitesDoc, error) { return nil, nil }

func (s *slowStats) SiteHeartbeats(context.Context) (map[string]protocol.SiteHeartbeat, error) {
	return nil, nil
}

// Scrapes that wait for a refresh slower than CacheTTL use its figures:
// one refresh for five scrapes at once, not one each in turn.
func TestCollectorScrapesWaitingForASlowRefreshShareIt(t *testing.T) {
	src := &slowStats{now: time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)}
	c := newCollector(context.Background(), src, Config{CacheTTL: 5 * time.Second, Now: src.Now})
	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			ch := make(chan prometheus.Metric, 100)
			go func() {
				for range ch {
				}
			}()
			c.Collect(ch)
			close(ch)
		})
	}
	wg.Wait()
	if n := src.stats.Load(); n != 1 {
		t.Errorf("five scrapes at once read the stats %d times, want once", n)
	}
}
