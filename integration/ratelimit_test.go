package integration

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// Four worker processes share a limit of 20 starts per second: over ten
// full windows they start 200 ± 10 % jobs, and never more than 20 in one.
func TestRateLimitAcrossProcesses(t *testing.T) {
	tb := setup(t, protocol.Config{})
	const limit, windows = 20, 10
	starts := rateLimitedProcesses(t, tb.ctx, tb.client, buildCLI(t), func(int) []string { return procEnv(tb.db.Name()) },
		"rl", limit, windows)
	judgeRate(t, starts, limit, "4 processes, one server")
}

// rateLimitedProcesses runs four worker processes of typ (env(i) is the
// environment of the i-th) on client's database, under a limit of limit
// starts per second (none when 0), for windows full windows after a
// warm-up. It fails the test when a window had more than limit starts, and
// returns the starts in each full window, by the claims' claimed_at.
func rateLimitedProcesses(t *testing.T, ctx context.Context, client *protocol.Client, bin string, env func(i int) []string,
	typ string, limit, windows int) []int {
	t.Helper()
	const workers = 4
	jobs := make([]protocol.NewJob, 600)
	for i := range jobs {
		jobs[i] = protocol.NewJob{Worker: typ}
	}
	for start := 0; start < len(jobs); start += 300 {
		if _, err := client.EnqueueMany(ctx, jobs[start:start+300]); err != nil {
			t.Fatal(err)
		}
	}
	var procs []*cliProc
	for i := range workers {
		args := []string{"worker", "--type", typ, "--handler", "noop", "--concurrency", "8", "--lease", "10s", "--feed-timeout", "2s"}
		if limit > 0 {
			args = append(args, "--rate", fmt.Sprintf("%s=%d/s", typ, limit))
		}
		procs = append(procs, startProcEnv(t, bin, env(i), fmt.Sprintf("%s-worker-%d", typ, i), args...))
	}
	waitFor(t, time.Minute, "every worker process to start jobs", func() bool {
		ws, err := client.Workers(ctx)
		return err == nil && len(ws) == len(procs)
	})
	time.Sleep(2 * time.Second) // let them all get going
	measured := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(measured.Add(time.Duration(windows+1) * time.Second)))
	for _, p := range procs {
		p.signal(t, syscall.SIGTERM)
	}
	for _, p := range procs {
		if code := p.wait(t, 30*time.Second); code != 0 {
			t.Fatalf("%s exited %d", p.name, code)
		}
	}
	batch, err := client.List(ctx, protocol.ListOptions{Worker: typ, Limit: len(jobs)})
	if err != nil {
		t.Fatal(err)
	}
	// A claim is stamped claimed_at, which its history event carries: each
	// claimed event is a start (a claim lost on a cluster leaves none).
	perWindow := map[int64]int{}
	for _, it := range batch.Items {
		for _, e := range it.History {
			if e.Event != protocol.EventClaimed {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, e.At)
			if err != nil {
				t.Fatalf("job %s: claimed at %q: %v", it.ID, e.At, err)
			}
			perWindow[at.Unix()]++
		}
	}
	for w, n := range perWindow {
		if limit > 0 && n > limit {
			t.Errorf("%d jobs started in the window of %s, over the limit of %d", n, time.Unix(w, 0).UTC().Format(time.TimeOnly), limit)
		}
	}
	starts := make([]int, windows)
	for k := range starts {
		starts[k] = perWindow[measured.Unix()+int64(k)]
	}
	return starts
}

// judgeRate fails the test unless starts (one count per window) add up to
// limit per window ± 10 %.
func judgeRate(t *testing.T, starts []int, limit int, what string) {
	t.Helper()
	total := 0
	for _, n := range starts {
		total += n
	}
	t.Logf("%d jobs started in %d full windows %v (limit %d/s, %s)", total, len(starts), starts, limit, what)
	if want := limit * len(starts); math.Abs(float64(total-want)) > 0.1*float64(want) {
		t.Fatalf("%d jobs started in %d windows, want %d ± 10%%", total, len(starts), want)
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
	tb := setup(t, protocol.Config{})
	const limit, windows = 5, 8
	client := clientThrough(t, tb, protocol.Config{}, func(next http.RoundTripper) http.RoundTripper {
		return &slowReads{next: next, delay: 1200 * time.Millisecond}
	})
	jobs := make([]protocol.NewJob, 100)
	for i := range jobs {
		jobs[i] = protocol.NewJob{Worker: "slowrl"}
	}
	if _, err := tb.client.EnqueueMany(tb.ctx, jobs); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	perWindow := map[int64]int{} // by the claimed_at of the claim each run came from
	cfg := fastWorker(tb, map[string]worker.Handler{"slowrl": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		mu.Lock()
		perWindow[int64(math.Floor(job.Item.ClaimedAt))]++
		mu.Unlock()
		return nil
	})})
	cfg.Concurrency = 10
	cfg.RateLimits = map[string]protocol.RateLimit{"slowrl": {N: limit, Per: time.Second}}
	w, err := worker.New((*couchq.Client)(client), cfg)
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

// afterRequests runs its steps, in order and each once, after the first
// request each matches answered, before the client goes on: a competitor's
// write landing between a taker's write and its confirming read, say.
type afterRequests struct {
	next  http.RoundTripper
	mu    sync.Mutex
	steps []afterStep
}

type afterStep struct {
	match func(r *http.Request) bool
	run   func()
}

// arm adds a step.
func (a *afterRequests) arm(match func(r *http.Request) bool, run func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.steps = append(a.steps, afterStep{match, run})
}

func (a *afterRequests) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := a.next.RoundTrip(r)
	a.mu.Lock()
	var run func()
	if len(a.steps) > 0 && a.steps[0].match(r) {
		run, a.steps = a.steps[0].run, a.steps[1:]
	}
	a.mu.Unlock()
	if run != nil {
		run()
	}
	return resp, err
}

func isBulkDocs(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/_bulk_docs") }

// isLeavesRead matches a read of every leaf (protocol.Client.Leaves or a
// _bulk_get of several documents).
func isLeavesRead(r *http.Request) bool {
	return strings.HasSuffix(r.URL.Path, "/_bulk_get") || r.URL.Query().Get("open_revs") == "all"
}

// slotTaker is a client of tb's database whose requests pass through
// hooks, and which confirms its writes as on a cluster (AlwaysConfirm).
func slotTaker(t *testing.T, tb *testBundle) (*protocol.Client, *afterRequests) {
	t.Helper()
	hooks := &afterRequests{}
	taker := clientThrough(t, tb, protocol.Config{AlwaysConfirm: true}, func(next http.RoundTripper) http.RoundTripper {
		hooks.next = next
		return hooks
	})
	return taker, hooks
}

// twoLeafSlot takes slot 0 of typ's 1/s limit for window w0 through taker,
// then gives the slot document a second first revision, ranked below the
// first (so that takers read and write over the first): another creation
// of the slot, through another node of a cluster. It returns that leaf.
func twoLeafSlot(t *testing.T, tb *testBundle, taker *protocol.Client, typ string, w0 time.Time) map[string]any {
	t.Helper()
	rl := protocol.RateLimit{N: 1, Per: time.Second}
	if got, _, _, err := taker.AcquireStartsFor(tb.ctx, typ, rl, w0, 1, "a"); err != nil || got != 1 {
		t.Fatalf("first take: %d %v", got, err)
	}
	other := map[string]any{"_id": protocol.RateSlotID(typ, 0), "_rev": "1-00000000000000000000000000000000",
		"type": protocol.RateSlotDocType, "worker": typ, "window": protocol.ToUnix(w0), "by": "b",
		"_revisions": map[string]any{"start": 1, "ids": []string{"00000000000000000000000000000000"}}}
	tb.injectRevision(t, other)
	return other
}

// competitorTakes writes, as competitor "b", the slot leaf other (from
// twoLeafSlot) over with window w, and returns the revision written.
func competitorTakes(t *testing.T, tb *testBundle, other map[string]any, w time.Time) string {
	t.Helper()
	id := other["_id"].(string)
	next := map[string]any{"_id": id, "_rev": other["_rev"], "type": protocol.RateSlotDocType,
		"worker": other["worker"], "window": protocol.ToUnix(w), "by": "b"}
	rev, err := tb.db.Put(tb.ctx, id, next)
	if err != nil {
		t.Errorf("the competitor's take: %v", err)
	}
	return rev
}

// liveLeaves lists the revisions of id that are not tombstones, as client
// reads them.
func liveLeaves(t *testing.T, ctx context.Context, client *protocol.Client, id string) []protocol.Leaf {
	t.Helper()
	leaves, err := client.Leaves(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var live []protocol.Leaf
	for _, l := range leaves {
		if !l.Deleted {
			live = append(live, l)
		}
	}
	return live
}

// A slot document with two leaves (as two first creations through
// different nodes of a cluster leave it) can be taken over each leaf, and
// both writes are committed: the confirming read must let at most one of
// the takers count it. Here the taker writes over one leaf while a
// competitor takes the other for the same window; the taker gives way and
// withdraws its leaf. Proven on one server with AlwaysConfirm (the cluster
// tier's rate limit test saw 10 starts in a window of 7 without it).
func TestRateSlotTakenOverTwoLeavesCountsOnce(t *testing.T) {
	tb := setup(t, protocol.Config{})
	taker, hooks := slotTaker(t, tb)
	rl := protocol.RateLimit{N: 1, Per: time.Second}
	w0 := time.Date(2026, 11, 24, 1, 0, 0, 0, time.UTC)
	w1 := w0.Add(time.Second)
	other := twoLeafSlot(t, tb, taker, "twoleaves", w0)
	id := protocol.RateSlotID("twoleaves", 0)
	// The competitor takes the slot for the same window over the other leaf.
	hooks.arm(isBulkDocs, func() { competitorTakes(t, tb, other, w1) })
	got, _, _, err := taker.AcquireStartsFor(tb.ctx, "twoleaves", rl, w1, 1, "a")
	if err != nil {
		t.Fatal(err)
	}
	if got != 0 {
		t.Fatalf("the taker counted %d slot(s) of a 1-slot window the competitor also took", got)
	}
	live := liveLeaves(t, tb.ctx, tb.client, id)
	for _, l := range live {
		if !strings.Contains(string(l.Doc), `"by":"b"`) {
			t.Errorf("live leaf %s is not the competitor's: %s", l.Rev, l.Doc)
		}
	}
	if len(live) != 1 {
		t.Fatalf("%d live leaves of the slot, want the competitor's alone: %+v", len(live), live)
	}
}

// A competitor whose write of a slot only a minority of the copies took
// (answered 202 on a cluster) withdraws it at once. A taker whose
// confirming read still saw that leaf reads again and keeps the slot: it
// would otherwise be lost to both (the cluster tier lost up to a third of
// its rate limit's slots this way).
func TestRateSlotStandsOnceTheOtherLeafIsWithdrawn(t *testing.T) {
	tb := setup(t, protocol.Config{})
	taker, hooks := slotTaker(t, tb)
	rl := protocol.RateLimit{N: 1, Per: time.Second}
	w0 := time.Date(2026, 11, 24, 1, 0, 0, 0, time.UTC)
	w1 := w0.Add(time.Second)
	other := twoLeafSlot(t, tb, taker, "withdrawn", w0)
	id := protocol.RateSlotID("withdrawn", 0)
	var competitorRev string
	hooks.arm(isBulkDocs, func() { competitorRev = competitorTakes(t, tb, other, w1) })
	reads := 0
	hooks.arm(isLeavesRead, func() {
		reads++
		// The taker saw the competitor's leaf; the competitor withdraws it.
		if _, err := tb.db.Delete(tb.ctx, id, competitorRev); err != nil {
			t.Errorf("the competitor's withdrawal: %v", err)
		}
	})
	got, _, _, err := taker.AcquireStartsFor(tb.ctx, "withdrawn", rl, w1, 1, "a")
	if err != nil {
		t.Fatal(err)
	}
	if reads != 1 {
		t.Fatalf("the taker's confirming read was not seen (%d)", reads)
	}
	if got != 1 {
		t.Fatalf("the taker counted %d slots, want the one the competitor withdrew from", got)
	}
	live := liveLeaves(t, tb.ctx, tb.client, id)
	if len(live) != 1 || !strings.Contains(string(live[0].Doc), `"by":"a"`) {
		t.Fatalf("live leaves of the slot %+v, want the taker's alone", live)
	}
}

// Claims that must be stamped in a window (a rate limit's start slots) are
// not written once the window has ended: ClaimManyBefore writes nothing
// past its deadline, and stamps claims before it otherwise.
func TestClaimManyBeforeDeadline(t *testing.T) {
	tb := setup(t, protocol.Config{})
	if _, err := tb.client.EnqueueMany(tb.ctx, []protocol.NewJob{{Worker: "stamped"}, {Worker: "stamped"}}); err != nil {
		t.Fatal(err)
	}
	batch, err := tb.client.Due(tb.ctx, "stamped", 10)
	if err != nil || len(batch.Items) != 2 {
		t.Fatalf("due: %v %+v", err, batch)
	}
	if res, ok := tb.client.ClaimManyBefore(tb.ctx, batch.Items, "test/1/w", time.Minute, time.Now()); ok || res != nil {
		t.Fatalf("claims past their deadline: ok %v, %+v", ok, res)
	}
	for _, it := range batch.Items {
		got, err := tb.client.Get(tb.ctx, it.ID)
		if err != nil || got.Claimed || got.Rev != it.Rev {
			t.Fatalf("job %s after a claim past its deadline: %v claimed %v rev %s (was %s)", it.ID, err, got.Claimed, got.Rev, it.Rev)
		}
	}
	deadline := time.Now().Add(time.Minute)
	res, ok := tb.client.ClaimManyBefore(tb.ctx, batch.Items, "test/1/w", time.Minute, deadline)
	if !ok {
		t.Fatal("claims before their deadline were not made")
	}
	for _, r := range res {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		if at := protocol.FromUnix(r.Item.ClaimedAt); !at.Before(deadline) {
			t.Errorf("claim stamped %s, not before its deadline %s", at, deadline)
		}
	}
}

// failLeavesReads fails every read of a document's leaves, as a server
// that stops answering between a taker's write and its confirming read.
type failLeavesReads struct{ next http.RoundTripper }

func (f failLeavesReads) RoundTrip(r *http.Request) (*http.Response, error) {
	if isLeavesRead(r) {
		return nil, errors.New("leaves read cut off by the test")
	}
	return f.next.RoundTrip(r)
}

// A taker whose confirming read fails counts none of the slots it wrote,
// and withdraws them: left held, run slots would keep the type's
// fleet-wide limit short by as many until their lease ran out, and rate
// slots the window's starts. Another taker then finds them free.
func TestSlotsWithdrawnWhenTheirConfirmingReadFails(t *testing.T) {
	tb := setup(t, protocol.Config{})
	taker := clientThrough(t, tb, protocol.Config{AlwaysConfirm: true}, func(next http.RoundTripper) http.RoundTripper {
		return failLeavesReads{next: next}
	})
	checkSlotsWithdrawn(t, tb.ctx, taker, tb.client, 0)
}

// checkSlotsWithdrawn takes every run slot and rate slot of a limit of 3
// through taker, whose confirming reads fail, and then through other, which
// must get them all, within settle (a cluster's copies may lag behind the
// withdrawals).
func checkSlotsWithdrawn(t *testing.T, ctx context.Context, taker, other *protocol.Client, settle time.Duration) {
	t.Helper()
	const limit = 3
	// takeAll takes slots until it has the limit's, or settle has passed.
	takeAll := func(take func(want int) (int, error)) (int, error) {
		total, deadline := 0, time.Now().Add(settle)
		for {
			n, err := take(limit - total)
			total += n
			if total == limit || err != nil || time.Now().After(deadline) {
				return total, err
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	got, err := taker.AcquireRunSlots(ctx, "limited", limit, limit, "a", time.Hour)
	if err != nil || len(got) != 0 {
		t.Fatalf("run slots taken without a confirming read: %d %v", len(got), err)
	}
	n, err := takeAll(func(want int) (int, error) {
		got, err := other.AcquireRunSlots(ctx, "limited", limit, want, "b", time.Hour)
		return len(got), err
	})
	if err != nil || n != limit {
		t.Fatalf("another holder took %d of %d run slots after the first counted none (%v): the first still holds them", n, limit, err)
	}

	rl := protocol.RateLimit{N: limit, Per: time.Hour}
	now := time.Now()
	if n, _, _, err := taker.AcquireStartsFor(ctx, "paced", rl, now, limit, "a"); err != nil || n != 0 {
		t.Fatalf("rate slots taken without a confirming read: %d %v", n, err)
	}
	n, err = takeAll(func(want int) (int, error) {
		n, _, _, err := other.AcquireStartsFor(ctx, "paced", rl, now, want, "b")
		return n, err
	})
	if err != nil || n != limit {
		t.Fatalf("another taker got %d of the window's %d starts after the first counted none (%v): the first still holds them", n, limit, err)
	}
}
