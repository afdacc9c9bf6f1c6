package bench

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// The worker's peak RSS is judged against TargetWorkerRSS100 only when the
// receiver saw WorkerRSSConcurrency requests at once: a worker that ran
// fewer jobs at once does not meet the target, however little it used.
func TestWorkerRSS100RowsJudgeTheTargetAtFullConcurrency(t *testing.T) {
	for _, tc := range []struct {
		rss      uint64
		inFlight int
		met      bool
		why      string // in the target's text
	}{
		{24 << 20, WorkerRSSConcurrency, true, ""},
		{TargetWorkerRSS100, WorkerRSSConcurrency, false, ""}, // the bound is strict
		{40 << 20, WorkerRSSConcurrency + 1, false, ""},
		{24 << 20, WorkerRSSConcurrency - 13, false, "only 87 ran at once"},
	} {
		var s Section
		workerRSS100Rows(&s, tc.rss, tc.inFlight)
		if len(s.Rows) != 2 {
			t.Fatalf("%d rows, want 2: %+v", len(s.Rows), s.Rows)
		}
		rss, peak := s.Rows[0], s.Rows[1]
		if rss.Key != keyWorkerRSS100 || rss.Unit != "MiB" || rss.Value != float64(tc.rss)/(1<<20) ||
			!strings.Contains(rss.Metric, "running 100 jobs at once") {
			t.Errorf("RSS row %+v for %d bytes", rss, tc.rss)
		}
		if rss.Met == nil || *rss.Met != tc.met || !strings.HasPrefix(rss.Target, "< 32 MiB") ||
			(tc.why == "") != !strings.Contains(rss.Target, "not met") || !strings.Contains(rss.Target, tc.why) {
			t.Errorf("%d bytes, %d at once: target %q met %v, want met %v (%q)", tc.rss, tc.inFlight, rss.Target, rss.Met, tc.met, tc.why)
		}
		if peak.Value != float64(tc.inFlight) || peak.Met != nil || peak.Key != "" {
			t.Errorf("in-flight row %+v, want %d, unjudged", peak, tc.inFlight)
		}
	}
}

// The receiver holds each request, so requests sent together are all in
// flight at once, and answers 200; closing it answers those still held.
func TestHoldServerCountsRequestsInFlight(t *testing.T) {
	const n = 5
	h := newHoldServer(300 * time.Millisecond)
	var wg sync.WaitGroup
	codes := make(chan int, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post(h.URL, "application/json", strings.NewReader(`{"url":"x"}`))
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Errorf("status %d, want 200", c)
		}
	}
	if peak, served := h.counts(); peak != n || served != n {
		t.Errorf("peak %d in flight, %d served; want %d and %d", peak, served, n, n)
	}
	h.close()
	// A request still held when the receiver closes is answered at once.
	h = newHoldServer(time.Hour)
	done := make(chan error, 1)
	go func() {
		resp, err := http.Post(h.URL, "application/json", strings.NewReader(`{}`))
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if peak, _ := h.counts(); peak == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the request never reached the receiver")
		}
	}
	h.close()
	if err := <-done; err != nil {
		t.Errorf("the held request: %v", err)
	}
}
