package worker

import (
	"context"
	"sync"
	"time"
)

// clockCheckInterval is how often a worker compares its clock with the
// server's.
const clockCheckInterval = time.Minute

// clockWatch paces a worker's clock checks (checkClock) and remembers
// whether it last found its clock off, so that it warns once per episode.
type clockWatch struct {
	mu   sync.Mutex
	next time.Time
	off  bool
}

// clockSkewLimit is how far a worker's clock may be from the server's
// before it warns: three eighths of sweepSkew (a quarter of the lease with
// the default heartbeat), at least 2 s. Two processes each within it of
// the server's clock are within three quarters of sweepSkew of each
// other.
func (w *Worker) clockSkewLimit() time.Duration {
	return max(2*time.Second, w.sweepSkew()*3/8)
}

// sweepSkew is how far apart two workers' clocks must be for one to sweep
// the other's running jobs. Leases are written on the claimant's clock
// and judged on the sweeper's, and a lease is renewed every heartbeat, so
// clocks that differ by the lease less a heartbeat (two thirds of the
// lease by default) have live jobs swept and run again: a process whose
// clock is behind loses its running jobs to others, one whose clock is
// ahead sweeps theirs.
func (w *Worker) sweepSkew() time.Duration {
	return w.cfg.LeaseDuration - w.cfg.HeartbeatInterval
}

// checkClock compares the worker's clock with the server's, at most every
// clockCheckInterval, and warns when it is off by more than
// clockSkewLimit (and says so when it is back within it). A server whose
// date the worker cannot read is not checked.
func (w *Worker) checkClock(ctx context.Context) {
	c := &w.clock
	c.mu.Lock()
	if time.Now().Before(c.next) {
		c.mu.Unlock()
		return
	}
	c.next = time.Now().Add(clockCheckInterval)
	c.mu.Unlock()
	skew, ok, err := w.client.ClockSkew(ctx)
	if err != nil || !ok {
		return // an unreachable server is reported by the heartbeat
	}
	w.cfg.Metrics.clockSkewIs(skew)
	limit := w.clockSkewLimit()
	off := skew > limit || skew < -limit
	c.mu.Lock()
	was := c.off
	c.off = off
	c.mu.Unlock()
	switch {
	case off && !was:
		way, by := "ahead of", skew
		if skew < 0 {
			way, by = "behind", -skew
		}
		w.log.Warn().Dur("skew", skew).Dur("limit", limit).
			Msgf("this process's clock is %s %s the CouchDB server's: leases are written and judged on the workers' own clocks, and workers whose clocks differ by the lease less a heartbeat (%s) or more sweep each other's running jobs, which then run twice; keep every machine's clock in sync (NTP)",
				by.Round(100*time.Millisecond), way, w.sweepSkew().Round(time.Millisecond))
	case !off && was:
		w.log.Info().Dur("skew", skew).Msg("this process's clock agrees with the CouchDB server's again")
	}
}
