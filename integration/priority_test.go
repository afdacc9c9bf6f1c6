package integration

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// A busy queue holds 1,000 low-priority jobs when 10 high-priority ones
// arrive: the high ones start before any further low one (only the low
// jobs already claimed, at most a claim batch, go first).
func TestHighPriorityOvertakesABusyQueue(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var mu sync.Mutex
	var order []int // priorities in start order
	highAt := -1    // len(order) when the high jobs were enqueued
	cfg := fastWorker(tb, map[string]worker.Handler{
		"render": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			mu.Lock()
			order = append(order, job.Item.EffectivePriority())
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
			return nil
		}),
	})
	cfg.Concurrency, cfg.ClaimBatch, cfg.PickAmong = 2, 2, 4
	low := make([]protocol.NewJob, 1000)
	for i := range low {
		low[i] = protocol.NewJob{Worker: "render", Priority: protocol.PriorityLowest}
	}
	for start := 0; start < len(low); start += 500 {
		if _, err := tb.client.EnqueueMany(tb.ctx, low[start:start+500]); err != nil {
			t.Fatal(err)
		}
	}
	startWorker(t, tb, cfg)
	started := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(order)
	}
	waitFor(t, 30*time.Second, "the worker to get busy", func() bool { return started() >= 10 })
	high := make([]protocol.NewJob, 10)
	for i := range high {
		high[i] = protocol.NewJob{Worker: "render", Priority: protocol.PriorityHighest}
	}
	mu.Lock()
	highAt = len(order)
	mu.Unlock()
	if _, err := tb.client.EnqueueMany(tb.ctx, high); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the high-priority jobs to start", func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, p := range order[highAt:] {
			if p == protocol.PriorityHighest {
				n++
			}
		}
		return n == len(high)
	})
	mu.Lock()
	defer mu.Unlock()
	lowBefore := 0
	seenHigh := 0
	for _, p := range order[highAt:] {
		if p == protocol.PriorityHighest {
			seenHigh++
			if seenHigh == len(high) {
				break
			}
			continue
		}
		lowBefore++
	}
	t.Logf("after the high jobs were enqueued, %d low jobs started before the last high one (claim batch %d, concurrency %d)",
		lowBefore, cfg.ClaimBatch, cfg.Concurrency)
	if lowBefore > cfg.ClaimBatch+cfg.Concurrency {
		t.Fatalf("%d low-priority jobs started before all high-priority ones: %v", lowBefore, order[highAt:])
	}
}

// DueFirst orders by priority, then by due date; a job without a priority
// sits in the middle, and a hand-written priority counts.
func TestDueFirstOrdersByPriorityThenDate(t *testing.T) {
	clk := opstest.NewClock(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC))
	tb := setup(t, protocol.Config{Now: clk.Now})
	base := clk.Now().Add(-time.Hour)
	for i, j := range []struct {
		id       string
		priority int
		at       time.Duration
	}{
		{"low-old", 5, 0}, {"mid-new", 0, 3 * time.Minute}, {"high-new", 1, 2 * time.Minute},
		{"mid-old", 3, time.Minute}, {"high-old", 1, 30 * time.Second}, {"two", 2, 10 * time.Minute},
	} {
		if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "p", ID: j.id, Priority: j.priority, At: base.Add(j.at)}); err != nil {
			t.Fatalf("job %d: %v", i, err)
		}
	}
	if code, body := tb.raw(t, "PUT", "/by-hand", `{"type":"WorkItem","worker":"p","priority":2,"date":1}`); code != 201 {
		t.Fatalf("hand-written job: %d %s", code, body)
	}
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "p", ID: "future", Priority: 1, At: clk.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	b, err := tb.client.DueFirst(tb.ctx, "p", 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, it := range b.Items {
		got = append(got, it.ID)
	}
	want := []string{"high-old", "high-new", "by-hand", "two", "mid-old", "mid-new", "low-old"}
	if len(got) != len(want) {
		t.Fatalf("DueFirst: %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("DueFirst: %v, want %v", got, want)
		}
	}
	// Workers list the same rows without their documents.
	cands, _, err := tb.client.DueCandidates(tb.ctx, "p", 100, false)
	if err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for _, c := range cands {
		got = append(got, c.ID)
		if c.Priority < protocol.PriorityHighest || c.Priority > protocol.PriorityLowest {
			t.Errorf("candidate %s: priority %d", c.ID, c.Priority)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("DueCandidates: %v, want %v", got, want)
	}
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "p", Priority: 6}); err == nil {
		t.Fatal("priority 6 accepted")
	}
}

// FetchDue reads the documents of the candidates a worker picked and keeps
// only those still due: a job claimed, finished, deleted or rescheduled
// since the view listed it would only earn a 409. A malformed document is
// set aside for quarantine, and an id that never existed is skipped.
func TestFetchDueKeepsOnlyJobsStillDue(t *testing.T) {
	clk := opstest.NewClock(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC))
	tb := setupWithout(t, protocol.Config{Now: clk.Now})
	// Without validation, so that the malformed job can be written.
	if _, err := protocol.InitWith(tb.ctx, tb.kivik, tb.db.Name(), protocol.InitOptions{Validation: designdocs.ValidationOff}, tb.log); err != nil {
		t.Fatal(err)
	}
	ids := []string{"claimed", "done", "deleted", "later", "malformed", "still-due", "also-due"}
	for _, id := range ids {
		if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "f", ID: id, At: clk.Now().Add(-time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	cands, _, err := tb.client.DueCandidates(tb.ctx, "f", 100, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(cands) != len(ids) {
		t.Fatalf("%d candidates, want %d", len(cands), len(ids))
	}
	// What happens between the view query and the read of the documents.
	get := func(id string) *protocol.WorkItem {
		it, err := tb.client.Get(tb.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return it
	}
	if _, err := tb.client.Claim(tb.ctx, get("claimed"), "other/1", time.Minute); err != nil {
		t.Fatal(err)
	}
	done, err := tb.client.Claim(tb.ctx, get("done"), "other/1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.client.Complete(tb.ctx, done, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.db.Delete(tb.ctx, "deleted", get("deleted").Rev); err != nil {
		t.Fatal(err)
	}
	later := get("later")
	later.Date = protocol.ToUnix(clk.Now().Add(time.Hour))
	if _, err := tb.db.Put(tb.ctx, later.ID, later); err != nil {
		t.Fatal(err)
	}
	bad := map[string]any{"_id": "malformed", "_rev": get("malformed").Rev, "type": "WorkItem", "worker": "f", "date": 0, "attempts": "many"}
	if _, err := tb.db.Put(tb.ctx, "malformed", bad); err != nil {
		t.Fatal(err)
	}
	b, err := tb.client.FetchDue(tb.ctx, append(ids, "never-was"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, it := range b.Items {
		got = append(got, it.ID)
	}
	if want := []string{"still-due", "also-due"}; !slices.Equal(got, want) {
		t.Errorf("FetchDue kept %v, want %v", got, want)
	}
	if want := []string{"other/1"}; !slices.Equal(b.ClaimedBy, want) {
		t.Errorf("FetchDue says %v claimed jobs since they were listed, want %v (once)", b.ClaimedBy, want)
	}
	if len(b.Malformed) != 1 || b.Malformed[0].ID != "malformed" {
		t.Errorf("malformed: %+v, want the malformed job", b.Malformed)
	}
}

// countAllDocs counts _all_docs requests: reads of documents by id.
type countAllDocs struct {
	next  http.RoundTripper
	reads atomic.Int64
}

func (c *countAllDocs) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/_all_docs") {
		c.reads.Add(1)
	}
	return c.next.RoundTrip(r)
}

// An idle worker lists due jobs with their documents, and FetchCandidates
// then reads none by id: the batch is the one DueCandidates and FetchDue
// give, malformed documents set aside alike, one request fewer.
func TestDueCandidatesWithDocsNeedNoSecondRead(t *testing.T) {
	tb := setupWithout(t, protocol.Config{})
	// Without validation, so that the malformed job can be written.
	if _, err := protocol.InitWith(tb.ctx, tb.kivik, tb.db.Name(), protocol.InitOptions{Validation: designdocs.ValidationOff}, tb.log); err != nil {
		t.Fatal(err)
	}
	var count *countAllDocs
	client := clientThrough(t, tb, protocol.Config{}, func(next http.RoundTripper) http.RoundTripper {
		count = &countAllDocs{next: next}
		return count
	})
	for i := range 4 {
		if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "d", Priority: 1 + i%3}); err != nil {
			t.Fatal(err)
		}
	}
	bad := map[string]any{"type": "WorkItem", "worker": "d", "date": 0, "attempts": "many"}
	if _, err := tb.db.Put(tb.ctx, "malformed", bad); err != nil {
		t.Fatal(err)
	}
	ids := func(b *protocol.Batch) (items, malformed []string) {
		for _, it := range b.Items {
			items = append(items, it.ID)
		}
		for _, m := range b.Malformed {
			malformed = append(malformed, m.ID)
		}
		return items, malformed
	}
	plain, _, err := client.DueCandidates(tb.ctx, "d", 100, false)
	if err != nil {
		t.Fatal(err)
	}
	want, err := client.FetchCandidates(tb.ctx, plain)
	if err != nil {
		t.Fatal(err)
	}
	if count.reads.Load() != 1 {
		t.Fatalf("%d reads by id for candidates listed without documents, want 1", count.reads.Load())
	}
	wantItems, wantMalformed := ids(want)
	if len(wantItems) != 4 || len(wantMalformed) != 1 {
		t.Fatalf("DueCandidates and FetchCandidates: %v, malformed %v; want 4 jobs and 1 malformed", wantItems, wantMalformed)
	}
	withDocs, _, err := client.DueCandidatesWithDocs(tb.ctx, "d", 100)
	if err != nil {
		t.Fatal(err)
	}
	got, err := client.FetchCandidates(tb.ctx, withDocs)
	if err != nil {
		t.Fatal(err)
	}
	if count.reads.Load() != 1 {
		t.Errorf("FetchCandidates read documents by id although the view included them")
	}
	gotItems, gotMalformed := ids(got)
	if !slices.Equal(gotItems, wantItems) || !slices.Equal(gotMalformed, wantMalformed) {
		t.Errorf("with documents: %v, malformed %v; want %v, %v", gotItems, gotMalformed, wantItems, wantMalformed)
	}
}

// On a cluster the candidates come without documents, which FetchCandidates
// reads by id: a view's copy may not hold a claim a majority took, and a
// claim of the older revision it lists would start a second branch there.
func TestClusterDueCandidatesWithDocsReadDocumentsByID(t *testing.T) {
	cb := setupCluster(t, protocol.Config{})
	var count *countAllDocs
	client := cb.openThrough(t, 1, protocol.Config{}, func(next http.RoundTripper) http.RoundTripper {
		count = &countAllDocs{next: next}
		return count
	})
	ids := cb.enqueue(t, "d", 3)
	var cands []protocol.DueCandidate
	deadline := time.Now().Add(10 * time.Second)
	for len(cands) < len(ids) && time.Now().Before(deadline) {
		var err error
		if cands, _, err = client.DueCandidatesWithDocs(cb.ctx, "d", 100); err != nil {
			t.Fatal(err)
		}
	}
	b, err := client.FetchCandidates(cb.ctx, cands)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Items) != len(ids) {
		t.Fatalf("%d jobs fetched, want %d", len(b.Items), len(ids))
	}
	if count.reads.Load() != 1 {
		t.Errorf("%d reads by id, want 1: the documents a view included on a cluster were trusted", count.reads.Load())
	}
}
