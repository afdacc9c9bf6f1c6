// Package integration proves couchq's queue semantics against a real
// CouchDB-compatible server (see internal/couchtest for which one).
package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/protocol"
)

// server is the package's test server, started once by TestMain.
var server *couchtest.Server

func TestMain(m *testing.M) {
	if timings := os.Getenv(fanOutWorkerEnv); timings != "" {
		// A worker process of the fan-out/fan-in chaos tests: it is given
		// a server to attach to and starts none.
		os.Exit(fanOutWorkerProcess(timings))
	}
	couchtest.Main(m, func(s *couchtest.Server) { server = s })
}

// testBundle is what most tests need: a fresh database with couchq's
// design document and a Client on it.
type testBundle struct {
	ctx    context.Context
	kivik  *kivik.Client
	db     *kivik.DB
	client *protocol.Client
	log    zerolog.Logger
	// lease is the lease test workers use (see testLease).
	lease time.Duration
}

// setup creates a database for the test, installs the design document and
// returns a Client configured with cfg.
func setup(t *testing.T, cfg protocol.Config) *testBundle {
	t.Helper()
	tb := setupWithout(t, cfg)
	tb.install(t)
	return tb
}

// setupWithout is setup without the design document (nothing validates
// writes yet), for tests of documents written before couchq was installed.
func setupWithout(t *testing.T, cfg protocol.Config) *testBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	tb := &testBundle{
		lease: testLease(t),
		ctx:   ctx,
		kivik: server.Client(t),
		db:    server.NewDB(t),
		log:   zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel).With().Timestamp().Logger(),
	}
	cfg.Logger = tb.log
	client, err := protocol.New(ctx, tb.db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	tb.client = client
	return tb
}

// install installs couchq's design document into the bundle's database.
func (tb *testBundle) install(t *testing.T) {
	t.Helper()
	if _, err := protocol.Init(tb.ctx, tb.kivik, tb.db.Name(), tb.log); err != nil {
		t.Fatal(err)
	}
}

// freshName is a database name for this test that does not exist yet.
func (tb *testBundle) freshName(t *testing.T) string {
	return server.UniqueDBName(t)
}

// raw sends an HTTP request to a path inside the bundle's database with
// no couchq code involved, as an application writing jobs by hand would.
func (tb *testBundle) raw(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	return rawRequest(tb.ctx, t, server, tb.db.Name(), method, path, body)
}

// rawRequest is raw through srv (a cluster's node, say) into database db.
func rawRequest(ctx context.Context, t *testing.T, srv *couchtest.Server, db, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, srv.DBURL(db)+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// due lists the ids of jobs of type worker due now.
func (tb *testBundle) due(t *testing.T, worker string) []string {
	t.Helper()
	batch, err := tb.client.Due(tb.ctx, worker, 100)
	if err != nil {
		t.Fatal(err)
	}
	return ids(batch.Items)
}

// injectRevision stores a competing revision as a cluster would.
func (tb *testBundle) injectRevision(t *testing.T, doc map[string]any) {
	t.Helper()
	couchtest.InjectRevision(tb.ctx, t, server, tb.db.Name(), doc)
}

// leaseProbe measures the server's write latency once per test run.
var leaseProbe struct {
	once  sync.Once
	lease time.Duration
	p90   time.Duration
}

// testLease is the lease test workers hold jobs with: 2 s, or 20 times the
// server's 90th-percentile single-document write latency, measured once,
// when that is longer (a loaded machine, a cluster). A fixed lease lets a
// live worker lose its jobs to the sweeper when writes slow down.
func testLease(t *testing.T) time.Duration {
	t.Helper()
	leaseProbe.once.Do(func() {
		db := server.NewDB(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var took []time.Duration
		for i := range 20 {
			began := time.Now()
			if _, err := db.Put(ctx, fmt.Sprintf("probe-%d", i), map[string]int{"i": i}); err != nil {
				t.Logf("measuring write latency: %v", err)
				continue
			}
			took = append(took, time.Since(began))
		}
		sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
		leaseProbe.lease = 2 * time.Second
		if len(took) > 0 {
			leaseProbe.p90 = took[len(took)*9/10]
			leaseProbe.lease = max(leaseProbe.lease, (20 * leaseProbe.p90).Round(100*time.Millisecond))
		}
		t.Logf("test lease %s (write latency p90 %s)", leaseProbe.lease, leaseProbe.p90)
	})
	return leaseProbe.lease
}

// clientThrough is a client of tb's database (logging to tb's log) whose
// requests pass through the transport wrap makes of couchq's own.
func clientThrough(t *testing.T, tb *testBundle, cfg protocol.Config, wrap func(http.RoundTripper) http.RoundTripper) *protocol.Client {
	t.Helper()
	hc := protocol.NewHTTPClient()
	hc.Transport = wrap(hc.Transport)
	user, password := server.Credentials()
	srv, err := protocol.ConnectHTTP(tb.ctx, server.URL(), user, password, hc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger = tb.log
	client, err := srv.Open(tb.ctx, tb.db.Name(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client
}
