package opshttp

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
)

// srv is the real server the tests in this package share.
var srv *couchtest.Server

func TestMain(m *testing.M) { couchtest.Main(m, func(s *couchtest.Server) { srv = s }) }

// newDB creates a database of the test's own, prepared by protocol.Init;
// ctx bounds the test's requests.
func newDB(t *testing.T) (context.Context, *kivik.DB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	client := srv.Client(t)
	name := srv.UniqueDBName(t)
	if _, err := protocol.Init(ctx, client, name, zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	return ctx, client.DB(name)
}

// newQueue is a queue client for a database of the test's own.
func newQueue(t *testing.T) (context.Context, *protocol.Client) {
	t.Helper()
	ctx, db := newDB(t)
	q, err := protocol.New(ctx, db, protocol.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, q
}

// playScript plays opstest's known script in a database of the test's own.
func playScript(t *testing.T) *opstest.Run {
	t.Helper()
	ctx, db := newDB(t)
	return opstest.Play(ctx, t, db)
}

// serveHandler serves NewHandler for q on a test server, logging to the
// test.
func serveHandler(ctx context.Context, t *testing.T, q *protocol.Client, cfg Config) *httptest.Server {
	t.Helper()
	cfg.Logger = zerolog.New(zerolog.NewTestWriter(t))
	hs := httptest.NewServer(NewHandler(ctx, (*couchq.Client)(q), cfg))
	t.Cleanup(hs.Close)
	return hs
}

// get fetches a path of hs and returns the status and body.
func get(t *testing.T, hs *httptest.Server, path string) (int, string) {
	t.Helper()
	return opstest.Get(t, hs.URL+path)
}

// scrape fetches /metrics and parses it as Prometheus text.
func scrape(t *testing.T, hs *httptest.Server) opstest.Metrics {
	t.Helper()
	code, body := get(t, hs, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	return opstest.ParseMetrics(t, body)
}
