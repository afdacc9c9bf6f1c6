package bench

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/designdocs"
)

// pathRecorder is a transport that records the path of every request.
type pathRecorder struct {
	next  http.RoundTripper
	mu    sync.Mutex
	paths []string
}

func (p *pathRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	p.mu.Lock()
	p.paths = append(p.paths, req.URL.Path)
	p.mu.Unlock()
	return p.next.RoundTrip(req)
}

func (p *pathRecorder) take() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	paths := p.paths
	p.paths = nil
	return paths
}

// Section 5 times the round a worker makes: it lists candidates from the
// claim view (not the operators' due view, whose nine other views every
// query would bring up to date), reads the picked job's document and
// claims it, each timed claim claiming one job.
func TestTimeClaimsMakesAWorkersRound(t *testing.T) {
	ctx := context.Background()
	name := srv.UniqueDBName(t)
	if _, err := couchq.InitWith(ctx, srv.Client(t), name, couchq.InitOptions{Validation: designdocs.ValidationOn}, zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	rec := &pathRecorder{next: couchq.NewHTTPClient().Transport}
	user, password := srv.Credentials()
	s, err := couchq.ConnectHTTP(ctx, srv.URL(), user, password, &http.Client{Transport: rec})
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Open(ctx, name, couchq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enqueueBulk(ctx, c, 12); err != nil {
		t.Fatal(err)
	}
	const claims = 4
	for _, stale := range []bool{false, true} {
		rec.take()
		times, err := timeClaims(ctx, c, claims, stale)
		if err != nil {
			t.Fatalf("%s: %v", roundKind(stale), err)
		}
		if len(times.total) != claims || len(times.list) != claims || len(times.read) != claims || len(times.claim) != claims {
			t.Fatalf("%s: samples %d/%d/%d/%d, want %d each", roundKind(stale),
				len(times.total), len(times.list), len(times.read), len(times.claim), claims)
		}
		for i, total := range times.total {
			if parts := times.list[i] + times.read[i] + times.claim[i]; parts != total || total <= 0 {
				t.Errorf("%s: claim %d took %v, its parts %v", roundKind(stale), i, total, parts)
			}
		}
		var lists, reads int
		for _, p := range rec.take() {
			switch {
			case strings.Contains(p, "/"+designdocs.ID+"/_view/due_priority"):
				lists++
			case strings.Contains(p, "/_view/"):
				t.Errorf("%s: read %s, want only the claim view", roundKind(stale), p)
			case strings.HasSuffix(p, "/_all_docs"):
				reads++
			}
		}
		if lists < claims || reads < claims {
			t.Errorf("%s: %d claim view reads and %d document reads for %d claims", roundKind(stale), lists, reads, claims)
		}
	}
	counts, err := c.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := counts[jobType][couchq.StatusRunning]; got != 2*claims {
		t.Errorf("%d jobs running, want %d (%v)", got, 2*claims, counts)
	}
}
