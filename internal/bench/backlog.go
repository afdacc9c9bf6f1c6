package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/worker"
)

// runBacklog times claims (one Due query plus one Claim, as a worker's
// round) with a small and a large backlog of due jobs. Every index is
// built before timing; each claim then leaves the index one document behind,
// which the next query catches up on, as in production.
func (b *run) runBacklog(ctx context.Context, s *Section) error {
	cfg := b.cfg
	var means [2]time.Duration
	for i, size := range []int{cfg.BacklogSmall, cfg.BacklogLarge} {
		db, err := b.newDB(ctx, s, fmt.Sprintf("backlog%d", size))
		if err != nil {
			return err
		}
		c, err := b.t.open(ctx, db)
		if err != nil {
			return err
		}
		took, err := enqueueBulk(ctx, c, size)
		if err != nil {
			return err
		}
		built, err := buildViews(ctx, c)
		if err != nil {
			return err
		}
		others, err := b.buildOtherIndexes(ctx, db)
		if err != nil {
			return err
		}
		s.add(textRow(fmt.Sprintf("%d due jobs: enqueue, due view build, every index on every copy built", size),
			fmt.Sprintf("%.1f s, %.1f s, %.1f s", took.Seconds(), built.Seconds(), others.Seconds())))
		samples, err := timeClaims(ctx, c, cfg.Claims)
		if err != nil {
			return fmt.Errorf("%d due jobs: %w", size, err)
		}
		sum := Summarize(samples)
		means[i] = sum.Mean
		s.add(durRow(fmt.Sprintf("%d due jobs: claim latency mean (Due + Claim, %d claims)", size, sum.N), sum.Mean))
		s.add(durRow(fmt.Sprintf("%d due jobs: claim latency p95", size), sum.P95))
		if !cfg.Keep {
			if err := b.t.dropDB(ctx, db); err != nil {
				return err
			}
		}
	}
	s.add(numRow(fmt.Sprintf("ratio %d / %d (should stay near 1)", cfg.BacklogLarge, cfg.BacklogSmall),
		ratio(float64(means[1]), float64(means[0])), "x", 2))
	return nil
}

// timeClaims claims n jobs one round at a time, as one worker with a free
// slot does: list the first PickAmong due jobs, claim one at random. On a
// cluster the view may still list a job this loop claimed (it is read from
// a copy that has not caught up): the claim then conflicts and, as a
// worker would, the round tries again; the sample includes the retries.
func timeClaims(ctx context.Context, c *couchq.Client, n int) ([]time.Duration, error) {
	samples := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		for tries := 1; ; tries++ {
			batch, err := c.Due(ctx, jobType, worker.PickAmongDefault)
			if err != nil {
				return samples, err
			}
			if len(batch.Items) == 0 {
				return samples, errors.New("the due view ran dry")
			}
			item := batch.Items[rand.IntN(len(batch.Items))]
			_, err = c.Claim(ctx, item, "bench/backlog", time.Hour)
			if err == nil {
				break
			}
			if !errors.Is(err, couchq.ErrClaimConflict) || tries >= maxClaimTries {
				return samples, fmt.Errorf("claiming %s (try %d): %w", item.ID, tries, err)
			}
		}
		samples = append(samples, time.Since(t0))
	}
	return samples, nil
}

// maxClaimTries bounds the rounds of one timed claim: a view that lists
// only jobs already claimed for this long is a failure, not lag.
const maxClaimTries = 100
