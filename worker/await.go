package worker

import (
	"context"
	"maps"
	"slices"
	"strings"
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
// other site that has beaten and runs its own jobs (runsItsOwn). A heartbeat that
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
		if name == own || !ok || !runsItsOwn(info, b) {
			continue
		}
		from[name] = b.Rev
	}
	if len(from) == 0 {
		return nil, 0
	}
	return from, silent
}

// runsItsOwn reports whether a site whose heartbeat is hb runs its own
// jobs: it was never taken over, or it has beaten since it was (it came
// back, and its workers run the jobs enqueued for it since). The times
// come from two sites' clocks, which need only roughly agree: a takeover
// is a matter of minutes.
func runsItsOwn(info protocol.SiteInfo, hb protocol.SiteHeartbeat) bool {
	return info.TakenOverBy == "" || hb.At > info.TakenOverAt
}

// decideAwait reads the sites' heartbeats and decides whether the worker
// waits before it claims (w.awaitFrom); it beats for the site either way,
// marking the heartbeat while the worker waits. Called by register,
// before the worker's own first heartbeat, which would make the site look
// alive.
func (w *Worker) decideAwait(ctx context.Context) {
	if w.cfg.AwaitSites > 0 && w.client.Site() != "" {
		sites, err := w.client.ReadSites(ctx)
		var beats map[string]protocol.SiteHeartbeat
		if err == nil && sites != nil {
			beats, err = w.client.SiteHeartbeats(ctx)
		}
		if err != nil {
			w.log.Warn().Err(err).Msg("reading the sites' heartbeats: claiming without waiting to hear from the other sites")
		} else if from, silent := sitesToAwait(w.client.Site(), sites, beats, w.cfg.Now(), w.cfg.HeartbeatInterval); len(from) > 0 {
			w.awaitFrom = from
			w.log.Info().Strs("sites", sortedKeys(from)).Dur("silent", silent.Round(time.Second)).Dur("up_to", w.cfg.AwaitSites).
				Msg("this site's workers were stopped: waiting to hear twice from the other sites before claiming, so that what they did meanwhile (a takeover of this site's jobs) is here first")
		}
	}
	beat := w.client.Beat
	if w.awaitFrom != nil {
		beat = w.client.BeatCatchingUp
	} else {
		close(w.claimable)
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
	last := maps.Clone(w.awaitFrom) // w.awaitFrom stays as it is: Ready names its sites
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
	close(w.claimable)
	if err := w.client.Beat(ctx); err != nil && ctx.Err() == nil {
		w.log.Warn().Err(err).Msg("writing the site's heartbeat")
	}
}

// untilClaimable waits until the worker may claim; false when ctx ended
// first.
func (w *Worker) untilClaimable(ctx context.Context) bool {
	select {
	case <-w.claimable:
		return true
	case <-ctx.Done():
		return false
	}
}

// awaiting reports whether the worker still waits to hear from the
// other sites.
func (w *Worker) awaiting() bool {
	if w.awaitFrom == nil {
		return false
	}
	select {
	case <-w.claimable:
		return false
	default:
		return true
	}
}

// awaitedSites names the sites the worker waits for, for Ready.
func (w *Worker) awaitedSites() string {
	return strings.Join(sortedKeys(w.awaitFrom), ", ")
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
