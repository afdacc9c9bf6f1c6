package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// Everything the sites commands do, through the Go API alone: two sites
// set up and linked, a cancel asked at a site that does not own the job
// and applied once by its owner, the request listed at both, the owner's
// heartbeat, the links and their removal.
func TestSitesThroughTheGoAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srvA, srvB := server.NewSite(t), server.NewSite(t)
	userA, passwordA := srvA.Credentials()
	userB, passwordB := srvB.Credentials()
	const db = "queue_api"
	connect := func(srv *couchtest.Server) *couchq.Server {
		user, password := srv.Credentials()
		s, err := couchq.Connect(ctx, srv.URL(), user, password)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Init(ctx, db, couchq.InitOptions{}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := connect(srvA), connect(srvB)
	admin, err := a.Open(ctx, db, couchq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, site := range []string{"A", "B"} {
		if err := admin.AddSite(ctx, site); err != nil {
			t.Fatal(err)
		}
	}
	err = couchq.LinkSites(ctx,
		couchq.SiteLink{Site: "A", Server: a, URL: srvA.URL(), DB: db, User: userA, Password: passwordA},
		couchq.SiteLink{Site: "B", Server: b, URL: srvB.URL(), DB: db, User: userB, Password: passwordB})
	if err != nil {
		t.Fatal(err)
	}
	qa, err := a.Open(ctx, db, couchq.Config{Site: "A", Actor: "test@A"})
	if err != nil {
		t.Fatal(err)
	}
	// B's copy of the sites document comes through the link.
	var qb *couchq.Client
	eventually(ctx, t, "site B's sites document", func() bool {
		c, err := b.Open(ctx, db, couchq.Config{Site: "B", Actor: "test@B"})
		if err != nil {
			return false
		}
		sites, err := c.Sites(ctx)
		if err != nil || sites == nil || len(sites.Sites) != 2 {
			return false
		}
		qb = c
		return true
	})

	// Due in an hour, so that only the cancel decides how it ends.
	job, err := qa.Enqueue(ctx, couchq.NewJob{Worker: "report", Site: "B", At: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := qa.Cancel(ctx, job.ID, "not needed"); !errors.Is(err, couchq.ErrForwarded) {
		t.Fatalf("cancel at A of B's job: %v, want ErrForwarded", err)
	}
	reqs, err := qa.SiteRequests(ctx, job.ID)
	if err != nil || len(reqs) != 1 || reqs[0].Action != "cancel" || reqs[0].Site != "B" || reqs[0].From != "A" || reqs[0].State != "pending" {
		t.Fatalf("A's requests for the job: %+v %v", reqs, err)
	}
	if others, err := qa.SiteRequests(ctx, "job:none"); err != nil || len(others) != 0 {
		t.Errorf("requests for a job nobody asked about: %+v %v", others, err)
	}

	w, err := worker.New(qb, worker.Config{
		Handlers: map[string]worker.Handler{"report": worker.HandlerFunc(func(context.Context, *worker.Job) error {
			t.Error("the cancelled job ran")
			return nil
		})},
		ID: "B-0", HeartbeatInterval: time.Second, SweepInterval: time.Second,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
	})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stopWorker := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(wctx) }()
	defer func() { stopWorker(); <-done }()

	// Applied once at B, and A learns it through the link.
	eventually(ctx, t, "the cancel applied at B, seen at A", func() bool {
		it, err := qa.Get(ctx, job.ID)
		reqs, rerr := qa.SiteRequests(ctx, job.ID)
		return err == nil && it.Status == couchq.StatusCancelled && rerr == nil && len(reqs) == 1 && reqs[0].State == "applied"
	})
	eventually(ctx, t, "B's heartbeat at A", func() bool {
		beats, err := qa.SiteHeartbeats(ctx)
		hb, ok := beats["B"]
		return err == nil && ok && hb.Site == "B" && hb.At > 0
	})

	if srvA.Caps().Vendor != "couchdb" {
		if _, err := a.UnlinkSites(ctx, db); err == nil {
			t.Error("unlinking on a server without a replicator of its own: no error")
		}
		return
	}
	links, err := a.SiteLinks(ctx, db)
	if err != nil || len(links) != 1 || links[0].From != "B" || links[0].To != "A" || links[0].State == "" {
		t.Fatalf("the links A's server holds: %+v %v", links, err)
	}
	if n, err := a.UnlinkSites(ctx, db); err != nil || n != 1 {
		t.Fatalf("unlinking at A: %d %v, want 1 link removed", n, err)
	}
	if links, err := a.SiteLinks(ctx, db); err != nil || len(links) != 0 {
		t.Errorf("links after unlinking: %+v %v", links, err)
	}
}

// eventually waits, up to two minutes, for cond, failing the test with
// what it waited for.
func eventually(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("waited in vain for %s", what)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// A job for a site, enqueued through the Go API in a database with no
// sites document, is stored (a producer not linked yet), and the client
// says once that no worker there runs it.
func TestSitedJobInADatabaseWithoutSitesIsSaid(t *testing.T) {
	var logged strings.Builder // written by this goroutine's calls only
	tb := setup(t, protocol.Config{})
	q, err := protocol.New(tb.ctx, tb.db, protocol.Config{Logger: zerolog.New(&logged)})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if it, err := q.Enqueue(tb.ctx, protocol.NewJob{Worker: "any", Site: "mars"}); err != nil || it.Site != "mars" {
			t.Fatalf("a job for site mars: %+v %v", it, err)
		}
	}
	if n := strings.Count(logged.String(), "no worker here runs them"); n != 1 {
		t.Errorf("warned %d times, want once:\n%s", n, logged.String())
	}
}
