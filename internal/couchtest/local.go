package couchtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/localserver"
)

// startLocal starts a single Apache CouchDB node from the release at home, in a temp dir.
func startLocal(ctx context.Context, home string, logger zerolog.Logger) (*Server, error) {
	dir, err := os.MkdirTemp("", "couchq-couchdb-*")
	if err != nil {
		return nil, fmt.Errorf("creating CouchDB data dir: %w", err)
	}
	c, err := localserver.StartCouchDB(ctx, localserver.CouchDBOptions{Home: home, Nodes: 1, DataDir: dir, Logger: logger})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	user, password := c.Credentials()
	s, err := newServer(KindLocal, c.URL(), user, password, logger)
	if err != nil {
		_ = c.Stop(ctx)
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s.couch, s.dataDir = c, dir
	return s, nil
}

// ClusterNodes is the cluster tier's node count.
const ClusterNodes = 3

// Cluster is a 3-node Apache CouchDB cluster (q=2, n=3) on loopback, started from the local
// release for the cluster tier. Its embedded Server speaks to node 1; Node(i) to node i.
type Cluster struct {
	*Server
	couch *localserver.CouchDB
	nodes []*Server
}

type clusterState struct {
	once    sync.Once
	cluster *Cluster
	err     error
	mu      sync.Mutex
}

// Cluster returns the test binary's 3-node cluster, starting it on first use; it is stopped
// with the Server. The test is skipped, with the reason, when no local Apache CouchDB release
// is installed, or when COUCHQ_SKIP_CLUSTER is set.
func (s *Server) Cluster(t testing.TB) *Cluster {
	t.Helper()
	c, err := s.startCluster()
	if err != nil {
		if errors.Is(err, errNoRelease) {
			Skip(t, "cluster tier: "+err.Error())
		}
		t.Fatalf("couchtest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wholeTimeout)
	defer cancel()
	if err := c.couch.WaitWhole(ctx); err != nil {
		t.Fatalf("couchtest: the cluster is not whole before the test (an earlier test's stopped or cut-off node has not come back): %v", err)
	}
	return c
}

// wholeTimeout bounds how long Cluster waits for a node an earlier test brought back to
// reconnect (seconds, usually).
const wholeTimeout = 2 * time.Minute

var errNoRelease = errors.New("no local Apache CouchDB release")

func (s *Server) startCluster() (*Cluster, error) {
	st := &s.cluster
	st.once.Do(func() {
		if os.Getenv("COUCHQ_SKIP_CLUSTER") != "" {
			st.err = fmt.Errorf("%w used: COUCHQ_SKIP_CLUSTER is set", errNoRelease)
			return
		}
		home, err := localserver.FindCouchDB(os.Getenv)
		if err != nil {
			st.err = fmt.Errorf("%w: %w", errNoRelease, err)
			return
		}
		dir, err := os.MkdirTemp("", "couchq-cluster-*")
		if err != nil {
			st.err = fmt.Errorf("creating cluster data dir: %w", err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		couch, err := localserver.StartCouchDB(ctx, localserver.CouchDBOptions{
			Home: home, Nodes: ClusterNodes, Q: 2, DataDir: dir, Logger: s.logger,
		})
		if err != nil {
			_ = os.RemoveAll(dir)
			st.err = fmt.Errorf("starting the 3-node cluster: %w", err)
			return
		}
		user, password := couch.Credentials()
		c := &Cluster{couch: couch}
		for i := 1; i <= couch.Nodes(); i++ {
			node, err := newServer(KindLocal, couch.NodeURL(i), user, password, s.logger)
			if err != nil {
				_ = couch.Stop(ctx)
				_ = os.RemoveAll(dir)
				st.err = err
				return
			}
			node.reason = fmt.Sprintf("node %d of the cluster tier's 3-node cluster", i)
			c.nodes = append(c.nodes, node)
		}
		c.Server = c.nodes[0]
		c.Server.dataDir = dir
		if c.Server.caps, err = detectCapabilities(ctx, c.Server); err != nil {
			_ = couch.Stop(ctx)
			_ = os.RemoveAll(dir)
			st.err = fmt.Errorf("detecting capabilities of the cluster: %w", err)
			return
		}
		for _, n := range c.nodes[1:] {
			n.caps = c.Server.caps
		}
		s.logger.Info().Strs("nodes", couch.NodeURLs()).Str("version", c.caps.Version).
			Int("n", c.caps.ClusterN).Msg("cluster tier: 3-node Apache CouchDB cluster ready")
		st.cluster = c
	})
	return st.cluster, st.err
}

func (st *clusterState) stop(ctx context.Context) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	c := st.cluster
	if c == nil {
		return nil
	}
	st.cluster = nil
	err := c.couch.Stop(ctx)
	if rmErr := os.RemoveAll(c.Server.dataDir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("removing cluster data: %w", rmErr))
	}
	return err
}

// Nodes is the cluster's node count.
func (c *Cluster) Nodes() int { return len(c.nodes) }

// Node is a Server speaking to node i (1-based) of the cluster.
func (c *Cluster) Node(i int) *Server { return c.nodes[i-1] }

// NodeURLs are the base URLs of every node, without credentials.
func (c *Cluster) NodeURLs() []string { return c.couch.NodeURLs() }

// StopNode stops node i gracefully; KillNode SIGKILLs it; StartNode brings it back on the
// same data and port and waits until it answers.
func (c *Cluster) StopNode(ctx context.Context, i int) error  { return c.couch.StopNode(ctx, i) }
func (c *Cluster) KillNode(ctx context.Context, i int) error  { return c.couch.KillNode(ctx, i) }
func (c *Cluster) StartNode(ctx context.Context, i int) error { return c.couch.StartNode(ctx, i) }

// Partition cuts node i off from the others while clients still reach it (see
// localserver.CouchDB.Partition: it needs tc and root); Heal ends it.
func (c *Cluster) Partition(ctx context.Context, i int) error { return c.couch.Partition(ctx, i) }
func (c *Cluster) Heal(ctx context.Context, i int) error      { return c.couch.Heal(ctx, i) }

// LogTail is the end of node i's log, for failure messages.
func (c *Cluster) LogTail(i int) string { return c.couch.LogTail(i) }
