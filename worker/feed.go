package worker

import (
	"context"
	"time"
)

// followChanges long-polls the database's _changes feed, filtered to
// WorkItems of this worker's types, and wakes the runners on every change.
// It reconnects with backoff when the feed breaks (a server restart, say)
// and wakes the runners after reconnecting, since changes may have been
// missed meanwhile. since is where it starts: Start reads it before the
// runners' first query of the due view, so that a job enqueued between that
// query and the feed's first request still wakes them.
func (w *Worker) followChanges(ctx context.Context, since string) {
	backoff := 100 * time.Millisecond
	broken := false
	for ctx.Err() == nil && !w.stopping() {
		n, last, err := w.client.WaitForChanges(ctx, since, w.Types(), w.cfg.FeedTimeout)
		if err != nil {
			if ctx.Err() != nil || w.stopping() {
				return
			}
			if !broken {
				w.log.Warn().Err(err).Msg("changes feed broke; reconnecting")
			}
			broken = true
			if !w.sleep(ctx, jitter(backoff)) {
				return
			}
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		if broken {
			w.log.Info().Msg("changes feed reconnected")
			broken = false
			w.wakeAll()
		}
		backoff = 100 * time.Millisecond
		if last != "" {
			since = last
		}
		if n > 0 {
			w.wakeAll()
		}
	}
}
