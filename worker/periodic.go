package worker

import (
	"context"
	"time"

	"github.com/couchq/couchq/internal/protocol"
)

// periodicLoop enqueues the schedule's jobs tick by tick until claiming
// stops: it sleeps until the next tick, then lets TickPeriodic enqueue it
// (or find that another process did). ticked is called once its first
// tick has been written, or has failed.
func (w *Worker) periodicLoop(ctx context.Context, p protocol.Periodic, ticked func()) {
	ticks, err := protocol.CheckPeriodic(p) // checked in New: cannot fail here
	if err != nil {
		w.log.Error().Err(err).Msg("periodic schedule")
		return
	}
	log := w.log.With().Str("schedule", p.Name).Str("type", p.Job.Worker).Logger()
	backoff := 100 * time.Millisecond
	for {
		if !w.untilClaimable(ctx) {
			return
		}
		next, enqueued, err := w.client.TickPeriodic(ctx, p, ticks, w.by)
		ticked()
		wait := time.Until(next)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn().Err(err).Dur("retry_in", backoff).Msg("periodic schedule: enqueueing its tick failed")
			wait = backoff
			backoff = min(backoff*2, 10*time.Second)
		case err == nil && next.IsZero():
			// Checked in New to fire at least once in five years; past
			// its last tick it has none left.
			log.Warn().Msg("periodic schedule: no further tick; it stops")
			return
		case err == nil:
			backoff = 100 * time.Millisecond
			for _, id := range enqueued {
				log.Info().Str("job", id).Time("next", next).Msg("periodic job enqueued")
			}
		}
		if !w.sleep(ctx, max(wait, 10*time.Millisecond)) {
			return
		}
	}
}
