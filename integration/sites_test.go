package integration

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// sitesDB is the queue database's name at every site of a test.
const sitesDB = "queue"

// testSite is one site of a queue: its server, a client of its database
// working for it, and what the links need to reach it.
type testSite struct {
	name   string
	srv    *couchtest.Server
	conn   *protocol.Server
	client *protocol.Client
	end    protocol.SiteEndpoint
}

// newTestSite prepares site name's database on srv and opens a client
// working for the site. The sites document is written at the first site
// (addSites) and reaches the others through the links.
func newTestSite(ctx context.Context, t *testing.T, srv *couchtest.Server, name string) *testSite {
	t.Helper()
	return newTestSiteDB(ctx, t, srv, name, sitesDB)
}

// newTestSiteDB is newTestSite for a database of another name (a site on
// the cluster, which the package's tests share).
func newTestSiteDB(ctx context.Context, t *testing.T, srv *couchtest.Server, name, db string) *testSite {
	t.Helper()
	user, password := srv.Credentials()
	conn, err := protocol.Connect(ctx, srv.URL(), user, password)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := protocol.Init(ctx, conn.Client, db, zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	s := &testSite{name: name, srv: srv, conn: conn, end: protocol.SiteEndpoint{
		Site: name, URL: srv.URL(), DB: db, User: user, Password: password,
		Replicator: srv.Caps().Vendor == "couchdb",
	}}
	return s
}

// open opens the site's client once the sites document names the site
// (written there, or brought by a link).
func (s *testSite) open(ctx context.Context, t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := s.conn.Open(ctx, s.end.DB, protocol.Config{Site: s.name, Actor: "test@" + s.name})
		if err == nil {
			if err = c.RefreshSites(ctx); err == nil {
				err = c.CheckSite() // the sites document listing the site has arrived
			}
		}
		if err == nil {
			s.client = c
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("opening site %s: %v", s.name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// siteRuns counts handler runs per job and site: the outside counter of
// the sites tests, never the documents alone.
type siteRuns struct {
	mu   sync.Mutex
	runs map[string][]string // job id -> the sites that ran it
}

func (rc *siteRuns) handler(site string) worker.Handler {
	return worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		rc.mu.Lock()
		if rc.runs == nil {
			rc.runs = map[string][]string{}
		}
		rc.runs[job.ID] = append(rc.runs[job.ID], site)
		rc.mu.Unlock()
		return nil
	})
}

func (rc *siteRuns) snapshot() map[string][]string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make(map[string][]string, len(rc.runs))
	for k, v := range rc.runs {
		out[k] = append([]string(nil), v...)
	}
	return out
}

// startWorkers runs n worker processes' worth of workers at the site
// until the test ends.
func (s *testSite) startWorkers(ctx context.Context, t *testing.T, rc *siteRuns, n int, types ...string) {
	t.Helper()
	for i := range n {
		handlers := map[string]worker.Handler{}
		for _, typ := range types {
			handlers[typ] = rc.handler(s.name)
		}
		s.runSiteWorker(ctx, t, worker.Config{
			Handlers: handlers, Concurrency: 4, ID: fmt.Sprintf("%s-%d-%s", s.name, i, s.srv.URL()[strings.LastIndex(s.srv.URL(), ":")+1:]),
			HeartbeatInterval: time.Second, SweepInterval: 2 * time.Second, FallbackPoll: 2 * time.Second,
			Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
		})
	}
}

// runSiteWorker runs a worker for site s with cfg until the test ends, or
// until the returned stop (which waits for it) is called.
func (s *testSite) runSiteWorker(ctx context.Context, t *testing.T, cfg worker.Config) (stop func()) {
	t.Helper()
	w, err := worker.New((*couchq.Client)(s.client), cfg)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := w.Run(wctx); err != nil && wctx.Err() == nil {
			t.Errorf("worker %s: %v", cfg.ID, err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// enqueue enqueues n jobs of type typ at the site, owned by owner (empty:
// the site's own).
func (s *testSite) enqueue(ctx context.Context, t *testing.T, typ, owner string, n int) []string {
	t.Helper()
	jobs := make([]protocol.NewJob, n)
	for i := range jobs {
		jobs[i] = protocol.NewJob{Worker: typ, Site: owner, Payload: map[string]any{"i": i, "at": s.name}}
	}
	res, err := s.client.EnqueueMany(ctx, jobs)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, n)
	for _, r := range res {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		ids = append(ids, r.Item.ID)
	}
	return ids
}

// waitDoneAtSites waits until every job in ids reads done at every site.
func waitDoneAtSites(ctx context.Context, t *testing.T, ids []string, within time.Duration, sites ...*testSite) {
	t.Helper()
	deadline := time.Now().Add(within)
	for _, s := range sites {
		pending := append([]string(nil), ids...)
		for len(pending) > 0 {
			var still []string
			for _, id := range pending {
				it, err := s.client.Get(ctx, id)
				if err != nil || it.Status != protocol.StatusDone {
					still = append(still, id)
				}
			}
			pending = still
			if len(pending) == 0 {
				break
			}
			if time.Now().After(deadline) {
				for _, l := range sites {
					links, err := l.conn.Links(ctx, sitesDB)
					t.Logf("links held by %s: %+v (%v)", l.name, links, err)
				}
				it, err := s.client.Get(ctx, pending[0])
				t.Fatalf("site %s: %d of %d jobs not done within %s; the first, %s: %+v (%v)", s.name, len(pending), len(ids), within, pending[0], it, err)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}

// checkRanOnceAtOwner fails the test for a job that ran other than once,
// or at a site that does not own it.
func checkRanOnceAtOwner(t *testing.T, rc *siteRuns, owners map[string]string) {
	t.Helper()
	runs := rc.snapshot()
	bad := 0
	for id, owner := range owners {
		if r := runs[id]; len(r) != 1 || r[0] != owner {
			if bad < 10 {
				t.Errorf("job %s (owner %s) ran at %v", id, owner, r)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d jobs did not run exactly once at their owner", bad, len(owners))
	}
}

// twoSites starts two linked Apache CouchDB sites, A (the default) and B.
func twoSites(t *testing.T) (context.Context, *testSite, *testSite) {
	t.Helper()
	a0, b0 := server.NewSite(t), server.NewSite(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	a, b := newTestSite(ctx, t, a0, "A"), newTestSite(ctx, t, b0, "B")
	addSites(ctx, t, a, "A", "B")
	if err := protocol.LinkSites(ctx, a.end, b.end, map[string]*protocol.Server{"A": a.conn, "B": b.conn}); err != nil {
		t.Fatal(err)
	}
	a.open(ctx, t)
	b.open(ctx, t) // once the link brought the sites document
	return ctx, a, b
}

// addSites writes the sites document at s, the first name the default.
func addSites(ctx context.Context, t *testing.T, s *testSite, names ...string) {
	t.Helper()
	c, err := s.conn.Open(ctx, s.end.DB, protocol.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if _, err := c.AddSite(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
}

// Two sites linked both ways, jobs enqueued at both and workers at both:
// every job runs exactly once, at its owner, and every site shows every
// job done.
func TestSitesRunEveryJobOnceAtItsOwner(t *testing.T) {
	ctx, a, b := twoSites(t)
	const perSite = 500
	owners := map[string]string{}
	for _, id := range a.enqueue(ctx, t, "email", "", perSite/2) {
		owners[id] = "A"
	}
	for _, id := range a.enqueue(ctx, t, "email", "B", perSite/2) { // enqueued at A for B
		owners[id] = "B"
	}
	for _, id := range b.enqueue(ctx, t, "email", "", perSite) {
		owners[id] = "B"
	}
	// A hand-written job that names no site belongs to the default site.
	if _, err := b.client.DB().Put(ctx, "job:handwritten", map[string]any{"type": "WorkItem", "worker": "email"}); err != nil {
		t.Fatal(err)
	}
	owners["job:handwritten"] = "A"
	// One for a site that does not exist is failed with the reason by the
	// default site, and one whose site is no site name is refused.
	if _, err := b.client.DB().Put(ctx, "job:nowhere", map[string]any{"type": "WorkItem", "worker": "email", "site": "Z"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.DB().Put(ctx, "job:badsite", map[string]any{"type": "WorkItem", "worker": "email", "site": 5}); err == nil ||
		!strings.Contains(err.Error(), "site must be a site name") {
		t.Errorf("a job whose site is a number: %v", err)
	}

	var rc siteRuns
	a.startWorkers(ctx, t, &rc, 2, "email")
	b.startWorkers(ctx, t, &rc, 2, "email")
	ids := make([]string, 0, len(owners))
	for id := range owners {
		ids = append(ids, id)
	}
	waitDoneAtSites(ctx, t, ids, 4*time.Minute, a, b)
	time.Sleep(3 * time.Second) // a second run, if any, would show by now
	checkRanOnceAtOwner(t, &rc, owners)
	waitStatusAt(ctx, t, b, protocol.StatusFailed, "job:nowhere")
	if it, err := b.client.Get(ctx, "job:nowhere"); err != nil || !strings.Contains(it.LastError, "site Z is not one of the queue's sites (A, B)") {
		t.Errorf("the job of an unknown site: %+v %v", it, err)
	}
	if r := rc.snapshot()["job:nowhere"]; len(r) != 0 {
		t.Errorf("the job of an unknown site ran at %v", r)
	}
}

// Links cut for a while as both sites keep enqueueing and running: no job
// runs twice, none is lost, and the backlog clears once they are back.
func TestSitesCutLinksLoseNothingAndRunNothingTwice(t *testing.T) {
	ctx, a, b := twoSites(t)
	var rc siteRuns
	a.startWorkers(ctx, t, &rc, 1, "report")
	b.startWorkers(ctx, t, &rc, 1, "report")
	owners := map[string]string{}
	add := func(s *testSite, owner string, n int) {
		for _, id := range s.enqueue(ctx, t, "report", owner, n) {
			owners[id] = map[string]string{"": s.name}[owner] + owner
		}
	}
	add(a, "", 50)
	add(b, "", 50)
	for _, s := range []*testSite{a, b} {
		if _, err := s.conn.Unlink(ctx, sitesDB); err != nil {
			t.Fatal(err)
		}
	}
	// Cut off: each site runs its own jobs; what it enqueues for the other
	// waits for the links.
	cutUntil := time.Now().Add(30 * time.Second)
	for time.Now().Before(cutUntil) {
		add(a, "", 10)
		add(a, "B", 5)
		add(b, "", 10)
		add(b, "A", 5)
		time.Sleep(3 * time.Second)
	}
	if err := protocol.LinkSites(ctx, a.end, b.end, map[string]*protocol.Server{"A": a.conn, "B": b.conn}); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, len(owners))
	for id := range owners {
		ids = append(ids, id)
	}
	waitDoneAtSites(ctx, t, ids, 4*time.Minute, a, b)
	time.Sleep(3 * time.Second)
	checkRanOnceAtOwner(t, &rc, owners)
}

// A producer site without a replicator (PouchDB Server, as PouchDB in a
// browser) writes jobs while its link is down; once linked they run once
// at their owner and their results replicate back.
func TestSitesProducerJobsRunAtTheOwnerOnce(t *testing.T) {
	ctx, a, b := twoSites(t)
	p := newTestSite(ctx, t, server.NewPouchSite(t), "P")
	addSites(ctx, t, a, "P")
	var rc siteRuns
	a.startWorkers(ctx, t, &rc, 1, "thumb")
	b.startWorkers(ctx, t, &rc, 1, "thumb")
	// couchq's design documents stay at their site: each site's are its
	// server's (the producer's run in JavaScript, A's in QuickJS where the
	// server has it), and two of different content would conflict. The
	// Mango validation's would fail every write at a server without such
	// validation; an empty one stands in for it here, where no server may
	// run it. A design document of another name crosses the links.
	for _, id := range []string{designdocs.ValidateID, "_design/app"} {
		if _, err := a.conn.Client.DB(sitesDB).Put(ctx, id, map[string]any{"language": "javascript"}); err != nil {
			t.Fatal(err)
		}
	}
	ownDocs := []string{designdocs.ID, designdocs.SweepID, designdocs.OpsID}
	revs := map[string]string{}
	for _, s := range []*testSite{a, b, p} {
		for _, id := range ownDocs {
			var doc struct {
				Rev string `json:"_rev"` // not GetRev: PouchDB Server's ETag is no revision
			}
			if err := s.conn.Client.DB(sitesDB).Get(ctx, id).ScanDoc(&doc); err != nil {
				t.Fatal(err)
			}
			revs[s.name+id] = doc.Rev
		}
	}

	// Offline: the producer's client works for no site (it runs no
	// workers); its jobs name their owners, or none (the default, A).
	pc, err := p.conn.Open(ctx, sitesDB, protocol.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p.client = pc
	owners := map[string]string{}
	for i, owner := range []string{"", "A", "B"} {
		for _, id := range p.enqueue(ctx, t, "thumb", owner, 30+i) {
			owners[id] = map[string]string{"": "A"}[owner] + owner
		}
	}
	time.Sleep(2 * time.Second)
	if n := len(rc.snapshot()); n != 0 {
		t.Fatalf("%d producer jobs ran before the producer was linked", n)
	}
	if err := protocol.LinkSites(ctx, a.end, p.end, map[string]*protocol.Server{"A": a.conn, "P": p.conn}); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, len(owners))
	for id := range owners {
		ids = append(ids, id)
	}
	waitDoneAtSites(ctx, t, ids, 3*time.Minute, a, b, p)
	time.Sleep(3 * time.Second)
	checkRanOnceAtOwner(t, &rc, owners)
	for _, s := range []*testSite{b, p} {
		db := s.conn.Client.DB(sitesDB)
		if _, err := db.GetRev(ctx, "_design/app"); err != nil {
			t.Errorf("site %s: a design document did not cross the links: %v", s.name, err)
		}
		if _, err := db.GetRev(ctx, designdocs.ValidateID); kivik.HTTPStatus(err) != http.StatusNotFound {
			t.Errorf("site %s: %s crossed the links (%v)", s.name, designdocs.ValidateID, err)
		}
	}
	for _, s := range []*testSite{a, b, p} {
		for _, id := range ownDocs {
			var doc struct {
				Rev       string   `json:"_rev"`
				Conflicts []string `json:"_conflicts"`
			}
			if err := s.conn.Client.DB(sitesDB).Get(ctx, id, kivik.Param("conflicts", true)).ScanDoc(&doc); err != nil {
				t.Fatal(err)
			}
			if doc.Rev != revs[s.name+id] || len(doc.Conflicts) > 0 {
				t.Errorf("site %s: %s is %s with conflicts %v, want its own %s alone: another site's crossed the links", s.name, id, doc.Rev, doc.Conflicts, revs[s.name+id])
			}
		}
	}
}

// Site A stops with jobs claimed and queued; B takes A's jobs over and runs
// them all; A comes back: every conflict is settled, every job that ran
// twice shows both runs and the takeover in its history, and A's workers
// claim nothing they no longer own.
func TestSitesTakeoverOfAStoppedSite(t *testing.T) {
	ctx, a, b := twoSites(t)
	var rc siteRuns
	ids := takeOverStoppedA(ctx, t, a, b, &rc)

	// A comes back, and its workers start at once, from A's copy as it was
	// when it stopped: they hold their claims until they have heard from
	// B through the link (worker.Config.AwaitSites), which brings the
	// takeover first, so they run nothing of what B took over.
	if err := a.srv.StartSite(ctx); err != nil {
		t.Fatal(err)
	}
	before := rc.snapshot()
	a.startWorkers(ctx, t, &rc, 1, "render")
	waitDoneAtSites(ctx, t, ids, 3*time.Minute, a)
	time.Sleep(5 * time.Second)

	after := rc.snapshot()
	twice := 0
	for _, id := range ids {
		r := after[id]
		if len(r) == 0 {
			t.Errorf("job %s never ran", id)
		}
		if len(r) > len(before[id]) {
			t.Errorf("job %s ran again at %v after A came back", id, r[len(before[id]):])
		}
		if len(r) > 2 || len(r) == 2 && (r[0] != "A" || r[1] != "B") {
			t.Errorf("job %s ran at %v", id, r)
		}
		if len(r) < 2 {
			continue
		}
		twice++
		// The second run is the one kind of duplicate a takeover allows:
		// its history shows A's claim, the takeover and B's run.
		it, err := b.client.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		var claimedByA, takeover bool
		for _, e := range it.History {
			claimedByA = claimedByA || e.Event == protocol.EventClaimed && strings.HasSuffix(e.By, "/A-0")
			takeover = takeover || e.Event == protocol.EventSiteTakeover
		}
		if !claimedByA || !takeover || it.Site != "B" {
			t.Errorf("job %s ran at A and B but its history does not say so: site %q, %s", id, it.Site, events(it))
		}
	}
	if twice == 0 {
		t.Error("no job ran at both sites: the test did not stop A under a claim")
	}
	// Every conflict is settled, at both sites.
	waitSettled(ctx, t, ids, a, b)
}

// A site that comes back while the site that took it over is out of
// reach finds its link from that site failed, and CouchDB's replicator
// starts a failed link again only after backing it off (30 s and more, at
// its next scheduling pass): longer than the restarted site's workers
// wait. They restart the link themselves, hear the takeover in time, and
// run nothing that was moved.
func TestSitesRestartedSiteRestartsItsFailedLink(t *testing.T) {
	ctx, a, b := twoSites(t)
	var rc siteRuns
	ids := takeOverStoppedA(ctx, t, a, b, &rc)

	// B goes out of reach and A comes back: A's link from B fails.
	if err := b.srv.StopSite(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.srv.StartSite(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for failed := false; !failed; {
		links, err := a.conn.Links(ctx, sitesDB)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range links {
			failed = failed || l.From == "B" && (l.State == "crashing" || l.State == "error")
		}
		if time.Now().After(deadline) {
			t.Fatalf("the link from B did not fail while B was down: %+v", links)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := b.srv.StartSite(ctx); err != nil {
		t.Fatal(err)
	}
	before := rc.snapshot()
	a.runSiteWorker(ctx, t, worker.Config{
		Handlers: map[string]worker.Handler{"render": rc.handler("A")}, Concurrency: 4, ID: "A-1",
		HeartbeatInterval: time.Second, SweepInterval: 2 * time.Second, FallbackPoll: 2 * time.Second,
		// Shorter than the replicator's own restart of the failed link
		// (30 s of backoff at least): only the worker's restart brings
		// B's changes before it stops waiting.
		AwaitSites: 25 * time.Second,
		Logger:     zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel),
	})
	waitDoneAtSites(ctx, t, ids, 3*time.Minute, a)
	time.Sleep(3 * time.Second)
	after := rc.snapshot()
	for _, id := range ids {
		if len(after[id]) > len(before[id]) {
			t.Errorf("job %s ran again at %v after A came back", id, after[id][len(before[id]):])
		}
	}
}

// A link that failed while the other site was down is restarted by the
// workers of the site it leads into (they run as a server admin here),
// not left to CouchDB's replicator, whose backoff doubles with each
// failure: it carries the other site's work again soon after that site is
// back.
func TestSitesWorkersRestartAFailedLink(t *testing.T) {
	ctx, a, b := twoSites(t)
	var rc siteRuns
	a.startWorkers(ctx, t, &rc, 1, "render")
	b.startWorkers(ctx, t, &rc, 1, "render")
	// B's workers have started (their site's heartbeat reached A) before
	// B's server stops under them.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if beats, err := a.client.SiteHeartbeats(ctx); err == nil && beats["B"].Rev != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("B's heartbeat did not reach A")
		}
	}
	if err := b.srv.StopSite(ctx); err != nil {
		t.Fatal(err)
	}
	repl := a.conn.Client.DB("_replicator")
	const link = "couchq-" + sitesDB + "-from-B-to-A"
	restartedAt := func() float64 {
		var doc struct {
			Couchq struct {
				RestartedAt float64 `json:"restarted_at"`
			} `json:"couchq"`
		}
		if err := repl.Get(ctx, link).ScanDoc(&doc); err != nil {
			t.Fatal(err)
		}
		return doc.Couchq.RestartedAt
	}
	deadline := time.Now().Add(2 * time.Minute)
	for restartedAt() == 0 {
		if time.Now().After(deadline) {
			links, _ := a.conn.Links(ctx, sitesDB)
			t.Fatalf("A's workers did not restart the link from B while B was down: %+v", links)
		}
		time.Sleep(time.Second)
	}
	if err := b.srv.StartSite(ctx); err != nil {
		t.Fatal(err)
	}
	ids := b.enqueue(ctx, t, "render", "", 5)
	waitDoneAtSites(ctx, t, ids, time.Minute, b, a)
	for _, id := range ids {
		if r := rc.snapshot()[id]; len(r) != 1 || r[0] != "B" {
			t.Errorf("job %s ran at %v, want [B]", id, r)
		}
	}

	// Linking again rewrites the link so that the replicator starts it
	// again, as the workers' restart does: it ignores a rewrite that
	// changes nothing of the replication.
	interval := func() float64 {
		var doc struct {
			CheckpointInterval float64 `json:"checkpoint_interval"`
		}
		if err := repl.Get(ctx, link).ScanDoc(&doc); err != nil {
			t.Fatal(err)
		}
		return doc.CheckpointInterval
	}
	before := interval()
	if err := protocol.LinkSites(ctx, a.end, b.end, map[string]*protocol.Server{"A": a.conn, "B": b.conn}); err != nil {
		t.Fatal(err)
	}
	if after := interval(); after == before || after < 30000 || after > 30001 {
		t.Errorf("linking again left the link's checkpoint interval at %v (was %v): the replicator would not restart it", after, before)
	}
}

// takeOverStoppedA stops site A's server under its claims
// (slowJobsRunningAtA), has B take A's jobs over, and waits until B has
// run them all; it returns A's jobs.
func takeOverStoppedA(ctx context.Context, t *testing.T, a, b *testSite, rc *siteRuns) []string {
	t.Helper()
	stopA, ids := slowJobsRunningAtA(ctx, t, a, b, rc)
	if err := a.srv.StopSite(ctx); err != nil {
		t.Fatal(err)
	}
	stopA()
	moved, err := b.client.TakeOver(ctx, "A", "B")
	if err != nil {
		t.Fatal(err)
	}
	if moved == 0 {
		t.Fatal("the takeover moved no job")
	}
	waitDoneAtSites(ctx, t, ids, 3*time.Minute, b)
	return ids
}

// site: every conflict settled.
func waitSettled(ctx context.Context, t *testing.T, ids []string, sites ...*testSite) {
	t.Helper()
	for _, s := range sites {
		deadline := time.Now().Add(time.Minute)
		for _, id := range ids {
			for {
				leaves, err := s.client.Leaves(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				live := 0
				for _, l := range leaves {
					if !l.Deleted {
						live++
					}
				}
				if live == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("site %s: job %s still has %d live branches", s.name, id, live)
				}
				time.Sleep(500 * time.Millisecond)
			}
		}
	}
}

// Cancel and retry issued at a site that does not own the job, with the
// links up and with them cut: each is applied once, at the owner.
func TestSitesActionsFromANonOwnerApplyOnceAtTheOwner(t *testing.T) {
	ctx, a, b := twoSites(t)
	var rc siteRuns
	failing := map[string]bool{}
	var mu sync.Mutex
	handler := func(site string) worker.Handler {
		count := rc.handler(site)
		return worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			_ = count.Handle(ctx, job)
			mu.Lock()
			defer mu.Unlock()
			if failing[job.ID] {
				failing[job.ID] = false // fails once, for good; succeeds when retried
				return worker.JobFail(fmt.Errorf("failing on purpose"))
			}
			return nil
		})
	}
	for _, s := range []*testSite{a, b} {
		s.runSiteWorker(ctx, t, worker.Config{
			Handlers: map[string]worker.Handler{"mail": handler(s.name)}, ID: s.name + "-0",
			HeartbeatInterval: time.Second, SweepInterval: time.Second, FallbackPoll: time.Second,
			Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel),
		})
	}
	later := func(n int) []string { // A's jobs, due in an hour: cancellable
		var jobs []protocol.NewJob
		for range n {
			jobs = append(jobs, protocol.NewJob{Worker: "mail", At: time.Now().Add(time.Hour)})
		}
		res, err := a.client.EnqueueMany(ctx, jobs)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range res {
			ids = append(ids, r.Item.ID)
		}
		return ids
	}
	failed := a.enqueue(ctx, t, "mail", "", 2)
	mu.Lock()
	for _, id := range failed {
		failing[id] = true
	}
	mu.Unlock()
	toCancel := later(2)
	waitStatusAt(ctx, t, b, protocol.StatusFailed, failed...)
	waitStatusAt(ctx, t, b, protocol.StatusQueued, toCancel...)

	// Links up: B asks, A applies.
	_, err := b.client.CancelJob(ctx, toCancel[0], "ops@B", "not needed")
	if !errors.Is(err, protocol.ErrForwarded) {
		t.Fatalf("cancel at a non-owner: %v", err)
	}
	_, err = b.client.Retry(ctx, failed[0], "ops@B")
	if !errors.Is(err, protocol.ErrForwarded) {
		t.Fatalf("retry at a non-owner: %v", err)
	}
	// Links cut: the requests wait at B, then go.
	for _, s := range []*testSite{a, b} {
		if _, err := s.conn.Unlink(ctx, sitesDB); err != nil {
			t.Fatal(err)
		}
	}
	_, err = b.client.CancelJob(ctx, toCancel[1], "ops@B", "not needed")
	var first *protocol.ForwardedError
	if !errors.As(err, &first) {
		t.Fatal(err)
	}
	// Asked again while the first waits: the answer is the same request,
	// not a second that the owner would refuse.
	_, err = b.client.CancelJob(ctx, toCancel[1], "ops@B", "still not needed")
	var again *protocol.ForwardedError
	if !errors.As(err, &again) || again.Request.ID != first.Request.ID {
		t.Fatalf("a second cancel while the first is pending: %v, want request %s again", err, first.Request.ID)
	}
	// Retrying every failed job of the type at B asks A for A's, as the
	// retry of one does, rather than writing them at B.
	if n, err := b.client.RetryFailed(ctx, "mail", "ops@B", nil); err != nil || n < 1 {
		t.Fatalf("retry of the failed jobs at a non-owner: %d, %v", n, err)
	}
	time.Sleep(3 * time.Second)
	if it, err := a.client.Get(ctx, toCancel[1]); err != nil || it.Status != protocol.StatusQueued {
		t.Fatalf("a request crossed a cut link: %+v %v", it, err)
	}
	if err := protocol.LinkSites(ctx, a.end, b.end, map[string]*protocol.Server{"A": a.conn, "B": b.conn}); err != nil {
		t.Fatal(err)
	}
	waitStatusAt(ctx, t, a, protocol.StatusCancelled, toCancel...)
	waitStatusAt(ctx, t, b, protocol.StatusCancelled, toCancel...)
	waitStatusAt(ctx, t, a, protocol.StatusDone, failed...)
	waitStatusAt(ctx, t, b, protocol.StatusDone, failed...)
	time.Sleep(3 * time.Second) // a second application would show by now

	runs := rc.snapshot()
	for _, id := range failed {
		if r := runs[id]; len(r) != 2 || r[0] != "A" || r[1] != "A" {
			t.Errorf("retried job %s ran at %v, want [A A]: once, and once more for the retry", id, r)
		}
	}
	for _, id := range toCancel {
		if r := runs[id]; len(r) != 0 {
			t.Errorf("cancelled job %s ran at %v", id, r)
		}
		it, err := a.client.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range it.History {
			if e.Event == protocol.EventCancelled {
				n++
			}
		}
		if n != 1 {
			t.Errorf("job %s cancelled %d times: %s", id, n, events(it))
		}
	}
	reqs, err := b.client.Requests(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	waitFor := time.Now().Add(time.Minute)
	for {
		applied := 0
		for _, r := range reqs {
			if r.State == protocol.RequestApplied {
				applied++
			}
		}
		if applied == 4 {
			break
		}
		if time.Now().After(waitFor) {
			t.Fatalf("requests at B: %+v", reqs)
		}
		time.Sleep(500 * time.Millisecond)
		if reqs, err = b.client.Requests(ctx, ""); err != nil {
			t.Fatal(err)
		}
	}

	// A week after they were applied, a sweep deletes them, and the
	// deletion reaches the site that made them: what every sweep reads
	// does not grow with the queue's age.
	weekLater, err := a.conn.Open(ctx, a.end.DB, protocol.Config{Site: "A", Actor: "test@A",
		Now: func() time.Time { return time.Now().Add(7*24*time.Hour + time.Minute) }})
	if err != nil {
		t.Fatal(err)
	}
	if err := weekLater.RefreshSites(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := weekLater.Sweep(ctx, "test@A", 100); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*testSite{a, b} {
		deadline := time.Now().Add(time.Minute)
		for {
			reqs, err := s.client.Requests(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			if len(reqs) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("requests at %s a week after they were applied: %+v", s.name, reqs)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}

// Pause and resume of a job type at another site, with the links up and
// cut: each is applied at the site named, in the order asked; a change made
// at that site after a request was made wins over the request.
func TestSitesPauseAndResumeAtAnotherSite(t *testing.T) {
	ctx, a, b := twoSites(t)
	var rc siteRuns
	a.runSiteWorker(ctx, t, worker.Config{
		Handlers: map[string]worker.Handler{"mail": rc.handler("A")}, ID: "A-0",
		HeartbeatInterval: time.Second, SweepInterval: time.Second, FallbackPoll: time.Second,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel),
	})
	pausedAt := func(s *testSite, typ string) bool {
		t.Helper()
		p, err := s.client.Paused(ctx, typ)
		if err != nil {
			t.Fatal(err)
		}
		return p[typ]
	}
	waitPaused := func(typ string, want bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for pausedAt(a, typ) != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s paused at A: want %v", typ, want)
			}
			time.Sleep(300 * time.Millisecond)
		}
	}

	// Links up: B asks A to pause mail; A's worker stops claiming it.
	if err := b.client.PauseAt(ctx, "A", "mail", "ops@B", "smtp down"); !errors.Is(err, protocol.ErrForwarded) {
		t.Fatalf("pause at another site: %v", err)
	}
	if pausedAt(b, "mail") {
		t.Fatal("a pause asked of A paused B")
	}
	waitPaused("mail", true)
	time.Sleep(time.Second) // the worker hears of it within a moment
	ids := a.enqueue(ctx, t, "mail", "", 3)
	time.Sleep(3 * time.Second)
	if n := len(rc.snapshot()); n != 0 {
		t.Fatalf("%d jobs ran at A while mail was paused there", n)
	}

	// Links cut: a resume waits at B. A pause of "other" asked before A
	// paused and resumed it itself is superseded by A's own change.
	for _, s := range []*testSite{a, b} {
		if _, err := s.conn.Unlink(ctx, sitesDB); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.client.ResumeAt(ctx, "A", "mail", "ops@B"); !errors.Is(err, protocol.ErrForwarded) {
		t.Fatal(err)
	}
	if err := b.client.PauseAt(ctx, "A", "other", "ops@B", "stale"); !errors.Is(err, protocol.ErrForwarded) {
		t.Fatal(err)
	}
	// A pause and then a resume of "third", both asked at B: applied in
	// that order, the resume not taken for superseded by the pause.
	if err := b.client.PauseAt(ctx, "A", "third", "ops@B", ""); !errors.Is(err, protocol.ErrForwarded) {
		t.Fatal(err)
	}
	if err := b.client.ResumeAt(ctx, "A", "third", "ops@B"); !errors.Is(err, protocol.ErrForwarded) {
		t.Fatal(err)
	}
	// A pause of "fourth" asked twice while pending is one request.
	var first, again *protocol.ForwardedError
	if err := b.client.PauseAt(ctx, "A", "fourth", "ops@B", ""); !errors.As(err, &first) {
		t.Fatal(err)
	}
	if err := b.client.PauseAt(ctx, "A", "fourth", "ops@B", ""); !errors.As(err, &again) || again.Request.ID != first.Request.ID {
		t.Fatalf("a second pause while the first is pending: %v, want request %s again", err, first.Request.ID)
	}
	// A pause of "fifth" asked at B, then a resume at A of the type,
	// which is not paused there: A's own word still comes later and wins.
	if err := b.client.PauseAt(ctx, "A", "fifth", "ops@B", ""); !errors.Is(err, protocol.ErrForwarded) {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if err := a.client.ResumeAt(ctx, "A", "fifth", "ops@A"); err != nil {
		t.Fatal(err)
	}
	if err := a.client.PauseAt(ctx, "A", "other", "ops@A", ""); err != nil {
		t.Fatal(err)
	}
	if err := a.client.ResumeAt(ctx, "A", "other", "ops@A"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if !pausedAt(a, "mail") {
		ctls, _ := a.client.Controls(ctx, "mail")
		reqs, _ := a.client.Requests(ctx, "")
		t.Fatalf("a resume crossed a cut link: %+v; requests at A: %+v", ctls, reqs)
	}
	if err := protocol.LinkSites(ctx, a.end, b.end, map[string]*protocol.Server{"A": a.conn, "B": b.conn}); err != nil {
		t.Fatal(err)
	}
	waitPaused("mail", false)
	waitStatusAt(ctx, t, a, protocol.StatusDone, ids...)
	waitFor := time.Now().Add(time.Minute)
	for {
		reqs, err := b.client.Requests(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		states := map[string]string{}
		for _, r := range reqs {
			states[r.Action+" "+r.Worker] = r.State
		}
		want := map[string]string{"pause mail": protocol.RequestApplied, "resume mail": protocol.RequestApplied, "pause other": protocol.RequestRefused,
			"pause third": protocol.RequestApplied, "resume third": protocol.RequestApplied, "pause fourth": protocol.RequestApplied,
			"pause fifth": protocol.RequestRefused}
		if len(reqs) == len(want) && maps.Equal(states, want) {
			break
		}
		if time.Now().After(waitFor) {
			t.Fatalf("requests as B has them: %+v", reqs)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if pausedAt(a, "other") {
		t.Error("a pause superseded by the site's own resume was applied")
	}
	if pausedAt(a, "fifth") {
		t.Error("a pause made before the site's own resume of the type, which was not paused, was applied")
	}
	if pausedAt(a, "third") || !pausedAt(a, "fourth") {
		t.Errorf("third paused %v (want resumed), fourth paused %v (want paused)", pausedAt(a, "third"), pausedAt(a, "fourth"))
	}
	for _, id := range ids {
		if r := rc.snapshot()[id]; len(r) != 1 {
			t.Errorf("job %s ran %v times", id, r)
		}
	}
	// Bad input: an unknown site, a bad name, no type.
	for _, err := range []error{
		b.client.PauseAt(ctx, "C", "mail", "ops@B", ""),
		b.client.PauseAt(ctx, "no way", "mail", "ops@B", ""),
		b.client.ResumeAt(ctx, "A", "", "ops@B"),
	} {
		if err == nil || errors.Is(err, protocol.ErrForwarded) {
			t.Errorf("bad pause: %v", err)
		}
	}
}

// waitStatusAt waits until every job in ids has status st at site s.
func waitStatusAt(ctx context.Context, t *testing.T, s *testSite, st protocol.Status, ids ...string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for _, id := range ids {
		for {
			it, err := s.client.Get(ctx, id)
			if err == nil && it.Status == st {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("site %s: job %s is not %s: %+v %v", s.name, id, st, it, err)
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
}

// A site whose heartbeat stops is taken over by the site configured to
// (worker.Config.TakeOver): its jobs run there.
func TestSitesAutomaticTakeover(t *testing.T) {
	ctx, a, b := twoSites(t)
	var rc siteRuns
	// A's workers beat for a while, then stop; A's database stays up.
	stopA := a.runSiteWorker(ctx, t, worker.Config{
		Handlers: map[string]worker.Handler{"sync": rc.handler("A")}, ID: "A-0", HeartbeatInterval: time.Second,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel),
	})
	time.Sleep(3 * time.Second)
	stopA()
	ids := a.enqueue(ctx, t, "sync", "", 20)

	if _, err := worker.New((*couchq.Client)(b.client), worker.Config{
		Handlers: map[string]worker.Handler{"sync": rc.handler("B")}, HeartbeatInterval: time.Second,
		TakeOver: []string{"A"}, TakeOverAfter: 2 * time.Second,
	}); err == nil {
		t.Fatal("a takeover after fewer than three heartbeats was accepted")
	}
	b.runSiteWorker(ctx, t, worker.Config{
		Handlers: map[string]worker.Handler{"sync": rc.handler("B")}, ID: "B-0", HeartbeatInterval: time.Second,
		TakeOver: []string{"A"}, TakeOverAfter: 5 * time.Second,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
	})

	waitDoneAtSites(ctx, t, ids, 2*time.Minute, b, a)
	owners := map[string]string{}
	for _, id := range ids {
		owners[id] = "B"
	}
	checkRanOnceAtOwner(t, &rc, owners)
	d, err := b.client.ReadSites(ctx)
	if err != nil || d.Sites["A"].TakenOverBy != "B" || d.Default != "B" {
		t.Fatalf("sites after the automatic takeover: %+v %v", d, err)
	}

	// A comes back, beats, and goes silent again: its new jobs are taken
	// over again, not left waiting for it.
	stopA = a.runSiteWorker(ctx, t, worker.Config{
		Handlers: map[string]worker.Handler{"sync": rc.handler("A")}, ID: "A-1", HeartbeatInterval: time.Second,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel),
	})
	time.Sleep(4 * time.Second)
	stopA()
	again := a.enqueue(ctx, t, "sync", "A", 5)
	waitDoneAtSites(ctx, t, again, 2*time.Minute, b, a)
	for _, id := range again {
		owners[id] = "B"
	}
	checkRanOnceAtOwner(t, &rc, owners)
}

// A 3-node cluster as a site beside a single node: every job runs exactly
// once at its owner, the cluster's workers claiming through two of its
// nodes.
func TestSitesClusterSiteRunsEveryJobOnce(t *testing.T) {
	cl := server.Cluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	a := newTestSite(ctx, t, server.NewSite(t), "A")
	db := server.UniqueDBName(t)
	c := newTestSiteDB(ctx, t, cl.Server, "C", db)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := c.conn.Unlink(ctx, db); err != nil {
			t.Errorf("unlinking the cluster site: %v", err)
		}
		if err := c.conn.Client.DestroyDB(ctx, db); err != nil {
			t.Errorf("dropping the cluster site's database: %v", err)
		}
	})
	addSites(ctx, t, a, "A", "C")
	if err := protocol.LinkSites(ctx, a.end, c.end, map[string]*protocol.Server{"A": a.conn, "C": c.conn}); err != nil {
		t.Fatal(err)
	}
	a.open(ctx, t)
	c.open(ctx, t)
	// A second client of the cluster site, through node 2.
	user, password := cl.Node(2).Credentials()
	conn2, err := protocol.Connect(ctx, cl.Node(2).URL(), user, password)
	if err != nil {
		t.Fatal(err)
	}
	c2 := &testSite{name: "C", srv: cl.Node(2), conn: conn2, end: c.end}
	c2.open(ctx, t)

	owners := map[string]string{}
	for _, id := range a.enqueue(ctx, t, "index", "", 150) {
		owners[id] = "A"
	}
	for _, id := range a.enqueue(ctx, t, "index", "C", 150) {
		owners[id] = "C"
	}
	for _, id := range c.enqueue(ctx, t, "index", "", 150) {
		owners[id] = "C"
	}
	var rc siteRuns
	a.startWorkers(ctx, t, &rc, 1, "index")
	c.startWorkers(ctx, t, &rc, 1, "index")
	c2.startWorkers(ctx, t, &rc, 1, "index")
	ids := make([]string, 0, len(owners))
	for id := range owners {
		ids = append(ids, id)
	}
	waitDoneAtSites(ctx, t, ids, 5*time.Minute, a, c)
	time.Sleep(3 * time.Second)
	checkRanOnceAtOwner(t, &rc, owners)
}

// A job for a site the sites document does not list is refused at
// enqueue, by Enqueue, EnqueueMany and EnqueueBatch alike, with nothing
// written for it; a site added since the client last read the document
// (here by another client) is found by reading it again.
func TestSitesRefuseAJobForAnUnlistedSite(t *testing.T) {
	tb := setup(t, protocol.Config{})
	ctx := tb.ctx
	for _, s := range []string{"A", "B"} {
		if _, err := tb.client.AddSite(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	c, err := protocol.New(ctx, tb.db, protocol.Config{Site: "A", Logger: tb.log})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tb.client.AddSite(ctx, "C"); err != nil {
		t.Fatal(err)
	}
	if it, err := c.Enqueue(ctx, protocol.NewJob{Worker: "w", Site: "C"}); err != nil || it.Site != "C" {
		t.Fatalf("a job for the site added since: %+v, %v", it, err)
	}
	const unlisted = "site Z is not one of the database's sites (A, B, C)"
	if _, err := c.Enqueue(ctx, protocol.NewJob{Worker: "w", Site: "Z"}); !errors.Is(err, protocol.ErrInvalidJob) || !strings.Contains(err.Error(), unlisted) {
		t.Errorf("Enqueue for Z: %v", err)
	}
	// A client of no site, which has not read the sites document, reads
	// it to check. Its agents claim nothing, and are told why.
	siteless, err := protocol.New(ctx, tb.db, protocol.Config{Logger: tb.log})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := siteless.Enqueue(ctx, protocol.NewJob{Worker: "w", Site: "Z"}); !errors.Is(err, protocol.ErrInvalidJob) || !strings.Contains(err.Error(), unlisted) {
		t.Errorf("Enqueue for Z by a client of no site: %v", err)
	}
	if _, err := siteless.ClaimForAgent(ctx, "w", 1, "bob", time.Minute); !errors.Is(err, protocol.ErrNoSite) {
		t.Errorf("an agent's claim by a client of no site: %v", err)
	}
	if claim, err := c.ClaimForAgent(ctx, "w", 1, "bob", time.Minute); err != nil || len(claim.Claimed) != 0 {
		t.Errorf("an agent's claim at site A, which has no w job: %+v, %v", claim, err)
	}
	// A job waiting for the refused one is refused too: its dependency is
	// never written.
	res, err := c.EnqueueMany(ctx, []protocol.NewJob{{Worker: "w", Site: "Z", ID: "job:for-Z"}, {Worker: "w", Site: "B"}, {Worker: "w", After: []string{"job:for-Z"}}})
	var depErr *protocol.DependencyError
	if err != nil || !errors.Is(res[0].Err, protocol.ErrInvalidJob) || !strings.Contains(fmt.Sprint(res[0].Err), unlisted) ||
		res[1].Err != nil || res[1].Item.Site != "B" || !errors.As(res[2].Err, &depErr) || depErr.Dependency != "job:for-Z" {
		t.Errorf("EnqueueMany for Z, for B and one waiting for Z's: %+v, %v", res, err)
	}
	_, err = c.EnqueueBatch(ctx, []protocol.NewJob{{Worker: "w"}, {Worker: "w", Site: "Z"}}, protocol.NewJob{Worker: "done"})
	if !errors.Is(err, protocol.ErrInvalidJob) || !strings.Contains(fmt.Sprint(err), "job 1 of the batch: invalid job: "+unlisted) {
		t.Errorf("EnqueueBatch with a job for Z: %v", err)
	}
	_, err = c.EnqueueBatch(ctx, []protocol.NewJob{{Worker: "w"}}, protocol.NewJob{Worker: "done", Site: "Z"})
	if !errors.Is(err, protocol.ErrInvalidJob) || !strings.Contains(fmt.Sprint(err), "the batch's callback: invalid job: "+unlisted) {
		t.Errorf("EnqueueBatch with a callback for Z: %v", err)
	}
	// The jobs for C and B alone were written.
	rows := tb.db.AllDocs(ctx, kivik.Param("include_docs", true))
	defer rows.Close()
	var sites []string
	for rows.Next() {
		var doc struct {
			Type string `json:"type"`
			Site string `json:"site"`
		}
		if err := rows.ScanDoc(&doc); err == nil && doc.Type == "WorkItem" {
			sites = append(sites, doc.Site)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(sites, ",") != "C,B" {
		t.Errorf("jobs written for sites %v, want C and B alone", sites)
	}
}

// A link that could only fail is refused before anything is written:
// neither database has the sites document, a site name no sites document
// lists, a database that does not exist, a peer that is the database
// itself, and sites added at each database
// apart (linking would keep one of the two documents). A database whose
// sites document is an older revision of the other's links.
func TestSitesLinkRefusesWhatCouldOnlyFail(t *testing.T) {
	s0 := server.NewSite(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a, b := newTestSiteDB(ctx, t, s0, "A", "qa"), newTestSiteDB(ctx, t, s0, "B", "qb")
	holders := map[string]*protocol.Server{"A": a.conn, "B": b.conn, "Bee": b.conn}
	refused := func(x, y protocol.SiteEndpoint, want string) {
		t.Helper()
		if err := protocol.LinkSites(ctx, x, y, holders); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("linking %s/%s and %s/%s: %v, want %q", x.Site, x.DB, y.Site, y.DB, err, want)
		}
	}
	refused(a.end, b.end, "neither database has a sites document")
	addSites(ctx, t, a, "A", "B")
	bee := b.end
	bee.Site = "Bee"
	refused(a.end, bee, "site Bee is not one of the sites (A, B) as site A's database has them")
	nodb := b.end
	nodb.DB = "nodb"
	refused(a.end, nodb, "site B's database nodb does not exist")
	// A peer that is this database again, through the same URL or
	// another name of its server: the link would replace both sites'
	// links with copies of the database into itself.
	self := a.end
	self.Site = "B"
	refused(a.end, self, "are one database")
	self.URL = strings.Replace(self.URL, "127.0.0.1", "localhost", 1)
	refused(a.end, self, "are one database")
	addSites(ctx, t, b, "B", "A")
	refused(a.end, b.end, "each database has a sites document of its own (site A's: A, B, default A; site B's: A, B, default B)")
	rows := s0.Client(t).DB("_replicator").AllDocs(ctx)
	for rows.Next() {
		if id, _ := rows.ID(); strings.HasPrefix(id, "couchq-") {
			t.Errorf("a refused link was written: %s", id)
		}
	}
	if err := rows.Err(); err != nil && kivik.HTTPStatus(err) != http.StatusNotFound {
		t.Fatal(err)
	}

	// B's own document gone, A's brought over, and a site added at A since:
	// the same document, B's an older revision of it.
	db := b.conn.Client.DB("qb")
	rev, err := db.GetRev(ctx, protocol.SitesDocID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Delete(ctx, protocol.SitesDocID, rev); err != nil {
		t.Fatal(err)
	}
	if err := protocol.ReplicateOnce(ctx, a.conn, a.end, b.end); err != nil {
		t.Fatal(err)
	}
	addSites(ctx, t, a, "C")
	if err := protocol.LinkSites(ctx, a.end, b.end, holders); err != nil {
		t.Errorf("linking A and B, B's sites document an older revision of A's: %v", err)
	}
	// Linked, then cut, with a site added at each while cut: one document
	// changed at both ends, which linking again merges (the sweeps do),
	// not two documents of their own.
	bc, err := b.conn.Open(ctx, b.end.DB, protocol.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if d, err := bc.ReadSites(ctx); err == nil && d != nil && d.Sites["C"].AddedAt > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("A's sites document did not reach B")
		}
	}
	for _, s := range []*testSite{a, b} {
		if _, err := s.conn.Unlink(ctx, s.end.DB); err != nil {
			t.Fatal(err)
		}
	}
	addSites(ctx, t, a, "D")
	addSites(ctx, t, b, "E")
	if err := protocol.LinkSites(ctx, a.end, b.end, holders); err != nil {
		t.Errorf("linking A and B again after a site was added at each while cut: %v", err)
	}
}

// A sites document changed on both sides of a cut (a site added at one
// database, a site taken over at the other) is settled by a sweep into
// one: every site either branch lists, the takeover, and the default it
// moved. Two databases holding the same branches settle them into the
// same revision, so that their links carry no new conflict.
func TestSitesSweepSettlesAConflictedSitesDocument(t *testing.T) {
	var revs []string
	for range 2 {
		tb := setup(t, protocol.Config{})
		ctx := tb.ctx
		base := map[string]any{"_id": protocol.SitesDocID, "_rev": "1-" + strings.Repeat("a", 32), "type": protocol.SitesDocType,
			"default": "A", "sites": map[string]any{"A": map[string]any{"added_at": 1}, "B": map[string]any{"added_at": 2}}}
		added := map[string]any{"_id": protocol.SitesDocID, "_rev": "2-" + strings.Repeat("b", 32), "type": protocol.SitesDocType,
			"_revisions": map[string]any{"start": 2, "ids": []string{strings.Repeat("b", 32), strings.Repeat("a", 32)}},
			"default":    "A", "sites": map[string]any{"A": map[string]any{"added_at": 1}, "B": map[string]any{"added_at": 2}, "C": map[string]any{"added_at": 3}}}
		takenOver := map[string]any{"_id": protocol.SitesDocID, "_rev": "2-" + strings.Repeat("c", 32), "type": protocol.SitesDocType,
			"_revisions": map[string]any{"start": 2, "ids": []string{strings.Repeat("c", 32), strings.Repeat("a", 32)}},
			"default":    "B", "sites": map[string]any{"A": map[string]any{"added_at": 1, "taken_over_by": "B", "taken_over_at": 4}, "B": map[string]any{"added_at": 2}}}
		base["_revisions"] = map[string]any{"start": 1, "ids": []string{strings.Repeat("a", 32)}}
		for _, doc := range []map[string]any{base, added, takenOver} {
			couchtest.InjectRevision(ctx, t, server, tb.db.Name(), doc)
		}
		c, err := protocol.New(ctx, tb.db, protocol.Config{Logger: tb.log})
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Sweep(ctx, "test", 100)
		if err != nil || res.Settled != 1 {
			t.Fatalf("the sweep of the conflicted sites document: %+v, %v", res, err)
		}
		var got struct {
			protocol.SitesDoc
			Conflicts []string `json:"_conflicts"`
		}
		if err := tb.db.Get(ctx, protocol.SitesDocID, kivik.Param("conflicts", true)).ScanDoc(&got); err != nil {
			t.Fatal(err)
		}
		if len(got.Conflicts) != 0 || got.Default != "B" || strings.Join(got.Names(), ",") != "A,B,C" || got.Sites["A"].TakenOverBy != "B" {
			t.Fatalf("the settled sites document: %+v", got)
		}
		if res, err := c.Sweep(ctx, "test", 100); err != nil || res.Settled != 0 {
			t.Errorf("a second sweep: %+v, %v", res, err)
		}
		revs = append(revs, got.Rev)
	}
	if revs[0] != revs[1] {
		t.Errorf("the same branches settled into %s and %s", revs[0], revs[1])
	}
}

// A worker writes its site's heartbeat when it starts, not a heartbeat
// interval later: couchq sites would say the site was never heard from.
func TestSitesWorkerBeatsWhenItStarts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	a := newTestSiteDB(ctx, t, server, "A", server.UniqueDBName(t))
	addSites(ctx, t, a, "A")
	a.open(ctx, t)
	a.runSiteWorker(ctx, t, worker.Config{
		Handlers: map[string]worker.Handler{"mail": worker.HandlerFunc(func(context.Context, *worker.Job) error { return nil })},
		ID:       "A-0", HeartbeatInterval: time.Hour, LeaseDuration: 3 * time.Hour,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		beats, err := a.client.SiteHeartbeats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := beats["A"]; ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no heartbeat of site A 30 s after its worker started (heartbeats every hour): %v", beats)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Every later beat replaces it (on PouchDB Server too, whose answer to
	// a HEAD request carries no revision).
	before, err := a.client.SiteHeartbeats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.client.Beat(ctx); err != nil {
		t.Fatalf("beating again: %v", err)
	}
	after, err := a.client.SiteHeartbeats(ctx)
	if err != nil || after["A"].Rev == before["A"].Rev {
		t.Fatalf("the heartbeat after beating again: %+v, before %+v (%v)", after["A"], before["A"], err)
	}
}

// A worker that starts at a site whose workers were all stopped claims
// nothing until it has heard twice from each other site that has workers
// (worker.Config.AwaitSites), and claims anyway once the wait is over when
// a site stays silent. One database stands for the site's copy: the
// other site's heartbeats are written into it as a link would bring them.
func TestSitesWorkerAwaitsTheOtherSitesAfterItWasDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	a := newTestSiteDB(ctx, t, server, "A", server.UniqueDBName(t))
	addSites(ctx, t, a, "A", "B")
	a.open(ctx, t)
	beatAs := func(site string, at time.Time) {
		t.Helper()
		c, err := a.conn.Open(ctx, a.end.DB, protocol.Config{Site: site, Now: func() time.Time { return at }})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Beat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Both sites' workers ran an hour ago, as this copy has it.
	hourAgo := time.Now().Add(-time.Hour)
	beatAs("A", hourAgo)
	beatAs("B", hourAgo)

	for _, tc := range []struct {
		name string
		wait time.Duration
		// hear makes B heard from (twice), or not.
		hear bool
	}{
		{"B heard from", time.Hour, true},
		{"B silent", 4 * time.Second, false},
	} {
		// The first case's worker would take B over after half an hour
		// of silence: B's heartbeat here is an hour old only because A
		// was down, so it must not while it waits.
		var takeOver []string
		if tc.hear {
			takeOver = []string{"B"}
		}
		t.Run(tc.name, func(t *testing.T) {
			var rc siteRuns
			id := a.enqueue(ctx, t, "mail", "", 1)[0]
			w, err := worker.New((*couchq.Client)(a.client), worker.Config{
				Handlers: map[string]worker.Handler{"mail": rc.handler("A")}, ID: "A-" + strings.ReplaceAll(tc.name, " ", "-"),
				HeartbeatInterval: time.Second, AwaitSites: tc.wait, TakeOver: takeOver, TakeOverAfter: 30 * time.Minute,
				Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel),
			})
			if err != nil {
				t.Fatal(err)
			}
			started := time.Now()
			if err := w.Start(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = w.Stop(context.Background()) })
			if err := w.Ready(); err == nil || !strings.Contains(err.Error(), "to hear from sites B") {
				t.Errorf("Ready while waiting = %v", err)
			}
			beats, err := a.client.SiteHeartbeats(ctx)
			if err != nil || !beats["A"].CatchingUp {
				t.Errorf("A's heartbeat while its worker waits: %+v (%v)", beats["A"], err)
			}
			time.Sleep(2 * time.Second)
			if runs := rc.snapshot(); len(runs) != 0 {
				t.Fatalf("the worker claimed before hearing from B: %v", runs)
			}
			if d, err := a.client.ReadSites(ctx); err != nil || d.Sites["B"].TakenOverBy != "" {
				t.Fatalf("sites while the worker waits: %+v (%v)", d, err)
			}
			// An agent of the site gets no new job meanwhile either.
			if got, err := a.client.ClaimForAgent(ctx, "mail", 1, "agent@A", time.Minute); err != nil || !got.CatchingUp || len(got.Jobs()) != 0 {
				t.Fatalf("an agent's claim while the site's worker waits: %+v (%v)", got, err)
			}
			if tc.hear {
				beatAs("B", time.Now())
				time.Sleep(time.Second) // two beats, each seen by the worker
				beatAs("B", time.Now())
			}
			deadline := time.Now().Add(time.Minute)
			for len(rc.snapshot()[id]) == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("job %s not run a minute after B was heard from (or the wait ended)", id)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if !tc.hear && time.Since(started) < tc.wait {
				t.Errorf("ran %s after the start, before the wait of %s was over", time.Since(started), tc.wait)
			}
			if err := w.Ready(); err != nil {
				t.Errorf("Ready once claiming = %v", err)
			}
			// Its workers stopped, A's heartbeat must look stale again
			// for the next case.
			if err := w.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			beatAs("A", hourAgo)
		})
	}
}

// A job its old owner put back in the queue while cut off (its worker
// stopped, releasing the claim) meets the new owner's queued branch from
// a takeover: two unfinished versions. The new owner's is kept at both
// sites, the job runs once more, at the new owner, and the old owner's
// workers, started while both versions are there, do not run it.
func TestSitesTakeoverMeetsAJobTheOldOwnerRequeued(t *testing.T) {
	ctx, a, b := twoSites(t)
	var rc siteRuns
	started := make(chan struct{}, 1)
	holds := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		rc.handler("A").Handle(ctx, job) //nolint:errcheck // counts the run, never fails
		started <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	})
	stopA := a.runSiteWorker(ctx, t, worker.Config{
		Handlers: map[string]worker.Handler{"render": holds}, Concurrency: 1, ID: "A-0",
		HeartbeatInterval: time.Second, ShutdownTimeout: time.Second,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel),
	})
	id := a.enqueue(ctx, t, "render", "", 1)[0]
	select {
	case <-started:
	case <-time.After(time.Minute):
		t.Fatal("A's worker did not start the job")
	}
	waitStatusAt(ctx, t, b, protocol.StatusRunning, id) // A's claim has reached B

	for _, s := range []*testSite{a, b} {
		if _, err := s.conn.Unlink(ctx, sitesDB); err != nil {
			t.Fatal(err)
		}
	}
	// Cut off, A's worker stops and puts the job back in A's queue; B
	// takes A over, which puts it in B's.
	stopA()
	waitStatusAt(ctx, t, a, protocol.StatusQueued, id)
	if moved, err := b.client.TakeOver(ctx, "A", "B"); err != nil || moved != 1 {
		t.Fatalf("takeover at B: %d moved, %v", moved, err)
	}
	if err := protocol.LinkSites(ctx, a.end, b.end, map[string]*protocol.Server{"A": a.conn, "B": b.conn}); err != nil {
		t.Fatal(err)
	}
	// Both versions at both sites before any worker runs.
	for _, s := range []*testSite{a, b} {
		deadline := time.Now().Add(time.Minute)
		for {
			leaves, err := s.client.Leaves(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if len(leaves) >= 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("site %s: the other site's version of %s did not arrive: %+v", s.name, id, leaves)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	a.startWorkers(ctx, t, &rc, 1, "render")
	b.startWorkers(ctx, t, &rc, 1, "render")
	waitDoneAtSites(ctx, t, []string{id}, 2*time.Minute, a, b)
	time.Sleep(3 * time.Second)
	if runs := rc.snapshot()[id]; len(runs) != 2 || runs[0] != "A" || runs[1] != "B" {
		t.Fatalf("job %s ran at %v, want [A B]: A's first attempt, then once at B", id, runs)
	}
	waitSettled(ctx, t, []string{id}, a, b)
	for _, s := range []*testSite{a, b} {
		it, err := s.client.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		var takeover bool
		for _, e := range it.History {
			takeover = takeover || e.Event == protocol.EventSiteTakeover
		}
		if it.Site != "B" || it.Status != protocol.StatusDone || !takeover {
			t.Errorf("site %s: job %s settled as site %q, %s: %s", s.name, id, it.Site, it.Status, events(it))
		}
	}
}

// A's server stops under a worker that keeps running; B takes A's jobs
// over and runs them; A's server comes back: the worker, which reached no
// CouchDB for longer than a site's workers count as stopped, holds its
// claims and sweeps until it has heard from B, as a worker starting then
// would, so it runs nothing B took over.
func TestSitesWorkerThatOutlivesItsServerWaitsForTheOtherSites(t *testing.T) {
	ctx, a, b := twoSites(t)
	var rc siteRuns
	_, ids := slowJobsRunningAtA(ctx, t, a, b, &rc)
	// A's server stops; its worker does not.
	if err := a.srv.StopSite(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.TakeOver(ctx, "A", "B"); err != nil {
		t.Fatal(err)
	}
	waitDoneAtSites(ctx, t, ids, 3*time.Minute, b)
	time.Sleep(5 * time.Second) // well over three of A's heartbeats
	before := rc.snapshot()
	if err := a.srv.StartSite(ctx); err != nil {
		t.Fatal(err)
	}
	waitDoneAtSites(ctx, t, ids, 3*time.Minute, a)
	time.Sleep(5 * time.Second)
	after := rc.snapshot()
	for _, id := range ids {
		if r := after[id]; len(r) > len(before[id]) {
			t.Errorf("job %s ran again at %v after A's server came back", id, r[len(before[id]):])
		}
	}
	// The conflicts of the jobs that ran at both sites (running at A when
	// its server stopped) are settled by B, their owner, once B's link
	// from A brings A's branches: CouchDB's replicator retries a link to
	// a server that was down after a backoff of its own, minutes at most.
}

// slowJobsRunningAtA starts a worker at A whose jobs take 3 s, and one at
// B that claims none of them (so that A's copy has B's heartbeat: A's
// workers know whom to hear from), enqueues 40 jobs at A, and returns once
// four of them run at A as B's copy has it: A's claims have reached B.
func slowJobsRunningAtA(ctx context.Context, t *testing.T, a, b *testSite, rc *siteRuns) (stopA func(), ids []string) {
	t.Helper()
	slow := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		rc.handler("A").Handle(ctx, job) //nolint:errcheck // counts the run, never fails
		select {
		case <-time.After(3 * time.Second):
		case <-ctx.Done():
		}
		return nil
	})
	stopA = a.runSiteWorker(ctx, t, worker.Config{
		Handlers: map[string]worker.Handler{"render": slow}, Concurrency: 4, ID: "A-0",
		HeartbeatInterval: time.Second, LeaseDuration: 10 * time.Second,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.Disabled),
	})
	b.startWorkers(ctx, t, rc, 1, "render")
	ids = a.enqueue(ctx, t, "render", "", 40)
	deadline := time.Now().Add(time.Minute)
	for {
		running, err := b.client.List(ctx, protocol.ListOptions{Worker: "render", Status: protocol.StatusRunning})
		if err != nil {
			t.Fatal(err)
		}
		if len(running.Items) >= 4 {
			return stopA, ids
		}
		if time.Now().After(deadline) {
			t.Fatalf("A's claims did not reach B: %d running there", len(running.Items))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
