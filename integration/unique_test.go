package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// A unique key holds one job while it is queued or running: a second
// enqueue returns that job and says so, in Enqueue and in EnqueueMany
// (also twice in one batch). Once the job is done the key is free: the
// next enqueue archives the finished job (nothing lost) and queues a new
// one under the same id.
func TestUniqueKeyHoldsOneJobUntilItFinishes(t *testing.T) {
	tb := setup(t, protocol.Config{})
	c := tb.client
	job := protocol.NewJob{Worker: "digest", Payload: map[string]int{"user": 42}, Unique: protocol.UniqueOpts{Key: "user-42"}}
	first, err := c.Enqueue(tb.ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	if want := "job:unique:digest:user-42"; first.ID != want || first.UniqueKey != "user-42" {
		t.Fatalf("unique job id %q key %q, want %q", first.ID, first.UniqueKey, want)
	}
	again, err := c.Enqueue(tb.ctx, job)
	if !errors.Is(err, protocol.ErrDuplicate) || again == nil || again.ID != first.ID || again.Rev != first.Rev {
		t.Fatalf("second enqueue: %+v, %v; want the first job and ErrDuplicate", again, err)
	}
	other := job
	other.Unique.Key = "user-43"
	res, err := c.EnqueueMany(tb.ctx, []protocol.NewJob{job, other, other})
	if err != nil {
		t.Fatal(err)
	}
	if !res[0].Duplicate || res[0].Item.ID != first.ID || res[0].Err != nil {
		t.Errorf("batch: the taken key: %+v", res[0])
	}
	if res[1].Duplicate || res[1].Err != nil || !res[2].Duplicate || res[2].Item.ID != res[1].Item.ID {
		t.Errorf("batch: a new key twice: %+v, %+v; want one new job, then its duplicate", res[1], res[2])
	}
	if n := len(allJobs(t, tb, "digest")); n != 2 {
		t.Fatalf("%d digest jobs stored, want 2", n)
	}

	// Running still holds the key.
	claimed, err := c.Claim(tb.ctx, first, "host/1/w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(tb.ctx, job); !errors.Is(err, protocol.ErrDuplicate) {
		t.Fatalf("enqueue while the job runs: %v, want ErrDuplicate", err)
	}
	if err := c.Complete(tb.ctx, claimed, []byte(`{"sent":true}`)); err != nil {
		t.Fatal(err)
	}
	// Done frees it: a new job under the same id; the finished one kept.
	next, err := c.Enqueue(tb.ctx, job)
	if err != nil {
		t.Fatalf("enqueue after the job finished: %v", err)
	}
	if next.ID != first.ID || next.Status != protocol.StatusQueued || next.Attempts != 0 {
		t.Fatalf("re-enqueued job: %+v", next)
	}
	archived, err := c.Get(tb.ctx, protocol.ArchiveID(claimed.ID, claimed.Rev))
	if err != nil {
		t.Fatalf("the finished job was not archived: %v", err)
	}
	if archived.Status != protocol.StatusDone || string(archived.Result) != `{"sent":true}` ||
		archived.History[len(archived.History)-1].Event != protocol.EventArchived {
		t.Fatalf("archived job: %+v", archived)
	}
	if n := len(allJobs(t, tb, "digest")); n != 3 {
		t.Fatalf("%d digest jobs stored, want 3 (two queued, one archived)", n)
	}
	// The archived copy is a record: retrying it, were it a failed job's,
	// would make a second job of the key while the key's own job is queued.
	failedCopy := archived.Clone()
	failedCopy.ID, failedCopy.Rev, failedCopy.Status = first.ID+"~9-failed", "", protocol.StatusFailed
	if _, err := tb.db.Put(tb.ctx, failedCopy.ID, failedCopy); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Retry(tb.ctx, failedCopy.ID, "ops"); !errors.Is(err, protocol.ErrWrongState) || !strings.Contains(err.Error(), "archived copy of unique job "+first.ID+",") {
		t.Errorf("retrying the archived copy: %v", err)
	}
	if n, err := c.RetryFailed(tb.ctx, "digest", "ops", nil); err != nil || n != 0 {
		t.Errorf("retrying the failed digest jobs, an archived copy among them: %d, %v", n, err)
	}
}

// With a period the key holds one job per period, whatever became of it;
// the next period has its own.
func TestUniqueKeyPerPeriod(t *testing.T) {
	clk := opstest.NewClock(time.Date(2026, 11, 23, 10, 15, 0, 0, time.UTC))
	tb := setup(t, protocol.Config{Now: clk.Now})
	c := tb.client
	job := protocol.NewJob{Worker: "report", Unique: protocol.UniqueOpts{Key: "daily", For: 24 * time.Hour}}
	first, err := c.Enqueue(tb.ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	if want := "job:unique:report:daily@2026-11-23T00:00:00Z"; first.ID != want {
		t.Fatalf("id %q, want %q", first.ID, want)
	}
	claimed, err := c.Claim(tb.ctx, first, "host/1/w", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Complete(tb.ctx, claimed, nil); err != nil {
		t.Fatal(err)
	}
	clk.Add(10 * time.Hour)
	if dup, err := c.Enqueue(tb.ctx, job); !errors.Is(err, protocol.ErrDuplicate) || dup.Status != protocol.StatusDone {
		t.Fatalf("enqueue later the same day: %+v %v, want the done job as a duplicate", dup, err)
	}
	clk.Add(14 * time.Hour)
	next, err := c.Enqueue(tb.ctx, job)
	if err != nil || next.ID != "job:unique:report:daily@2026-11-24T00:00:00Z" {
		t.Fatalf("enqueue the next day: %+v %v", next, err)
	}
}

// A worker that deletes its type's finished jobs keeps those of a unique
// key with a period: deleted, the key would be free again the same
// period, and the job run again.
func TestDeleteDoneKeepsAUniqueJobThatHoldsItsPeriod(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var runs atomic.Int32
	cfg := fastWorker(tb, map[string]worker.Handler{
		"report": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error { runs.Add(1); return nil }),
	})
	cfg.DeleteDone = map[string]bool{"report": true}
	startWorker(t, tb, cfg)
	daily := protocol.NewJob{Worker: "report", Unique: protocol.UniqueOpts{Key: "daily", For: 24 * time.Hour}}
	first := mustEnqueue(t, tb, daily)
	waitStatus(t, tb, first.ID, protocol.StatusDone, 15*time.Second)
	// The same worker's plain unique job (no period) is deleted as done.
	once := mustEnqueue(t, tb, protocol.NewJob{Worker: "report", Unique: protocol.UniqueOpts{Key: "once"}})
	deadline := time.Now().Add(15 * time.Second)
	for _, err := tb.client.Get(tb.ctx, once.ID); !errors.Is(err, protocol.ErrNotFound); _, err = tb.client.Get(tb.ctx, once.ID) {
		if time.Now().After(deadline) {
			t.Fatalf("the unique job without a period was not deleted when done: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if dup, err := tb.client.Enqueue(tb.ctx, daily); !errors.Is(err, protocol.ErrDuplicate) || dup.ID != first.ID {
		t.Fatalf("enqueueing the key again the same period: %+v %v, want the done job as a duplicate", dup, err)
	}
	time.Sleep(300 * time.Millisecond)
	if n := runs.Load(); n != 2 {
		t.Fatalf("%d runs, want 2 (the daily job once, the other once)", n)
	}
}

// Bad unique options are refused before anything is written.
func TestUniqueOptionsRefused(t *testing.T) {
	tb := setup(t, protocol.Config{})
	for _, tc := range []struct {
		job  protocol.NewJob
		want string
	}{
		{protocol.NewJob{Worker: "a:b", Unique: protocol.UniqueOpts{Key: "k"}}, "cannot contain ':'"},
		{protocol.NewJob{Worker: "a", Unique: protocol.UniqueOpts{For: time.Hour}}, "needs a unique key"},
		{protocol.NewJob{Worker: "a", Unique: protocol.UniqueOpts{Key: "k", For: time.Millisecond}}, "at least 1s"},
		{protocol.NewJob{Worker: "a", Unique: protocol.UniqueOpts{Key: strings.Repeat("k", 300)}}, "at most"},
		{protocol.NewJob{Worker: "a", ID: "job:mine", Unique: protocol.UniqueOpts{Key: "k"}}, "not both"},
	} {
		_, err := tb.client.Enqueue(tb.ctx, tc.job)
		if !errors.Is(err, protocol.ErrInvalidJob) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want ErrInvalidJob saying %q", tc.job, err, tc.want)
		}
	}
	if n := len(allJobs(t, tb, "a")) + len(allJobs(t, tb, "a:b")); n != 0 {
		t.Fatalf("%d jobs stored by refused enqueues", n)
	}
}

// Eight CLI processes enqueue the same key at once: one job, one process
// says it enqueued it, seven say "already queued" with its id, all exit 0.
func TestUniqueKeyFromEightProcesses(t *testing.T) {
	tb := setup(t, protocol.Config{})
	bin := buildCLI(t)
	const n = 8
	for round := range 3 {
		key := fmt.Sprintf("order-%d", round)
		procs := make([]*cliProc, n)
		for i := range procs {
			procs[i] = startProc(t, bin, tb.db.Name(), fmt.Sprintf("enqueue-%d", i),
				"enqueue", "--type", "invoice", "--unique-key", key, "--payload", fmt.Sprintf(`{"from":%d}`, i))
		}
		created, dup := 0, 0
		id := protocol.UniqueID("invoice", protocol.UniqueOpts{Key: key}, time.Time{})
		for _, p := range procs {
			if code := p.wait(t, time.Minute); code != 0 {
				t.Fatalf("%s exited %d: %s", p.name, code, p.stderr.String())
			}
			out := strings.TrimSpace(p.stdout.String())
			switch {
			case out == id:
				created++
			case strings.HasPrefix(out, "already queued: "+id):
				dup++
			default:
				t.Fatalf("%s printed %q", p.name, out)
			}
		}
		if created != 1 || dup != n-1 {
			t.Fatalf("round %d: %d created, %d already queued; want 1 and %d", round, created, dup, n-1)
		}
	}
	if jobs := allJobs(t, tb, "invoice"); len(jobs) != 3 {
		t.Fatalf("%d invoice jobs stored, want 3", len(jobs))
	}
}

// Goroutines of one process race too: at most one enqueue creates the
// job, all others get it back as a duplicate.
func TestUniqueKeyConcurrentEnqueues(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	created, dups := 0, 0
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			it, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "race", Payload: i, Unique: protocol.UniqueOpts{Key: "k"}})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				created++
			case errors.Is(err, protocol.ErrDuplicate) && it != nil && it.ID == "job:unique:race:k":
				dups++
			default:
				t.Errorf("enqueue %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if created != 1 || dups != 15 {
		t.Fatalf("%d created, %d duplicates; want 1 and 15", created, dups)
	}
}

// Archived copies of unique jobs stay failed for good, and retry --failed
// pages past them: a failed job listed after more of them than a page
// holds is retried too.
func TestRetryFailedPagesPastArchivedCopies(t *testing.T) {
	tb := setup(t, protocol.Config{})
	c := tb.client
	const copies = 600 // more than RetryFailed's page of 500
	docs := make([]any, 0, copies+1)
	for i := range copies {
		docs = append(docs, map[string]any{
			"_id": fmt.Sprintf("job:unique:digest:k%d~1-abc", i), "type": "WorkItem", "worker": "digest",
			"status": "failed", "unique_key": fmt.Sprintf("k%d", i), "attempts": 1, "finished_at": 1000 + i,
			"history": []map[string]any{{"at": "2026-11-28T10:00:00Z", "event": "archived", "by": "test"}},
		})
	}
	// The one failed job that may be retried finished last, so it is
	// listed after every archived copy.
	docs = append(docs, map[string]any{
		"_id": "job:late", "type": "WorkItem", "worker": "digest", "status": "failed",
		"attempts": 1, "finished_at": 5000, "last_error": "boom",
	})
	results, err := tb.db.BulkDocs(tb.ctx, docs)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if r.Error != nil {
			t.Fatalf("storing %s: %v", r.ID, r.Error)
		}
	}
	n, err := c.RetryFailed(tb.ctx, "digest", "ops", nil)
	if err != nil || n != 1 {
		t.Fatalf("retrying the failed digest jobs behind %d archived copies: %d, %v; want 1", copies, n, err)
	}
	if late, err := c.Get(tb.ctx, "job:late"); err != nil || late.Status != protocol.StatusQueued {
		t.Fatalf("the failed job after the archived copies: %+v, %v; want queued", late, err)
	}
}
