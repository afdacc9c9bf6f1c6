package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/couchtest"
)

// testClock is a clock tests move by hand; safe for the goroutines of a
// running serve.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// opsRun is a known script of jobs played on a controlled clock, the same
// as integration's opsScript, so that the figures are exact:
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
// scheduled, E running, A and B done.
type opsRun struct {
	c   cli // online, database initialized, clock set
	q   *couchq.Client
	clk *testClock
	t0  time.Time
	ctx context.Context
	e   *couchq.WorkItem // E as claimed
}

const claimant = "host/1/w1"

func runOpsScript(t *testing.T) *opsRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	r := &opsRun{c: online(t).mustInit(t), ctx: ctx}
	r.t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	r.clk = &testClock{t: r.t0}
	r.c.now = r.clk.Now
	var err error
	r.q, err = couchq.New(ctx, srv.Client(t).DB(r.c.env["COUCHQ_DB"]), couchq.Config{Now: r.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	at := func(sec int) { r.clk.Set(r.t0.Add(time.Duration(sec) * time.Second)) }
	enqueue := func(id string, due time.Time) {
		if _, err := r.q.Enqueue(ctx, couchq.NewJob{ID: id, Worker: "mail", At: due}); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(id string) *couchq.WorkItem { return r.claim(t, id) }
	at(0)
	for _, id := range []string{"A", "B", "C", "E"} {
		enqueue(id, time.Time{})
	}
	at(2)
	a := claim("A")
	at(3)
	enqueue("D", r.t0.Add(100*time.Second))
	at(4)
	b := claim("B")
	at(5)
	if err := r.q.Complete(ctx, a, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.q.Fail(ctx, b, "smtp timeout", couchq.FailOptions{RetryAfter: time.Second}); err != nil {
		t.Fatal(err)
	}
	at(6)
	b = claim("B")
	at(7)
	r.e = claim("E")
	at(10)
	if err := r.q.Complete(ctx, b, nil); err != nil {
		t.Fatal(err)
	}
	at(20)
	return r
}

func (r *opsRun) claim(t *testing.T, id string) *couchq.WorkItem {
	t.Helper()
	it, err := r.q.Get(r.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if it, err = r.q.Claim(r.ctx, it, claimant, time.Minute); err != nil {
		t.Fatal(err)
	}
	return it
}

func (r *opsRun) at(sec int) { r.clk.Set(r.t0.Add(time.Duration(sec) * time.Second)) }

// since is the start of the window that covers the whole script.
func (r *opsRun) since() string { return r.t0.Add(-time.Second).Format(time.RFC3339) }

// checkScriptStats checks a report of the whole script at T0+20.
func checkScriptStats(t *testing.T, st *couchq.Stats) {
	t.Helper()
	if len(st.Types) != 1 || st.Types[0].Type != "mail" {
		t.Fatalf("types: %+v", st.Types)
	}
	m := st.Types[0]
	if m.Added != 5 || m.Started != 4 || m.Finished != 2 || m.Failed != 0 || m.Retried != 1 {
		t.Errorf("events: added %d started %d finished %d failed %d retried %d; want 5 4 2 0 1",
			m.Added, m.Started, m.Finished, m.Failed, m.Retried)
	}
	if !near(m.Throughput, 2.0/21) {
		t.Errorf("throughput %v, want 2 finished in 21s", m.Throughput)
	}
	checkSummary(t, "wait", m.Wait, 3, 2, 13.0/3, 7, 4, 7)
	checkSummary(t, "service", m.Service, 2, 5, 7.5, 10, 5, 10)
	checkSummary(t, "execution", m.Execution, 3, 1, 8.0/3, 4, 3, 4)
	want := couchq.QueueNow{Due: 1, Scheduled: 1, Running: 1, Done: 2, OldestDueAge: 20}
	if m.Queue != want {
		t.Errorf("queue now %+v, want %+v", m.Queue, want)
	}
	if st.Workers == nil || len(st.Workers) != 0 {
		t.Errorf("workers: %#v, want []", st.Workers)
	}
}

func near(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 }

func checkSummary(t *testing.T, name string, s couchq.Summary, count int64, lo, mean, hi, p50, p95 float64) {
	t.Helper()
	if s.Count != count || !near(s.Min, lo) || !near(s.Mean, mean) || !near(s.Max, hi) ||
		s.P50 == nil || s.P95 == nil || !near(*s.P50, p50) || !near(*s.P95, p95) {
		t.Errorf("%s: %+v, want count %d min %v mean %v max %v p50 %v p95 %v", name, s, count, lo, mean, hi, p50, p95)
	}
}

// serving is a couchq serve running in-process.
type serving struct {
	url    string
	stderr *couchtest.SyncBuffer
	cancel context.CancelFunc
	done   chan int
	once   sync.Once
	code   int
}

// startServe runs couchq serve --json with args in-process and waits
// until it listens.
func startServe(t *testing.T, c cli, args ...string) *serving {
	t.Helper()
	pr, pw := io.Pipe()
	s := &serving{stderr: &couchtest.SyncBuffer{}, done: make(chan int, 1)}
	m := NewMain(strings.NewReader(""), pw, s.stderr)
	m.Getenv = func(k string) string { return c.env[k] }
	m.IsTerminal = func(io.Writer) bool { return false }
	if c.now != nil {
		m.Now = c.now
	}
	var ctx context.Context
	ctx, s.cancel = context.WithCancel(context.Background())
	go func() {
		code := m.Run(ctx, append([]string{"serve", "--json"}, args...))
		_ = pw.Close()
		s.done <- code
	}()
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		line := ""
		if sc.Scan() {
			line = sc.Text()
		}
		first <- line
		_, _ = io.Copy(io.Discard, pr)
	}()
	t.Cleanup(func() { s.stop(t) })
	select {
	case line := <-first:
		var out struct {
			Listening string `json:"listening"`
		}
		if err := json.Unmarshal([]byte(line), &out); err != nil || out.Listening == "" {
			t.Fatalf("serve did not say where it listens: %q (%v); stderr:\n%s", line, err, s.stderr)
		}
		s.url = out.Listening
	case <-time.After(time.Minute):
		t.Fatalf("serve did not start; stderr:\n%s", s.stderr)
	}
	return s
}

// stop interrupts serve and returns its exit code.
func (s *serving) stop(t *testing.T) int {
	t.Helper()
	s.once.Do(func() {
		s.cancel()
		select {
		case s.code = <-s.done:
		case <-time.After(30 * time.Second):
			t.Errorf("serve did not stop within 30s of the interrupt")
			s.code = -1
		}
		t.Logf("couchq serve -> %d\nstderr:\n%s", s.code, s.stderr)
	})
	return s.code
}

// get fetches a path of the server and returns the status and body.
func (s *serving) get(t *testing.T, path string) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: time.Minute}
	resp, err := client.Get(s.url + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

// bulkWrite stores documents as they are, 1,000 per request, bypassing
// couchq as an application writing its own documents would.
func bulkWrite(t *testing.T, db string, docs []any) {
	t.Helper()
	kdb := srv.Client(t).DB(db)
	for start := 0; start < len(docs); start += 1000 {
		results, err := kdb.BulkDocs(context.Background(), docs[start:min(start+1000, len(docs))])
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range results {
			if r.Error != nil {
				t.Fatalf("writing %s: %v", r.ID, r.Error)
			}
		}
	}
}

// statusTotals counts a database's jobs by type and status, as "type/status".
func statusTotals(t *testing.T, db string) string {
	t.Helper()
	q, err := couchq.New(context.Background(), srv.Client(t).DB(db), couchq.Config{})
	if err != nil {
		t.Fatal(err)
	}
	counts, err := q.Counts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for typ, byStatus := range counts {
		for st, n := range byStatus {
			if n > 0 {
				parts = append(parts, fmt.Sprintf("%s/%s=%d", typ, st, n))
			}
		}
	}
	return sortedJoin(parts)
}

func sortedJoin(parts []string) string {
	slices.Sort(parts)
	return strings.Join(parts, " ")
}
