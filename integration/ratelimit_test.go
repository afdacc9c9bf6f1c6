package integration

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/worker"
)

// Four worker processes share a limit of 20 starts per second: over ten
// full windows they start 200 ± 10 % jobs, and never more than 20 in one.
func TestRateLimitAcrossProcesses(t *testing.T) {
	tb := setup(t, couchq.Config{})
	bin := buildCLI(t)
	const limit, windows = 20, 10
	jobs := make([]couchq.NewJob, 600)
	for i := range jobs {
		jobs[i] = couchq.NewJob{Worker: "rl"}
	}
	for start := 0; start < len(jobs); start += 300 {
		if _, err := tb.client.EnqueueMany(tb.ctx, jobs[start:start+300]); err != nil {
			t.Fatal(err)
		}
	}
	var procs []*cliProc
	for i := range 4 {
		procs = append(procs, startProc(t, bin, tb.db.Name(), fmt.Sprintf("worker-%d", i),
			"worker", "--type", "rl", "--handler", "noop", "--concurrency", "8", "--rate", fmt.Sprintf("rl=%d/s", limit),
			"--lease", "10s", "--feed-timeout", "2s"))
	}
	waitFor(t, time.Minute, "every worker process to start jobs", func() bool {
		ws, err := tb.client.Workers(tb.ctx)
		return err == nil && len(ws) == len(procs)
	})
	time.Sleep(2 * time.Second) // let them all get going
	measured := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(measured.Add((windows + 1) * time.Second)))
	for _, p := range procs {
		p.signal(t, syscall.SIGTERM)
	}
	for _, p := range procs {
		if code := p.wait(t, 30*time.Second); code != 0 {
			t.Fatalf("%s exited %d", p.name, code)
		}
	}
	perWindow := map[int64]int{}
	first, last := int64(math.MaxInt64), int64(0)
	for _, it := range allJobs(t, tb, "rl") {
		if it.StartedAt == 0 {
			continue
		}
		w := int64(math.Floor(it.StartedAt))
		perWindow[w]++
		first, last = min(first, w), max(last, w)
	}
	for w, n := range perWindow {
		if n > limit {
			t.Errorf("%d jobs started in the window of %s, over the limit of %d", n, time.Unix(w, 0).UTC().Format(time.TimeOnly), limit)
		}
	}
	// The ten full windows measured, with every process running.
	total := 0
	for w := measured.Unix(); w < measured.Unix()+windows; w++ {
		total += perWindow[w]
	}
	t.Logf("%d jobs started in %d full windows (limit %d/s, 4 processes); %d windows in all", total, windows, limit, last-first+1)
	if want := limit * windows; math.Abs(float64(total-want)) > 0.1*float64(want) {
		t.Fatalf("%d jobs started in %d windows, want %d ± 10%%: %v", total, windows, want, perWindow)
	}
}

// slowReads delays every read of documents by id (_all_docs), which is
// how a runner reads a rate limit's slots.
type slowReads struct {
	next  http.RoundTripper
	delay time.Duration
}

func (s *slowReads) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/_all_docs") {
		time.Sleep(s.delay)
	}
	return s.next.RoundTrip(r)
}

// A round of taking start slots that lasts longer than a window (as on a
// busy cluster) still starts jobs, never more than the limit per window:
// the runner takes the slots of the window its round will end in, and
// claims as that window begins. Taking the current window's slots, every
// round would end in a later window with its slots unusable, and no job
// would start. One runner's round (1.2 s) is longer than a window, so it
// cannot serve every window: a third of them at least.
func TestRateLimitSlowSlotRounds(t *testing.T) {
	tb := setup(t, couchq.Config{})
	const limit, windows = 5, 8
	hc := couchq.NewHTTPClient()
	hc.Transport = &slowReads{next: hc.Transport, delay: 1200 * time.Millisecond}
	user, password := server.Credentials()
	srv, err := couchq.ConnectHTTP(tb.ctx, server.URL(), user, password, hc)
	if err != nil {
		t.Fatal(err)
	}
	client, err := srv.Open(tb.ctx, tb.db.Name(), couchq.Config{Logger: tb.log})
	if err != nil {
		t.Fatal(err)
	}
	jobs := make([]couchq.NewJob, 100)
	for i := range jobs {
		jobs[i] = couchq.NewJob{Worker: "slowrl"}
	}
	if _, err := tb.client.EnqueueMany(tb.ctx, jobs); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	perWindow := map[int64]int{} // by the started_at each claim wrote
	cfg := fastWorker(tb, map[string]worker.Handler{"slowrl": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		mu.Lock()
		perWindow[int64(math.Floor(job.Item.StartedAt))]++
		mu.Unlock()
		return nil
	})})
	cfg.Concurrency = 10
	cfg.RateLimits = map[string]couchq.RateLimit{"slowrl": {N: limit, Per: time.Second}}
	w, err := worker.New(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(tb.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	time.Sleep(3 * time.Second) // the first round learns how long rounds take
	measured := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(measured.Add((windows + 1) * time.Second)))
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for win, n := range perWindow {
		if n > limit {
			t.Errorf("%d jobs started in one window, over the limit of %d", n, limit)
		}
		if win >= measured.Unix() && win < measured.Unix()+windows {
			total += n
		}
	}
	t.Logf("%d jobs started in %d full windows (limit %d/s, slot reads of 1.2 s): %v", total, windows, limit, perWindow)
	if total < limit*windows/3 {
		t.Fatalf("%d jobs started in %d windows, want at least %d", total, windows, limit*windows/3)
	}
}

// afterBulkDocs runs hook (once, when armed) after a _bulk_docs request
// answered, before the client goes on: a competitor's write landing between
// a taker's write and its confirming read.
type afterBulkDocs struct {
	next http.RoundTripper
	mu   sync.Mutex
	hook func()
}

func (a *afterBulkDocs) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := a.next.RoundTrip(r)
	if strings.HasSuffix(r.URL.Path, "/_bulk_docs") {
		a.mu.Lock()
		hook := a.hook
		a.hook = nil
		a.mu.Unlock()
		if hook != nil {
			hook()
		}
	}
	return resp, err
}

// A slot document with two leaves (as two first creations through
// different nodes of a cluster leave it) can be taken over each leaf, and
// both writes are committed: the confirming read must let at most one of
// the takers count it. Here the taker writes over one leaf while a
// competitor takes the other for the same window; the taker gives way and
// withdraws its leaf. Proven on one server with AlwaysConfirm (the cluster
// tier's rate limit test saw 10 starts in a window of 7 without it).
func TestRateSlotTakenOverTwoLeavesCountsOnce(t *testing.T) {
	tb := setup(t, couchq.Config{})
	hook := &afterBulkDocs{}
	hc := couchq.NewHTTPClient()
	hook.next, hc.Transport = hc.Transport, hook
	user, password := server.Credentials()
	srv, err := couchq.ConnectHTTP(tb.ctx, server.URL(), user, password, hc)
	if err != nil {
		t.Fatal(err)
	}
	taker, err := srv.Open(tb.ctx, tb.db.Name(), couchq.Config{Logger: tb.log, AlwaysConfirm: true})
	if err != nil {
		t.Fatal(err)
	}
	rl := couchq.RateLimit{N: 1, Per: time.Second}
	w0 := time.Date(2026, 11, 24, 1, 0, 0, 0, time.UTC)
	w1 := w0.Add(time.Second)
	if got, _, _, err := taker.AcquireStartsFor(tb.ctx, "twoleaves", rl, w0, 1, "a"); err != nil || got != 1 {
		t.Fatalf("first take: %d %v", got, err)
	}
	id := couchq.RateSlotID("twoleaves", 0)
	var first map[string]any
	if err := tb.db.Get(tb.ctx, id).ScanDoc(&first); err != nil {
		t.Fatal(err)
	}
	// A second first revision, ranked below the first (so the taker reads
	// and writes over the first): another creation of the slot.
	other := map[string]any{"_id": id, "_rev": "1-00000000000000000000000000000000", "type": couchq.RateSlotDocType,
		"worker": "twoleaves", "window": couchq.ToUnix(w0), "by": "b",
		"_revisions": map[string]any{"start": 1, "ids": []string{"00000000000000000000000000000000"}}}
	tb.injectRevision(t, other)
	hook.mu.Lock()
	hook.hook = func() {
		// The competitor takes the slot for the same window over the other leaf.
		next := map[string]any{"_id": id, "_rev": other["_rev"], "type": couchq.RateSlotDocType,
			"worker": "twoleaves", "window": couchq.ToUnix(w1), "by": "b"}
		if _, err := tb.db.Put(tb.ctx, id, next); err != nil {
			t.Errorf("the competitor's take: %v", err)
		}
	}
	hook.mu.Unlock()
	got, _, _, err := taker.AcquireStartsFor(tb.ctx, "twoleaves", rl, w1, 1, "a")
	if err != nil {
		t.Fatal(err)
	}
	if got != 0 {
		t.Fatalf("the taker counted %d slot(s) of a 1-slot window the competitor also took", got)
	}
	leaves, err := tb.client.Leaves(tb.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	live := 0
	for _, l := range leaves {
		if !l.Deleted {
			live++
			if !strings.Contains(string(l.Doc), `"by":"b"`) {
				t.Errorf("live leaf %s is not the competitor's: %s", l.Rev, l.Doc)
			}
		}
	}
	if live != 1 {
		t.Fatalf("%d live leaves of the slot, want the competitor's alone: %+v", live, leaves)
	}
}
