package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// Section 9 measures what a site pays for being one of several
// (internal/protocol/sites.go and link.go): its throughput linked to
// another site against alone, how long its results take to reach the
// other sites, and its server's CPU per job of its own as sites are
// added. Site A is the single Apache CouchDB node the report measures;
// sites B and C are further single nodes started from the same release,
// each its own server, as the sites tests start them. It runs four times,
// each in fresh databases (sitesScenarios): every site enqueues SitesJobs
// jobs of its own, the links carry them to every linked site, every site
// indexes them, and then every site's workers start at once.

// sitesScenario is one run of section 9: how many sites, and whether they
// are linked.
type sitesScenario struct {
	sites  int
	linked bool
}

// sitesScenarios are section 9's runs in order, each later one compared
// with earlier ones: A alone; A and B working side by side without links
// (the machine shared, which linked / alone also measures on one machine);
// A and B linked both ways; and three sites, every pair linked both ways,
// as the sites guide advises (each hears from every other directly).
func sitesScenarios() []sitesScenario {
	return []sitesScenario{{1, false}, {2, false}, {2, true}, {3, true}}
}

func (sc sitesScenario) String() string {
	switch {
	case sc.sites == 1:
		return "1 site (A alone)"
	case !sc.linked:
		return fmt.Sprintf("%d sites side by side, not linked", sc.sites)
	case sc.sites == 2:
		return "2 sites linked both ways"
	}
	return fmt.Sprintf("%d sites, every pair linked both ways", sc.sites)
}

// siteName names the i-th site of a run: A, B, C.
func siteName(i int) string { return string(rune('A' + i)) }

// sitesSkip says why section 9 cannot run on the server ps, or "".
func sitesSkip(ps plannedServer) string {
	switch ps.kind {
	case ServerCouchDB:
		if ps.home == "" {
			return "no Apache CouchDB release to start the other sites from"
		}
		return ""
	case ServerCluster:
		return "its sites are single nodes: it runs in the single Apache CouchDB node's report, that node being site A, and not again on the cluster"
	case ServerPouchDB:
		return "its links are Apache CouchDB's replicator, which PouchDB Server lacks: it runs in the single Apache CouchDB node's report"
	}
	return "its other sites are single Apache CouchDB nodes that the bench starts from the local release next to the single node it starts, " +
		"which is site A; a server given by URL is measured alone (run it without a URL: --servers couchdb)"
}

// sitesNotes explain section 9's figures under the table.
func sitesNotes(cfg Config) []string {
	return []string{
		fmt.Sprintf("Section 9 (sites): site A is this single node; sites B and C are further single Apache CouchDB nodes (q=%d) "+
			"started from the same release on this machine, each its own server, B for the runs of two sites and C for the run of three. "+
			"Each run works in fresh databases: the sites document lists the run's sites, A the default, and each site enqueues "+
			"%d jobs naming it as their owner; linked sites pull from each other through their _replicator (three sites: every pair). "+
			"Every site holds every linked site's jobs, indexed, before every site's workers (%d goroutines each, the no-op handler) "+
			"start together; a site's throughput is its own jobs' first claim -> last done, as its documents record them.",
			clusterQ, cfg.SitesJobs, cfg.Workers),
		"Section 9: the sites share this machine's cores, so linked / alone measures the sharing as much as the links; " +
			"the side-by-side run, two sites working at once without links, tells them apart: linked / side by side is what the links themselves cost.",
		"Section 9's replication lag: the bench follows a continuous _changes feed at each site, filtered with a _selector to jobs done, " +
			"and records when each job first reads done there (a feed, not a poll: no polling interval); the lag is that time minus the job's " +
			"finished_at, written by its owner's worker with the same clock. The same read at A of A's own jobs is the measure's floor: " +
			"the owner's write and the feed's delivery.",
		"Section 9's server CPU of site A: its node's process tree (couchjs included) from before the enqueue until every job of the run " +
			"reads done at every site and A's views have caught up, over A's own jobs. Linked, the other sites' jobs cost A their replication " +
			"in and out, validation and indexing; the bench's feed at A (one filtered read per job done there) is in it too.",
	}
}

// runSites is section 9.
func (b *run) runSites(ctx context.Context, s *Section) error {
	if why := sitesSkip(b.server); why != "" {
		s.add(textRow("sites", "not measured (see the notes)"))
		b.notes = append(b.notes, "Section 9 (sites) did not run: "+why+".")
		return nil
	}
	b.notes = append(b.notes, sitesNotes(b.cfg)...)
	servers := []*target{b.t}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		for i, t := range servers[1:] {
			if err := t.close(stopCtx); err != nil {
				b.log.Warn().Err(err).Str("site", siteName(i+1)).Msg("stopping a site's server")
			}
		}
	}()
	runs := &siteRuns{}
	var outs []sitesOutcome
	for _, sc := range sitesScenarios() {
		// A site's server starts when a run first needs it, so that A
		// alone is alone on the machine.
		for len(servers) < sc.sites {
			t, err := b.startSite(ctx, siteName(len(servers)))
			if err != nil {
				return err
			}
			servers = append(servers, t)
		}
		b.log.Info().Stringer("run", sc).Msg("sites: run starting")
		out, err := b.sitesRun(ctx, s, sc, servers[:sc.sites], runs)
		if err != nil {
			return fmt.Errorf("%s: %w", sc, err)
		}
		outs = append(outs, out)
		sitesRows(s, outs, b.cfg)
	}
	s.add(numRow("jobs not run exactly once, at their owner (every run)", float64(runs.wrong()), "", 0))
	return nil
}

// startSite starts another site's server: a single Apache CouchDB node
// from the release the report's own node came from.
func (b *run) startSite(ctx context.Context, name string) (*target, error) {
	ps := plannedServer{kind: ServerCouchDB, home: b.server.home, homeFrom: b.server.homeFrom}
	t, err := connect(ctx, b.cfg, ps, b.log.With().Str("site", name).Logger())
	if err != nil {
		return nil, fmt.Errorf("starting site %s's server: %w", name, err)
	}
	return t, nil
}

// benchSite is one site of a run: its server, its database there and
// what the run started on it.
type benchSite struct {
	name   string
	t      *target
	db     string
	client *protocol.Client // enqueues
	pool   *pool
	feed   *doneFeed
}

func (st *benchSite) endpoint() protocol.SiteEndpoint {
	return protocol.SiteEndpoint{Site: st.name, URL: st.t.base, DB: st.db, User: st.t.user, Password: st.t.password, Replicator: true}
}

// sitesOutcome is what one run measured.
type sitesOutcome struct {
	sc sitesScenario
	// tput is each site's jobs/s over its own jobs, first claim -> last
	// done as their documents at the site record it, in site order.
	tput []float64
	// lag is, for each of A's jobs at each other site (linked), the time
	// from its finished_at to its first reading done there; floor is the
	// same read at A.
	lag, floor []time.Duration
	// cpu0 and cpu1 are A's server CPU before the enqueue and once every
	// job read done at every site and A's views caught up.
	cpu0, cpu1 cpuUse
	jobs       int // each site's own
	// oneCopy is, in the run of A alone, A's server CPU per job to serve
	// and store one finished copy of each of its jobs (oneCopyCPU).
	oneCopy time.Duration
}

// cpuPerJob is A's server CPU per job of its own, and the couchjs part of
// it; ok is false when the server's CPU is unknown.
func (o sitesOutcome) cpuPerJob() (all, js time.Duration, ok bool) {
	if !o.cpu0.serverOK || !o.cpu1.serverOK || o.jobs == 0 {
		return 0, 0, false
	}
	n := time.Duration(o.jobs)
	return (o.cpu1.server - o.cpu0.server) / n, o.cpu1.jsSince(o.cpu0) / n, true
}

// sitesRun runs one scenario on servers (A's first) and measures it.
func (b *run) sitesRun(ctx context.Context, s *Section, sc sitesScenario, servers []*target, runs *siteRuns) (out sitesOutcome, err error) {
	n := b.cfg.SitesJobs
	out.sc, out.jobs = sc, n
	sites := make([]*benchSite, len(servers))
	for i, t := range servers {
		sites[i] = &benchSite{name: siteName(i), t: t}
	}
	defer func() { err = errors.Join(err, b.sitesCleanup(ctx, sites)) }()
	for _, st := range sites {
		var err error
		if st.t == b.t {
			st.db, err = b.newDB(ctx, s, "sites")
		} else {
			st.db, err = st.t.newDB(ctx, "sites", b.cfg.Validation, b.log)
		}
		if err != nil {
			return out, fmt.Errorf("site %s: %w", st.name, err)
		}
	}
	if err := setUpSites(ctx, sites, sc.linked); err != nil {
		return out, err
	}
	before := make([]int, len(sites))
	for i, st := range sites {
		if before[i], err = st.t.docCount(ctx, st.db); err != nil {
			return out, err
		}
	}
	held := n // the jobs each site holds once the links have carried them
	if sc.linked {
		held = n * len(sites)
	}
	out.cpu0 = b.t.cpu()
	for _, st := range sites {
		if _, err := enqueueBulkFor(ctx, st.client, n, st.name); err != nil {
			return out, fmt.Errorf("enqueueing at site %s: %w", st.name, err)
		}
	}
	// Every site holds every linked site's jobs, indexed, before any
	// worker starts: the runs time the work, not the first copy, as
	// section 2 indexes its backlog before it times.
	for i, st := range sites {
		if err := st.t.waitDocCount(ctx, st.db, before[i]+held); err != nil {
			return out, fmt.Errorf("site %s: %w", st.name, err)
		}
	}
	for _, st := range sites {
		if _, err := st.t.bringIndexesUpToDate(ctx, st.db, autoIndexed()...); err != nil {
			return out, fmt.Errorf("site %s: %w", st.name, err)
		}
	}
	for _, st := range sites {
		if st.feed, err = followDone(ctx, st.t, st.db); err != nil {
			return out, fmt.Errorf("site %s: %w", st.name, err)
		}
	}
	h, err := noop()
	if err != nil {
		return out, err
	}
	conc := splitConcurrency(b.cfg.Workers, b.cfg.Instances)
	for _, st := range sites {
		open := func(ctx context.Context) (*protocol.Client, error) { return st.t.openSite(ctx, st.db, st.name) }
		if st.pool, err = startPoolWith(ctx, open, runs.handler(st.name, h), conc, b.cfg); err != nil {
			return out, fmt.Errorf("starting site %s's workers: %w", st.name, err)
		}
	}
	for _, st := range sites {
		if err := st.pool.waitCompleted(ctx, int64(n), stallTimeout); err != nil {
			return out, fmt.Errorf("site %s's workers: %w", st.name, err)
		}
	}
	for _, st := range sites {
		st.pool.stop(ctx)
		st.pool = nil
	}
	for _, st := range sites {
		if err := st.feed.wait(ctx, held, stallTimeout); err != nil {
			return out, fmt.Errorf("site %s: %w", st.name, err)
		}
	}
	if _, err := b.t.bringIndexesUpToDate(ctx, sites[0].db, autoIndexed()...); err != nil {
		return out, fmt.Errorf("site A, after the run: %w", err)
	}
	out.cpu1 = b.t.cpu()
	for _, st := range sites {
		seen := st.feed.snapshot()
		jt := ownJobTimes(seen, st.name)
		if jt.done != n {
			return out, fmt.Errorf("site %s reads %d of its %d jobs done", st.name, jt.done, n)
		}
		out.tput = append(out.tput, rate(int64(n), jt.span()))
		if st.name == siteName(0) {
			out.floor = lagsOf(seen, st.name)
		} else if sc.linked {
			out.lag = append(out.lag, lagsOf(seen, siteName(0))...)
		}
	}
	if sc.sites == 1 && out.cpu1.serverOK {
		if out.oneCopy, err = b.oneCopyCPU(ctx, s, sites[0]); err != nil {
			return out, err
		}
	}
	return out, nil
}

// oneCopyCPU is the least a job of one site can cost another site's
// server: A's finished jobs copied once (a one-shot replication of what
// a link carries, in its full batches) into a fresh database with couchq's
// design documents on A's own node, and that database indexed, A's server
// CPU over it per job. The node both serves and stores each copy, as a
// site of a mesh serves each of its jobs to every other site and stores
// each of theirs. A link can only cost more: it carries every revision
// that is still the latest when its batch leaves (a claim, a renewal, the
// finish), in batches as small as one when the site is quiet.
func (b *run) oneCopyCPU(ctx context.Context, s *Section, a *benchSite) (time.Duration, error) {
	copyDB, err := b.newDB(ctx, s, "sites_copy")
	if err != nil {
		return 0, err
	}
	from := a.endpoint()
	to := from
	to.DB, to.Site = copyDB, "copy of "+a.name
	before := b.t.cpu()
	if err := protocol.ReplicateOnce(ctx, b.t.srv, from, to); err != nil {
		return 0, err
	}
	if _, err := b.t.bringIndexesUpToDate(ctx, copyDB, autoIndexed()...); err != nil {
		return 0, fmt.Errorf("the copy of site %s: %w", a.name, err)
	}
	after := b.t.cpu()
	if !before.serverOK || !after.serverOK {
		return 0, nil
	}
	return (after.server - before.server) / time.Duration(b.cfg.SitesJobs), nil
}

// leastGrowth is the growth of A's server CPU per job of its own that
// the one-copy cost alone makes with each count of sites: with k sites in
// a mesh, each sending as many jobs as A, each job of A's is served k-1
// times and A stores k-1 other jobs for it.
func leastGrowth(alone, oneCopy time.Duration, sites []int) []float64 {
	if alone <= 0 {
		return nil
	}
	g := make([]float64, len(sites))
	for i, k := range sites {
		g[i] = 1 + float64(k-1)*float64(oneCopy)/float64(alone)
	}
	return g
}

// siteListedWithin bounds the wait for the sites document to reach a
// linked site.
const siteListedWithin = time.Minute

// setUpSites writes the sites document, links the sites when linked, and
// opens each site's client once its database names it. Linked, the
// document is written at A alone, listing every site with A the default,
// and the links carry it to the others, as `couchq sites add` at one
// database does (the links between the others are made once it has
// reached them); not linked, each database has its own naming its site.
func setUpSites(ctx context.Context, sites []*benchSite, linked bool) error {
	var names []string
	for _, st := range sites {
		names = append(names, st.name)
	}
	for i, st := range sites {
		if linked && i > 0 {
			break
		}
		c, err := st.t.queue.Open(ctx, st.db, protocol.Config{Actor: "couchq-bench"})
		if err != nil {
			return fmt.Errorf("site %s: %w", st.name, err)
		}
		add := []string{st.name}
		if linked {
			add = names
		}
		for _, name := range add {
			if _, err := c.AddSite(ctx, name); err != nil {
				return fmt.Errorf("adding site %s at site %s: %w", name, st.name, err)
			}
		}
	}
	holders := map[string]*protocol.Server{}
	for _, st := range sites {
		holders[st.name] = st.t.srv
	}
	link := func(x, y *benchSite) error {
		if !linked {
			return nil
		}
		return protocol.LinkSites(ctx, x.endpoint(), y.endpoint(), holders)
	}
	// A with each of the others first: a link needs one of its two
	// databases to have the sites document, and the others have it once
	// A's link has brought it, which openWhenListed waits for.
	for _, other := range sites[1:] {
		if err := link(sites[0], other); err != nil {
			return err
		}
	}
	for _, st := range sites {
		if err := st.openWhenListed(ctx); err != nil {
			return err
		}
	}
	for i := 1; i < len(sites); i++ {
		for _, other := range sites[i+1:] {
			if err := link(sites[i], other); err != nil {
				return err
			}
		}
	}
	return nil
}

// openWhenListed opens the site's client once its database's sites
// document names it: at once where it was written, after the links
// brought it elsewhere.
func (st *benchSite) openWhenListed(ctx context.Context) error {
	c, err := st.t.openSite(ctx, st.db, st.name)
	if err != nil {
		return fmt.Errorf("site %s: %w", st.name, err)
	}
	deadline := time.Now().Add(siteListedWithin)
	for {
		err := c.RefreshSites(ctx)
		if err == nil {
			if err = c.CheckSite(); err == nil {
				st.client = c
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("site %s: the sites document did not name it within %s: %w", st.name, siteListedWithin, err)
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// sitesCleanup ends a run: the workers and feeds stopped, the links
// removed at every site (a link into a database dropped under it would
// retry, and cost the next run's CPU), the databases dropped (A's kept
// with --keep; the other sites' servers are removed at the section's
// end).
func (b *run) sitesCleanup(ctx context.Context, sites []*benchSite) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	for _, st := range sites {
		if st.pool != nil {
			st.pool.stop(ctx)
		}
		if st.feed != nil {
			st.feed.stop()
		}
	}
	var errs []error
	for _, st := range sites {
		if st.db == "" {
			continue
		}
		if _, err := st.t.srv.Unlink(ctx, st.db); err != nil {
			errs = append(errs, fmt.Errorf("site %s: %w", st.name, err))
		}
	}
	for _, st := range sites {
		if st.db != "" && !(b.cfg.Keep && st.t == b.t) {
			errs = append(errs, st.t.dropDB(ctx, st.db))
		}
	}
	return errors.Join(errs...)
}

// docCount is the database's document count (GET /db): jobs carried by
// the links show in it without reading them.
func (t *target) docCount(ctx context.Context, db string) (int, error) {
	var info struct {
		DocCount int `json:"doc_count"`
	}
	if err := t.getJSON(ctx, t.base+"/"+url.PathEscape(db), &info); err != nil {
		return 0, fmt.Errorf("reading database %s's document count: %w", db, err)
	}
	return info.DocCount, nil
}

// waitDocCount waits until db holds want documents.
func (t *target) waitDocCount(ctx context.Context, db string, want int) error {
	return waitProgress(ctx, int64(want), stallTimeout, 250*time.Millisecond, "documents in "+db, func() (int64, error) {
		n, err := t.docCount(ctx, db)
		return int64(n), err
	})
}

// doneFeed follows a site's changes feed, filtered to jobs done, and
// records when each job first reads done there. A continuous feed, so
// that what it records is when the server had the change, give or take
// the feed's delivery, and not when a poll came round.
type doneFeed struct {
	cancel context.CancelFunc
	ended  chan struct{}
	mu     sync.Mutex
	seen   map[string]seenDone
	err    error // why the feed ended before it was stopped
}

// seenDone is a job as it first read done at a site.
type seenDone struct {
	at   time.Time
	item *protocol.WorkItem
}

// followDone starts following db's jobs done from now on: from its update
// sequence read first, so that a job done before the feed's request
// reaches the server is not missed.
func followDone(ctx context.Context, t *target, db string) (*doneFeed, error) {
	dbURL := t.base + "/" + url.PathEscape(db)
	var info struct {
		UpdateSeq json.RawMessage `json:"update_seq"`
	}
	if err := t.getJSON(ctx, dbURL, &info); err != nil {
		return nil, fmt.Errorf("reading database %s's update sequence: %w", db, err)
	}
	since := string(info.UpdateSeq) // a number on some servers
	var seq string
	if json.Unmarshal(info.UpdateSeq, &seq) == nil {
		since = seq
	}
	body, err := json.Marshal(map[string]any{"selector": map[string]any{"type": protocol.DocType, "status": protocol.StatusDone}})
	if err != nil {
		return nil, fmt.Errorf("encoding the changes feed's selector: %w", err)
	}
	q := url.Values{"feed": {"continuous"}, "since": {since}, "filter": {"_selector"}, "include_docs": {"true"}, "heartbeat": {"5000"}}
	fctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(fctx, http.MethodPost, dbURL+"/_changes?"+q.Encode(), bytes.NewReader(body))
	if err != nil {
		cancel()
		return nil, fmt.Errorf("following database %s's jobs done: %w", db, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if t.user != "" {
		req.SetBasicAuth(t.user, t.password)
	}
	f := &doneFeed{cancel: cancel, ended: make(chan struct{}), seen: map[string]seenDone{}}
	// The request is made in the background: a server may send the
	// answer's headers only with the first change.
	go f.follow(fctx, t.raw, req, db)
	return f, nil
}

func (f *doneFeed) follow(ctx context.Context, hc *http.Client, req *http.Request, db string) {
	defer close(f.ended)
	err := func() error {
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("the changes feed answered %s", resp.Status)
		}
		dec := json.NewDecoder(resp.Body)
		for {
			var ch struct {
				ID  string          `json:"id"`
				Doc json.RawMessage `json:"doc"`
			}
			if err := dec.Decode(&ch); err != nil {
				return fmt.Errorf("reading the changes feed: %w", err)
			}
			at := time.Now()
			if ch.ID == "" || len(ch.Doc) == 0 {
				continue // the feed's last_seq
			}
			var it protocol.WorkItem
			if err := json.Unmarshal(ch.Doc, &it); err != nil {
				return fmt.Errorf("decoding job %s from the changes feed: %w", ch.ID, err)
			}
			it.History = nil // what the rows need is the times
			f.mu.Lock()
			if _, ok := f.seen[ch.ID]; !ok {
				f.seen[ch.ID] = seenDone{at: at, item: &it}
			}
			f.mu.Unlock()
		}
	}()
	if ctx.Err() == nil {
		f.mu.Lock()
		f.err = fmt.Errorf("following database %s's jobs done: %w", db, err)
		f.mu.Unlock()
	}
}

// wait waits until n jobs read done, or the feed fails.
func (f *doneFeed) wait(ctx context.Context, n int, stall time.Duration) error {
	return waitProgress(ctx, int64(n), stall, 20*time.Millisecond, "jobs read done", func() (int64, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return int64(len(f.seen)), f.err
	})
}

// snapshot is what the feed recorded so far.
func (f *doneFeed) snapshot() map[string]seenDone {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.seen)
}

func (f *doneFeed) stop() {
	f.cancel()
	<-f.ended
}

// ownJobTimes is jobTimes over the jobs of seen that owner owns.
func ownJobTimes(seen map[string]seenDone, owner string) jobTimes {
	var jt jobTimes
	for _, s := range seen {
		if s.item.Site == owner {
			jt.add(s.item)
		}
	}
	return jt
}

// lagsOf is, for each job of seen that owner owns, the time from its
// finished_at to its first reading done where seen was recorded.
func lagsOf(seen map[string]seenDone, owner string) []time.Duration {
	var lags []time.Duration
	for _, s := range seen {
		if s.item.Site == owner && s.item.FinishedAt > 0 {
			lags = append(lags, s.at.Sub(protocol.FromUnix(s.item.FinishedAt)))
		}
	}
	return lags
}

// siteRuns records where each job ran: a job must run once, at its owner,
// whatever the links do.
type siteRuns struct {
	mu   sync.Mutex
	runs map[string]*jobRuns // by job id
}

type jobRuns struct {
	owner string
	at    []string // the sites that ran it
}

// handler records each run of next at site.
func (r *siteRuns) handler(site string, next worker.Handler) worker.Handler {
	return worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		owner := ""
		if job.Item != nil {
			owner = job.Item.Site
		}
		r.add(job.ID, owner, site)
		return next.Handle(ctx, job)
	})
}

func (r *siteRuns) add(id, owner, site string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.runs == nil {
		r.runs = map[string]*jobRuns{}
	}
	jr := r.runs[id]
	if jr == nil {
		jr = &jobRuns{owner: owner}
		r.runs[id] = jr
	}
	jr.at = append(jr.at, site)
}

// wrong counts the jobs that ran more than once, or at a site that does
// not own them.
func (r *siteRuns) wrong() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, jr := range r.runs {
		if len(jr.at) != 1 || jr.at[0] != jr.owner {
			n++
		}
	}
	return n
}

// sitesShareMet judges a site's throughput linked against alone.
func sitesShareMet(linked, alone float64) bool {
	return alone > 0 && linked >= TargetSitesShare*alone
}

// cpuGrowth is each of more as a multiple of one, the largest of them,
// and whether none exceeds TargetSitesCPUGrowth.
func cpuGrowth(one time.Duration, more []time.Duration) (ratios []float64, worst float64, met bool) {
	if one <= 0 || len(more) == 0 {
		return nil, 0, false
	}
	for _, m := range more {
		r := float64(m) / float64(one)
		ratios = append(ratios, r)
		worst = max(worst, r)
	}
	return ratios, worst, worst <= TargetSitesCPUGrowth
}

// ratesRow is several sites' jobs/s in one row, A's the value.
func ratesRow(metric string, rates []float64) Row {
	texts := make([]string, len(rates))
	for i, r := range rates {
		texts[i] = numRow("", r, "", 0).Text
	}
	return Row{Metric: metric, Value: rates[0], Unit: "jobs/s", Text: strings.Join(texts, " / ") + " jobs/s"}
}

// sitesRows adds the rows of the last run of outs, compared with the
// earlier ones.
func sitesRows(s *Section, outs []sitesOutcome, cfg Config) {
	o := outs[len(outs)-1]
	find := func(sc sitesScenario) (sitesOutcome, bool) {
		for _, x := range outs {
			if x.sc == sc {
				return x, true
			}
		}
		return sitesOutcome{}, false
	}
	alone, hasAlone := find(sitesScenario{1, false})
	switch {
	case o.sc.sites == 1:
		s.add(numRow(fmt.Sprintf("%s, %s jobs, %d worker goroutines: throughput, first claim -> last done",
			o.sc, groupThousands(fmt.Sprint(cfg.SitesJobs)), cfg.Workers), o.tput[0], "jobs/s", 0)).Key = keySitesAlone
	case !o.sc.linked:
		s.add(ratesRow(fmt.Sprintf("%s (the machine shared): throughput of A / B", o.sc), o.tput))
		if hasAlone {
			// What sharing one machine's CPU costs before any link: the
			// bound on "linked / alone" when every site runs here.
			s.add(numRow("  site A side by side, not linked / alone (the machine's share)", 100*ratio(o.tput[0], alone.tput[0]), "%", 1))
		}
	case o.sc.sites == 2:
		s.add(numRow(fmt.Sprintf("%s: site A's throughput", o.sc), o.tput[0], "jobs/s", 0)).Key = keySitesLinked
		s.add(numRow("  site B's throughput", o.tput[1], "jobs/s", 0))
		if hasAlone {
			row := s.add(numRow("site A linked / alone", 100*ratio(o.tput[0], alone.tput[0]), "%", 1))
			row.target(fmt.Sprintf(">= %.0f%% of alone", TargetSitesShare*100), sitesShareMet(o.tput[0], alone.tput[0]))
			row.Key = keySitesShare
		}
		if side, ok := find(sitesScenario{2, false}); ok {
			s.add(numRow("site A linked / side by side, not linked (what the links cost)", 100*ratio(o.tput[0], side.tput[0]), "%", 1))
			if one, _, ok := alone.cpuPerJob(); ok && alone.oneCopy > 0 {
				s.add(reachShareRow(ratio(side.tput[0], alone.tput[0]), leastGrowth(one, alone.oneCopy, []int{2})[0]))
			}
		}
		if lag := Summarize(o.lag); lag.N > 0 {
			s.add(durRow("replication lag of A's results at B (finished_at -> read done there): p50", lag.P50)).Key = keySitesLagP50
			s.add(durRow("  p99", lag.P99)).Key = keySitesLagP99
		}
		if floor := Summarize(o.floor); floor.N > 0 {
			s.add(textRow("  the same read at A itself (the measure's floor): p50 / p99",
				formatDuration(floor.P50)+" / "+formatDuration(floor.P99)))
		}
	default:
		names := make([]string, o.sc.sites)
		for i := range names {
			names[i] = siteName(i)
		}
		s.add(ratesRow(fmt.Sprintf("%s: throughput of %s", o.sc, strings.Join(names, " / ")), o.tput))
		if lag := Summarize(o.lag); lag.N > 0 {
			s.add(textRow("  replication lag of A's results at the other sites: p50 / p99", formatDuration(lag.P50)+" / "+formatDuration(lag.P99)))
		}
	}
	all, js, ok := o.cpuPerJob()
	if !ok {
		return
	}
	row := s.add(durRow(fmt.Sprintf("%s: site A's server CPU per job of its own", o.sc), all))
	if o.sc.linked || o.sc.sites == 1 {
		row.Key = map[int]string{1: keySitesCPU1, 2: keySitesCPU2, 3: keySitesCPU3}[o.sc.sites]
	}
	s.add(durRow("  of which couchjs (validate_doc_update, views)", js))
	if o.sc.sites == 1 && o.oneCopy > 0 {
		s.add(durRow("the least a job of another site can cost A: one finished copy served and stored, in full batches, indexed (per job)", o.oneCopy))
		s.add(numRow("  as a share of A's own job alone", 100*ratio(float64(o.oneCopy), float64(all)), "%", 1))
	}
	if o.sc.linked {
		// A linked site stores every site's jobs (so that each shows them
		// all): its CPU per job it stores is what replication adds per
		// document, apart from holding the others' jobs at all.
		s.add(durRow(fmt.Sprintf("  per job it stores (its own and the %d other sites')", o.sc.sites-1), all/time.Duration(o.sc.sites)))
	}
	if !o.sc.linked || !hasAlone {
		return
	}
	one, _, ok := alone.cpuPerJob()
	if !ok || o.sc.sites < 3 {
		return // judged once every linked run is in
	}
	var more []time.Duration
	var labels []string
	var counts []int
	for _, x := range outs {
		if x.sc.linked {
			c, _, _ := x.cpuPerJob()
			more = append(more, c)
			labels = append(labels, fmt.Sprint(x.sc.sites))
			counts = append(counts, x.sc.sites)
		}
	}
	ratios, worst, met := cpuGrowth(one, more)
	texts := make([]string, len(ratios))
	for i, r := range ratios {
		texts[i] = fmt.Sprintf("%.2f x", r)
	}
	growth := s.add(Row{Metric: fmt.Sprintf("site A's server CPU per job, %s sites linked vs alone", strings.Join(labels, " / ")),
		Value: worst, Unit: "x", Text: strings.Join(texts, " / ")})
	growth.target(fmt.Sprintf("<= %.2f x (not growing with other sites' jobs)", TargetSitesCPUGrowth), met)
	growth.Key = keySitesCPUGrowth
	if alone.oneCopy > 0 {
		s.add(reachGrowthRow(leastGrowth(one, alone.oneCopy, counts)))
	}
	// What a linked site pays per job it stores, against alone: the
	// growth that is not the other sites' jobs themselves.
	stored := make([]string, len(more))
	for i, m := range more {
		stored[i] = fmt.Sprintf("%.2f x", float64(m)/float64(counts[i])/float64(one))
	}
	s.add(textRow(fmt.Sprintf("site A's server CPU per job it stores, %s sites linked vs alone", strings.Join(labels, " / ")), strings.Join(stored, " / ")))
}

// reachShareRow says whether the throughput target is within reach of two
// sites on one machine: a site server-bound there runs at most the
// machine's share (side by side / alone) divided by the least growth of
// its CPU per job with two sites.
func reachShareRow(machineShare, leastGrowth float64) Row {
	best := 100 * machineShare / leastGrowth
	verdict := "no"
	if best >= 100*TargetSitesShare {
		verdict = "yes"
	}
	return Row{Metric: "  within reach of two sites on one machine? (the machine's share / the least growth with 2 sites)",
		Value: best, Unit: "%", Text: fmt.Sprintf("%s: %.1f %%", verdict, best), Key: keySitesShareReach}
}

// reachGrowthRow says whether the CPU growth target is within reach of any
// site that stores every other site's jobs, from the least growth their one
// copy each makes (leastGrowth); the worst is the value.
func reachGrowthRow(least []float64) Row {
	verdict, worst := "yes", 0.0
	texts := make([]string, len(least))
	for i, g := range least {
		texts[i] = fmt.Sprintf("%.2f x", g)
		worst = max(worst, g)
	}
	if worst > TargetSitesCPUGrowth {
		verdict = "no"
	}
	return Row{Metric: "  within reach of a site that stores every other site's jobs? (the least growth: one finished copy of each)",
		Value: worst, Unit: "x", Text: verdict + ": " + strings.Join(texts, " / "), Key: keySitesReach}
}
