package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/couchq/couchq/internal/protocol"
)

// featureRounds is how many enqueues or slot rounds each feature row
// averages over.
const featureRounds = 100

// runFeatures measures what the scheduling features cost in HTTP requests
// and time: an enqueue plain and with a unique key (new, and a duplicate),
// a rate limit's start-slot round and a fleet concurrency limit's run-slot
// round (take and release), each as a worker makes it before a claim.
func (b *run) runFeatures(ctx context.Context, s *Section) error {
	db, err := b.newDB(ctx, s, "features")
	if err != nil {
		return err
	}
	c, err := b.t.open(ctx, db)
	if err != nil {
		return err
	}
	measure := func(what string, each func(i int) error) error {
		traffic0 := b.t.stats.snapshot()
		start := time.Now()
		for i := range featureRounds {
			if err := each(i); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
		}
		took := time.Since(start)
		n := b.t.stats.snapshot().since(traffic0).requests()
		if b.cfg.Instrument {
			s.add(numRow(what+": HTTP requests", float64(n)/featureRounds, "", 2))
		}
		s.add(durRow(what+": time each", took/featureRounds))
		return nil
	}
	if err := measure("enqueue", func(int) error {
		_, err := c.Enqueue(ctx, protocol.NewJob{Worker: "plain"})
		return err
	}); err != nil {
		return err
	}
	unique := func(i int) protocol.NewJob {
		return protocol.NewJob{Worker: "uniq", Unique: protocol.UniqueOpts{Key: fmt.Sprint(i)}}
	}
	if err := measure("enqueue with a new unique key", func(i int) error {
		_, err := c.Enqueue(ctx, unique(i))
		return err
	}); err != nil {
		return err
	}
	if err := measure("enqueue of a unique key already queued", func(i int) error {
		if _, err := c.Enqueue(ctx, unique(i)); err == nil {
			return fmt.Errorf("key %d enqueued twice", i)
		}
		return nil
	}); err != nil {
		return err
	}
	rl := protocol.RateLimit{N: featureRounds, Per: time.Hour}
	if err := measure("rate limit: one start slot taken (per claim round)", func(int) error {
		got, _, _, err := c.AcquireStarts(ctx, "limited", rl, 1, "bench")
		if err == nil && got != 1 {
			err = fmt.Errorf("took %d start slots, want 1", got)
		}
		return err
	}); err != nil {
		return err
	}
	return measure("fleet concurrency: a run slot taken and released (per job)", func(int) error {
		slots, err := c.AcquireRunSlots(ctx, "fleet", 16, 1, "bench", time.Minute)
		if err != nil {
			return err
		}
		if len(slots) != 1 {
			return fmt.Errorf("took %d run slots, want 1", len(slots))
		}
		return c.ReleaseRunSlots(ctx, slots)
	})
}
