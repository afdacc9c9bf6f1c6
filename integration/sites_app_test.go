package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/internal/localserver"
	"github.com/couchq/couchq/internal/protocol"
)

// guideAppSync is the replication option the sites guide gives an
// application's PouchDB, in the guide's own words: only jobs (and
// deletions) cross.
const guideAppSync = `{selector: {$or: [{type: 'WorkItem'}, {_deleted: true}]}}`

// appSyncScript is an application's PouchDB (in memory, from the PouchDB
// packages the harness installs for PouchDB Server): it pulls from one
// site with the guide's option, enqueues a job for site B, pushes to
// another site, and prints what it holds.
const appSyncScript = `
const nm = process.argv[2];
const PouchDB = require(nm + '/pouchdb-core')
  .plugin(require(nm + '/pouchdb-adapter-http'))
  .plugin(require(nm + '/pouchdb-adapter-memory'))
  .plugin(require(nm + '/pouchdb-replication'));
const sync = JSON.parse(process.argv[3]);
(async () => {
  const db = new PouchDB('app', {adapter: 'memory'});
  await db.replicate.from(process.argv[4], sync);
  await db.put({_id: 'job:from-the-app', type: 'WorkItem', worker: 'thumb', site: 'B'});
  await db.replicate.to(process.argv[5], sync);
  const all = await db.allDocs({include_docs: true});
  console.log(JSON.stringify(all.rows.map(r => ({id: r.id, type: r.doc.type}))));
})().catch(e => { console.error(e); process.exit(1); });
`

// An application that syncs its PouchDB with one site and later with
// another (its site taken over, say), as the sites guide shows, carries
// jobs and nothing a site keeps for itself: a pause at A does not reach
// B, nor A's worker registry, nor couchq's design documents.
func TestSitesApplicationSyncCarriesJobsOnly(t *testing.T) {
	if !server.Caps().SelectorFilter {
		t.Skip("an application syncs with a site that runs workers, which has the _selector filter (Apache CouchDB); PouchDB Server has none")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	tools, err := localserver.ToolsDir()
	if err != nil {
		t.Fatal(err)
	}
	modules := filepath.Join(tools, "node_modules")
	if _, err := os.Stat(filepath.Join(modules, "pouchdb-replication")); err != nil {
		t.Skipf("the PouchDB packages are not installed in %s (make installs them): %v", modules, err)
	}
	guide, err := os.ReadFile("../docs/sites.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(guide), guideAppSync) {
		t.Fatalf("the sites guide no longer gives an application %s", guideAppSync)
	}
	ctx, a, b := twoSites(t)
	var rc siteRuns
	a.startWorkers(ctx, t, &rc, 1, "thumb")
	ids := a.enqueue(ctx, t, "thumb", "A", 3)
	waitStatusAt(ctx, t, a, protocol.StatusDone, ids...)
	if err := a.client.Pause(ctx, "thumb", "ops@A", "A only"); err != nil {
		t.Fatal(err)
	}

	siteURL := func(s *testSite) string {
		u, err := url.Parse(strings.TrimRight(s.end.URL, "/") + "/" + s.end.DB)
		if err != nil {
			t.Fatal(err)
		}
		if s.end.User != "" {
			u.User = url.UserPassword(s.end.User, s.end.Password)
		}
		return u.String()
	}
	// The guide's option is JavaScript; the script takes it as JSON.
	option := `{"selector": {"$or": [{"type": "WorkItem"}, {"_deleted": true}]}}`
	runCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	script := filepath.Join(t.TempDir(), "app.js")
	if err := os.WriteFile(script, []byte(appSyncScript), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(runCtx, node, script, modules, option, siteURL(a), siteURL(b)).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("the application's sync: %v\n%s", err, stderr)
	}
	var held []struct{ ID, Type string }
	if err := json.Unmarshal(out, &held); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	jobs := 0
	for _, d := range held {
		if d.Type != protocol.DocType {
			t.Errorf("the application holds %s (type %q): only jobs should cross", d.ID, d.Type)
		}
		jobs++
	}
	if jobs < len(ids)+1 {
		t.Errorf("the application holds %d jobs, want A's %d and its own: %+v", jobs, len(ids), held)
	}
	// The application's job reached B, and A's pause did not.
	bdb := b.conn.Client.DB(sitesDB)
	if _, err := bdb.GetRev(ctx, "job:from-the-app"); err != nil {
		t.Errorf("the application's job at B: %v", err)
	}
	if _, err := bdb.GetRev(ctx, protocol.ControlID("thumb")); kivik.HTTPStatus(err) != http.StatusNotFound {
		t.Errorf("A's pause reached B through the application (%v)", err)
	}
	if paused, err := b.client.Paused(ctx, "thumb"); err != nil || paused["thumb"] {
		t.Errorf("thumb paused at B: %v %v", paused, err)
	}
}
