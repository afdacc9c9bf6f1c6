package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/localserver"
)

// The local servers the bench starts when it is given no server URL.
const (
	// ServerCouchDB is one Apache CouchDB node started from the local release.
	ServerCouchDB = "couchdb"
	// ServerCluster is three Apache CouchDB nodes from the local release,
	// joined into one cluster.
	ServerCluster = "cluster"
	// ServerPouchDB is PouchDB Server from tools/pouchdb-server.
	ServerPouchDB = "pouchdb"
	// serverURL is the server of --url or COUCHDB_URL.
	serverURL = "url"
)

// LocalServers are the servers the bench can start, in the order it
// measures them.
func LocalServers() []string { return []string{ServerCouchDB, ServerCluster, ServerPouchDB} }

// The cluster's shape: that of the test harness's cluster tier
// (internal/couchtest), so the bench measures what the cluster tests run
// on. n is min(nodes, 3) = 3: every node holds a copy of every shard.
const (
	clusterNodes = 3
	clusterQ     = 2
)

// plannedServer is one server of a run: measured, or skipped with the
// reason.
type plannedServer struct {
	kind string
	// home is the Apache CouchDB release (couchdb, cluster) and homeFrom
	// where that came from, for the report.
	home, homeFrom string
	skip           string
}

// planServers lists the servers a run measures, in order: the URL's
// alone when there is one; else the named local servers, or every local
// server when none is named. A named server that cannot run is an error;
// an unnamed one is skipped with the reason, so that `make bench`
// measures what this machine has.
func planServers(cfg Config) ([]plannedServer, error) {
	if cfg.URL != "" {
		return []plannedServer{{kind: serverURL}}, nil
	}
	named := len(cfg.Servers) > 0
	kinds := cfg.Servers
	if !named {
		kinds = LocalServers()
	}
	// FindCouchDB reads only COUCHQ_COUCHDB_HOME: give it the configured one.
	home, homeErr := localserver.FindCouchDB(func(k string) string {
		if k == localserver.CouchDBHomeEnv {
			return cfg.CouchDBHome
		}
		return ""
	})
	from := "the default location"
	if cfg.CouchDBHome != "" {
		from = localserver.CouchDBHomeEnv
	}
	var plan []plannedServer
	var errs []error
	for _, k := range LocalServers() { // in the bench's order, whatever the flag's
		if !slices.Contains(kinds, k) {
			continue
		}
		ps := plannedServer{kind: k}
		if k == ServerCouchDB || k == ServerCluster {
			ps.home, ps.homeFrom = home, from
			if homeErr != nil {
				if named {
					errs = append(errs, fmt.Errorf("--servers %s: %w", k, homeErr))
				}
				ps.skip = homeErr.Error()
			}
		}
		plan = append(plan, ps)
	}
	return plan, errors.Join(errs...)
}

// topologyName says what a local server is, for the report.
func topologyName(kind string) string {
	switch kind {
	case ServerCouchDB:
		return "single node"
	case ServerCluster:
		return fmt.Sprintf("%d-node cluster", clusterNodes)
	}
	return ""
}

// startCouchDB starts the Apache CouchDB release as one node or as the
// cluster, in a temporary directory removed when it stops.
func (t *target) startCouchDB(ctx context.Context, ps plannedServer, log zerolog.Logger) error {
	nodes := 1
	if ps.kind == ServerCluster {
		nodes = clusterNodes
	}
	dir, err := os.MkdirTemp("", "couchq-bench-couchdb-*")
	if err != nil {
		return fmt.Errorf("creating a data directory for Apache CouchDB: %w", err)
	}
	log.Info().Str("data_dir", dir).Int("nodes", nodes).Str("release", ps.home).Msg("starting Apache CouchDB")
	c, err := localserver.StartCouchDB(ctx, localserver.CouchDBOptions{
		Home: ps.home, Nodes: nodes, Q: clusterQ, DataDir: dir, Logger: log,
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return fmt.Errorf("starting Apache CouchDB (%s) from %s: %w", topologyName(ps.kind), ps.home, err)
	}
	t.stop = func(ctx context.Context) error {
		err := c.Stop(ctx)
		return errors.Join(err, os.RemoveAll(dir))
	}
	t.user, t.password = c.Credentials()
	t.nodes = c.NodeURLs()
	t.serverPIDs = slices.DeleteFunc(c.NodePIDs(), func(pid int) bool { return pid == 0 })
	q, n := c.Shards()
	t.info.Topology = fmt.Sprintf("%s, q=%d, n=%d", topologyName(ps.kind), q, n)
	t.info.Origin = fmt.Sprintf("%s started by the bench from %s (%s), Erlang VM flags %s, automatic compaction at %sx the live data",
		topologyName(ps.kind), ps.home, ps.homeFrom, localserver.SchedulerFlags, localserver.CompactionRatio)
	if nodes > 1 {
		t.info.CPU = fmt.Sprintf("the %d nodes summed: each node's Erlang VM (beam.smp) and its descendants, couchjs included", nodes)
	} else {
		t.info.CPU = "the node's Erlang VM (beam.smp) and its descendants, couchjs included"
	}
	return nil
}

// startPouchDB starts PouchDB Server in a temporary directory removed
// when it stops.
func (t *target) startPouchDB(ctx context.Context, log zerolog.Logger) error {
	dir, err := os.MkdirTemp("", "couchq-bench-*")
	if err != nil {
		return fmt.Errorf("creating a data directory for PouchDB Server: %w", err)
	}
	log.Info().Str("data_dir", dir).Msg("starting a local PouchDB Server")
	p, err := localserver.Start(ctx, localserver.Options{DataDir: dir, Logger: log})
	if err != nil {
		_ = os.RemoveAll(dir)
		return fmt.Errorf("starting a local PouchDB Server: %w", err)
	}
	t.stop = func(ctx context.Context) error {
		err := p.Stop(ctx)
		return errors.Join(err, os.RemoveAll(dir))
	}
	t.nodes = []string{p.URL()}
	t.info.Origin = "started by the bench from tools/pouchdb-server"
	if pid, err := findServerPID(p.DataDir()); err == nil {
		t.serverPIDs = []int{pid}
		t.info.CPU = "the Node.js process and its descendants (PouchDB Server runs validate_doc_update in-process)"
	} else {
		log.Info().Err(err).Msg("no CPU and memory figures for the server")
	}
	return nil
}

// serverName is the server as a reader knows it: "Apache CouchDB 3.5.0".
func serverName(vendor, version string) string {
	name := vendor
	switch vendor {
	case "couchdb":
		name = "Apache CouchDB"
	case "pouchdb":
		name = "PouchDB Server"
	case "":
		name = "unknown server"
	}
	return strings.TrimSpace(name + " " + version)
}
