package bench

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeRelease makes a directory that localserver.FindCouchDB takes for an
// Apache CouchDB release (nothing is started from it).
func fakeRelease(t *testing.T) string {
	t.Helper()
	home := t.TempDir()
	for _, f := range []struct {
		path string
		mode os.FileMode
	}{{"bin/couchdb", 0o755}, {"etc/default.ini", 0o644}, {"etc/vm.args", 0o644}} {
		p := filepath.Join(home, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	return home
}

func kindsOf(plan []plannedServer) (kinds, skipped []string) {
	for _, ps := range plan {
		kinds = append(kinds, ps.kind)
		if ps.skip != "" {
			skipped = append(skipped, ps.kind)
		}
	}
	return kinds, skipped
}

func TestPlanServers(t *testing.T) {
	release, empty := fakeRelease(t), t.TempDir()
	for _, c := range []struct {
		name          string
		cfg           Config
		kinds, skip   []string
		err, homeFrom string
	}{
		{name: "a URL alone", cfg: Config{URL: "http://127.0.0.1:5984", CouchDBHome: release}, kinds: []string{serverURL}},
		{name: "every server", cfg: Config{CouchDBHome: release},
			kinds: []string{ServerCouchDB, ServerCluster, ServerPouchDB}, homeFrom: "COUCHQ_COUCHDB_HOME"},
		{name: "no release: CouchDB skipped", cfg: Config{CouchDBHome: empty},
			kinds: []string{ServerCouchDB, ServerCluster, ServerPouchDB}, skip: []string{ServerCouchDB, ServerCluster}},
		{name: "named, in the bench's order", cfg: Config{CouchDBHome: release, Servers: []string{ServerPouchDB, ServerCluster}},
			kinds: []string{ServerCluster, ServerPouchDB}},
		{name: "pouchdb needs no release", cfg: Config{CouchDBHome: empty, Servers: []string{ServerPouchDB}},
			kinds: []string{ServerPouchDB}},
		{name: "a named server without its release", cfg: Config{CouchDBHome: empty, Servers: []string{ServerCluster, ServerPouchDB}},
			err: "--servers cluster: no Apache CouchDB release at " + empty},
	} {
		t.Run(c.name, func(t *testing.T) {
			plan, err := planServers(c.cfg)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			kinds, skipped := kindsOf(plan)
			if !slices.Equal(kinds, c.kinds) || !slices.Equal(skipped, c.skip) {
				t.Fatalf("servers %v (skipped %v), want %v (skipped %v)", kinds, skipped, c.kinds, c.skip)
			}
			for _, ps := range plan {
				if ps.skip != "" && !strings.Contains(ps.skip, "no Apache CouchDB release at "+empty) {
					t.Errorf("%s skipped for %q", ps.kind, ps.skip)
				}
				if c.homeFrom != "" && ps.kind != ServerPouchDB && (ps.home != release || ps.homeFrom != c.homeFrom) {
					t.Errorf("%s: release %q from %q, want %q from %q", ps.kind, ps.home, ps.homeFrom, release, c.homeFrom)
				}
			}
		})
	}
}

// The cluster runs smaller sections 2 and 5 and a slower section 3, and
// section 4's full backlog; every other server the sizes given.
func TestForServerScalesTheCluster(t *testing.T) {
	c := Config{Jobs: 5000, ContentionJobs: 400, BacklogSmall: 1000, BacklogLarge: 20000, Claims: 200, ClusterScale: 0.4}.WithDefaults()
	for _, kind := range []string{ServerCouchDB, ServerPouchDB, serverURL} {
		if got := c.forServer(kind); got.Jobs != 5000 || got.ContentionJobs != 400 || got.BacklogLarge != 20000 {
			t.Errorf("%s: %d / %d / %d, want the sizes given", kind, got.Jobs, got.ContentionJobs, got.BacklogLarge)
		}
	}
	got := c.forServer(ServerCluster)
	if got.Jobs != 2000 || got.ContentionJobs != 400 || got.BacklogLarge != 8000 || got.BacklogSmall != 1000 {
		t.Errorf("cluster: jobs %d, contention %d, backlog %d / %d", got.Jobs, got.ContentionJobs, got.BacklogSmall, got.BacklogLarge)
	}
	// Section 3 enqueues at the scaled rate, half as many jobs (200 at 20/s for 10 s on a node).
	if got.Rate != 8 || got.Duration != 12500*time.Millisecond {
		t.Errorf("cluster: wake-up rate %g/s for %s, want 8/s for 12.5s", got.Rate, got.Duration)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("the scaled configuration is invalid: %v", err)
	}
	// Never below the small backlog (section 5 compares the two), nor below one job.
	c.ClusterScale = 0.001
	got = c.forServer(ServerCluster)
	if got.Jobs != 5 || got.ContentionJobs != 400 || got.BacklogLarge != 1000 {
		t.Errorf("scaled far down: jobs %d, contention %d, large backlog %d", got.Jobs, got.ContentionJobs, got.BacklogLarge)
	}
	if got.Duration != 50*time.Second {
		t.Errorf("scaled far down: the wake-up section enqueues for %s, want at most five times 10s", got.Duration)
	}
	c.ClusterScale = 1
	if got := c.forServer(ServerCluster); got.Jobs != 5000 || got.BacklogLarge != 20000 {
		t.Errorf("scale 1: %d / %d", got.Jobs, got.BacklogLarge)
	}
}
