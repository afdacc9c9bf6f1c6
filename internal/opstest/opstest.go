// Package opstest helps the tests of couchq's operator surfaces, the CLI's
// stats and job commands and the metrics and API of opshttp, check exact
// figures: a known script of jobs played on a controlled clock, what its
// report must say, and readers of HTTP answers and Prometheus text.
package opstest

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-kivik/kivik/v4"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/couchq/couchq/internal/protocol"
)

// Clock is a clock tests move by hand; safe for the goroutines of a
// running server or worker.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a Clock stopped at t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now is the time the clock was last set to.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// Add moves the clock on by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Claimant is who claims the script's jobs.
const Claimant = "host/1/w1"

// Run is the known script played on a controlled clock, so that the
// figures are exact:
//
//	T0+0   enqueue A, B, C, E (due now)
//	T0+2   claim A
//	T0+3   enqueue D, due at T0+100
//	T0+4   claim B
//	T0+5   complete A; fail B, retry in 1s
//	T0+6   claim B again
//	T0+7   claim E (left running)
//	T0+10  complete B
//	T0+20  the clock stops here
//
// Over a window from T0-1s: added 5, started 4, finished 2, failed 0,
// retried 1; wait (enqueue to first claim) 2, 4, 7; service (enqueue to
// done) 5, 10; execution (per attempt) 3, 1, 4. Now: C due for 20s, D
// scheduled, E running, A and B done. CheckStats checks a report of it.
// integration's opsScript plays the same script on its own test bundle;
// keep the two in step.
type Run struct {
	Q     *protocol.Client // on the clock
	Clock *Clock
	T0    time.Time
	Ctx   context.Context    // bounds the test's requests
	E     *protocol.WorkItem // E as claimed
}

// Play plays the script in db, which protocol.Init has prepared, and leaves
// the clock at T0+20s. ctx bounds its requests and the Run's.
func Play(ctx context.Context, t testing.TB, db *kivik.DB) *Run {
	t.Helper()
	r := &Run{T0: time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC), Ctx: ctx}
	r.Clock = NewClock(r.T0)
	var err error
	if r.Q, err = protocol.New(ctx, db, protocol.Config{Now: r.Clock.Now}); err != nil {
		t.Fatal(err)
	}
	enqueue := func(id string, due time.Time) {
		if _, err := r.Q.Enqueue(ctx, protocol.NewJob{ID: id, Worker: "mail", At: due}); err != nil {
			t.Fatal(err)
		}
	}
	r.At(0)
	for _, id := range []string{"A", "B", "C", "E"} {
		enqueue(id, time.Time{})
	}
	r.At(2)
	a := r.Claim(t, "A")
	r.At(3)
	enqueue("D", r.T0.Add(100*time.Second))
	r.At(4)
	b := r.Claim(t, "B")
	r.At(5)
	if err := r.Q.Complete(ctx, a, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Q.Fail(ctx, b, "smtp timeout", protocol.FailOptions{RetryAfter: time.Second}); err != nil {
		t.Fatal(err)
	}
	r.At(6)
	b = r.Claim(t, "B")
	r.At(7)
	r.E = r.Claim(t, "E")
	r.At(10)
	if err := r.Q.Complete(ctx, b, nil); err != nil {
		t.Fatal(err)
	}
	r.At(20)
	return r
}

// SitesAB makes db a database of sites: A, the default, whose workers
// have just beaten (at now; nil is time.Now), and B, whose never have.
func SitesAB(ctx context.Context, t testing.TB, db *kivik.DB, now func() time.Time) {
	t.Helper()
	a, err := protocol.New(ctx, db, protocol.Config{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"A", "B"} {
		if _, err := a.AddSite(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if a, err = protocol.New(ctx, db, protocol.Config{Site: "A", Now: now}); err != nil {
		t.Fatal(err)
	}
	if err := a.Beat(ctx); err != nil {
		t.Fatal(err)
	}
}

// Claim claims job id as Claimant, at the clock's time.
func (r *Run) Claim(t testing.TB, id string) *protocol.WorkItem {
	t.Helper()
	it, err := r.Q.Get(r.Ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if it, err = r.Q.Claim(r.Ctx, it, Claimant, time.Minute); err != nil {
		t.Fatal(err)
	}
	return it
}

// At sets the clock to T0 plus sec seconds.
func (r *Run) At(sec int) { r.Clock.Set(r.T0.Add(time.Duration(sec) * time.Second)) }

// Since is the start of the window that covers the whole script, in
// RFC 3339.
func (r *Run) Since() string { return r.T0.Add(-time.Second).Format(time.RFC3339) }

// CheckStats checks a report of the whole script at T0+20, as JSON
// decodes it (no workers is [], not null).
func CheckStats(t testing.TB, st *protocol.Stats) {
	t.Helper()
	if len(st.Types) != 1 || st.Types[0].Type != "mail" {
		t.Fatalf("types: %+v", st.Types)
	}
	m := st.Types[0]
	if m.Added != 5 || m.Started != 4 || m.Finished != 2 || m.Failed != 0 || m.Retried != 1 {
		t.Errorf("events: added %d started %d finished %d failed %d retried %d; want 5 4 2 0 1",
			m.Added, m.Started, m.Finished, m.Failed, m.Retried)
	}
	if !Near(m.Throughput, 2.0/21) {
		t.Errorf("throughput %v, want 2 finished in 21s", m.Throughput)
	}
	checkSummary(t, "wait", m.Wait, 3, 2, 13.0/3, 7, 4, 7)
	checkSummary(t, "service", m.Service, 2, 5, 7.5, 10, 5, 10)
	checkSummary(t, "execution", m.Execution, 3, 1, 8.0/3, 4, 3, 4)
	want := protocol.QueueNow{Due: 1, Scheduled: 1, Running: 1, Done: 2, OldestDueAge: 20}
	if m.Queue != want {
		t.Errorf("queue now %+v, want %+v", m.Queue, want)
	}
	if st.Workers == nil || len(st.Workers) != 0 {
		t.Errorf("workers: %#v, want []", st.Workers)
	}
}

// Near reports whether two figures are equal but for float rounding.
func Near(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 }

func checkSummary(t testing.TB, name string, s protocol.Summary, count int64, lo, mean, hi, p50, p95 float64) {
	t.Helper()
	if s.Count != count || !Near(s.Min, lo) || !Near(s.Mean, mean) || !Near(s.Max, hi) ||
		s.P50 == nil || s.P95 == nil || !Near(*s.P50, p50) || !Near(*s.P95, p95) {
		t.Errorf("%s: %+v, want count %d min %v mean %v max %v p50 %v p95 %v", name, s, count, lo, mean, hi, p50, p95)
	}
}

// Get fetches url and returns the status and the body.
func Get(t testing.TB, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	code, _, body := send(t, req)
	return code, body
}

// Post sends an empty POST to url, with basic credentials unless user is
// empty, and returns the status, the WWW-Authenticate header and the body.
func Post(t testing.TB, url, user, password string) (code int, challenge, body string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	return send(t, req)
}

// PostJSON is Post with a JSON body.
func PostJSON(t testing.TB, url, user, password, body string) (code int, challenge, answer string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	return send(t, req)
}

// send makes req, within a minute, and reads the whole answer.
func send(t testing.TB, req *http.Request) (code int, challenge, body string) {
	t.Helper()
	client := &http.Client{Timeout: time.Minute}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", req.Method, req.URL, err)
	}
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate"), string(b)
}

// Metrics is a scrape parsed: the metric families by name.
type Metrics map[string]*dto.MetricFamily

// ParseMetrics parses a /metrics answer as Prometheus text.
func ParseMetrics(t testing.TB, body string) Metrics {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("not Prometheus text: %v\n%s", err, body)
	}
	return families
}

// Value finds the sample of family name whose labels include want (as
// name=value pairs) and returns its value: a gauge's or counter's value, or
// a summary's sum and count.
func (m Metrics) Value(t testing.TB, name string, want ...string) (value, count float64) {
	t.Helper()
	f := m[name]
	if f == nil {
		t.Errorf("no metric %s", name)
		return -1, -1
	}
next:
	for _, s := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range s.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for _, pair := range want {
			k, v, _ := strings.Cut(pair, "=")
			if labels[k] != v {
				continue next
			}
		}
		switch f.GetType() {
		case dto.MetricType_GAUGE:
			return s.GetGauge().GetValue(), 0
		case dto.MetricType_COUNTER:
			return s.GetCounter().GetValue(), 0
		case dto.MetricType_SUMMARY:
			return s.GetSummary().GetSampleSum(), float64(s.GetSummary().GetSampleCount())
		}
		t.Errorf("%s has type %s", name, f.GetType())
		return -1, -1
	}
	t.Errorf("no %s%v", name, want)
	return -1, -1
}

// Check checks the value of a gauge or counter.
func (m Metrics) Check(t testing.TB, want float64, name string, labels ...string) {
	t.Helper()
	if got, _ := m.Value(t, name, labels...); !Near(got, want) {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

// CheckSummary checks the sum and count of type mail's summary name.
func (m Metrics) CheckSummary(t testing.TB, name string, sum, count float64) {
	t.Helper()
	gotSum, gotCount := m.Value(t, name, "type=mail")
	if !Near(gotSum, sum) || gotCount != count {
		t.Errorf("%s: sum %v count %v, want %v and %v", name, gotSum, gotCount, sum, count)
	}
	if m[name].GetType() != dto.MetricType_SUMMARY {
		t.Errorf("%s is a %s, want a summary", name, m[name].GetType())
	}
}
