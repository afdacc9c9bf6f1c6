package integration

import (
	"net/http"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// A worker whose clock is off from the server's by more than it can be
// without sweeping other workers' running jobs (or having its own swept)
// says so when it starts; one whose clock agrees says nothing.
func TestWorkerWarnsOfAClockOffFromTheServers(t *testing.T) {
	tb := setup(t, protocol.Config{})
	for _, tc := range []struct {
		name  string
		shift time.Duration
		warns bool
	}{
		{"behind", -time.Minute, true},
		{"ahead", 40 * time.Second, true},
		{"in time", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := func() time.Time { return time.Now().Add(tc.shift) }
			client := clientThrough(t, tb, protocol.Config{Now: now}, func(rt http.RoundTripper) http.RoundTripper { return rt })
			skew, ok, err := client.ClockSkew(tb.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				t.Skip("the client reads no server date on this server (not Apache CouchDB)")
			}
			if d := skew - tc.shift; d < -1500*time.Millisecond || d > 1500*time.Millisecond {
				t.Fatalf("ClockSkew %s for a clock shifted by %s", skew, tc.shift)
			}
			warnings := &lineCounter{phrase: "the CouchDB server's: leases are written and judged", t: t}
			cfg := fastWorker(tb, map[string]worker.Handler{"tick": worker.HandlerFunc(nil)})
			cfg.Now, cfg.Logger = now, zerolog.New(warnings).Level(zerolog.WarnLevel)
			runWorker(t, tb.ctx, client, cfg)
			if got := warnings.n.Load() > 0; got != tc.warns {
				t.Fatalf("warned %v, want %v", got, tc.warns)
			}
		})
	}
}
