package bench

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// runContention works the same backlog with 1, 4 and 16 claimants (separate
// worker.Worker values, each its own claimant with its own client) and
// counts the claims lost to 409 per job claimed.
func (b *run) runContention(ctx context.Context, s *Section) error {
	cfg := b.cfg
	h, err := noop()
	if err != nil {
		return err
	}
	b.memory.start()
	defer b.memory.stop()
	for _, n := range cfg.ContentionWorkers {
		db, err := b.newDB(ctx, s, fmt.Sprintf("contention%d", n))
		if err != nil {
			return err
		}
		c, err := b.t.open(ctx, db)
		if err != nil {
			return err
		}
		if _, err := enqueueBulk(ctx, c, cfg.ContentionJobs); err != nil {
			return err
		}
		if _, err := buildViews(ctx, c); err != nil {
			return err
		}
		traffic0 := b.t.stats.snapshot()
		cpu0 := b.t.cpu()
		conc := slices.Repeat([]int{cfg.ContentionConcurrency}, n)
		// Timed from before the workers start: the first ones claim while
		// the others are still starting, and on a small backlog (the
		// cluster's) they can finish it before the last one has started.
		began := time.Now()
		p, err := startPool(ctx, b.t, db, h, conc, cfg)
		if err != nil {
			return err
		}
		waitErr := p.waitCompleted(ctx, int64(cfg.ContentionJobs), stallTimeout)
		wall := time.Since(began)
		p.stop(ctx)
		cpu1 := b.t.cpu()
		tr := b.t.stats.snapshot().since(traffic0)
		if waitErr != nil {
			return fmt.Errorf("%d workers: %w", n, waitErr)
		}
		st := p.stats()
		label := fmt.Sprintf("%d claimants x %d", n, cfg.ContentionConcurrency)
		row := s.add(numRow(label+": 409 conflicts per claimed job", ratio(float64(st.Conflicts), float64(st.Claimed)), "", 3))
		if n == targetConflictWorkers {
			per := ratio(float64(st.Conflicts), float64(st.Claimed))
			row.target(fmt.Sprintf("< %.1f", TargetConflicts), per < TargetConflicts)
			row.Key = keyConflicts
		}
		s.add(numRow(label+": throughput", rate(st.Completed, wall), "jobs/s", 0))
		s.add(numRow(label+": due-view queries per claimed job", ratio(float64(st.Queries), float64(st.Claimed)), "", 2))
		if cfg.Instrument {
			s.add(numRow(label+": HTTP requests per job", ratio(float64(tr.requests()), float64(cfg.ContentionJobs)), "", 2))
			s.add(numRow(label+": TCP connections opened per job", ratio(float64(tr.dials), float64(cfg.ContentionJobs)), "", 2))
		}
		cpuRows(s, label+": ", cpu0, cpu1, cfg.ContentionJobs)
		if !cfg.Keep {
			if err := b.t.dropDB(ctx, db); err != nil {
				return err
			}
		}
	}
	s.add(textRow("backlog of each run", fmt.Sprintf("%d jobs", cfg.ContentionJobs)))
	return nil
}
