package opshttp

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/forms"
	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
)

// getSites fetches /api/sites, failing the test on anything but 200 and
// its JSON; raw is the answer as an object, to tell an absent field from
// an empty one.
func getSites(t *testing.T, url string) (report forms.SitesReport, raw map[string]json.RawMessage) {
	t.Helper()
	code, body := opstest.Get(t, url+"/api/sites")
	if code != http.StatusOK {
		t.Fatalf("/api/sites: %d\n%s", code, body)
	}
	if err := json.Unmarshal([]byte(body), &report); err != nil {
		t.Fatalf("/api/sites: %v\n%s", err, body)
	}
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatalf("/api/sites: %v\n%s", err, body)
	}
	return report, raw
}

// A single database has no site heartbeat gauge and no sites. Once it has
// sites A (the default) and B, and A's workers beat: the gauge has A's
// heartbeat age at the scrape and no series for B, which never beat;
// /api/sites lists both, B's age null; the links are left out for a
// client that cannot read them.
func TestHandlerSites(t *testing.T) {
	t.Parallel()
	ctx, db := newDB(t)
	clock := opstest.NewClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	q, err := protocol.New(ctx, db, protocol.Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	hs := serveHandler(ctx, t, q, Config{Now: clock.Now, CacheTTL: -1, CouchURL: srv.URL()})

	m := scrape(t, hs)
	m.Check(t, 1, "couchq_up")
	if f := m["couchq_site_heartbeat_age_seconds"]; f != nil {
		t.Errorf("a single database has site heartbeat ages: %v", f)
	}
	report, raw := getSites(t, hs.URL)
	if len(report.Sites) != 0 || string(raw["sites"]) != "[]" || raw["links"] != nil {
		t.Errorf("/api/sites of a single database: %+v %s", report, raw)
	}

	opstest.SitesAB(ctx, t, db, clock.Now)
	clock.Add(7 * time.Second)

	m = scrape(t, hs)
	m.Check(t, 1, "couchq_up")
	m.Check(t, 7, "couchq_site_heartbeat_age_seconds", "site=A")
	if f := m["couchq_site_heartbeat_age_seconds"]; f == nil || len(f.GetMetric()) != 1 || f.GetHelp() == "" {
		t.Errorf("want one series, A's, with help: %v", f)
	}

	report, raw = getSites(t, hs.URL)
	if len(report.Sites) != 2 || raw["links"] != nil {
		t.Fatalf("/api/sites: %+v %s", report, raw)
	}
	if s := report.Sites[0]; s.Site != "A" || !s.Default || s.HeartbeatAge == nil || *s.HeartbeatAge != 7 || s.TakenOverBy != "" {
		t.Errorf("site A: %+v", s)
	}
	if s := report.Sites[1]; s.Site != "B" || s.Default || s.HeartbeatAge != nil {
		t.Errorf("site B: %+v", s)
	}

	// Each site's backlog: a job naming no site is the default site's (A);
	// one due later is not due. couchq_queue_due counts both sites'.
	if err := q.RefreshSites(ctx); err != nil {
		t.Fatal(err)
	}
	var it *protocol.WorkItem // the last, B's job due in an hour
	for _, j := range []protocol.NewJob{{Worker: "mail"}, {Worker: "mail", Site: "B"}, {Worker: "mail", Site: "B", At: clock.Now().Add(time.Hour)}} {
		if it, err = q.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	m = scrape(t, hs)
	m.Check(t, 2, "couchq_queue_due", "type=mail")
	m.Check(t, 1, "couchq_site_queue_due", "site=A", "type=mail")
	m.Check(t, 1, "couchq_site_queue_due", "site=B", "type=mail")

	// A cancel from the dashboard of a job this server's site (none) does
	// not own is a request for its owner: 202, not a failure.
	if admin, password := srv.Credentials(); admin != "" {
		code, _, body := opstest.Post(t, hs.URL+"/api/jobs/"+it.ID+"/cancel", admin, password)
		var answer struct {
			Forwarded protocol.SiteRequest `json:"forwarded"`
		}
		if code != http.StatusAccepted || json.Unmarshal([]byte(body), &answer) != nil || answer.Forwarded.Site != "B" || answer.Forwarded.Job != it.ID {
			t.Errorf("cancel of B's job from the dashboard: %d %s, want 202 and the request for B", code, body)
		}
		if reqs, err := q.Requests(ctx, it.ID); err != nil || len(reqs) != 1 || reqs[0].By != admin {
			t.Errorf("requests for B's job: %+v %v", reqs, err)
		}
	}

	// B takes A over: the report says so, and B is the default.
	if _, err := q.TakeOver(ctx, "A", "B"); err != nil {
		t.Fatal(err)
	}
	if report, _ = getSites(t, hs.URL); report.Sites[0].TakenOverBy != "B" || report.Sites[0].Default || !report.Sites[1].Default {
		t.Errorf("/api/sites after B took A over: %+v", report)
	}
	// A's silence is now expected: its gauge stops rather than grow for ever.
	if f := scrape(t, hs)["couchq_site_heartbeat_age_seconds"]; f != nil {
		t.Errorf("a taken-over site still has a heartbeat age: %v", f)
	}
	if f := scrape(t, hs)["couchq_site_queue_due"]; f == nil || len(f.GetMetric()) != 1 {
		t.Errorf("want B's due series only after the takeover: %v", f)
	}

	// A comes back: its workers beat again and run the jobs enqueued for
	// it since, so it is watched again, and the report says it came back.
	clock.Add(5 * time.Second)
	a, err := protocol.New(ctx, db, protocol.Config{Site: "A", Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Beat(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Add(2 * time.Second)
	m = scrape(t, hs)
	m.Check(t, 2, "couchq_site_heartbeat_age_seconds", "site=A")
	m.Check(t, 0, "couchq_site_queue_due", "site=A", "type=mail")
	if report, _ = getSites(t, hs.URL); report.Sites[0].TakenOverBy != "B" || !report.Sites[0].Returned || report.Sites[1].Returned {
		t.Errorf("/api/sites after A came back: %+v", report)
	}
}

// A client opened through a Server, as couchq serve's is, reads the links
// the server holds for the database (as an admin): [] before any, then the
// link from B's database into A's, with its state.
func TestHandlerSitesLinks(t *testing.T) {
	t.Parallel()
	if c := srv.Caps(); c.Vendor != "couchdb" || !c.SelectorFilter {
		t.Skip("the links are read from Apache CouchDB's replicator")
	}
	user, password := srv.Credentials()
	ctx, dbA := newDB(t)
	_, dbB := newDB(t)
	server, err := protocol.Connect(ctx, srv.URL(), user, password)
	if err != nil {
		t.Fatal(err)
	}
	q, err := server.Open(ctx, dbA.Name(), protocol.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.AddSite(ctx, "A"); err != nil {
		t.Fatal(err)
	}
	hs := serveHandler(ctx, t, q, Config{CacheTTL: -1})
	report, raw := getSites(t, hs.URL)
	if len(report.Sites) != 1 || string(raw["links"]) != "[]" {
		t.Fatalf("/api/sites before any link: %+v %s", report, raw)
	}
	if _, err := q.AddSite(ctx, "B"); err != nil { // a link's sites must be listed
		t.Fatal(err)
	}

	// Both databases on the one server: A's pulls from B's and B's from
	// A's, both links held here.
	end := func(site, db string) protocol.SiteEndpoint {
		return protocol.SiteEndpoint{Site: site, URL: srv.URL(), DB: db, User: user, Password: password, Replicator: true}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, db := range []string{dbA.Name(), dbB.Name()} {
			if _, err := server.Unlink(ctx, db); err != nil {
				t.Errorf("unlinking %s: %v", db, err)
			}
		}
	})
	if err := protocol.LinkSites(ctx, end("A", dbA.Name()), end("B", dbB.Name()), map[string]*protocol.Server{"A": server, "B": server}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		report, _ = getSites(t, hs.URL)
		if len(report.Links) == 1 && report.Links[0].State != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the link into A does not show: %+v", report)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if l := report.Links[0]; l.From != "B" || l.To != "A" || l.DocID == "" {
		t.Errorf("link: %+v", l)
	}
}
