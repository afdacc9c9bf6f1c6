package worker

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/couchq/couchq/internal/protocol"
)

// A site's database is as current as its inbound links. A site that was
// down (its server, or all its workers) restarts from its own copy, and
// what the other sites did meanwhile arrives only as the links catch up:
// above all a takeover of this site's jobs. A worker that claimed before
// would run a job another site now owns, and it would run twice. So a
// worker that starts after its site's workers were all stopped holds its
// claims (and sweeps and periodic ticks) until the other sites have been
// heard from twice, or Config.AwaitSites has passed.
//
// Twice, because a link brings a site's changes in the order the site
// made them, each document at its latest revision: the first heartbeat
// that arrives may come before documents the site changed just after
// writing it (the jobs it runs, say), the second was written after the
// link's first read, so everything the site wrote before that read has
// arrived with it. Revisions, not times, tell a new heartbeat from an old
// one: the sites' clocks need not agree.

// awaitStale is how many of its own heartbeat intervals a site's last
// heartbeat must be older than for a starting worker to wait: as long as
// Ready allows a worker without contact, so a site whose workers were
// only restarting does not wait.
const awaitStale = readyHeartbeats

// sitesToAwait returns the sites a worker of site own starting at now
// waits to hear from, each with its heartbeat's revision as this database
// has it: none when the site's workers beat until a moment ago (its copy
// is as current as its links) or never beat (a new site), else every
// other site that has beaten and runs its own jobs (protocol.RunsItsOwn). A heartbeat that
// says the site is catching up counts as stale: another worker of the
// site is waiting already, and this one must not claim before it.
func sitesToAwait(own string, sites *protocol.SitesDoc, beats map[string]protocol.SiteHeartbeat, now time.Time, interval time.Duration) (map[string]string, time.Duration) {
	if own == "" || sites == nil {
		return nil, 0
	}
	hb, ok := beats[own]
	if !ok {
		return nil, 0
	}
	silent := now.Sub(protocol.FromUnix(hb.At))
	if !hb.CatchingUp && silent <= awaitStale*interval {
		return nil, 0
	}
	from := map[string]string{}
	for name, info := range sites.Sites {
		b, ok := beats[name]
		if name == own || !ok || !protocol.RunsItsOwn(info, b) {
			continue
		}
		from[name] = b.Rev
	}
	if len(from) == 0 {
		return nil, 0
	}
	return from, silent
}

// siteGate holds the worker's claims (and sweeps and periodic ticks)
// while it waits to hear from the other sites. It is open when the worker
// may claim.
type siteGate struct {
	mu sync.Mutex
	// open is closed while the worker may claim.
	open chan struct{}
	// from are the sites waited for, with their heartbeats' revisions
	// when the wait began; nil when not waiting for any.
	from map[string]string
	// outage says the gate was closed because CouchDB was not reached for
	// as long as a site's workers count as stopped.
	outage bool
}

// wait waits until the gate is open; false when ctx ended first.
func (g *siteGate) wait(ctx context.Context) bool {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
		return true
	case <-ctx.Done():
		return false
	}
}

// waiting reports whether the gate holds claims for sites to be heard.
func (g *siteGate) waiting() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.from == nil {
		return false
	}
	select {
	case <-g.open:
		return false
	default:
		return true
	}
}

// sites are the sites waited for: a copy.
func (g *siteGate) sites() map[string]string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return maps.Clone(g.from)
}

// await holds claims until the sites of from are heard (awaitSites
// opens the gate); from nil opens it at once.
func (g *siteGate) await(from map[string]string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.from, g.outage = from, false
	if from == nil {
		g.openLocked()
	}
}

// holdForOutage closes an open gate: CouchDB has not been reached for
// as long as a site's workers count as stopped. It reports whether it
// closed it.
func (g *siteGate) holdForOutage() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		return false // closed already
	}
	g.open, g.from, g.outage = make(chan struct{}), nil, true
	return true
}

// heldForOutage reports whether the gate is closed for an outage and not
// yet waiting for sites.
func (g *siteGate) heldForOutage() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.outage
}

// release opens the gate.
func (g *siteGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.outage = false
	g.openLocked()
}

func (g *siteGate) openLocked() {
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

// sitesToHear reads the sites' heartbeats and says which sites a worker
// must hear from before it claims (sitesToAwait): nil for none, or when
// they cannot be read (logged).
func (w *Worker) sitesToHear(ctx context.Context) (map[string]string, time.Duration) {
	sites, err := w.client.ReadSites(ctx)
	var beats map[string]protocol.SiteHeartbeat
	if err == nil && sites != nil {
		beats, err = w.client.SiteHeartbeats(ctx)
	}
	if err != nil {
		w.log.Warn().Err(err).Msg("reading the sites' heartbeats: claiming without waiting to hear from the other sites")
		return nil, 0
	}
	return sitesToAwait(w.client.Site(), sites, beats, w.cfg.Now(), w.cfg.HeartbeatInterval)
}

// decideAwait reads the sites' heartbeats and decides whether the worker
// waits before it claims (w.gate); it beats for the site either way,
// marking the heartbeat while the worker waits. Called by register,
// before the worker's own first heartbeat, which would make the site look
// alive.
func (w *Worker) decideAwait(ctx context.Context) {
	var from map[string]string
	if w.cfg.AwaitSites > 0 && w.client.Site() != "" {
		var silent time.Duration
		if from, silent = w.sitesToHear(ctx); len(from) > 0 {
			w.log.Info().Strs("sites", sortedKeys(from)).Dur("silent", silent.Round(time.Second)).Dur("up_to", w.cfg.AwaitSites).
				Msg("this site's workers were stopped: waiting to hear twice from the other sites before claiming, so that what they did meanwhile (a takeover of this site's jobs) is here first")
		} else {
			from = nil
		}
	}
	w.gate.await(from)
	beat := w.client.Beat
	if from != nil {
		beat = w.client.BeatCatchingUp
	}
	// The site's heartbeat now, not a heartbeat interval later: until the
	// first, couchq sites says the site was never heard from.
	if err := beat(ctx); err != nil {
		w.log.Warn().Err(err).Msg("writing the site's heartbeat")
	}
}

// awaitSites polls the heartbeats until every site of w.awaitFrom has
// beaten twice since the worker started, or Config.AwaitSites has passed,
// then lets the worker claim.
func (w *Worker) awaitSites(ctx context.Context) {
	heard := map[string]int{}
	last := w.gate.sites()
	deadline := time.Now().Add(w.cfg.AwaitSites)
	poll := min(w.cfg.HeartbeatInterval/4, 250*time.Millisecond)
	for {
		beats, err := w.client.SiteHeartbeats(ctx)
		if err != nil && ctx.Err() == nil {
			w.log.Warn().Err(err).Msg("reading the sites' heartbeats")
		}
		var waiting []string
		for site, rev := range last {
			if b, ok := beats[site]; ok && b.Rev != rev {
				heard[site]++
				last[site] = b.Rev
			}
			if heard[site] < 2 {
				waiting = append(waiting, site)
			}
		}
		if len(waiting) == 0 {
			w.log.Info().Msg("heard from the other sites: claiming")
			break
		}
		w.keepLinks(ctx)
		if time.Now().After(deadline) {
			slices.Sort(waiting)
			w.log.Warn().Strs("sites", waiting).Dur("waited", w.cfg.AwaitSites).
				Msg("not heard from these sites (down, or their links to this one): claiming anyway; a takeover they made meanwhile may not be here yet")
			break
		}
		if !w.sleep(ctx, poll) {
			return
		}
	}
	w.gate.release()
	if err := w.client.Beat(ctx); err != nil && ctx.Err() == nil {
		w.log.Warn().Err(err).Msg("writing the site's heartbeat")
	}
}

// linkCheckInterval is how often a worker of a site looks for failed
// links into its database to restart, and how long a restart (by any
// worker of the site) holds before the link may be restarted again.
const linkCheckInterval = 10 * time.Second

// linkKeeper paces a worker's restarts of failed links (keepLinks).
type linkKeeper struct {
	mu sync.Mutex
	// next is when the worker may look at the links again.
	next time.Time
	// outOfReach is set once the worker found it may not restart links.
	outOfReach bool
}

// keepLinks restarts the failed links into this site's database, at most
// every linkCheckInterval (protocol.Client.RestartFailedLinks). CouchDB's
// replicator starts a failed link again only after a backoff that doubles
// with each failure, up to hours: the link from a site that was down for
// an hour could come back up to half an hour after the site, and a site that
// restarted would wait to hear through a link its replicator holds back.
// A worker that may not restart links (credentials that are not a server
// admin's, or no replicator) says so once and stops looking.
func (w *Worker) keepLinks(ctx context.Context) {
	k := &w.links
	k.mu.Lock()
	if k.outOfReach || time.Now().Before(k.next) {
		k.mu.Unlock()
		return
	}
	k.next = time.Now().Add(linkCheckInterval)
	k.mu.Unlock()
	restarted, err := w.client.RestartFailedLinks(ctx, linkCheckInterval)
	for _, l := range restarted {
		w.log.Info().Str("from", l.From).Str("link", l.DocID).Str("state", l.State).Str("error", l.Error).
			Msg("restarted a failed link into this site: CouchDB's replicator had backed it off, and would have started it again only later")
	}
	switch {
	case errors.Is(err, protocol.ErrLinksOutOfReach):
		k.mu.Lock()
		k.outOfReach = true
		k.mu.Unlock()
		w.log.Info().Err(err).Msg("not restarting failed links into this site (that takes a server admin's credentials on Apache CouchDB): a link the replicator backed off brings the other sites' changes only when it starts again")
	case err != nil && ctx.Err() == nil:
		w.log.Warn().Err(err).Msg("restarting failed links into this site")
	}
}

// holdAfterOutage closes the gate when the worker has not reached CouchDB
// for as long as a site's workers count as stopped (awaitStale
// heartbeats): a server that was down, or cut off from this worker, may
// come back with a copy the links have yet to bring up to date, a
// takeover of this site's jobs above all, exactly as when the site's
// workers were all stopped. Called after each registry write.
func (w *Worker) holdAfterOutage(ctx context.Context, contactErr error, lastContact time.Time) {
	if w.cfg.AwaitSites <= 0 || w.client.Site() == "" {
		return
	}
	if contactErr != nil {
		if silent := time.Since(lastContact); silent > awaitStale*w.cfg.HeartbeatInterval && w.gate.holdForOutage() {
			w.log.Warn().Dur("silent", silent.Round(time.Second)).
				Msg("CouchDB not reached for as long as this site's workers count as stopped: holding claims, sweeps and ticks until it answers and the other sites are heard from")
		}
		return
	}
	if !w.gate.heldForOutage() {
		return
	}
	from, silent := w.sitesToHear(ctx)
	w.gate.await(from)
	if from == nil {
		w.log.Info().Msg("CouchDB answers again, and the site's heartbeat says no other site needs hearing from: claiming")
		return
	}
	w.log.Info().Strs("sites", sortedKeys(from)).Dur("silent", silent.Round(time.Second)).Dur("up_to", w.cfg.AwaitSites).
		Msg("CouchDB answers again after an outage: waiting to hear twice from the other sites before claiming, so that what they did meanwhile (a takeover of this site's jobs) is here first")
	// Not one of the worker's loops: Stop does not wait for it, and it
	// ends with ctx.
	go w.awaitSites(ctx)
}

// untilClaimable waits until the worker may claim; false when ctx ended
// first.
func (w *Worker) untilClaimable(ctx context.Context) bool { return w.gate.wait(ctx) }

// awaiting reports whether the worker holds its claims: it waits to hear
// from the other sites, or for CouchDB after an outage.
func (w *Worker) awaiting() bool { return w.gate.waiting() || w.gate.heldForOutage() }

// awaitedSites names the sites the worker waits for, for Ready.
func (w *Worker) awaitedSites() string {
	return strings.Join(sortedKeys(w.gate.sites()), ", ")
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
