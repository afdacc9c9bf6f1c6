package couchtest

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/couchq/couchq/internal/localserver"
)

// Sites are more servers of the same kind as the harness's own: each a
// separate site of a queue whose databases are linked by replication. A
// test starts the sites it needs and they stop when it ends; a site is
// stopped and started again (Restart) as a cluster's nodes are.

// NewSite starts a single Apache CouchDB node of its own from the local
// release, a site, stopped when the test ends; without a release the test
// is skipped, saying why.
func (s *Server) NewSite(t testing.TB) *Server {
	t.Helper()
	if os.Getenv("COUCHQ_SKIP_CLUSTER") != "" {
		Skip(t, "sites tier: COUCHQ_SKIP_CLUSTER is set")
	}
	home, err := localserver.FindCouchDB(os.Getenv)
	if err != nil {
		Skip(t, fmt.Sprintf("sites tier: %v: %v", errNoRelease, err))
	}
	dir, err := os.MkdirTemp("", "couchq-site-*")
	if err != nil {
		t.Fatalf("couchtest: creating a site's data dir: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	couch, err := localserver.StartCouchDB(ctx, localserver.CouchDBOptions{Home: home, Nodes: 1, DataDir: dir, Logger: s.logger})
	if err != nil {
		_ = os.RemoveAll(dir)
		t.Fatalf("couchtest: starting a site: %v", err)
	}
	user, password := couch.Credentials()
	site, err := newServer(KindLocal, couch.URL(), user, password, s.logger)
	if err == nil {
		site.couch, site.dataDir = couch, dir
		site.reason = "a site of its own, a single Apache CouchDB node from the local release"
		site.caps, err = detectCapabilities(ctx, site)
	}
	if err != nil {
		_ = couch.Stop(ctx)
		_ = os.RemoveAll(dir)
		t.Fatalf("couchtest: starting a site: %v", err)
	}
	t.Cleanup(func() { stopSite(t, site) })
	return site
}

// NewPouchSite starts a PouchDB Server of its own, a site that has no
// replicator (a producer, like PouchDB in a browser), stopped when the
// test ends.
func (s *Server) NewPouchSite(t testing.TB) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	site, err := startPouchDB(ctx, s.logger)
	if err == nil {
		site.reason = "a site of its own, a PouchDB Server"
		site.caps, err = detectCapabilities(ctx, site)
	}
	if err != nil {
		if site != nil {
			_ = site.Stop(ctx)
		}
		t.Fatalf("couchtest: starting a PouchDB site: %v", err)
	}
	t.Cleanup(func() { stopSite(t, site) })
	return site
}

func stopSite(t testing.TB, site *Server) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := site.Stop(ctx); err != nil {
		t.Errorf("couchtest: stopping a site: %v", err)
	}
}

// StopSite stops a site started by NewSite, keeping its data: the site is
// down until StartSite.
func (s *Server) StopSite(ctx context.Context) error {
	if s.couch == nil {
		return fmt.Errorf("couchtest: %s is not a site started from the local release", s)
	}
	return s.couch.StopNode(ctx, 1)
}

// StartSite starts a stopped site again, on the same data and port.
func (s *Server) StartSite(ctx context.Context) error {
	if s.couch == nil {
		return fmt.Errorf("couchtest: %s is not a site started from the local release", s)
	}
	return s.couch.StartNode(ctx, 1)
}
