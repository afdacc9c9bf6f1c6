package worker

import (
	"context"
	"time"
)

// followChanges long-polls the database's _changes feed, filtered to
// WorkItems of this worker's types and their control documents, wakes the
// runners on every job change and follows pauses and resumes.
// It reconnects with backoff when the feed breaks (a server restart, say)
// and wakes the runners after reconnecting, since changes may have been
// missed meanwhile. since is where it starts: Start reads it before the
// runners' first query of the due view, so that a job enqueued between that
// query and the feed's first request still wakes them.
func (w *Worker) followChanges(ctx context.Context, since string) {
	backoff := 100 * time.Millisecond
	broken := false
	for ctx.Err() == nil && !w.stopping() {
		// An idle runner claims the jobs the feed brings from the
		// documents it includes, without a due-view read first (see
		// runner.offer and fetch); a busy one finds them in the view anyway, and the
		// server would read each document for nothing.
		docs := w.anyIdle()
		timeout := w.cfg.FeedTimeout
		if broken {
			// A short poll first: the feed counts as connected (Ready)
			// within a second of CouchDB answering again, not after a
			// whole long-poll without changes.
			timeout = min(timeout, time.Second)
		}
		fc, last, err := w.client.WaitForWork(ctx, since, w.Types(), timeout, docs)
		if err != nil {
			if ctx.Err() != nil || w.stopping() {
				return
			}
			if !broken {
				w.log.Warn().Err(err).Msg("changes feed broke; reconnecting")
			}
			broken = true
			w.noteFeed(err)
			if !w.sleep(ctx, jitter(backoff)) {
				return
			}
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		if broken {
			w.log.Info().Msg("changes feed reconnected")
			broken = false
			w.noteFeed(nil)
			w.cfg.Metrics.feedReconnected()
			w.refreshPaused(ctx) // a pause or resume may have been missed
			w.wakeAll()
		}
		backoff = 100 * time.Millisecond
		if last != "" {
			since = last
		}
		if len(fc.Controls) > 0 {
			w.refreshPaused(ctx)
			// On a cluster the feed can report a change before a majority
			// of the copies hold it, so the read may miss it: look again.
			time.AfterFunc(time.Second, func() {
				if ctx.Err() == nil {
					w.refreshPaused(ctx)
				}
			})
		}
		if fc.Joined > 0 {
			w.refreshPeers(ctx) // share the jobs with the newcomer from now on
			w.refreshPeersAgain(ctx)
		}
		fed := 0
		for _, r := range w.runners {
			r.offer(fc.Due[r.typ])
			fed += len(fc.Due[r.typ])
		}
		if fc.Jobs > 0 {
			w.wakeAll()
			// Jobs the feed brought to idle runners with their documents
			// are claimed from those, not looked for in the view.
			if w.client.Replicas() > 1 && (!docs || fed < fc.Jobs) {
				w.relook(ctx)
			}
		}
	}
}

// peerRelook is how long after a read of the registry that followed a
// registration (a peer's, or the worker's own) it is read again.
const peerRelook = time.Second

// refreshPeersAgain reads the registry again peerRelook from now. On a
// cluster the registry is listed from whichever copy of each shard range
// answers first, which may not hold the newest registration yet. Until
// the worker reads it again it may count itself alone, or miss a
// newcomer, and take its peers' jobs; while it wins those races it has no
// lost claim to make it look.
func (w *Worker) refreshPeersAgain(ctx context.Context) {
	time.AfterFunc(peerRelook, func() {
		if ctx.Err() == nil && !w.stopping() {
			w.refreshPeers(ctx)
		}
	})
}

// How long after the feed reported work on a cluster the runners look for
// it again (relook).
const (
	relookSoon  = 50 * time.Millisecond
	relookAgain = 250 * time.Millisecond
	relookLater = time.Second
)

// relook wakes the runners again a little after the feed reported work, on
// a cluster. The feed can report a job before the copies the due view is
// read from hold it (each shard range's rows come from whichever copy
// answers first), so the round it woke may not list the job, and nothing
// else would wake the runner for it until the fallback poll (30 s by
// default): the bench saw that for about one job in a hundred on an idle
// cluster. A runner busy meanwhile takes the wake-up as a fresh look.
func (w *Worker) relook(ctx context.Context) {
	for _, d := range []time.Duration{relookSoon, relookAgain, relookLater} {
		time.AfterFunc(d, func() {
			if ctx.Err() == nil && !w.stopping() {
				w.wakeAll()
			}
		})
	}
}

// refreshPaused reads the control documents of the worker's types and
// pauses or resumes their runners; a resumed runner looks for work at once.
// When they cannot be read, nothing changes (the next feed change or
// reconnect reads them again).
func (w *Worker) refreshPaused(ctx context.Context) {
	w.pauseMu.Lock() // one read at a time: an older read never lands last
	defer w.pauseMu.Unlock()
	qctx, cancel := context.WithTimeout(ctx, w.cfg.QueryTimeout)
	paused, err := w.client.Paused(qctx, w.Types()...)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn().Err(err).Msg("reading which job types are paused; keeping the current state")
		}
		return
	}
	for _, r := range w.runners {
		now := paused[r.typ]
		if r.paused.Swap(now) == now {
			continue
		}
		if now {
			w.log.Info().Str("type", r.typ).Msg("job type paused: not claiming it; running jobs finish")
			continue
		}
		w.log.Info().Str("type", r.typ).Msg("job type resumed")
		r.nudge()
	}
}

// anyIdle reports whether a runner waits for work with a slot free: the
// last round left nothing due behind.
func (w *Worker) anyIdle() bool {
	for _, r := range w.runners {
		if !r.paused.Load() && !r.behind.Load() && r.free() > 0 {
			return true
		}
	}
	return false
}
