package bench

import (
	"context"
	"errors"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/protocol"
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
	if _, err := protocol.InitWith(ctx, srv.Client(t), name, protocol.InitOptions{Validation: designdocs.ValidationOn}, zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	rec := &pathRecorder{next: protocol.NewHTTPClient().Transport}
	user, password := srv.Credentials()
	s, err := protocol.ConnectHTTP(ctx, srv.URL(), user, password, &http.Client{Transport: rec})
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Open(ctx, name, protocol.Config{})
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
	if got := counts[jobType][protocol.StatusRunning]; got != 2*claims {
		t.Errorf("%d jobs running, want %d (%v)", got, 2*claims, counts)
	}
}

// The large backlog's enqueue is judged against the bare bulk ceiling, and
// shown as a share of the design document's ceiling as the run installs it.
func TestEnqueueRowsJudgeTheBulkCeiling(t *testing.T) {
	ceiling := &ceilingResult{bulkBare: 10000, bulkDesign: 1000, bulkNoValidation: 9000}
	for _, tc := range []struct {
		validation designdocs.Validation
		took       time.Duration
		met        bool
		share      string
	}{
		{designdocs.ValidationOn, 200 * time.Second, false, "5.0 % / 50.0 %"},   // 500 jobs/s
		{designdocs.ValidationOff, 10 * time.Second, true, "100.0 % / 111.1 %"}, // 10,000 jobs/s
		{designdocs.ValidationOff, 15 * time.Second, false, "66.7 % / 74.1 %"},  // 6,667 jobs/s
	} {
		b := &run{cfg: Config{Validation: tc.validation}, ceiling: ceiling}
		var s Section
		b.enqueueRows(&s, 100000, tc.took)
		if len(s.Rows) != 2 {
			t.Fatalf("%d rows, want 2: %+v", len(s.Rows), s.Rows)
		}
		if m := s.Rows[0].Met; m == nil || *m != tc.met || !strings.Contains(s.Rows[0].Target, "10000 docs/s (bulk, bare)") {
			t.Errorf("validation %s, %s: target %q met %v, want met %v", tc.validation, tc.took, s.Rows[0].Target, m, tc.met)
		}
		if s.Rows[1].Text != tc.share {
			t.Errorf("validation %s, %s: shares %q, want %q", tc.validation, tc.took, s.Rows[1].Text, tc.share)
		}
	}
	// Without section 1 there is nothing to judge against.
	var s Section
	(&run{}).enqueueRows(&s, 100000, time.Second)
	if len(s.Rows) != 1 || s.Rows[0].Met != nil || !strings.Contains(s.Rows[0].Target, "run section 1") {
		t.Errorf("without a ceiling: %+v", s.Rows)
	}
}

// Section 5 times its two backlogs in turn, neither always first, so that
// a change in the machine's load lands on both.
func TestInTurnAlternatesWhichGoesFirst(t *testing.T) {
	var order []int
	if err := inTurn(3, func(i int) error { order = append(order, i); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := []int{0, 1, 1, 0, 0, 1}; !slices.Equal(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}
	stop := errors.New("stop")
	calls := 0
	err := inTurn(3, func(i int) error {
		calls++
		if calls == 2 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || calls != 2 {
		t.Errorf("a failed step: %v after %d calls, want %v after 2", err, calls, stop)
	}
}

// Each backlog's CPU rows add up its own rounds only, not the other's
// rounds in between.
func TestCPUSpansAddUpTheirSpans(t *testing.T) {
	reading := func(bench, server, js time.Duration) cpuUse {
		return cpuUse{bench: bench, server: server, js: map[int]time.Duration{7: js}, ok: true, serverOK: true}
	}
	var c cpuSpans
	c.add(reading(1*time.Millisecond, 10*time.Millisecond, 2*time.Millisecond), reading(2*time.Millisecond, 20*time.Millisecond, 3*time.Millisecond))
	// The other backlog's round ran here, from 20 ms to 50 ms.
	c.add(reading(4*time.Millisecond, 50*time.Millisecond, 5*time.Millisecond), reading(6*time.Millisecond, 70*time.Millisecond, 9*time.Millisecond))
	var s Section
	c.rows(&s, "x: ", 2)
	want := []struct {
		suffix string
		ms     float64
	}{
		{"bench process (queue clients + workers)", 1.5}, // (2-1 + 6-4) / 2
		{"server processes", 15},                         // (20-10 + 70-50) / 2
		{"of which couchjs (JavaScript: validate_doc_update, views)", 2.5},
	}
	if len(s.Rows) != len(want) {
		t.Fatalf("%d rows, want %d: %+v", len(s.Rows), len(want), s.Rows)
	}
	for i, w := range want {
		if r := s.Rows[i]; !strings.HasSuffix(r.Metric, w.suffix) || !strings.HasPrefix(r.Metric, "x: ") || math.Abs(r.Value-w.ms) > 1e-9 {
			t.Errorf("row %d: %s = %v ms, want …%s = %v ms", i, r.Metric, r.Value, w.suffix, w.ms)
		}
	}
	// Without a span there is nothing to say.
	var none cpuSpans
	var empty Section
	none.rows(&empty, "", 1)
	if len(empty.Rows) != 0 {
		t.Errorf("no spans: %+v", empty.Rows)
	}
}
