package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/forms"
	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
)

// siteCmdline is a cmdline for a site of its own, database "queue".
func siteCmdline(t *testing.T, s *couchtest.Server, site string) cmdline {
	t.Helper()
	user, password := s.Credentials()
	return cmdline{env: map[string]string{
		"COUCHDB_URL": s.URL(), "COUCHDB_USER": user, "COUCHDB_PASSWORD": password,
		"COUCHQ_DB": "queue", "COUCHQ_SITE": site,
	}}
}

// The sites commands as an operator uses them: add the sites, link two
// Apache CouchDB servers with the peer's password in a file (never
// printed), enqueue at one site for the other, see the job run there by a
// worker of that site, list the sites and links, and take a site over.
func TestSitesCommands(t *testing.T) {
	a0, b0 := srv.NewSite(t), srv.NewSite(t)
	a, b := siteCmdline(t, a0, "A"), siteCmdline(t, b0, "B")
	a.mustInit(t)
	b.mustInit(t)

	// Bad input first: each a clear usage error.
	expect(t, a.run(t, "sites", "add", "no way"), exitUsage, "invalid site name")
	expect(t, a.run(t, "sites", "takeover", "A"), exitUsage, "--to")
	expect(t, a.run(t, "sites", "takeover", "A", "--to", "A"), exitUsage, "a site cannot take itself over")
	expect(t, a.run(t, "sites", "link", "--peer-site", "B"), exitUsage, "--peer-url")
	expect(t, a.run(t, "sites", "link", "--peer-site", "B", "--peer-url", "localhost:5984"), exitUsage, `invalid --peer-url "localhost:5984"`)
	expect(t, a.run(t, "sites", "frobnicate"), exitUsage, "unknown subcommand")
	expect(t, a.run(t, "enqueue", "--type", "x", "--site", "-bad"), exitUsage, "invalid --site")
	expect(t, a.run(t, "worker", "--type", "x", "--handler", "noop", "--take-over", "B"), exitUsage, "go together")
	expect(t, a.run(t, "worker", "--type", "x", "--handler", "noop", "--take-over", "no way", "--take-over-after", "1m"), exitUsage, "not a site name")
	expect(t, a.run(t, "worker", "--type", "x", "--handler", "noop", "--await-sites", "-1s"), exitUsage, "invalid --await-sites -1s: must not be negative")
	if r := a.run(t, "sites"); r.code != 0 || !strings.Contains(r.stdout, "no sites") {
		t.Fatalf("sites before any: %+v", r)
	}
	// --json is JSON, none or not: no sites, no requests.
	if r := a.run(t, "sites", "--json"); r.code != 0 || strings.TrimSpace(r.stdout) != `{
  "sites": []
}` {
		t.Errorf("sites --json before any: %+v", r)
	}
	if r := a.run(t, "sites", "requests", "--json"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("sites requests --json before any: %+v", r)
	}
	// A database without sites stores a job for a site (it may be a
	// producer not linked yet) and says that nothing there runs it.
	single := a.withEnv("COUCHQ_DB", "single").mustInit(t)
	r := single.run(t, "enqueue", "--type", "x", "--site", "B")
	if r.code != 0 || !strings.Contains(r.stderr, "this database has no sites: jobs for site B run only once") {
		t.Fatalf("enqueue for a site in a database without sites: %+v", r)
	}
	if r := single.run(t, "show", strings.TrimSpace(r.stdout)); !strings.Contains(r.stdout, "B (this database has no sites: no worker here runs it") {
		t.Fatalf("show of a job for a site in a database without sites: %+v", r)
	}
	if r := single.run(t, "ls"); !strings.Contains(r.stdout, "jobs of site B: this database has no sites: no worker here runs them") {
		t.Fatalf("ls of a job for a site in a database without sites: %+v", r)
	}
	if r := single.withEnv("COUCHQ_SITE", "").run(t, "enqueue", "--type", "x"); r.code != 0 || r.stderr != "" {
		t.Fatalf("enqueue for no site in a database without sites: %+v", r)
	}
	// A worker of a site the database does not know does not start.
	r = a.run(t, "worker", "--type", "x", "--handler", "noop", "--drain")
	if r.code == 0 || !strings.Contains(r.stderr, "couchq sites add A") {
		t.Fatalf("worker of an unknown site: %+v", r)
	}

	for _, s := range []string{"A", "B"} {
		if r := a.withEnv("COUCHQ_SITE", "").run(t, "sites", "add", s); r.code != 0 {
			t.Fatalf("sites add %s: %+v", s, r)
		}
	}
	_, bpw := b0.Credentials()
	pwFile := filepath.Join(t.TempDir(), "peer.pw")
	if err := os.WriteFile(pwFile, []byte(bpw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	buser, _ := b0.Credentials()
	// A link that could only fail is refused before anything is written: a
	// site no sites document lists (a misspelt name), a database that does
	// not exist.
	expect(t, a.run(t, "sites", "link", "--peer-url", b0.URL(), "--peer-site", "Bee", "--peer-user", buser, "--peer-password-file", pwFile),
		exitFailure, "site Bee is not one of the sites (A, B) as site A's database has them")
	expect(t, a.run(t, "sites", "link", "--peer-url", b0.URL(), "--peer-site", "B", "--peer-db", "nodb", "--peer-user", buser, "--peer-password-file", pwFile),
		exitFailure, "site B's database nodb does not exist")
	expect(t, a.run(t, "sites", "link", "--peer-url", a0.URL(), "--peer-site", "B"), exitFailure, "are one database") // a wrong --peer-url
	if r := a.withEnv("COUCHQ_SITE", "").run(t, "sites", "--json"); r.code != 0 || strings.Contains(r.stdout, `"links": [{`) || strings.Contains(r.stdout, `"doc_id"`) {
		t.Fatalf("links after two refused: %+v", r)
	}
	r = a.run(t, "sites", "link", "--peer-url", b0.URL(), "--peer-site", "B", "--peer-user", buser, "--peer-password-file", pwFile)
	if r.code != 0 || strings.Contains(r.stdout+r.stderr, bpw) || r.stderr != "" {
		t.Fatalf("sites link: %+v", r)
	}
	// Linked again through a list of nodes: the links take the first, and
	// say that the site is cut off while that one is down.
	r = a.run(t, "sites", "link", "--peer-url", b0.URL()+","+b0.URL(), "--peer-site", "B", "--peer-user", buser, "--peer-password-file", pwFile)
	if r.code != 0 || !strings.Contains(r.stderr, "note: the links reach site B through its first node, "+b0.URL()+", alone") {
		t.Fatalf("sites link through a list of nodes: %+v", r)
	}
	// The sites document reaches B through the link.
	waitFor(t, time.Minute, func() bool {
		r := b.run(t, "sites", "--json")
		return r.code == 0 && strings.Contains(r.stdout, `"site": "B"`)
	})

	// A user who is no server admin still lists the sites; the links, a
	// server admin's to read, are said to be hidden, not an error.
	member := fmt.Sprintf("member-%08x", rand.Uint32())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a0.AddUser(ctx, member, "member-pw"); err == nil {
		expect(t, a.run(t, "init", "--workers", member), exitOK)
		r := a.as(t, member, "member-pw").run(t, "sites")
		if r.code != 0 || !strings.Contains(r.stdout, "links not shown") || !strings.Contains(r.stdout, "A ") {
			t.Fatalf("sites as a member: %+v", r)
		}
		r = a.as(t, member, "member-pw").run(t, "sites", "--json")
		if r.code != 0 || strings.Contains(r.stdout, `"links"`) || !strings.Contains(r.stdout, `"site": "B"`) {
			t.Fatalf("sites --json as a member: %+v", r)
		}
	} else if !errors.Is(err, couchtest.ErrNoUsers) {
		t.Fatal(err)
	}

	// A site the sites document does not list is refused, nothing written;
	// a line of a --file names its own site, checked like the flag.
	expect(t, a.run(t, "enqueue", "--type", "thumb", "--site", "Z"), exitUsage, "site Z is not one of the database's sites (A, B)")
	expect(t, a.withStdin(`{"type":"thumb","site":"no way"}`+"\n").run(t, "enqueue", "--file", "-"), exitUsage, `stdin:1: invalid "site" "no way"`)
	// The file is refused whole: the line for B is not enqueued either.
	r = a.withStdin(`{"type":"filed","site":"Z"}`+"\n"+`{"type":"filed","site":"B","id":"job:line-for-B"}`+"\n").run(t, "enqueue", "--file", "-")
	if r.code != exitUsage || !strings.Contains(r.stderr, "stdin:1: invalid job: site Z is not one of the database's sites (A, B)") ||
		!strings.Contains(r.stderr, "nothing was enqueued") || strings.Contains(r.stderr, "no sites") {
		t.Fatalf("enqueue --file with a line for Z and one for B: %+v", r)
	}
	if r := a.run(t, "show", "job:line-for-B"); r.code != exitFailure {
		t.Fatalf("the line for B of a refused file was enqueued: %+v", r)
	}
	expect(t, a.withStdin(`{"type":"filed","site":"B","id":"job:line-for-B"}`+"\n").run(t, "enqueue", "--file", "-"), exitOK)
	r = a.run(t, "show", "job:line-for-B", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"site": "B"`) {
		t.Fatalf("the line for B: %+v", r)
	}
	if r := a.run(t, "ls", "--type", "filed", "--json"); r.code != 0 || strings.Count(r.stdout, `"_id"`) != 1 {
		t.Fatalf("jobs of type filed, want the line for B alone: %+v", r)
	}

	// One written by hand for a site the queue does not have is failed by
	// the default site's sweep, which says so.
	a.put(t, "queue", "job:handwritten-for-Z", `{"type":"WorkItem","worker":"filed","site":"Z"}`)
	if r := a.run(t, "show", "job:handwritten-for-Z"); !strings.Contains(r.stdout, "Z (not one of the queue's sites: the default site's sweep fails it)") {
		t.Fatalf("show of a job for Z: %+v", r)
	}
	if r := a.run(t, "ls", "--type", "filed"); !strings.Contains(r.stdout, "jobs of site Z: not one of the queue's sites") {
		t.Fatalf("ls of a job for Z: %+v", r)
	}
	if r := a.run(t, "sweep"); r.code != 0 || !strings.Contains(r.stdout, "1 job of unknown sites failed") {
		t.Fatalf("the default site's sweep of a job for Z: %+v", r)
	}

	r = a.run(t, "enqueue", "--type", "thumb", "--payload", `{"n":1}`, "--site", "B")
	if r.code != 0 {
		t.Fatalf("enqueue for B: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	// A's worker drains without touching B's job; B's runs it.
	// A takeover that could never happen is refused at start: its own
	// site, a site the queue does not have.
	expect(t, a.run(t, "worker", "--type", "thumb", "--handler", "noop", "--drain", "--take-over", "A", "--take-over-after", "1m"),
		exitFailure, "TakeOver A: a site cannot take itself over")
	expect(t, a.run(t, "worker", "--type", "thumb", "--handler", "noop", "--drain", "--take-over", "Z", "--take-over-after", "1m"),
		exitFailure, "TakeOver Z: site Z is not one of the sites (A, B)")
	if r := a.run(t, "worker", "--type", "thumb", "--handler", "noop", "--drain"); r.code != 0 {
		t.Fatalf("A's worker: %+v", r)
	}
	waitFor(t, time.Minute, func() bool {
		r := b.run(t, "show", id, "--json")
		return r.code == 0
	})
	if r := b.run(t, "worker", "--type", "thumb", "--handler", "noop", "--drain"); r.code != 0 {
		t.Fatalf("B's worker: %+v", r)
	}
	r = b.run(t, "show", id, "--json")
	var job struct {
		Status  string `json:"status"`
		Site    string `json:"site"`
		History []struct {
			Event, By string
		} `json:"history"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &job); err != nil || job.Status != "done" || job.Site != "B" {
		t.Fatalf("B's job after B's worker: %v %+v\n%s", err, job, r.stdout)
	}

	// A cancel at A of a job of B's waits for B: show says so, and sites
	// requests takes the job's id (not a site's name).
	r = a.run(t, "enqueue", "--type", "later", "--site", "B", "--in", "1h")
	later := strings.TrimSpace(r.stdout)
	if r := a.run(t, "cancel", later); r.code != 0 || !strings.Contains(r.stdout, "requested from site B") {
		t.Fatalf("cancel at A of B's job: %+v", r)
	}
	if r := a.run(t, "show", later); !strings.Contains(r.stdout, "cancel by cli") || !strings.Contains(r.stdout, "pending: site B applies it when the request reaches it") {
		t.Fatalf("show of a job whose cancel waits for its owner: %+v", r)
	}
	if r := a.run(t, "sites", "requests", later); r.code != 0 || !strings.Contains(r.stdout, later) || !strings.Contains(r.stdout, "pending") {
		t.Fatalf("sites requests of a job: %+v", r)
	}

	// A requeue is not asked of another site (whether the claimant is gone
	// is known at the owner): refused at A, saying so and not calling it
	// a claim conflict; nothing is written.
	r = b.run(t, "enqueue", "--type", "held")
	held := strings.TrimSpace(r.stdout)
	if r := b.run(t, "claim", "--type", "held", "--as", "agent-b"); r.code != 0 || !strings.Contains(r.stdout, held) {
		t.Fatalf("claim at B: %+v", r)
	}
	waitFor(t, time.Minute, func() bool {
		r := a.run(t, "show", held, "--json")
		return r.code == 0 && strings.Contains(r.stdout, `"status": "running"`)
	})
	r = a.run(t, "requeue", held, "--force")
	if r.code != exitFailure || !strings.Contains(r.stderr, "it belongs to site B, and this is not asked of another site; run it there") || strings.Contains(r.stderr, "claimed") {
		t.Fatalf("requeue at A of B's running job: %+v", r)
	}

	// A pause of thumb at B, asked at A: B's workers apply it.
	expect(t, a.run(t, "pause", "thumb", "--at", "no way"), exitUsage, "invalid --at")
	expect(t, a.run(t, "pause", "thumb", "--at", "Z"), exitUsage, "pause of thumb at site Z: site Z is not one of the sites (A, B)")
	r = a.run(t, "pause", "thumb", "--at", "B", "--reason", "disk full")
	if r.code != 0 || !strings.Contains(r.stdout, "pause of thumb requested from site B") {
		t.Fatalf("pause --at B: %+v", r)
	}
	waitFor(t, time.Minute, func() bool {
		r := b.run(t, "sites", "requests")
		return r.code == 0 && strings.Contains(r.stdout, "type thumb")
	})
	if r := b.run(t, "sweep"); r.code != 0 { // as B's workers' sweeps do
		t.Fatalf("B's sweep: %+v", r)
	}
	waitFor(t, time.Minute, func() bool {
		r := b.run(t, "stats", "--json")
		return r.code == 0 && strings.Contains(r.stdout, `"paused": true`)
	})
	if r := a.run(t, "resume", "thumb", "--at", "B"); r.code != 0 || !strings.Contains(r.stdout, "resume of thumb requested from site B") {
		t.Fatalf("resume --at B: %+v", r)
	}
	waitFor(t, time.Minute, func() bool {
		r := b.run(t, "sites", "requests")
		return r.code == 0 && strings.Count(r.stdout, "type thumb") == 2
	})
	if r := b.run(t, "sweep"); r.code != 0 {
		t.Fatalf("B's sweep: %+v", r)
	}
	if r := b.run(t, "stats", "--json"); r.code != 0 || strings.Contains(r.stdout, `"paused": true`) {
		t.Fatalf("thumb still paused at B: %+v", r)
	}

	// ls: both sites, A the default, and the links A holds.
	r = a.run(t, "sites")
	for _, want := range []string{"SITE", "A     yes", "B", "LINK", "B -> A", "running"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("couchq sites does not show %q:\n%s", want, r.stdout)
		}
	}

	// B takes A over: A's queued job moves, and B becomes the default.
	r = a.run(t, "enqueue", "--type", "thumb")
	if r.code != 0 {
		t.Fatal(r)
	}
	aJob := strings.TrimSpace(r.stdout)
	waitFor(t, time.Minute, func() bool { return b.run(t, "show", aJob, "--json").code == 0 })
	expect(t, b.run(t, "sites", "takeover", "Z", "--to", "B"), exitUsage, "taking site Z over by B: site Z is not one of the sites (A, B)")
	r = b.run(t, "sites", "takeover", "A", "--to", "B")
	if r.code != 0 || !strings.Contains(r.stdout, "moved 1 unfinished job of site A to site B") {
		t.Fatalf("takeover: %+v", r)
	}
	r = b.run(t, "sites", "--json")
	var listed struct {
		Sites []struct {
			Site        string `json:"site"`
			Default     bool   `json:"default"`
			TakenOverBy string `json:"taken_over_by"`
		} `json:"sites"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &listed); err != nil || len(listed.Sites) != 2 ||
		listed.Sites[0].TakenOverBy != "B" || !listed.Sites[1].Default {
		t.Fatalf("sites after the takeover: %v %+v", err, listed)
	}
	if r := b.run(t, "worker", "--type", "thumb", "--handler", "noop", "--drain"); r.code != 0 {
		t.Fatal(r)
	}
	if r := b.run(t, "show", aJob); !strings.Contains(r.stdout, "site-takeover") || !strings.Contains(r.stdout, "done") {
		t.Fatalf("the job taken over: %s", r.stdout)
	}
	if r := a.run(t, "sites", "unlink"); r.code != 0 || !strings.Contains(r.stdout, "removed 1 link this server held for queue") {
		t.Fatalf("unlink: %+v", r)
	}
}

// waitFor polls cond until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatal("timed out waiting")
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// ls and show name each job's owner: not at all in a single database
// whose jobs name no site (the output as it always was), the site a job
// names, and once the database has sites, the default site for a job that
// names none. sites --json has each site's heartbeat age, null for a site
// that never beat.
func TestLsAndShowNameTheOwnerSite(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := srv.Client(t).DB(c.env["COUCHQ_DB"])
	q, err := protocol.New(ctx, db, protocol.Config{})
	if err != nil {
		t.Fatal(err)
	}
	enqueue := func(id, site string) {
		t.Helper()
		if _, err := q.Enqueue(ctx, protocol.NewJob{ID: id, Worker: "mail", Site: site}); err != nil {
			t.Fatal(err)
		}
	}
	// ls returns the table's header and each job's owner by id.
	ls := func() (header []string, owners map[string]string) {
		t.Helper()
		r := c.run(t, "ls")
		expect(t, r, exitOK)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		owners = map[string]string{}
		for _, l := range lines[1:] {
			if f := strings.Fields(l); len(f) > 2 {
				owners[f[0]] = f[2]
			}
		}
		return strings.Fields(lines[0]), owners
	}
	siteLine := regexp.MustCompile(`\n  site +(.*)\n`)
	showSite := func(id string) string {
		t.Helper()
		r := c.run(t, "show", id)
		expect(t, r, exitOK)
		if m := siteLine.FindStringSubmatch(r.stdout); m != nil {
			return m[1]
		}
		return ""
	}

	enqueue("plain", "")
	if header, _ := ls(); strings.Join(header, " ") != "ID TYPE STATUS ATTEMPTS DUE LAST ERROR" {
		t.Errorf("ls of a single database: header %q", header)
	}
	if s := showSite("plain"); s != "" {
		t.Errorf("show in a single database: site %q", s)
	}

	// A job that names a site, before the database has sites.
	enqueue("for-b", "B")
	header, owners := ls()
	if strings.Join(header, " ") != "ID TYPE SITE STATUS ATTEMPTS DUE LAST ERROR" || owners["plain"] != "-" || owners["for-b"] != "B" {
		t.Errorf("ls with a job for B: %q %v", header, owners)
	}

	opstest.SitesAB(ctx, t, db, nil)
	if _, owners := ls(); owners["plain"] != "A" || owners["for-b"] != "B" {
		t.Errorf("ls with sites: owners %v, want plain A and for-b B", owners)
	}
	if s := showSite("plain"); s != "A (default)" {
		t.Errorf("show plain: site %q, want A (default)", s)
	}
	if s := showSite("for-b"); s != "B" {
		t.Errorf("show for-b: site %q, want B", s)
	}

	// stats splits the due jobs by owner site: each site's workers claim
	// only their own.
	if r := c.run(t, "stats", "--type", "mail"); r.code != 0 || !regexp.MustCompile(`DUE BY SITE\n.*A 1, B 1\n`).MatchString(r.stdout) {
		t.Errorf("stats of a database of sites: want mail's due jobs as A 1, B 1:\n%s", r.stdout)
	}

	r := c.run(t, "sites", "--json")
	expect(t, r, exitOK)
	var report forms.SitesReport
	if err := json.Unmarshal([]byte(r.stdout), &report); err != nil || len(report.Sites) != 2 {
		t.Fatalf("sites --json: %v\n%s", err, r.stdout)
	}
	if age := report.Sites[0].HeartbeatAge; age == nil || *age < 0 || *age > 60 {
		t.Errorf("A's heartbeat age: want a few seconds\n%s", r.stdout)
	}
	if age := report.Sites[1].HeartbeatAge; age != nil {
		t.Errorf("B's heartbeat age: %v, want none", *age)
	}
	if !strings.Contains(r.stdout, `"heartbeat_age_seconds": null`) {
		t.Errorf("sites --json: no null heartbeat age for B:\n%s", r.stdout)
	}
	r = c.run(t, "sites")
	if !strings.Contains(r.stdout, "never") || !strings.Contains(r.stdout, " ago") {
		t.Errorf("sites: want A's heartbeat some time ago and B's never:\n%s", r.stdout)
	}
	// PouchDB Server's links run in its own process and are not listed:
	// an empty table of links would read as none.
	if srv.Caps().Vendor == "pouchdb-server" && !strings.Contains(r.stdout, "links not shown: this server has no replicator of its own") {
		t.Errorf("sites on PouchDB Server: want the links said not shown:\n%s", r.stdout)
	}
	// Nor can they be cut but by a restart: unlink says so rather than
	// that it removed none.
	if srv.Caps().Vendor == "pouchdb-server" {
		expect(t, c.run(t, "sites", "unlink"), exitFailure, "this server has no replicator of its own", "restart it to cut them")
	}

	// serve's /api/sites is the same report; serve reads the links as
	// the sites command does (here none, as an admin of Apache CouchDB).
	s := startServe(t, c, "--addr", "127.0.0.1:0")
	code, body := s.get(t, "/api/sites")
	if err := json.Unmarshal([]byte(body), &report); code != 200 || err != nil || len(report.Sites) != 2 || report.Sites[1].Site != "B" {
		t.Fatalf("/api/sites: %d %v\n%s", code, err, body)
	}
	if caps := srv.Caps(); caps.Vendor == "couchdb" && caps.SelectorFilter && !strings.Contains(body, `"links": []`) {
		t.Errorf("/api/sites of serve on Apache CouchDB has no links:\n%s", body)
	}
	if !strings.Contains(s.stderr.String(), "the database has sites and this server works for none") {
		t.Errorf("serve without --site in a database of sites does not say what that means:\n%s", s.stderr)
	}
}
