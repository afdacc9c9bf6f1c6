package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/protocol"
)

// shardsOf is the database's q as the server reports it, 0 where it has
// none (PouchDB Server).
func shardsOf(ctx context.Context, t *testing.T, client *kivik.Client, db string) (q, n int) {
	t.Helper()
	info, err := client.DB(db).Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Cluster == nil {
		return 0, 0
	}
	return info.Cluster.Shards, info.Cluster.Replicas
}

// On a single node init creates the queue database with the server's own
// number of shards unless asked for another; a database that exists keeps
// its own; a negative number is refused before anything is created.
func TestInitShardsOnOneNode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := server.Client(t)
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)

	bare := server.UniqueDBName(t)
	if err := client.CreateDB(ctx, bare); err != nil {
		t.Fatal(err)
	}
	serverQ, _ := shardsOf(ctx, t, client, bare)

	chosen := server.UniqueDBName(t)
	if _, err := protocol.InitWith(ctx, client, chosen, protocol.InitOptions{}, log); err != nil {
		t.Fatal(err)
	}
	if q, _ := shardsOf(ctx, t, client, chosen); q != serverQ {
		t.Errorf("a database init created on one node: q=%d, want the server's own, %d", q, serverQ)
	}

	asked := server.UniqueDBName(t)
	if _, err := protocol.InitWith(ctx, client, asked, protocol.InitOptions{Shards: 3}, log); err != nil {
		t.Fatal(err)
	}
	if serverQ == 0 {
		t.Logf("%s reports no shards: init with a number of shards only has to work", server.Caps().Vendor)
		return
	}
	if q, _ := shardsOf(ctx, t, client, asked); q != 3 {
		t.Errorf("init --shards 3: q=%d, want 3", q)
	}
	// Another number for it is refused, not ignored; it keeps its own.
	if _, err := protocol.InitWith(ctx, client, asked, protocol.InitOptions{Shards: 5}, log); err == nil || !strings.Contains(err.Error(), "exists with 3 shards") {
		t.Errorf("init --shards 5 of a database of 3 shards: %v, want it refused", err)
	}
	if q, _ := shardsOf(ctx, t, client, asked); q != 3 {
		t.Errorf("init --shards 5 of a database of 3 shards: q=%d, want it kept", q)
	}

	refused := server.UniqueDBName(t)
	if _, err := protocol.InitWith(ctx, client, refused, protocol.InitOptions{Shards: -1}, log); err == nil || !strings.Contains(err.Error(), "must be positive") {
		t.Errorf("init with -1 shards: %v, want refused", err)
	}
	if exists, err := client.DBExists(ctx, refused); err != nil || exists {
		t.Errorf("init with -1 shards created the database: %v %v", exists, err)
	}
}

// On a cluster init creates the queue database with one shard, copied to
// every node, and workers on two nodes racing for its jobs run each once.
func TestClusterInitCreatesOneShard(t *testing.T) {
	cb := setupClusterShards(t, protocol.Config{}, 0)
	if q, n := shardsOf(cb.ctx, t, cb.cl.Client(t), cb.dbName); q != 1 || n != 3 {
		t.Fatalf("a database init created on the cluster: q=%d, n=%d, want 1 and 3", q, n)
	}
	var rc runCounter
	startClusterWorker(t, cb, 1, "w1", &rc, "one-shard")
	startClusterWorker(t, cb, 2, "w2", &rc, "one-shard")
	ids := cb.enqueue(t, "one-shard", 60)
	waitAllDone(t, cb.clients[2], ids, 2*time.Minute)
	if twice := rc.twice(); len(twice) > 0 {
		t.Fatalf("jobs run more than once: %v", twice)
	}
}
