package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// The changes feed wakes workers for claimable work only: a new job or a
// retry passes, claims and completions do not (they would wake every
// worker for nothing). Proven for the design document's filter (every
// server) and for CouchDB's native _selector filter (where the server has
// one).
func TestChangesFeedPassesOnlyClaimableWork(t *testing.T) {
	eachFeedFilter(t, checkFeed)
}

// eachFeedFilter runs check with a client that follows the feed through
// the design document's filter (every server), then with one that uses
// CouchDB's native _selector filter (skipped where the server has none).
func eachFeedFilter(t *testing.T, check func(*testing.T, *testBundle, *protocol.Client)) {
	t.Run("design-document filter", func(t *testing.T) {
		tb := setup(t, protocol.Config{})
		check(t, tb, tb.client)
	})
	t.Run("_selector filter", func(t *testing.T) {
		tb := setup(t, protocol.Config{})
		user, password := server.Credentials()
		srv, err := protocol.Connect(tb.ctx, server.URL(), user, password)
		if err != nil {
			t.Fatal(err)
		}
		if want := server.Caps().SelectorFilter; srv.Caps.SelectorFilter != want {
			t.Fatalf("couchq detects _selector support %v, the harness %v (%s %s)",
				srv.Caps.SelectorFilter, want, srv.Caps.Vendor, srv.Caps.Version)
		}
		if !srv.Caps.SelectorFilter {
			couchtest.Skip(t, "the server has no _selector changes filter ("+srv.Caps.Vendor+" "+srv.Caps.Version+
				"); couchq follows the design document's filter there, tested above")
		}
		client, err := srv.Open(tb.ctx, tb.db.Name(), protocol.Config{Logger: tb.log})
		if err != nil {
			t.Fatal(err)
		}
		check(t, tb, client)
	})
}

func checkFeed(t *testing.T, tb *testBundle, c *protocol.Client) {
	t.Helper()
	ctx := tb.ctx
	_, since, err := c.WaitForChanges(ctx, "now", []string{"feed"}, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	wait := func(what string, want bool) {
		t.Helper()
		n, next, err := c.WaitForChanges(ctx, since, []string{"feed"}, 500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if got := n > 0; got != want {
			t.Fatalf("%s: feed reported %d changes, want any: %v", what, n, want)
		}
		since = next
	}
	if _, err := c.Enqueue(ctx, protocol.NewJob{Worker: "other-type"}); err != nil {
		t.Fatal(err)
	}
	wait("a job of another type", false)
	job, err := c.Enqueue(ctx, protocol.NewJob{Worker: "feed"})
	if err != nil {
		t.Fatal(err)
	}
	wait("a new job", true)
	it, err := c.Claim(ctx, job, "feed/1/w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	wait("a claim", false)
	if err := c.Extend(ctx, it, time.Minute); err != nil {
		t.Fatal(err)
	}
	wait("a lease renewal", false)
	if err := c.Fail(ctx, it, "again", protocol.FailOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("a retry", true)
	batch, err := c.Due(ctx, "feed", 1)
	if err != nil || len(batch.Items) != 1 {
		t.Fatalf("due: %v", err)
	}
	it, err = c.Claim(ctx, batch.Items[0], "feed/1/w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	wait("a second claim", false)
	if err := c.Complete(context.WithoutCancel(ctx), it, nil); err != nil {
		t.Fatal(err)
	}
	wait("a completion", false)
}

// slowDBInfo delays GET /{db} (the database info, where the update
// sequence comes from) while on is set.
type slowDBInfo struct {
	next  http.RoundTripper
	delay time.Duration
	on    atomic.Bool
}

func (s *slowDBInfo) RoundTrip(r *http.Request) (*http.Response, error) {
	if s.on.Load() && r.Method == http.MethodGet && strings.Count(strings.Trim(r.URL.Path, "/"), "/") == 0 {
		time.Sleep(s.delay)
	}
	return s.next.RoundTrip(r)
}

// A job enqueued right after Start — after the runners' first look at the
// due view, before the changes feed's first request — wakes the worker:
// the feed starts from the update sequence read in Start, not from
// whenever its first request happens to go out.
func TestJobEnqueuedRightAfterStartIsNotMissed(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var slow *slowDBInfo
	client := clientThrough(t, tb, protocol.Config{}, func(next http.RoundTripper) http.RoundTripper {
		slow = &slowDBInfo{next: next, delay: 1500 * time.Millisecond}
		return slow
	})
	ran := make(chan struct{}, 1)
	cfg := fastWorker(tb, map[string]worker.Handler{"early": worker.HandlerFunc(func(context.Context, *worker.Job) error {
		ran <- struct{}{}
		return nil
	})})
	runWorker(t, tb.ctx, client, cfg)
	slow.on.Store(true) // from now on, reading the update sequence is slow
	time.Sleep(300 * time.Millisecond)
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "early"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
	case <-time.After(15 * time.Second):
		t.Fatalf("a job enqueued right after Start did not run within 15 s (the fallback poll is %s)", cfg.FallbackPoll)
	}
}

// slowNext delays the answers to queries for a type's next scheduled job
// (due_priority ranges that end past every date, [worker, priority, {}])
// while on.
type slowNext struct {
	next  http.RoundTripper
	delay time.Duration
	on    atomic.Bool
	seen  atomic.Int64
}

func (s *slowNext) RoundTrip(r *http.Request) (*http.Response, error) {
	if !s.on.Load() {
		return s.next.RoundTrip(r)
	}
	r, query, err := readDueQuery(r)
	if err != nil || query != dueNext {
		return s.next.RoundTrip(r)
	}
	s.seen.Add(1)
	// The server answers at once; the answer arrives late, describing
	// the queue as it was when the query was sent.
	resp, err := s.next.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	select {
	case <-time.After(s.delay):
	case <-r.Context().Done():
		_ = resp.Body.Close()
		return nil, r.Context().Err()
	}
	return resp, nil
}

// What a request of the due_priority view asks for (readDueQuery).
const (
	notDue  = iota
	dueNow  // jobs due now (DueCandidates): ranges end at a date
	dueNext // the next scheduled job (Next): ranges end past every date
)

// readDueQuery tells which due_priority query r is, from its URL or body,
// and returns a request that can still be sent.
func readDueQuery(r *http.Request) (*http.Request, int, error) {
	if !strings.Contains(r.URL.Path, "/_view/due_priority") {
		return r, notDue, nil
	}
	query, _ := url.QueryUnescape(r.URL.RawQuery)
	var body []byte
	if r.Body != nil {
		var err error
		if body, err = io.ReadAll(r.Body); err != nil {
			return r, notDue, err
		}
		_ = r.Body.Close()
		r = r.Clone(r.Context())
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	if strings.Contains(query+string(body), ",{}]") {
		return r, dueNext, nil
	}
	return r, dueNow, nil
}

// A job enqueued while an idle runner asks when its next scheduled job is
// due runs at once: the wake-up does not wait for that query. On a
// cluster the query is about a third of an idle round.
func TestWakeUpDoesNotWaitForTheNextScheduledQuery(t *testing.T) {
	tb := setup(t, protocol.Config{})
	const delay = 6 * time.Second
	var slow *slowNext
	client := clientThrough(t, tb, protocol.Config{}, func(next http.RoundTripper) http.RoundTripper {
		slow = &slowNext{next: next, delay: delay}
		return slow
	})
	ran := make(chan struct{}, 1)
	cfg := fastWorker(tb, map[string]worker.Handler{"woken": worker.HandlerFunc(func(context.Context, *worker.Job) error {
		ran <- struct{}{}
		return nil
	})})
	cfg.QueryTimeout = 2 * delay
	slow.on.Store(true)
	runWorker(t, tb.ctx, client, cfg)
	// The runner found nothing due and is waiting on its slow query.
	deadline := time.Now().Add(5 * time.Second)
	for slow.seen.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if slow.seen.Load() == 0 {
		t.Fatal("the idle runner never asked for its next scheduled job: the test proves nothing")
	}
	time.Sleep(200 * time.Millisecond)
	began := time.Now()
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "woken"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
		t.Logf("ran %s after the enqueue", time.Since(began).Round(time.Millisecond))
	case <-time.After(delay / 2):
		t.Fatalf("the job did not run within %s: it waited for the next-scheduled query (%s)", delay/2, delay)
	}
	// A job scheduled since then runs when due, give or take one slow
	// query: an answer to a query sent before it existed ("nothing
	// scheduled") must not put the runner to sleep until the fallback poll.
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "woken", At: time.Now().Add(500 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
	case <-time.After(3 * delay):
		t.Fatalf("a scheduled job did not run within %s (the fallback poll is %s)", 3*delay, cfg.FallbackPoll)
	}
}

// laggingCopy answers the first query it matches after it is armed with
// the answer to the one before (or the last that keep kept): as a cluster
// answers a view query from a copy that does not hold the newest jobs yet.
// It matches queries for due jobs unless given match; its feed then
// carries no documents (withoutFeedDocs).
type laggingCopy struct {
	next http.RoundTripper
	// match reports whether r is a query the copy lags on, and the request
	// to send.
	match func(r *http.Request) (*http.Request, bool)
	// keep reports whether an answer is one to replay; nil keeps all.
	keep     func(body []byte) bool
	mu       sync.Mutex
	last     []byte // the last answer to a matching query
	arm      atomic.Bool
	replayed atomic.Int64
}

// dueNowQuery matches the queries for jobs due now.
func dueNowQuery(r *http.Request) (*http.Request, bool) {
	r, query, err := readDueQuery(withoutFeedDocs(r))
	return r, err == nil && query == dueNow
}

func (l *laggingCopy) RoundTrip(r *http.Request) (*http.Response, error) {
	match := l.match
	if match == nil {
		match = dueNowQuery
	}
	r, ok := match(r)
	if !ok {
		return l.next.RoundTrip(r)
	}
	l.mu.Lock()
	last := l.last
	l.mu.Unlock()
	if last != nil && l.arm.CompareAndSwap(true, false) {
		l.replayed.Add(1)
		return &http.Response{
			StatusCode: http.StatusOK, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"Content-Type": {"application/json"}},
			Body:   io.NopCloser(bytes.NewReader(last)), ContentLength: int64(len(last)), Request: r,
		}, nil
	}
	resp, body, err := roundTripOK(l.next, r)
	if err != nil || body == nil {
		return resp, err
	}
	if l.keep == nil || l.keep(body) {
		l.mu.Lock()
		l.last = body
		l.mu.Unlock()
	}
	return resp, nil
}

// roundTripOK sends r through next and returns the answer and, when it is
// a 200, its body read whole (the answer's body can still be read).
func roundTripOK(next http.RoundTripper, r *http.Request) (*http.Response, []byte, error) {
	resp, err := next.RoundTrip(r)
	if err != nil || resp.StatusCode != http.StatusOK {
		return resp, nil, err
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return nil, nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, body, nil
}

// On a cluster the feed can report a job before the copy a due query reads
// holds it: the round the feed woke finds nothing. The worker looks again
// shortly after, so the job runs at once rather than at the next fallback
// poll. (An idle worker whose feed brings the job's document claims it
// without the view: TestClusterIdleWorkerClaimsWhatTheFeedBrings.)
func TestClusterFeedWakeUpSurvivesALaggingCopy(t *testing.T) {
	cb := setupCluster(t, protocol.Config{})
	var lag *laggingCopy
	client := cb.openThrough(t, 1, protocol.Config{}, func(next http.RoundTripper) http.RoundTripper {
		lag = &laggingCopy{next: next}
		return lag
	})
	ran := make(chan struct{}, 1)
	cfg := clusterWorker(cb.log, map[string]worker.Handler{"lagged": worker.HandlerFunc(func(context.Context, *worker.Job) error {
		ran <- struct{}{}
		return nil
	})})
	cfg.FallbackPoll = time.Minute // a test that passes proves the feed, not the poll
	runWorker(t, cb.ctx, client, cfg)
	time.Sleep(500 * time.Millisecond) // past the runner's first look, which found nothing
	lag.arm.Store(true)
	began := time.Now()
	if _, err := cb.clients[1].Enqueue(cb.ctx, protocol.NewJob{Worker: "lagged"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
		t.Logf("ran %s after the enqueue", time.Since(began).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatalf("the job did not run within 10 s of a due query answered from a lagging copy (fallback poll %s)", cfg.FallbackPoll)
	}
	if lag.replayed.Load() != 1 {
		t.Fatalf("%d due queries were answered from the lagging copy, want 1: the test proved nothing", lag.replayed.Load())
	}
}

// withoutFeedDocs asks the changes feed for no documents (as a busy
// worker's feed), so that the worker looks for a new job in the due view.
func withoutFeedDocs(r *http.Request) *http.Request {
	if !strings.HasSuffix(r.URL.Path, "/_changes") {
		return r
	}
	r = r.Clone(r.Context())
	q := r.URL.Query()
	q.Del("include_docs")
	r.URL.RawQuery = q.Encode()
	return r
}

// hangingDue leaves the next query of a due view unanswered, until the
// request is cancelled, once armed: as CouchDB 3.5.0 did with a node
// stopped mid-query. Its feed carries no documents (withoutFeedDocs).
type hangingDue struct {
	next http.RoundTripper
	arm  atomic.Bool
	hung atomic.Int64
}

func (h *hangingDue) RoundTrip(r *http.Request) (*http.Response, error) {
	r = withoutFeedDocs(r)
	if strings.Contains(r.URL.Path, "/_view/due") && h.arm.CompareAndSwap(true, false) {
		h.hung.Add(1)
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	return h.next.RoundTrip(r)
}

// A due query the server never answers is cut off after QueryTimeout and
// asked again: the job it would have found runs. Without the timeout the
// runner waits on that query for good (the fallback poll is a minute).
func TestHungDueQueryIsCutOffByQueryTimeout(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var hang *hangingDue
	client := clientThrough(t, tb, protocol.Config{}, func(next http.RoundTripper) http.RoundTripper {
		hang = &hangingDue{next: next}
		return hang
	})
	ran := make(chan struct{}, 1)
	cfg := fastWorker(tb, map[string]worker.Handler{"hung": worker.HandlerFunc(func(context.Context, *worker.Job) error {
		ran <- struct{}{}
		return nil
	})})
	cfg.QueryTimeout = 500 * time.Millisecond
	runWorker(t, tb.ctx, client, cfg)
	time.Sleep(300 * time.Millisecond) // past the runner's first look
	hang.arm.Store(true)
	began := time.Now()
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "hung"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
	case <-time.After(20 * time.Second):
		t.Fatalf("the job did not run within 20 s of a hung due query (%d hung; QueryTimeout %s)", hang.hung.Load(), cfg.QueryTimeout)
	}
	if hang.hung.Load() != 1 {
		t.Fatalf("%d due queries hung, want 1: the test proved nothing", hang.hung.Load())
	}
	t.Logf("ran %s after the enqueue, past one hung due query", time.Since(began).Round(time.Millisecond))
}

// An idle worker's feed brings the new jobs due now with their documents,
// by type and priority, so that it claims them without reading the due
// view; a job scheduled for later is left to the view. A busy worker's
// feed brings none. Through both filters.
func TestFeedBringsDueJobsWithTheirDocuments(t *testing.T) {
	eachFeedFilter(t, func(t *testing.T, tb *testBundle, c *protocol.Client) {
		ctx := tb.ctx
		_, since, err := c.WaitForWork(ctx, "now", []string{"fed"}, 10*time.Millisecond, true)
		if err != nil {
			t.Fatal(err)
		}
		urgent, err := c.Enqueue(ctx, protocol.NewJob{Worker: "fed", Priority: protocol.PriorityHighest})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Enqueue(ctx, protocol.NewJob{Worker: "fed", At: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Enqueue(ctx, protocol.NewJob{Worker: "other"}); err != nil {
			t.Fatal(err)
		}
		jobs := 0
		var due []protocol.DueCandidate
		for deadline := time.Now().Add(5 * time.Second); jobs < 2 && time.Now().Before(deadline); {
			fc, next, err := c.WaitForWork(ctx, since, []string{"fed"}, 500*time.Millisecond, true)
			if err != nil {
				t.Fatal(err)
			}
			since, jobs, due = next, jobs+fc.Jobs, append(due, fc.Due["fed"]...)
			if len(fc.Due) > 1 || (len(fc.Due) == 1 && fc.Due["fed"] == nil) {
				t.Fatalf("the feed brought jobs of other types: %v", fc.Due)
			}
		}
		if jobs != 2 || len(due) != 1 || due[0].ID != urgent.ID || due[0].Priority != protocol.PriorityHighest {
			t.Fatalf("the feed reported %d job changes and brought %+v, want 2 and the job due now (%s, priority 1)", jobs, due, urgent.ID)
		}
		// Claimed from the document the feed brought.
		batch, err := c.FetchCandidates(ctx, due)
		if err != nil || len(batch.Items) != 1 || batch.Items[0].Rev != urgent.Rev {
			t.Fatalf("the fed job as FetchCandidates reads it: %+v, %v; want revision %s", batch, err, urgent.Rev)
		}
		if _, err := c.Claim(ctx, batch.Items[0], "fed/1/w", time.Minute); err != nil {
			t.Fatalf("claiming the fed job: %v", err)
		}
		if _, err := c.Enqueue(ctx, protocol.NewJob{Worker: "fed"}); err != nil {
			t.Fatal(err)
		}
		fc, _, err := c.WaitForWork(ctx, since, []string{"fed"}, 2*time.Second, false)
		if err != nil || fc.Jobs != 1 || fc.Due != nil {
			t.Fatalf("without documents the feed reported %d jobs and brought %v (%v), want 1 and none", fc.Jobs, fc.Due, err)
		}
	})
}

// An idle worker claims a job the feed brought without a due-view read:
// its claim round reads no view at all.
func TestIdleWorkerClaimsWhatTheFeedBrings(t *testing.T) {
	tb := setup(t, protocol.Config{})
	checkIdleClaimsFromFeed(t, tb.ctx, tb.client, tb.client, func(h map[string]worker.Handler) worker.Config { return fastWorker(tb, h) })
}

// checkIdleClaimsFromFeed enqueues three jobs one at a time through
// enqueue for an idle worker on work and checks that it ran each without
// reading the due view.
func checkIdleClaimsFromFeed(t *testing.T, ctx context.Context, enqueue, work *protocol.Client, config func(map[string]worker.Handler) worker.Config) {
	t.Helper()
	ran := make(chan string, 10)
	w := runWorker(t, ctx, work, config(map[string]worker.Handler{"fed": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		ran <- job.ID
		return nil
	})}))
	// Idle: its first rounds found nothing due.
	before := w.Stats().Queries
	for settled := time.Now().Add(5 * time.Second); ; {
		time.Sleep(300 * time.Millisecond)
		if now := w.Stats().Queries; now == before {
			break
		} else if time.Now().After(settled) {
			t.Fatalf("an idle worker keeps reading the due view (%d queries)", now)
		} else {
			before = now
		}
	}
	for i := range 3 {
		job, err := enqueue.Enqueue(ctx, protocol.NewJob{Worker: "fed"})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case id := <-ran:
			if id != job.ID {
				t.Fatalf("ran %s, want %s", id, job.ID)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("job %d did not run within 10 s", i)
		}
		time.Sleep(200 * time.Millisecond) // its outcome written
	}
	time.Sleep(300 * time.Millisecond) // a round after the last job would read the view now
	if after := w.Stats().Queries; after != before {
		t.Errorf("the idle worker read the due view %d times for 3 jobs the feed brought, want none", after-before)
	}
}

// A change a long poll of the changes feed slept through is found a moment
// later, not a feed timeout (a minute by default) later. CouchDB starts a
// long poll's update listener beside its first read of the changes, so a
// change written between the two wakes nobody: a worker missed a peer's
// registration that way, one start in five. The transport here plays the
// server's part: the poll sleeps to its timeout and reports nothing.
func TestFeedFindsAChangeThePollSleptThrough(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var asleep atomic.Int64
	c := clientThrough(t, tb, protocol.Config{}, func(next http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			q := r.URL.Query()
			if !strings.HasSuffix(r.URL.Path, "/_changes") || q.Get("feed") != "longpoll" {
				return next.RoundTrip(r)
			}
			asleep.Add(1)
			timeout, _ := strconv.Atoi(q.Get("timeout"))
			select {
			case <-time.After(time.Duration(timeout) * time.Millisecond):
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
			body := fmt.Sprintf(`{"results":[],"last_seq":%q,"pending":0}`, q.Get("since"))
			return &http.Response{
				StatusCode: http.StatusOK, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				Header: http.Header{"Content-Type": {"application/json"}},
				Body:   io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)), Request: r,
			}, nil
		})
	})
	since, err := c.UpdateSeq(tb.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(tb.ctx, protocol.NewJob{Worker: "slept"}); err != nil {
		t.Fatal(err)
	}
	const timeout = 5 * time.Second
	for _, docs := range []bool{false, true} {
		began := time.Now()
		fc, _, err := c.WaitForWork(tb.ctx, since, []string{"slept"}, timeout, docs)
		took := time.Since(began)
		if err != nil {
			t.Fatal(err)
		}
		if fc.Jobs != 1 || took > timeout/2 {
			t.Fatalf("with documents %v the feed reported %d jobs after %s, want the job well before the poll's timeout (%s)", docs, fc.Jobs, took.Round(time.Millisecond), timeout)
		}
		if docs && len(fc.Due["slept"]) != 1 {
			t.Fatalf("the look that found the job brought %d due jobs with their documents, want 1", len(fc.Due["slept"]))
		}
	}
	if asleep.Load() != 2 {
		t.Fatalf("%d polls went through the sleeping server, want 2: the test proved nothing", asleep.Load())
	}
}

// A copy that does not hold a worker's claim yet can report the job to the
// worker's feed again, due at the revision the claim was written over: on
// a cluster a poll may be answered from another copy of the shard. The
// worker must not claim it again. That claim could only lose (409), and it
// counted as a race lost to a peer, which has the worker read the registry
// again. The transport here replays the feed's answer that brought the job
// a few seconds after the job has run.
func TestFeedReportingAClaimedJobAgainStartsNoClaim(t *testing.T) {
	tb := setup(t, protocol.Config{})
	checkClaimedJobReportedAgain(t, tb.ctx, func(wrap func(http.RoundTripper) http.RoundTripper) *protocol.Client {
		return clientThrough(t, tb, protocol.Config{}, wrap)
	}, func(h map[string]worker.Handler) worker.Config { return fastWorker(tb, h) })
}

// checkClaimedJobReportedAgain runs one job through a worker whose client
// (from open) replays the feed's answer that brought the job once it ran,
// and checks that the worker made no second claim of it.
func checkClaimedJobReportedAgain(t *testing.T, ctx context.Context, open func(wrap func(http.RoundTripper) http.RoundTripper) *protocol.Client, config func(map[string]worker.Handler) worker.Config) {
	t.Helper()
	var lag *laggingCopy
	c := open(func(next http.RoundTripper) http.RoundTripper {
		lag = &laggingCopy{
			next: next,
			match: func(r *http.Request) (*http.Request, bool) {
				return r, strings.HasSuffix(r.URL.Path, "/_changes")
			},
			keep: func(body []byte) bool { return bytes.Contains(body, []byte(`"worker":"again"`)) },
		}
		return lag
	})
	ran := make(chan string, 4)
	w := runWorker(t, ctx, c, config(map[string]worker.Handler{"again": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		ran <- job.ID
		return nil
	})}))
	time.Sleep(500 * time.Millisecond) // idle, its feed bringing documents
	if _, err := c.Enqueue(ctx, protocol.NewJob{Worker: "again"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("the job did not run within 10 s")
	}
	lag.mu.Lock()
	brought := lag.last
	lag.mu.Unlock()
	if !bytes.Contains(brought, []byte(`"doc":`)) {
		t.Fatalf("the feed brought the job without its document: the test proved nothing (%s)", brought)
	}
	// A copy can lag by seconds (a node under load, or one cut off for a
	// while): the replay comes later than the moment for which a runner
	// skips its recent claims in any view read.
	time.Sleep(2500 * time.Millisecond)
	lag.arm.Store(true)
	for deadline := time.Now().Add(5 * time.Second); lag.replayed.Load() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the feed was not read again within 5 s")
		}
	}
	time.Sleep(500 * time.Millisecond) // the round the replay woke
	select {
	case id := <-ran:
		t.Fatalf("job %s ran twice", id)
	default:
	}
	if st := w.Stats(); st.Claimed != 1 || st.Conflicts != 0 {
		t.Errorf("after the feed reported the claimed job again: %d claims won, %d lost; want 1 and none", st.Claimed, st.Conflicts)
	}
}

// A job scheduled for a moment later, that the feed brought before it was
// due while the worker was busy claiming, runs when it falls due: not a
// fallback poll (here a minute) later. The round that claims what the feed
// brought reads no view, so the next scheduled job must be looked for
// from where the view was last read, not from the round's start, which
// may be past the job's time. The transport here holds the worker's first
// claim while the two jobs are enqueued.
//
// (On a cluster the worker looks at the view again a moment after a round
// that claimed what the feed brought, which finds such a job anyway.)
func TestJobScheduledWhileAClaimWaitsRunsWhenDue(t *testing.T) {
	tb := setup(t, protocol.Config{})
	ctx, enqueue := tb.ctx, tb.client
	var armed atomic.Bool
	held := make(chan struct{})
	release := make(chan struct{})
	c := clientThrough(t, tb, protocol.Config{}, func(next http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if armed.Load() && r.Body != nil && (r.Method == http.MethodPut || r.Method == http.MethodPost) {
				body, err := io.ReadAll(r.Body)
				if err != nil {
					return nil, err
				}
				r.Body = io.NopCloser(bytes.NewReader(body))
				if bytes.Contains(body, []byte(`"claimed":true`)) && armed.CompareAndSwap(true, false) {
					close(held)
					select {
					case <-release:
					case <-r.Context().Done():
						return nil, r.Context().Err()
					}
				}
			}
			return next.RoundTrip(r)
		})
	})
	ran := make(chan string, 10)
	runWorker(t, ctx, c, fastWorker(tb, map[string]worker.Handler{"soon": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		ran <- job.ID
		return nil
	})}))
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	// Registered after the worker's: runs before it stops, should the test
	// end early.
	t.Cleanup(free)
	time.Sleep(500 * time.Millisecond) // idle, its feed bringing documents
	armed.Store(true)
	first, err := enqueue.Enqueue(ctx, protocol.NewJob{Worker: "soon"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker did not claim the first job within 10 s")
	}
	res, err := enqueue.EnqueueMany(ctx, []protocol.NewJob{
		{Worker: "soon"},
		{Worker: "soon", At: time.Now().Add(200 * time.Millisecond)},
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the feed brought both; the second is due now
	free()
	want := map[string]bool{first.ID: true}
	for _, r := range res {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		want[r.Item.ID] = true
	}
	for deadline := time.After(10 * time.Second); len(want) > 0; {
		select {
		case id := <-ran:
			delete(want, id)
		case <-deadline:
			t.Fatalf("%d of 3 jobs did not run within 10 s: %v", len(want), want)
		}
	}
}

// A worker counts as ready again within seconds of CouchDB coming back
// after a restart, not after a whole long-poll of its feed without
// changes (FeedTimeout, here a minute).
func TestWorkerReadySoonAfterARestart(t *testing.T) {
	if !server.CanRestart() {
		couchtest.Skip(t, fmt.Sprintf("%s servers are not ours to restart (%s)", server.Kind(), server.Reason()))
	}
	tb := setup(t, protocol.Config{})
	cfg := fastWorker(tb, map[string]worker.Handler{"idle": worker.HandlerFunc(func(context.Context, *worker.Job) error { return nil })})
	cfg.FeedTimeout, cfg.HeartbeatInterval = time.Minute, time.Second
	w := startWorker(t, tb, cfg)
	waitFor(t, 15*time.Second, "the worker to be ready", func() bool { return w.Ready() == nil })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := server.Restart(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	back := time.Now()
	waitFor(t, 60*time.Second, "the worker to be ready again", func() bool { return w.Ready() == nil })
	if took := time.Since(back); took > 20*time.Second {
		t.Errorf("the worker was ready again %s after CouchDB answered, want well under its feed timeout (%s)", took.Round(time.Millisecond), cfg.FeedTimeout)
	} else {
		t.Logf("ready again %s after CouchDB answered", took.Round(time.Millisecond))
	}
}
