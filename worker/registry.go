package worker

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/couchq/couchq/internal/protocol"
)

// registryInfo builds this process's registry document from live state.
func (w *Worker) registryInfo(info *protocol.WorkerInfo) {
	w.mu.Lock()
	running := make([]string, 0, len(w.running))
	for id := range w.running {
		running = append(running, id)
	}
	busy := w.busy
	w.mu.Unlock()
	sort.Strings(running)
	st := w.Stats()
	info.Claimant = w.by
	info.Host = hostname()
	info.PID = os.Getpid()
	info.Types = w.Types()
	info.Concurrency = w.cfg.Concurrency
	info.Running = running
	info.StartedAt = protocol.ToUnix(w.started)
	info.LastHeartbeat = protocol.ToUnix(w.cfg.Now())
	info.HeartbeatInterval = w.cfg.HeartbeatInterval.Seconds()
	info.Site = w.client.Site()
	info.BusySeconds = busy.Seconds()
	info.Claimed, info.Completed, info.Failed, info.Conflicts = st.Claimed, st.Completed, st.Failed, st.Conflicts
}

// register writes the registry document when the worker starts.
func (w *Worker) register(ctx context.Context) error {
	// Whether the database has sites, and if so which jobs are this
	// site's, before the first claim.
	if err := w.client.RefreshSites(ctx); err != nil {
		return err
	}
	if err := w.client.CheckSite(); err != nil {
		return err
	}
	if err := w.checkTakeOver(ctx); err != nil {
		return err
	}
	w.registry = &protocol.WorkerInfo{ID: protocol.WorkerDocID(hostname(), os.Getpid(), w.cfg.ID)}
	w.registryInfo(w.registry)
	w.registry.Joined = true
	err := w.client.PutWorker(ctx, w.registry)
	w.registry.Joined = false
	if err != nil {
		return err
	}
	w.checkClock(ctx)
	w.decideAwait(ctx)
	w.peers.mu.Lock()
	w.peers.joined = time.Now()
	w.peers.mu.Unlock()
	w.refreshPeers(ctx)
	w.refreshPeersAgain(ctx) // the read may miss a peer already there
	return nil
}

// heartbeatRegistry refreshes the registry document every heartbeat.
func (w *Worker) heartbeatRegistry(ctx context.Context) {
	for w.sleep(ctx, w.cfg.HeartbeatInterval) {
		w.registryInfo(w.registry)
		// Stop must not cut a write off mid-request: the server may apply
		// it anyway, after unregister deleted the document, and bring it
		// back (a cleanly stopped worker would then look dead for ever).
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.LeaseDuration)
		err := w.client.PutWorker(wctx, w.registry)
		if err == nil {
			w.refreshPeers(wctx)
			// A takeover moves the default site; a site added makes a
			// database one of sites. Either reaches the worker here.
			if serr := w.client.RefreshSites(wctx); serr != nil && ctx.Err() == nil {
				w.log.Warn().Err(serr).Msg("reading the sites document")
			}
			beat := w.client.Beat
			if w.awaiting() {
				beat = w.client.BeatCatchingUp
			}
			if serr := beat(wctx); serr != nil && ctx.Err() == nil {
				w.log.Warn().Err(serr).Msg("writing the site's heartbeat")
			}
			w.takeOverSilentSites(wctx)
			w.checkClock(wctx)
			if w.client.Site() != "" {
				w.keepLinks(wctx)
			}
		}
		cancel()
		if ctx.Err() == nil {
			w.health.mu.Lock()
			lastContact := w.health.lastContact
			w.health.mu.Unlock()
			w.noteContact(err)
			w.holdAfterOutage(ctx, err, lastContact)
		}
		if err != nil && ctx.Err() == nil {
			w.log.Warn().Err(err).Msg("updating worker registry document failed")
		}
	}
}

// unregister removes the registry document on a clean exit.
func (w *Worker) unregister(ctx context.Context) {
	if err := w.client.DeleteWorker(ctx, w.registry); err != nil {
		w.log.Warn().Err(err).Msg("removing worker registry document failed")
	}
}

// checkTakeOver refuses a Config.TakeOver that could never take a site
// over, which would otherwise pass unnoticed until the site it was meant
// for is gone: a worker of no site, its own site, or a site the sites
// document does not list (a misspelt name).
func (w *Worker) checkTakeOver(ctx context.Context) error {
	if len(w.cfg.TakeOver) == 0 {
		return nil
	}
	own := w.client.Site()
	if own == "" {
		return fmt.Errorf("worker config: TakeOver %s: a worker takes sites over for its own site, and this one has none", strings.Join(w.cfg.TakeOver, ", "))
	}
	sites, err := w.client.ReadSites(ctx)
	if err != nil {
		return err
	}
	for _, site := range w.cfg.TakeOver {
		switch {
		case site == own:
			return fmt.Errorf("worker config: TakeOver %s: a site cannot take itself over", site)
		case sites == nil:
			return fmt.Errorf("worker config: TakeOver %s: the database has no sites document", site)
		}
		if _, ok := sites.Sites[site]; !ok {
			return fmt.Errorf("worker config: TakeOver %s: site %s is not one of the sites (%s)", site, site, strings.Join(sites.Names(), ", "))
		}
	}
	return nil
}

// takeOverSilentSites takes over the sites of Config.TakeOver whose
// heartbeat is older than Config.TakeOverAfter, once each; not while the
// worker waits to hear from the other sites (awaitSites).
func (w *Worker) takeOverSilentSites(ctx context.Context) {
	if len(w.cfg.TakeOver) == 0 || w.cfg.TakeOverAfter <= 0 || w.client.Site() == "" {
		return
	}
	if w.awaiting() {
		// This copy is as old as this site's outage: every other site's
		// heartbeat in it looks silent until the links bring the new ones.
		return
	}
	sites, err := w.client.ReadSites(ctx)
	if err != nil || sites == nil {
		return
	}
	beats, err := w.client.SiteHeartbeats(ctx)
	if err != nil {
		w.log.Warn().Err(err).Msg("reading the sites' heartbeats")
		return
	}
	now := w.cfg.Now()
	for _, site := range w.cfg.TakeOver {
		info, ok := sites.Sites[site]
		hb, beat := beats[site]
		// A site taken over before is taken over again once it came back
		// (it beat since) and went silent again: its new jobs wait for it.
		if !ok || site == w.client.Site() || (info.TakenOverBy != "" && (!beat || !protocol.RunsItsOwn(info, hb))) {
			continue
		}
		last := protocol.FromUnix(info.AddedAt) // never beat: silent since it joined
		if beat {
			last = protocol.FromUnix(hb.At)
		}
		if now.Sub(last) < w.cfg.TakeOverAfter {
			continue
		}
		moved, err := w.client.TakeOver(ctx, site, w.client.Site())
		if err != nil {
			w.log.Warn().Err(err).Str("site", site).Msg("taking over a silent site")
			continue
		}
		w.log.Warn().Str("site", site).Int("jobs", moved).Dur("silent", now.Sub(last)).
			Msg("took over a site whose heartbeat stopped")
	}
}
