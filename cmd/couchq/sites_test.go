package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/couchtest"
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
	expect(t, a.run(t, "sites", "link", "--peer-site", "B"), exitUsage, "--peer-url")
	expect(t, a.run(t, "sites", "frobnicate"), exitUsage, "unknown subcommand")
	expect(t, a.run(t, "enqueue", "--type", "x", "--site", "-bad"), exitUsage, "invalid --site")
	expect(t, a.run(t, "worker", "--type", "x", "--handler", "noop", "--take-over", "B"), exitUsage, "go together")
	expect(t, a.run(t, "worker", "--type", "x", "--handler", "noop", "--take-over", "no way", "--take-over-after", "1m"), exitUsage, "not a site name")
	if r := a.run(t, "sites"); r.code != 0 || !strings.Contains(r.stdout, "no sites") {
		t.Fatalf("sites before any: %+v", r)
	}
	// A worker of a site the database does not know does not start.
	r := a.run(t, "worker", "--type", "x", "--handler", "noop", "--drain")
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
	r = a.run(t, "sites", "link", "--peer-url", b0.URL(), "--peer-site", "B", "--peer-user", buser, "--peer-password-file", pwFile)
	if r.code != 0 || strings.Contains(r.stdout+r.stderr, bpw) {
		t.Fatalf("sites link: %+v", r)
	}
	// The sites document reaches B through the link.
	waitFor(t, time.Minute, func() bool {
		r := b.run(t, "sites", "--json")
		return r.code == 0 && strings.Contains(r.stdout, `"site": "B"`)
	})

	r = a.run(t, "enqueue", "--type", "thumb", "--payload", `{"n":1}`, "--site", "B")
	if r.code != 0 {
		t.Fatalf("enqueue for B: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	// A's worker drains without touching B's job; B's runs it.
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
	r = b.run(t, "sites", "takeover", "A", "--to", "B")
	if r.code != 0 || !strings.Contains(r.stdout, "moved 1 unfinished jobs of site A to site B") {
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
