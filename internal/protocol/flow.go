package protocol

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/google/uuid"

	"github.com/couchq/couchq/designdocs"
)

// Workflows: jobs that wait for other jobs.
//
// A waiting job (StatusWaiting) is one that names jobs it waits for
// (after), or the callback of a batch (callback_of), or a job whose
// handler enqueued children and waits for them (continuation). The due
// views and the changes filter skip it, so no worker claims it. It is
// released — written back to queued with released_at — by whoever sees
// its dependencies finished first:
//
//   - the worker that finishes a dependency asks the dependents view for
//     the waiting jobs keyed by the finished job's id, reads those and
//     their dependencies' states in one _all_docs request, and writes the
//     released ones with the revision it read (release);
//   - the enqueue of a waiting job checks it once right after writing it,
//     since its dependencies may have finished in between;
//   - the sweeper reads the waiting view a page at a time and does the
//     same, which covers a worker that died between finishing a job and
//     releasing its dependents.
//
// No lock is taken: each release is a write over the revision read, and a
// 409 means another releaser (or an operator) wrote first, so the job is
// read and checked again. On a cluster two releases of one revision
// through different nodes can both be stored; they are the same state, a
// conflict the sweeper settles like any other (settleRank keeps one).

// What a waiting job does when a dependency fails for good or is cancelled.
const (
	// DependencyCancel cancels the waiting job (the default).
	DependencyCancel = "cancel"
	// DependencyRun runs it anyway once every dependency has finished.
	DependencyRun = "run"
)

// The activity-log events of workflows.
const (
	// EventDependenciesDone: a waiting job was released.
	EventDependenciesDone = "dependencies-done"
	// EventAwaitingChildren: a handler enqueued children and waits.
	EventAwaitingChildren = "awaiting-children"
)

// MissingDependencyGrace is how long a waiting job may name a job that
// does not exist before the sweeper fails it: couchq refuses such a
// dependency at enqueue, but a document written by hand (or replicated in
// before its dependency) is given this long for it to appear.
const MissingDependencyGrace = time.Minute

// maxAfter bounds how many jobs one job may wait for: they are read in one
// request on every check.
const maxAfter = 1000

// waitingSweepInterval is how often a client's sweeps look at the waiting
// jobs (a page each time): the workers that finish jobs release their
// dependents at once, so this pass is the safety net, not the path.
const waitingSweepInterval = 2 * time.Second

// waitingMemory is how long a client, having seen waiting jobs, keeps
// asking for dependents of every job it finishes without checking again
// that any job waits; waitingRecheck is how long it trusts "none".
const (
	waitingMemory  = 30 * time.Second
	waitingRecheck = time.Second
)

func validDependencyPolicy(s string) bool {
	return s == "" || s == DependencyCancel || s == DependencyRun
}

// flowState is a client's memory of the waiting jobs: a database that
// has none never pays a dependents query per finished job.
type flowState struct {
	seen    atomic.Int64 // Unix ns when waiting jobs were last known to exist
	checked atomic.Int64 // Unix ns when the waiting view was last asked
	swept   atomic.Int64 // Unix ns of the last sweep of waiting jobs
	cursor  atomic.Pointer[string]
	// unchecked are jobs finished while the client believed no job
	// waited for another (dependentsToCheck).
	mu        sync.Mutex
	unchecked []string
	// looked are jobs finished here whose dependents were looked for, in
	// the order they finished (LookAgainForDependents).
	looked []lookedJob
	// noCycle holds, by id, the revision of each hand-written waiting job
	// the sweeper found in no cycle (endStuck): it is not walked again
	// while it stands. Emptied when it grows past maxNoCycle.
	noCycle map[string]string
	// batches holds, by batch id, the last batchRead of a batch far from
	// done (batchMayBeDone); entries go when the batch nears its end.
	batches sync.Map
	// batchReading holds the batches whose read is on its way.
	batchReading sync.Map
	// batchTails holds, by batch, when a worker here last finished one of
	// its jobs without finding the batch finished (Unix ns): the index said
	// it was far from done, another count was on its way, or a count made
	// afresh found some unfinished or failed. Settled by
	// SettleQuietBatches.
	batchTails sync.Map
}

// DependencyError is an enqueue refused because of the jobs it names in
// After: one that does not exist, or the job itself. It wraps
// ErrInvalidJob.
type DependencyError struct {
	// Job is the job being enqueued, Dependency the job it names.
	Job, Dependency string
	// Reason says what is wrong with it.
	Reason string
	// Status is the HTTP status that fits: 422 for a job that does not
	// exist, 400 for a malformed list.
	Status int
}

func (e *DependencyError) Error() string {
	return fmt.Sprintf("%s: job %s waits for %s: %s", ErrInvalidJob, e.Job, e.Dependency, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalidJob) hold.
func (e *DependencyError) Unwrap() error { return ErrInvalidJob }

// HTTPStatus is the status an HTTP API answers the refusal with.
func (e *DependencyError) HTTPStatus() int { return e.Status }

// dependencies sets it's workflow fields from j: the list cleaned of
// repeats, a self-reference refused, and the job waiting when it names any.
func (c *Client) dependencies(it *WorkItem, j NewJob) error {
	if !validDependencyPolicy(j.OnDependencyFailure) {
		return fmt.Errorf("%w: on dependency failure must be %q or %q, got %q", ErrInvalidJob, DependencyCancel, DependencyRun, j.OnDependencyFailure)
	}
	if j.OnDependencyFailure != "" && len(j.After) == 0 {
		// As couchq enqueue refuses it: a policy for dependencies on a job
		// that has none is a mistake (an After list lost on the way), not
		// a setting.
		return fmt.Errorf("%w: on dependency failure %q needs After: it applies only to a job that waits for others", ErrInvalidJob, j.OnDependencyFailure)
	}
	it.OnDependencyFailure = j.OnDependencyFailure
	seen := map[string]bool{}
	for _, d := range j.After {
		switch {
		case d == "":
			return &DependencyError{Job: it.ID, Dependency: `""`, Reason: "a job id must not be empty", Status: http.StatusBadRequest}
		case d == it.ID:
			return &DependencyError{Job: it.ID, Dependency: d, Reason: "a job cannot wait for itself", Status: http.StatusBadRequest}
		case seen[d]:
			continue
		}
		seen[d] = true
		it.After = append(it.After, d)
	}
	if len(it.After) > maxAfter {
		return fmt.Errorf("%w: a job waits for at most %d jobs, got %d", ErrInvalidJob, maxAfter, len(it.After))
	}
	if len(it.After) > 0 {
		it.Status = StatusWaiting
	}
	return nil
}

// checkDependencies checks that every job the items wait for exists, in
// one _all_docs request: a job named by an item may also be one of the
// items before it (written in the same request). errs[i] is item i's
// refusal. Since a dependency must exist first, no cycle can form.
// refused, when given, holds the items already refused for another
// reason: they will not be written, so no later item may wait for them.
func (c *Client) checkDependencies(ctx context.Context, items []*WorkItem, refused ...error) []error {
	errs := make([]error, len(items))
	earlier := map[string]bool{}
	var keys []string
	for _, it := range items {
		for _, d := range it.After {
			if !earlier[d] {
				keys = append(keys, d)
			}
		}
		earlier[it.ID] = true
	}
	exists, notJob := map[string]bool{}, map[string]bool{}
	if len(keys) > 0 {
		// Read with the documents: a document that is no job (an
		// application's own, a control) would leave the job waiting until
		// the sweeper failed it.
		stored, err := c.readJobs(ctx, keys, true)
		if err != nil {
			for i := range errs {
				errs[i] = fmt.Errorf("checking the jobs %s waits for: %w", items[i].ID, err)
			}
			return errs
		}
		for id, st := range stored {
			exists[id] = st.exists
			notJob[id] = st.exists && st.item == nil && st.malformed == nil
		}
	}
	before := map[string]bool{}
	pending := map[string]*WorkItem{} // the items before this one, as if stored
	for i, it := range items {
		if i < len(refused) && refused[i] != nil {
			continue // not written: not before any item
		}
		for _, d := range it.After {
			if checkJobID(d) != nil {
				// CouchDB's or couchq's own document: never a job.
				errs[i] = &DependencyError{Job: it.ID, Dependency: d, Reason: "not a job's id", Status: http.StatusUnprocessableEntity}
				break
			}
			if !before[d] && !exists[d] {
				errs[i] = &DependencyError{Job: it.ID, Dependency: d, Reason: "no such job (a dependency must be enqueued first)", Status: http.StatusUnprocessableEntity}
				break
			}
			if !before[d] && notJob[d] {
				errs[i] = &DependencyError{Job: it.ID, Dependency: d, Reason: "not a job: its document is of another type", Status: http.StatusUnprocessableEntity}
				break
			}
		}
		if errs[i] == nil && len(it.After) > 0 && !generatedID(it.ID) {
			// A job waiting for this id may already be stored (written by
			// hand, within the grace of a missing dependency): then this
			// job, waiting for it in turn, could close a cycle. Looked for
			// only when some job waits for the id, so that building a
			// chain forward under ids of one's own reads nothing more.
			if path, err := c.cycleOfNew(ctx, it, pending); err != nil {
				errs[i] = fmt.Errorf("checking that %s would not wait for itself: %w", it.ID, err)
			} else if path != nil {
				errs[i] = &DependencyError{Job: it.ID, Dependency: path[0],
					Reason: "the job would wait for itself: " + strings.Join(append([]string{it.ID}, path...), " waits for "), Status: http.StatusBadRequest}
			}
		}
		before[it.ID] = errs[i] == nil
		if errs[i] == nil {
			pending[it.ID] = it
		}
	}
	return errs
}

// cycleOfNew is the cycle job it, about to be written, would close (nil
// for none): through its dependencies back to it, when some job already
// waits for its id.
func (c *Client) cycleOfNew(ctx context.Context, it *WorkItem, pending map[string]*WorkItem) ([]string, error) {
	waiters, _, err := c.dependents(ctx, []string{it.ID})
	if err != nil || len(waiters) == 0 {
		return nil, err
	}
	return c.cycleThrough(ctx, it.ID, it.After, pending)
}

// maxNoCycle bounds flowState.noCycle.
const maxNoCycle = 10000

// generatedID reports an id NewID made: a new UUID, which no job can have
// been waiting for.
func generatedID(id string) bool {
	u, ok := strings.CutPrefix(id, "job:")
	if !ok {
		return false
	}
	_, err := uuid.Parse(u)
	return err == nil && len(u) == 36
}

// walkedForCycle reports whether endStuck found job it, at its revision,
// in no cycle before.
func (c *Client) walkedForCycle(it *WorkItem) bool {
	c.flow.mu.Lock()
	defer c.flow.mu.Unlock()
	return c.flow.noCycle[it.ID] == it.Rev
}

// noCycleFound records that job it, at its revision, is in no cycle.
func (c *Client) noCycleFound(it *WorkItem) {
	c.flow.mu.Lock()
	defer c.flow.mu.Unlock()
	if c.flow.noCycle == nil || len(c.flow.noCycle) >= maxNoCycle {
		c.flow.noCycle = map[string]string{}
	}
	c.flow.noCycle[it.ID] = it.Rev
}

// cycleSearch bounds how many jobs cycleThrough reads.
const cycleSearch = 1000

// cycleThrough looks for a path from the jobs in after, through the
// after fields of waiting jobs, back to id: the jobs id would wait for in
// turn, ending with id. pending holds jobs not stored yet (the earlier
// jobs of the same enqueue). It reads one level of jobs a request, and
// gives up (nil) after cycleSearch jobs.
func (c *Client) cycleThrough(ctx context.Context, id string, after []string, pending map[string]*WorkItem) ([]string, error) {
	via := map[string]string{} // a job reached -> the job that waits for it
	frontier := []string{}
	for _, d := range after {
		if _, seen := via[d]; !seen {
			via[d] = ""
			frontier = append(frontier, d)
		}
	}
	path := func(last string) []string {
		var out []string
		for j := last; j != ""; j = via[j] {
			out = append([]string{j}, out...)
		}
		return append(out, id)
	}
	for read := 0; len(frontier) > 0 && read < cycleSearch; {
		var fetch []string
		for _, j := range frontier {
			if _, ok := pending[j]; !ok {
				fetch = append(fetch, j)
			}
		}
		stored := map[string]jobState{}
		if len(fetch) > 0 {
			var err error
			if stored, err = c.readJobs(ctx, fetch, true); err != nil {
				return nil, err
			}
		}
		read += len(frontier)
		var next []string
		for _, j := range frontier {
			it := pending[j]
			if it == nil {
				it = stored[j].item
			}
			if it == nil || it.Status != StatusWaiting {
				continue // only a waiting job waits: the others end
			}
			for _, d := range it.After {
				if d == id {
					return path(j), nil
				}
				if _, seen := via[d]; !seen {
					via[d] = j
					next = append(next, d)
				}
			}
		}
		frontier = next
	}
	return nil, nil
}

// checkMany is EnqueueMany's checks of sites and dependencies: the refused
// jobs get their error and are left out of docs.
func (c *Client) checkMany(ctx context.Context, results []EnqueueResult, docs []any, index []int) ([]any, []int) {
	var items []*WorkItem
	for _, i := range index {
		items = append(items, results[i].Item)
	}
	errs := c.checkSites(ctx, items)
	if slices.ContainsFunc(items, func(it *WorkItem) bool { return len(it.After) > 0 }) {
		for k, err := range c.checkDependencies(ctx, items, errs...) {
			errs[k] = cmp.Or(errs[k], err)
		}
	}
	if !slices.ContainsFunc(errs, func(err error) bool { return err != nil }) {
		return docs, index
	}
	var keptDocs []any
	var keptIndex []int
	for k, i := range index {
		if errs[k] != nil {
			results[i] = EnqueueResult{Err: errs[k]}
			continue
		}
		keptDocs = append(keptDocs, docs[k])
		keptIndex = append(keptIndex, i)
	}
	return keptDocs, keptIndex
}

// settleEnqueued checks waiting jobs just written: a dependency may have
// finished between the enqueue's check and its write, and its worker
// then found no dependent to release. A failure is logged; the sweeper
// checks again.
//
// A dependency still running may be one whose handler has returned: its
// worker looks for the jobs waiting for it while it writes the outcome
// (LookForDependents), and that look may have come before this job was
// written. Neither side would release the job then, and it waited for a
// sweep (seconds; 5.6 to 12.8 s in the bench's workflows section). So a
// job left waiting for a running one is checked again (settleAgain). A
// dependency whose handler returns after this job was written finds it
// anyway.
func (c *Client) settleEnqueued(ctx context.Context, items []*WorkItem) {
	var ids []string
	for _, it := range items {
		if it != nil && it.Rev != "" && it.Status == StatusWaiting {
			ids = append(ids, it.ID)
		}
	}
	if len(ids) == 0 {
		return
	}
	if slices.ContainsFunc(items, func(it *WorkItem) bool { return it != nil && len(it.After) > 0 }) {
		c.flow.seen.Store(time.Now().UnixNano())
	}
	_, _, onRunning, err := c.releaseRead(ctx, slices.Clone(ids), nil, c.cfg.Actor)
	if err == nil && onRunning {
		c.settleAgain(ctx, ids)
	}
	if err != nil {
		ev := c.log.Warn()
		if isStatus(err, http.StatusForbidden) {
			// A producer (couchq init --producers) may enqueue but not
			// release: the workers' sweepers do.
			ev = c.log.Debug()
		}
		ev.Err(err).Int("jobs", len(ids)).Msg("could not check the jobs just enqueued as waiting; the sweeper will")
	}
}

// settleTimeout bounds each of settleAgain's checks.
const settleTimeout = 10 * time.Second

// settleChecks are when settleAgain checks, from the enqueue, jobs left
// waiting for a running dependency: an outcome write takes some 10 to 100
// ms, and the second check covers a slow one.
func settleChecks() []time.Duration {
	return []time.Duration{100 * time.Millisecond, time.Second}
}

// settleAgain checks the waiting jobs ids again at each of settleChecks,
// on its own goroutine (the enqueue has returned by then), until none
// waits for a running job.
func (c *Client) settleAgain(ctx context.Context, ids []string) {
	ctx = context.WithoutCancel(ctx)
	go func() {
		waited := time.Duration(0)
		for _, at := range settleChecks() {
			time.Sleep(at - waited)
			waited = at
			rctx, cancel := context.WithTimeout(ctx, settleTimeout)
			_, _, onRunning, err := c.releaseRead(rctx, slices.Clone(ids), nil, c.cfg.Actor)
			cancel()
			if err != nil {
				c.log.Debug().Err(err).Int("jobs", len(ids)).Msg("could not check the jobs just enqueued as waiting again; the sweeper will")
				return
			}
			if !onRunning {
				return
			}
		}
	}()
}

// jobState is what a release needs of a job: whether it exists and, if
// it does, the job (nil when it is not a WorkItem couchq can read).
type jobState struct {
	exists  bool
	deleted bool
	item    *WorkItem
	// malformed is a WorkItem couchq cannot read, read with its document.
	malformed *Malformed
}

// readJobs reads ids in one _all_docs request, with the documents when
// docs is set.
func (c *Client) readJobs(ctx context.Context, ids []string, docs bool) (map[string]jobState, error) {
	out := make(map[string]jobState, len(ids))
	for start := 0; start < len(ids); start += 1000 {
		page := ids[start:min(start+1000, len(ids))]
		rows := c.db.AllDocs(ctx, kivik.Params(map[string]any{"keys": page, "include_docs": docs}))
		for rows.Next() {
			var stub struct {
				Rev     string `json:"rev"`
				Deleted bool   `json:"deleted"`
			}
			id, _ := rows.ID()
			if err := rows.ScanValue(&stub); err != nil || stub.Rev == "" {
				continue // an id never stored: an error row
			}
			st := jobState{exists: !stub.Deleted, deleted: stub.Deleted}
			if docs && !stub.Deleted {
				var raw json.RawMessage
				if err := rows.ScanDoc(&raw); err == nil && !gone(raw) {
					var it WorkItem
					var m *MalformedError
					switch err := json.Unmarshal(raw, &it); {
					case err == nil:
						st.item = &it
					case errors.As(err, &m) && m.Field != "type":
						st.malformed = &Malformed{ID: id, Rev: stub.Rev, Err: m, Raw: raw}
					}
				}
			}
			out[id] = st
		}
		err := rows.Err()
		_ = rows.Close()
		if err != nil {
			return nil, fmt.Errorf("reading %d jobs: %w", len(page), err)
		}
	}
	return out, nil
}

// Finished releases what waited for item, which has just reached a final
// state (done, failed for good, cancelled): its dependents, and its
// batch's callback when it was the batch's last job. Workers call it after
// every final outcome; an error is the caller's to log, since the sweeper
// does the same later.
func (c *Client) Finished(ctx context.Context, item *WorkItem, by string) error {
	_, err := c.FinishedReleasing(ctx, item, by, nil)
	return err
}

// DependentsLook is a look for the jobs waiting for one job, made while
// that job's outcome is being written (LookForDependents).
type DependentsLook struct {
	done chan struct{}
	deps []string
	docs map[string]jobState
	err  error
}

// LookForDependents starts looking for the jobs waiting for job id, for
// FinishedReleasing, so that the look and the write of the job's outcome
// take their time together: on a single node the look is a fifth of the
// time from a job ending to its dependent starting. It looks only while
// waiting jobs are known to exist (nil otherwise: FinishedReleasing looks
// itself, as it would have). A dependent enqueued while the outcome is
// being written, which the look may miss and whose enqueue may still see
// the job unfinished, is found by the worker's look a moment later
// (LookAgainForDependents), or else by the sweeper.
func (c *Client) LookForDependents(ctx context.Context, id string) *DependentsLook {
	if time.Now().UnixNano()-c.flow.seen.Load() >= int64(waitingMemory) {
		return nil
	}
	l := &DependentsLook{done: make(chan struct{})}
	go func() {
		defer close(l.done)
		l.deps, l.docs, l.err = c.dependents(ctx, []string{id})
	}()
	return l
}

// FinishedReleasing is Finished returning the jobs it released to the
// queue (claimable now, with the revisions it stored), so that a worker
// with a free slot for one can claim it at once instead of waiting for
// the changes feed and a due-view query to bring it.
//
// look, when not nil, is a LookForDependents of item made before its
// outcome was written: its answer stands for the query.
func (c *Client) FinishedReleasing(ctx context.Context, item *WorkItem, by string, look *DependentsLook) ([]*WorkItem, error) {
	if !item.Status.Terminal() {
		return nil, nil
	}
	if look != nil {
		select {
		case <-look.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if look.err != nil {
			look = nil // look again, as without it
		}
	}
	var ids []string
	if item.Batch != "" {
		if c.batchMayBeDone(ctx, item.Batch) && c.startBatchRead(item.Batch) {
			// The callback is read only when none of the batch's jobs is left.
			left, err := c.batchJobsLeft(ctx, item.Batch)
			c.flow.batchReading.Delete(item.Batch)
			if err != nil {
				c.flow.batchTails.Store(item.Batch, time.Now().UnixNano())
				return nil, err
			}
			if !left {
				ids = append(ids, BatchCallbackID(item.Batch))
			} else {
				// The index may lag behind jobs just finished (on a
				// cluster, the copy read may not have their outcomes
				// yet): the batch is counted again, checked against the
				// jobs themselves, once its jobs stop finishing here.
				c.flow.batchTails.Store(item.Batch, time.Now().UnixNano())
			}
		} else {
			// Far from done, or another finisher here is looking: counted
			// again once its jobs stop finishing here.
			c.flow.batchTails.Store(item.Batch, time.Now().UnixNano())
		}
	}
	if look != nil {
		c.flow.addLooked(item.ID)
		if len(look.deps) > 0 {
			c.flow.seen.Store(time.Now().UnixNano())
		}
		if len(ids) == 0 && look.docs != nil {
			_, released, _, err := c.releaseRead(ctx, look.deps, look.docs, by)
			return released, err
		}
		ids = append(ids, look.deps...)
	} else if finished := c.dependentsToCheck(ctx, item.ID); len(finished) > 0 {
		deps, docs, err := c.dependents(ctx, finished)
		if err != nil {
			return nil, err
		}
		if len(deps) > 0 {
			c.flow.seen.Store(time.Now().UnixNano())
		}
		if len(ids) == 0 && docs != nil {
			_, released, _, err := c.releaseRead(ctx, deps, docs, by)
			return released, err
		}
		ids = append(ids, deps...)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	_, released, _, err := c.releaseRead(ctx, ids, nil, by)
	return released, err
}

// AfterFinish is Finished for callers that only log a failure (agents,
// operator actions): the sweeper releases what it could not.
func (c *Client) AfterFinish(ctx context.Context, item *WorkItem, by string) {
	if err := c.Finished(ctx, item, by); err != nil {
		c.log.Warn().Err(err).Str("job", item.ID).Msg("could not release the jobs waiting for this one; the sweeper will")
	}
}

// batchFreshBelow is how many unfinished jobs a batch may have, as its
// index last stood, for the worker finishing one of them to bring the
// index up to date and count again (batchMayBeDone).
const batchFreshBelow = 256

// batchMayBeDone reads the batch's unfinished jobs from the batches view
// as it stands (update=false: no indexing, a cheap read) and reports
// whether they may all have finished: when the index says few are left,
// or cannot say. Bringing the sweep views up to date after every job of
// a big batch cost most of the server's time (section 10 of the bench);
// an index that lags only counts jobs as unfinished that are not, so a
// batch it says is far from done is. A last job that misses its batch's
// end this way (an index lagging by more than batchFreshBelow) leaves the
// callback to the sweeper.
//
// A read that found the batch far from done answers for the jobs of the
// batch this client finishes for as long as no queue could finish the
// rest (batchReuse), and while one read of a batch is on its way the
// client's other finishers wait for none: reading it for every job
// finished was half a batch's requests.
func (c *Client) batchMayBeDone(ctx context.Context, batch string) bool {
	now := time.Now().UnixNano()
	last, seen := c.flow.batches.Load(batch)
	if seen {
		read := last.(batchRead)
		if now-read.at < int64(batchReuse(read.pending)) {
			return false
		}
		if !c.startBatchRead(batch) {
			return false // far from done a moment ago, and being read again
		}
		defer c.flow.batchReading.Delete(batch)
	}
	rows := c.db.Query(ctx, designdocs.DocFor("batches"), "_view/batches", kivik.Params(map[string]any{
		"key": []any{batch, "pending"}, "update": "false",
	}))
	defer rows.Close()
	var pending int64
	if rows.Next() {
		if err := rows.ScanValue(&pending); err != nil {
			return true
		}
	}
	if rows.Err() != nil {
		return true
	}
	if pending > batchFreshBelow {
		c.flow.batches.Store(batch, batchRead{pending: pending, at: now})
	} else {
		c.flow.batches.Delete(batch)
	}
	return pending <= batchFreshBelow
}

// SettleQuietBatches counts afresh each batch that a job finished here
// left uncounted (FinishedReleasing) and that has had no job finished here
// for quiet, and releases its callback when none of its jobs is left. A
// worker calls it every so often: the index that said a batch was far
// from done may have lagged behind its last jobs, and then nobody else
// would count the batch again until the sweeper's next pass. A batch whose
// jobs keep finishing here is counted once they stop, so a big batch
// costs one fresh count per worker process at its end.
//
// It returns the callbacks it released, as stored. A batch whose count
// failed is kept for the next call.
func (c *Client) SettleQuietBatches(ctx context.Context, by string, quiet time.Duration) ([]*WorkItem, error) {
	now := time.Now().UnixNano()
	var batches []string
	var touched []int64
	c.flow.batchTails.Range(func(k, v any) bool {
		if at := v.(int64); now-at >= int64(quiet) && c.flow.batchTails.CompareAndDelete(k, v) {
			batches = append(batches, k.(string))
			touched = append(touched, at)
		}
		return true
	})
	if len(batches) == 0 {
		return nil, nil
	}
	ids := make([]string, len(batches))
	for k, b := range batches {
		ids[k] = BatchCallbackID(b)
	}
	// The callback's own release reads the batch's counts afresh and
	// releases it only when every job has finished.
	_, released, _, err := c.releaseRead(ctx, ids, nil, by)
	if err != nil {
		for k, b := range batches {
			c.flow.batchTails.LoadOrStore(b, touched[k])
		}
		return released, fmt.Errorf("counting %d batches whose jobs stopped finishing here: %w", len(batches), err)
	}
	return released, nil
}

// lookedJob is a job finished here whose dependents were looked for, and
// when (Unix ns).
type lookedJob struct {
	id string
	at int64
}

func (f *flowState) addLooked(ids ...string) {
	now := time.Now().UnixNano()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		if len(f.looked) >= maxUnchecked {
			f.looked = f.looked[1:]
		}
		f.looked = append(f.looked, lookedJob{id: id, at: now})
	}
}

// takeLooked takes the looked jobs finished at least quiet ago.
func (f *flowState) takeLooked(quiet time.Duration) []lookedJob {
	cut := time.Now().UnixNano() - int64(quiet)
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for n < len(f.looked) && f.looked[n].at <= cut {
		n++
	}
	out := slices.Clone(f.looked[:n])
	f.looked = f.looked[n:]
	return out
}

// putLooked gives back jobs takeLooked took, for the next look.
func (f *flowState) putLooked(jobs []lookedJob) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.looked = append(jobs, f.looked...)
	if over := len(f.looked) - maxUnchecked; over > 0 {
		f.looked = f.looked[over:]
	}
}

// LookAgainForDependents looks once more for the jobs waiting for the jobs
// finished here at least quiet ago whose dependents were looked for while
// their outcomes were written (FinishedReleasing with a LookForDependents),
// in one dependents query, and releases those ready. It returns the jobs
// it released, as stored. Only a worker looks that way, and it calls this
// every so often; a client that finishes jobs otherwise (the CLI, the
// agents' API) keeps nothing for it.
//
// The first look can miss a dependent: a worker looks while it writes the
// outcome, and a job enqueued in that moment is written after the look
// but checks its dependency before the outcome is stored, so neither side
// releases it; on a cluster the copy of the view that answers may also
// lag a job just enqueued. The enqueuer checks such
// a job again for a second (settleAgain), but only while its process
// lives: a CLI enqueue ends at once. Looked for again here, once the
// outcome has long been stored, such a job is found, and it no longer
// waits for the sweeper. A job that was released meanwhile no longer
// waits, and the view does not list it.
func (c *Client) LookAgainForDependents(ctx context.Context, by string, quiet time.Duration) ([]*WorkItem, error) {
	jobs := c.flow.takeLooked(quiet)
	var released []*WorkItem
	for start := 0; start < len(jobs); start += relookPage {
		page := jobs[start:min(start+relookPage, len(jobs))]
		ids := make([]string, len(page))
		for k, j := range page {
			ids[k] = j.id
		}
		deps, docs, err := c.dependents(ctx, ids)
		if err == nil && len(deps) > 0 {
			var more []*WorkItem
			_, more, _, err = c.releaseRead(ctx, deps, docs, by)
			released = append(released, more...)
		}
		if err != nil {
			c.flow.putLooked(jobs[start:])
			return released, fmt.Errorf("looking again for the jobs waiting for %d jobs finished here: %w", len(jobs)-start, err)
		}
	}
	return released, nil
}

// relookPage is how many finished jobs one query of
// LookAgainForDependents asks for.
const relookPage = 500

// batchDrainRate is more jobs a second than any couchq queue finishes
// (the fastest measured are a tenth of it): a batch read with n jobs
// unfinished cannot be done sooner than n / batchDrainRate later.
const batchDrainRate = 4096

// batchReuse is how long a read that found pending jobs unfinished
// answers for the batch (batchMayBeDone): the time the fastest queue
// would take to finish them, at most batchReuseMax.
func batchReuse(pending int64) time.Duration {
	if pending <= batchFreshBelow {
		return 0
	}
	return min(time.Duration(pending)*time.Second/batchDrainRate, batchReuseMax)
}

// batchReuseMax bounds batchReuse: the batches view's figures are looked
// at again at least this often while its jobs finish.
const batchReuseMax = 2 * time.Second

// batchRead is what a client last read of a batch's unfinished jobs.
type batchRead struct {
	pending int64
	at      int64 // Unix ns
}

// dependentsToCheck returns the finished jobs whose dependents to look
// for now: id, with the jobs finished while the client believed no job
// waited for another, once it finds that one does. It believes so for
// waitingRecheck after a look at the dependents view found none, so that
// a database where no job waits pays one query a second, not one per
// finished job. A job finished in that second is looked for at the next
// look that finds one: a dependent enqueued after the look found none
// either came after the job finished (its enqueue's own check releases
// it) or is found then.
func (c *Client) dependentsToCheck(ctx context.Context, id string) []string {
	if time.Now().UnixNano()-c.flow.seen.Load() < int64(waitingMemory) {
		return append(c.flow.takeUnchecked(), id)
	}
	switch c.mayHaveWaiting(ctx) {
	case waitingFound:
		return append(c.flow.takeUnchecked(), id)
	case waitingNone:
		c.flow.takeUnchecked() // none waited for them when it looked
		return nil
	default:
		c.flow.addUnchecked(id)
		return nil
	}
}

// maxUnchecked bounds the finished jobs a client keeps to look for
// dependents of later (dependentsToCheck); past it the oldest are left
// to the sweeper.
const maxUnchecked = 10000

func (f *flowState) addUnchecked(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.unchecked) >= maxUnchecked {
		f.unchecked = f.unchecked[1:]
	}
	f.unchecked = append(f.unchecked, id)
}

func (f *flowState) takeUnchecked() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.unchecked
	f.unchecked = nil
	return out
}

// What a look for waiting jobs found.
type waitingLook int

const (
	waitingSkipped waitingLook = iota // not looked: looked less than waitingRecheck ago
	waitingFound
	waitingNone
)

// mayHaveWaiting looks (at most every waitingRecheck) whether any job
// waits for others (After; a batch's callback is found through its
// batch), in the dependents view.
func (c *Client) mayHaveWaiting(ctx context.Context) waitingLook {
	now := time.Now().UnixNano()
	last := c.flow.checked.Load()
	if now-last < int64(waitingRecheck) || !c.flow.checked.CompareAndSwap(last, now) {
		return waitingSkipped
	}
	rows := c.view(ctx, "dependents", kivik.Param("limit", 1))
	defer rows.Close()
	found := rows.Next()
	if err := rows.Err(); err != nil {
		c.log.Debug().Err(err).Msg("could not look for jobs waiting for others; asking for dependents anyway")
		return waitingFound
	}
	if !found {
		return waitingNone
	}
	c.flow.seen.Store(now)
	return waitingFound
}

// dependents lists the waiting jobs that wait for any of ids (the
// dependents view, keyed by the job waited for).
//
// On a single node the rows carry the documents (one request less per
// release): docs holds them, as readJobs would have read them. Not on a
// cluster, where a view's documents come from one copy, which may not
// hold the newest revision.
func (c *Client) dependents(ctx context.Context, ids []string) (out []string, docs map[string]jobState, err error) {
	withDocs := !c.confirming()
	rows := c.view(ctx, "dependents", kivik.Params(map[string]any{"keys": ids, "include_docs": withDocs}))
	defer rows.Close()
	if withDocs {
		docs = map[string]jobState{}
	}
	for rows.Next() {
		id, err := rows.ID()
		if err != nil {
			return nil, nil, fmt.Errorf("listing the jobs waiting for %s: %w", strings.Join(ids, ", "), err)
		}
		if slices.Contains(out, id) {
			continue
		}
		out = append(out, id)
		if withDocs {
			var raw json.RawMessage
			var it WorkItem
			if rows.ScanDoc(&raw) != nil || gone(raw) || json.Unmarshal(raw, &it) != nil {
				docs = nil // read them all afresh
				withDocs = false
				continue
			}
			docs[id] = jobState{exists: true, item: &it}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("listing the jobs waiting for %s: %w", strings.Join(ids, ", "), err)
	}
	return out, docs, nil
}

// releaseRounds bounds how often releaseReady reads again after losing
// write races.
const releaseRounds = 5

// releaseReady checks the waiting jobs among ids and writes each one
// whose dependencies have all finished released (or cancelled, per its
// policy), over the revision it read. A job another writer changed in
// between (409) is read and checked again. It returns how many it wrote.
func (c *Client) releaseReady(ctx context.Context, ids []string, by string) (int, error) {
	n, _, _, err := c.releaseRead(ctx, ids, nil, by)
	return n, err
}

// cascadeSteps bounds how far releaseRead follows the jobs it ended to
// their own dependents: a longer chain is ended by the sweeper's pass over
// waiting jobs, a step a pass.
const cascadeSteps = 100

// releaseRead is releaseReady with the jobs of ids already read (read,
// for its first round; nil reads them). It also returns the jobs it
// released to the queue, as stored, and whether a job it left waiting
// waits for a running one. A job it ends (cancelled after a failed
// dependency, or failed for a missing one) ends what waits for it in
// turn, so a failure stops the rest of a chain at once: releaseRead
// settles those dependents (and the callbacks of the batches the ended
// jobs belong to) too.
func (c *Client) releaseRead(ctx context.Context, ids []string, read map[string]jobState, by string) (written int, released []*WorkItem, onRunning bool, err error) {
	for range cascadeSteps {
		n, rel, waitsOnRunning, ended, err := c.releaseStep(ctx, ids, read, by)
		written += n
		released = append(released, rel...)
		onRunning = onRunning || waitsOnRunning
		if err != nil || len(ended) == 0 {
			return written, released, onRunning, err
		}
		var endedIDs, callbacks []string
		for _, it := range ended {
			endedIDs = append(endedIDs, it.ID)
			if it.Batch != "" && !slices.Contains(callbacks, BatchCallbackID(it.Batch)) {
				callbacks = append(callbacks, BatchCallbackID(it.Batch))
			}
		}
		if ids, read, err = c.dependents(ctx, endedIDs); err != nil {
			return written, released, onRunning, err
		}
		if len(callbacks) > 0 {
			ids, read = append(ids, callbacks...), nil // the callbacks are not among the rows read
		}
	}
	return written, released, onRunning, nil
}

// releaseStep is one step of releaseRead: it settles the waiting jobs of
// ids and returns, besides releaseRead's results, the jobs it ended.
func (c *Client) releaseStep(ctx context.Context, ids []string, read map[string]jobState, by string) (written int, released []*WorkItem, onRunning bool, ended []*WorkItem, err error) {
	for range releaseRounds {
		onRunning = false
		if len(ids) == 0 {
			return written, released, onRunning, ended, nil
		}
		jobs := read
		read = nil
		if jobs == nil {
			var err error
			if jobs, err = c.readJobs(ctx, ids, true); err != nil {
				return written, released, onRunning, ended, fmt.Errorf("releasing waiting jobs: %w", err)
			}
		}
		var waiting []*WorkItem
		var deps []string
		batches := map[string]*BatchStatus{}
		for _, id := range ids {
			it := jobs[id].item
			if it == nil || it.Status != StatusWaiting || c.owns(it) != nil {
				continue
			}
			waiting = append(waiting, it)
			deps = append(deps, it.After...)
			if it.CallbackOf != "" {
				batches[it.CallbackOf] = nil
			}
		}
		if len(waiting) == 0 {
			return written, released, onRunning, ended, nil
		}
		states, err := c.readJobs(ctx, deps, true)
		if err != nil {
			return written, released, onRunning, ended, fmt.Errorf("reading the jobs %d waiting jobs wait for: %w", len(waiting), err)
		}
		for b := range batches {
			if batches[b], err = c.batchCountsChecked(ctx, b); err != nil {
				return written, released, onRunning, ended, err
			}
		}
		var docs []any
		var next []*WorkItem
		for _, it := range waiting {
			if n := c.decide(ctx, it, states, batches[it.CallbackOf], by); n != nil {
				docs = append(docs, n)
				next = append(next, n)
			} else if slices.ContainsFunc(it.After, func(d string) bool {
				st := states[d].item
				return st != nil && st.Status == StatusRunning
			}) {
				onRunning = true
			}
		}
		if len(docs) == 0 {
			return written, released, onRunning, ended, nil
		}
		wctx, _ := c.traced(ctx)
		bulk, err := c.db.BulkDocs(wctx, docs, c.bulkOpts()...)
		ids = ids[:0]
		keys := make([]string, len(next))
		for k, n := range next {
			keys[k] = n.ID
		}
		for k, r := range alignBulk(keys, bulk, err) {
			switch {
			case r.Error == nil:
				written++
				switch {
				case next[k].Status == StatusQueued:
					next[k].Rev = r.Rev
					released = append(released, next[k])
				case next[k].Status.Terminal():
					next[k].Rev = r.Rev
					ended = append(ended, next[k])
				}
				c.log.Debug().Str("job", r.ID).Str("status", string(next[k].Status)).Msg("waiting job settled")
			case isStatus(r.Error, http.StatusConflict):
				ids = append(ids, r.ID) // someone else wrote: read and check again
			default:
				return written, released, onRunning, ended, fmt.Errorf("releasing waiting job %s: %w", r.ID, r.Error)
			}
		}
	}
	return written, released, onRunning, ended, nil
}

// decide returns the next state of waiting job it, or nil while it must
// wait: released when every dependency is done (or finished, under
// DependencyRun), cancelled when one failed under DependencyCancel, failed
// when one has been missing for MissingDependencyGrace. A dependency that
// was deleted counts as done: couchq deletes only finished jobs (a type
// with DeleteDone, a purge).
func (c *Client) decide(ctx context.Context, it *WorkItem, states map[string]jobState, batch *BatchStatus, by string) *WorkItem {
	now := c.now()
	var pending, failed, missing, notJobs []string
	for _, d := range it.After {
		st := states[d]
		switch {
		case st.deleted:
		case !st.exists:
			missing = append(missing, d)
		case st.item == nil:
			notJobs = append(notJobs, d)
		case st.item.Status == StatusDone:
		case st.item.Status == StatusFailed || st.item.Status == StatusCancelled:
			failed = append(failed, fmt.Sprintf("%s (%s)", d, st.item.Status))
		default:
			pending = append(pending, d)
		}
	}
	next := it.Clone()
	c.unclaim(next)
	if len(failed) > 0 && it.OnDependencyFailure != DependencyRun {
		reason := fmt.Sprintf("dependency %s; on_dependency_failure is %s", strings.Join(failed, ", "), DependencyCancel)
		next.Status = StatusCancelled
		next.LastError = truncate(reason)
		next.FinishedAt = ToUnix(now)
		c.record(next, EventCancelled, by, reason)
		return next
	}
	if len(missing)+len(notJobs) > 0 {
		if it.CreatedAt == 0 {
			// A hand-written job without created_at: the grace starts now.
			next.Status = StatusWaiting
			next.CreatedAt = ToUnix(now)
			return next
		}
		if now.Sub(FromUnix(it.CreatedAt)) < MissingDependencyGrace {
			return nil
		}
		var why []string
		if len(missing) > 0 {
			why = append(why, fmt.Sprintf("waits for %s, which does not exist", strings.Join(missing, ", ")))
		}
		if len(notJobs) > 0 {
			why = append(why, fmt.Sprintf("waits for %s, which is not a job", strings.Join(notJobs, ", ")))
		}
		reason := fmt.Sprintf("%s (%s after it was enqueued)", strings.Join(why, "; "), MissingDependencyGrace)
		next.Status = StatusFailed
		next.LastError = truncate(reason)
		next.FinishedAt = ToUnix(now)
		c.record(next, EventFailed, by, reason)
		return next
	}
	if len(pending) > 0 {
		return nil
	}
	var note string
	if len(failed) > 0 {
		note = fmt.Sprintf("dependency %s; on_dependency_failure is %s", strings.Join(failed, ", "), DependencyRun)
	}
	if it.CallbackOf != "" {
		if batch == nil || !batch.Complete(it.BatchSize) {
			return nil
		}
		next.Payload = withBatchSummary(next.Payload, batch)
	}
	next.Status = StatusQueued
	next.ReleasedAt = ToUnix(now)
	c.record(next, EventDependenciesDone, by, note)
	return next
}

// SweepWaiting is the sweeper's pass over waiting jobs: at most every
// waitingSweepInterval per client, a page of limit jobs of the waiting
// view (the next page each time, from the start again after the last) is
// checked as a finished dependency's worker would have. It returns how
// many jobs it released, cancelled or failed.
func (c *Client) SweepWaiting(ctx context.Context, by string, limit int) (int, error) {
	now := time.Now().UnixNano()
	last := c.flow.swept.Load()
	if now-last < int64(waitingSweepInterval) || !c.flow.swept.CompareAndSwap(last, now) {
		return 0, nil
	}
	params := map[string]any{"limit": limit + 1}
	if cur := c.flow.cursor.Load(); cur != nil {
		params["startkey_docid"] = *cur
		params["startkey"] = *cur
	}
	rows := c.view(ctx, "waiting", kivik.Params(params))
	var ids []string
	for rows.Next() {
		id, err := rows.ID()
		if err != nil {
			_ = rows.Close()
			return 0, fmt.Errorf("listing waiting jobs: %w", err)
		}
		ids = append(ids, id)
	}
	err := rows.Err()
	_ = rows.Close()
	if err != nil {
		return 0, fmt.Errorf("listing waiting jobs: %w", err)
	}
	if len(ids) > limit {
		c.flow.cursor.Store(&ids[limit])
		ids = ids[:limit]
	} else {
		c.flow.cursor.Store(nil)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	// One read of the page serves the release and endStuck (whose jobs
	// the release leaves as they were: a job it changed meanwhile makes
	// endStuck's write a 409, skipped).
	jobs, err := c.readJobs(ctx, ids, true)
	if err != nil {
		return 0, fmt.Errorf("reading waiting jobs: %w", err)
	}
	n, _, _, err := c.releaseRead(ctx, slices.Clone(ids), maps.Clone(jobs), by)
	if err != nil {
		return n, err
	}
	m, err := c.endStuck(ctx, ids, jobs, by)
	return n + m, err
}

// endStuck ends the waiting jobs of ids (read as jobs) that nothing would
// ever release.
// A document the waiting view lists but couchq cannot read (a malformed
// batch_size, say) is quarantined, by the default site's sweeper as every
// malformed job is. A job that waits for itself through others (a cycle
// written by hand, which no enqueue lets form) is failed, and the jobs of
// the cycle that wait for it are then ended by their policy; only a job
// waiting longer than MissingDependencyGrace is looked at, as for a
// missing dependency.
func (c *Client) endStuck(ctx context.Context, ids []string, jobs map[string]jobState, by string) (int, error) {
	n := 0
	var malformed []Malformed
	for _, id := range ids {
		if m := jobs[id].malformed; m != nil {
			malformed = append(malformed, *m)
		}
	}
	if len(malformed) > 0 && c.ownsUnsited() {
		for _, err := range c.QuarantineMany(ctx, malformed, by) {
			if err != nil {
				c.log.Warn().Err(err).Msg("cannot quarantine a malformed waiting job")
				continue
			}
			n++
		}
	}
	now := c.now()
	for _, id := range ids {
		it := jobs[id].item
		handWritten := it != nil && !slices.ContainsFunc(it.History, func(e Event) bool { return e.Event == EventEnqueued })
		if handWritten && it.Status == StatusWaiting && len(it.After) > 0 && it.CreatedAt == 0 && c.owns(it) == nil {
			// Without created_at the grace starts now, as for a missing
			// dependency: written down, so that the next pass counts it.
			next := it.Clone()
			next.CreatedAt = ToUnix(now)
			if _, err := c.db.Put(ctx, next.ID, next, c.writeOpts()...); err != nil && !isStatus(err, http.StatusConflict) {
				return n, fmt.Errorf("starting the grace of %s, which names no created_at: %w", it.ID, err)
			}
			continue
		}
		// Enqueues let no cycle form, so one has a job written by hand
		// (no enqueued entry) on it: the walks start from those only, and
		// from each once a revision.
		if it == nil || it.Status != StatusWaiting || len(it.After) == 0 || c.owns(it) != nil ||
			it.CreatedAt == 0 || now.Sub(FromUnix(it.CreatedAt)) < MissingDependencyGrace ||
			slices.ContainsFunc(it.History, func(e Event) bool { return e.Event == EventEnqueued }) || c.walkedForCycle(it) {
			continue
		}
		path, err := c.cycleThrough(ctx, it.ID, it.After, nil)
		if err != nil {
			return n, err
		}
		if path == nil {
			c.noCycleFound(it)
			continue
		}
		reason := "waits for itself: " + strings.Join(append([]string{it.ID}, path...), " waits for ")
		next := it.Clone()
		next.Status = StatusFailed
		next.LastError = truncate(reason)
		next.FinishedAt = ToUnix(now)
		c.record(next, EventFailed, by, reason)
		rev, err := c.db.Put(ctx, next.ID, next, c.writeOpts()...)
		switch {
		case isStatus(err, http.StatusConflict):
			continue // changed meanwhile: the next pass looks again
		case err != nil:
			return n, fmt.Errorf("failing %s, which waits for itself: %w", it.ID, err)
		}
		next.Rev = rev
		n++
		c.log.Warn().Str("job", it.ID).Str("reason", reason).Msg("failed a job that waits for itself")
		if err := c.Finished(ctx, next, by); err != nil {
			c.log.Warn().Err(err).Str("job", it.ID).Msg("could not end what waits for the job; the sweeper will")
		}
	}
	return n, nil
}

// Batches: jobs enqueued together (EnqueueBatch) carry the batch's id;
// its callback, a waiting job with the id BatchCallbackID, is released
// once every job of the batch has finished, with a summary in its payload
// under "batch". The batches view counts a batch's jobs by state
// ([batch, state], reduced with _count), so that the check is one view
// query whatever the batch's size.

// BatchCallbackID is the id of the callback job of batch id.
func BatchCallbackID(batch string) string { return "job:batch:" + batch }

// BatchStatus is a batch's progress: how many of its jobs are done,
// failed, cancelled and not finished yet, with the failed jobs' ids.
type BatchStatus struct {
	ID string `json:"id"`
	// Size is how many jobs the batch was enqueued with (its callback's
	// batch_size); 0 when the callback cannot be read.
	Size      int64    `json:"size"`
	Done      int64    `json:"done"`
	Failed    int64    `json:"failed"`
	Cancelled int64    `json:"cancelled"`
	Pending   int64    `json:"pending"`
	FailedIDs []string `json:"failed_ids,omitempty"`
	// Callback is the callback job, as it stands (nil when missing).
	Callback *WorkItem `json:"-"`
}

// Finished is how many of the batch's jobs have finished.
func (b *BatchStatus) Finished() int64 { return b.Done + b.Failed + b.Cancelled }

// Complete reports whether every one of size jobs has finished: none is
// pending (a job that failed an attempt and will be retried is pending).
func (b *BatchStatus) Complete(size int) bool {
	return b.Pending == 0 && b.Finished() >= int64(size)
}

// batchCountsChecked is batchCounts with the jobs the view counts as
// unfinished read themselves when they are few (batchCheckBelow), so that
// the callback's release does not wait on an index that lags behind its
// batch's last outcomes. A view reads one copy of each shard, and on a
// cluster that copy may not have a write the majority has; a document is
// read from a majority of copies.
//
// The count and the list of unfinished jobs are two queries of one copy
// (stable); when a job finished there between them, so that they disagree,
// they are asked again, and after batchCheckRounds the count stands
// unchecked (the sweeper counts the batch again later).
func (c *Client) batchCountsChecked(ctx context.Context, batch string) (*BatchStatus, error) {
	stable := kivik.Param("stable", true)
	b, err := c.batchCounts(ctx, batch, stable)
	for round := 0; err == nil && b.Pending > 0 && b.Pending <= batchCheckBelow && round < batchCheckRounds; round++ {
		var ids []string
		if round > 0 {
			if b, err = c.batchCounts(ctx, batch, stable); err != nil {
				break
			}
		}
		if ids, err = c.batchPendingIDs(ctx, batch); err != nil {
			return nil, err
		}
		if int64(len(ids)) != b.Pending {
			continue
		}
		jobs, err := c.readJobs(ctx, ids, true)
		if err != nil {
			return nil, fmt.Errorf("reading the unfinished jobs of batch %s: %w", batch, err)
		}
		b.recount(ids, jobs)
		return b, nil
	}
	return b, err
}

// recount moves the jobs of ids that the batches view counted as
// unfinished, and that have finished as read in jobs, to their final
// state's count.
func (b *BatchStatus) recount(ids []string, jobs map[string]jobState) {
	for _, id := range ids {
		it := jobs[id].item
		if it == nil || it.Batch != b.ID || !it.Status.Terminal() {
			continue
		}
		b.Pending--
		b.count(string(it.Status), 1)
		if it.Status == StatusFailed && len(b.FailedIDs) < maxFailedIDs {
			b.FailedIDs = append(b.FailedIDs, id)
			sort.Strings(b.FailedIDs)
		}
	}
}

// batchCheckBelow is how many unfinished jobs a batch may have, as the
// batches view counts them, for batchCountsChecked to read them;
// batchCheckRounds is how often it asks when the count and the list
// disagree.
const (
	batchCheckBelow  = 64
	batchCheckRounds = 3
)

// batchPendingIDs lists the jobs of batch that the batches view counts as
// unfinished, from the copy batchCounts reads with stable.
func (c *Client) batchPendingIDs(ctx context.Context, batch string) ([]string, error) {
	ids, err := rowIDs(c.db.Query(ctx, designdocs.DocFor("batches"), "_view/batches", kivik.Params(map[string]any{
		"reduce": false, "key": []any{batch, "pending"}, "limit": batchCheckBelow + 1, "stable": true,
	})))
	if err != nil {
		return nil, fmt.Errorf("listing the unfinished jobs of batch %s: %w", batch, err)
	}
	return ids, nil
}

// startBatchRead marks a read of batch as on its way and reports whether
// none was. One finisher at a time looks at a batch afresh: the last few
// hundred jobs of a big batch each asked at once, and PouchDB Server
// brings the view up to date once for every query, one after another (a
// 10,000-job batch's last looks timed out after 30 s). A finisher that
// finds a look on its way leaves the batch to be counted once its jobs
// stop finishing here (SettleQuietBatches).
func (c *Client) startBatchRead(batch string) bool {
	_, busy := c.flow.batchReading.LoadOrStore(batch, true)
	return !busy
}

// batchJobsLeft says whether the batches view, brought up to date, lists
// any unfinished job of batch: one row at most, where a count of the batch
// (batchCounts) reads every row of it on a server without stored
// reductions (PouchDB Server), and the last few hundred jobs of a big batch
// each ask.
func (c *Client) batchJobsLeft(ctx context.Context, batch string) (bool, error) {
	ids, err := rowIDs(c.view(ctx, "batches", kivik.Params(map[string]any{
		"reduce": false, "key": []any{batch, "pending"}, "limit": 1,
	})))
	if err != nil {
		return false, fmt.Errorf("looking for unfinished jobs of batch %s: %w", batch, err)
	}
	return len(ids) > 0, nil
}

// maxFailedIDs bounds the failed ids a batch summary lists.
const maxFailedIDs = 1000

// batchCounts reads a batch's counts (one grouped query of the batches
// view) and, when some failed, their ids.
func (c *Client) batchCounts(ctx context.Context, batch string, opts ...kivik.Option) (*BatchStatus, error) {
	b := &BatchStatus{ID: batch}
	rows := c.view(ctx, "batches", append([]kivik.Option{kivik.Params(map[string]any{
		"group_level": 2, "startkey": []any{batch}, "endkey": []any{batch, map[string]any{}},
	})}, opts...)...)
	for rows.Next() {
		var key []any
		var n int64
		if err := rows.ScanKey(&key); err != nil || len(key) != 2 {
			continue
		}
		if err := rows.ScanValue(&n); err != nil {
			continue
		}
		b.count(key[1], n)
	}
	err := rows.Err()
	_ = rows.Close()
	if err != nil {
		return nil, fmt.Errorf("counting the jobs of batch %s: %w", batch, err)
	}
	if b.Failed > 0 {
		ids, err := rowIDs(c.view(ctx, "batches", kivik.Params(map[string]any{
			"reduce": false, "key": []any{batch, string(StatusFailed)}, "limit": maxFailedIDs,
		})))
		b.FailedIDs = append(b.FailedIDs, ids...)
		if err != nil {
			return nil, fmt.Errorf("listing the failed jobs of batch %s: %w", batch, err)
		}
		sort.Strings(b.FailedIDs)
	}
	return b, nil
}

// withBatchSummary puts the batch's summary into a callback's payload
// under "batch": into the object it is, or a new object (a payload that
// is not an object goes under "payload").
func withBatchSummary(payload json.RawMessage, b *BatchStatus) json.RawMessage {
	obj := map[string]json.RawMessage{}
	if len(payload) > 0 && json.Unmarshal(payload, &obj) != nil {
		obj = map[string]json.RawMessage{"payload": payload}
	}
	summary := map[string]any{
		"id": b.ID, "done": b.Done, "failed": b.Failed, "cancelled": b.Cancelled,
		"failed_ids": append([]string{}, b.FailedIDs...),
	}
	obj["batch"] = mustJSON(summary)
	return mustJSON(obj)
}

// Batch reads a batch's progress and its callback. Its last few
// unfinished jobs are read themselves (batchCountsChecked), so that it
// agrees with what releases the callback.
func (c *Client) Batch(ctx context.Context, id string) (*BatchStatus, error) {
	b, err := c.batchCountsChecked(ctx, id)
	if err != nil {
		return nil, err
	}
	cb, err := c.Get(ctx, BatchCallbackID(id))
	switch {
	case errors.Is(err, ErrNotFound):
		if b.Finished()+b.Pending == 0 {
			return nil, &describedError{fmt.Sprintf("reading batch %s: no such batch", id), ErrNotFound}
		}
		b.Size = b.Finished() + b.Pending // jobs of the batch without a callback
	case err != nil:
		return nil, fmt.Errorf("reading batch %s: %w", id, err)
	default:
		b.Callback = cb
		b.Size = int64(cb.BatchSize)
	}
	return b, nil
}

// NewBatchID returns a time-ordered batch id (a UUIDv7).
func NewBatchID() string { return strings.TrimPrefix(NewID(), "job:") }

// EnqueueBatch enqueues jobs as one batch (each carries its id) and then
// callback, a waiting job (id BatchCallbackID) that is released once every
// job of the batch has finished, with a summary under "batch" in its
// payload (done, failed and cancelled counts and the failed ids). It
// returns the batch's id. Every job is checked before anything is
// written; a job that cannot be stored fails the call, and the callback
// then counts only the jobs that were. Unique jobs cannot be batched.
func (c *Client) EnqueueBatch(ctx context.Context, jobs []NewJob, callback NewJob) (string, error) {
	id := NewBatchID()
	items := make([]*WorkItem, 0, len(jobs))
	for i, j := range jobs {
		if j.Unique.Key != "" {
			return "", fmt.Errorf("%w: job %d of the batch is unique; a batch counts its jobs, so they cannot be unique", ErrInvalidJob, i)
		}
		j, err := c.beforeEnqueue(ctx, j)
		if err != nil {
			return "", fmt.Errorf("job %d of the batch: %w", i, err)
		}
		it, err := c.item(j)
		if err != nil {
			return "", fmt.Errorf("job %d of the batch: %w", i, err)
		}
		it.Batch = id
		items = append(items, it)
	}
	if callback.Unique.Key != "" || callback.ID != "" {
		return "", fmt.Errorf("%w: a batch's callback has the id %s and cannot be unique", ErrInvalidJob, BatchCallbackID(id))
	}
	callback, err := c.beforeEnqueue(ctx, callback)
	if err != nil {
		return "", fmt.Errorf("the batch's callback: %w", err)
	}
	callback.ID = BatchCallbackID(id)
	cb, err := c.item(callback)
	if err != nil {
		return "", fmt.Errorf("the batch's callback: %w", err)
	}
	for i, err := range c.checkSites(ctx, append(slices.Clip(items), cb)) {
		switch {
		case err != nil && i == len(items):
			return "", fmt.Errorf("the batch's callback: %w", err)
		case err != nil:
			return "", fmt.Errorf("job %d of the batch: %w", i, err)
		}
	}
	if errs := c.checkDependencies(ctx, items); slices.ContainsFunc(errs, func(e error) bool { return e != nil }) {
		return "", errors.Join(errs...)
	}
	stored := 0
	var failures []error
	for start := 0; start < len(items); start += 1000 {
		page := items[start:min(start+1000, len(items))]
		docs := make([]any, len(page))
		keys := make([]string, len(page))
		for k, it := range page {
			docs[k], keys[k] = it, it.ID
		}
		bulk, err := c.db.BulkDocs(ctx, docs, c.bulkOpts()...)
		for k, r := range alignBulk(keys, bulk, err) {
			if r.Error != nil {
				failures = append(failures, fmt.Errorf("enqueueing job %s of batch %s: %w", r.ID, id, refusedJob(r.Error)))
				continue
			}
			page[k].Rev = r.Rev
			stored++
		}
	}
	cb.Status = StatusWaiting
	cb.CallbackOf = id
	cb.BatchSize = stored
	rev, err := c.db.Put(ctx, cb.ID, cb, c.writeOpts()...)
	if err != nil {
		return id, fmt.Errorf("enqueueing the callback of batch %s: %w", id, refusedJob(err))
	}
	cb.Rev = rev
	var waiting []*WorkItem
	for _, it := range items {
		if it.Status == StatusWaiting && it.Rev != "" {
			waiting = append(waiting, it)
		}
	}
	c.settleEnqueued(ctx, append(waiting, cb))
	if len(failures) > 0 {
		return id, errors.Join(failures...)
	}
	return id, nil
}

// CancelBatch cancels every job of a batch that has not finished; the
// callback is then released as for any batch whose jobs all finished. It
// returns how many it cancelled (another site's jobs count once asked of
// their owner).
//
// The jobs go a page at a time, each page cancelled in one _bulk_docs
// write: one cancel after another chased the workers running the batch,
// which ran most of it while the cancel went. A job whose write fails
// (a worker's claim or outcome in between, a write short of a majority of
// a cluster's copies) is cancelled again on its own, as CancelJob does; a
// job that still cannot be is reported at the end, after the rest.
func (c *Client) CancelBatch(ctx context.Context, id, by, reason string) (int, error) {
	if reason == "" {
		reason = "batch " + id + " cancelled by operator"
	}
	n := 0
	var failed []error
	after := ""
	for {
		limit := cancelBatchPage
		params := map[string]any{"reduce": false, "key": []any{id, "pending"}}
		if after != "" {
			// From the last page's last job on: listed again when the
			// index still has it pending (its write failed), not when it
			// has taken the cancel, so it is left out by id, not skipped.
			params["startkey_docid"] = after
			limit++
		}
		params["limit"] = limit
		ids, err := rowIDs(c.view(ctx, "batches", kivik.Params(params)))
		if err != nil {
			return n, fmt.Errorf("listing the unfinished jobs of batch %s: %w", id, err)
		}
		full := len(ids) == limit
		if after != "" && len(ids) > 0 && ids[0] == after {
			ids = ids[1:]
		}
		if len(ids) == 0 {
			break
		}
		after = ids[len(ids)-1]
		cancelled, errs := c.cancelMany(ctx, ids, by, reason)
		n += cancelled
		failed = append(failed, errs...)
		if !full {
			break
		}
	}
	if _, err := c.releaseReady(ctx, []string{BatchCallbackID(id)}, by); err != nil {
		return n, err
	}
	if len(failed) > 0 {
		return n, fmt.Errorf("cancelling batch %s: cancelled %d jobs, and %d could not be (run it again): %w", id, n, len(failed), errors.Join(failed...))
	}
	if n == 0 {
		// Nothing to cancel: a batch that had finished, or none at all,
		// which Batch says (a mistyped id must not read as done).
		if _, err := c.Batch(ctx, id); errors.Is(err, ErrNotFound) {
			return 0, err
		}
	}
	return n, nil
}

// cancelBatchPage is how many of a batch's jobs CancelBatch cancels in one
// write.
const cancelBatchPage = 500

// cancelMany cancels the unfinished jobs of ids in one _bulk_docs write,
// releases what waited for them, and returns how many it cancelled and
// the errors of those it could not. A job finished or gone meanwhile is
// skipped; one that cannot be written so (another site's, a malformed
// one, a write that failed) goes through CancelJob on its own.
func (c *Client) cancelMany(ctx context.Context, ids []string, by, reason string) (int, []error) {
	jobs, err := c.readJobs(ctx, ids, true)
	if err != nil {
		return 0, []error{err}
	}
	var alone []string
	var nexts []*WorkItem
	for _, jid := range ids {
		st := jobs[jid]
		switch {
		case !st.exists || (st.item != nil && st.item.Status.Terminal()):
			continue // finished or deleted since it was listed
		case st.item == nil:
			alone = append(alone, jid) // CancelJob says what is wrong with it
			continue
		}
		if elsewhere, err := c.forward(ctx, st.item); err != nil || elsewhere {
			alone = append(alone, jid) // asked of its owner, by request
			continue
		}
		next := st.item.Clone()
		c.cancel(next, by, reason)
		nexts = append(nexts, next)
	}
	n := 0
	var cancelled []string
	if len(nexts) > 0 {
		docs := make([]any, len(nexts))
		wids := make([]string, len(nexts))
		for i, next := range nexts {
			docs[i], wids[i] = next, next.ID
		}
		wctx, trace := c.traced(ctx)
		results, err := c.db.BulkDocs(wctx, docs, c.bulkOpts()...)
		for i, r := range c.resendUnexplained(ctx, docs, wids, results, err) {
			if r.Error != nil || trace.uncommitted(r.ID, r.Rev) {
				alone = append(alone, wids[i])
				continue
			}
			nexts[i].Rev = r.Rev
			cancelled = append(cancelled, wids[i])
			n++
		}
	}
	if len(cancelled) > 0 {
		// What waited for them follows now rather than at the next sweep.
		deps, docs, err := c.dependents(ctx, cancelled)
		if err == nil && len(deps) > 0 {
			_, _, _, err = c.releaseRead(ctx, deps, docs, by)
		}
		if err != nil {
			c.log.Warn().Err(err).Int("jobs", len(cancelled)).Msg("could not release what waited for the cancelled jobs; the sweeper will")
		}
	}
	var errs []error
	for _, jid := range alone {
		_, err := c.CancelJob(ctx, jid, by, reason) // releases what waited for it
		switch {
		case errors.Is(err, ErrWrongState) || errors.Is(err, ErrNotFound):
			// finished meanwhile
		case err == nil || errors.Is(err, ErrForwarded):
			n++
		default:
			errs = append(errs, err)
		}
	}
	return n, errs
}

// ChildID is the id of the child a running job's handler enqueues under
// key: derived from the parent's id, so that a handler that runs again
// (its claim was lost) enqueues the same children, not more.
func ChildID(parent, key string) string { return parent + ":" + key }

// EnqueueChild enqueues j as the child of job parent under key, at
// ChildID(parent, key), with child_of naming the parent. A child an
// earlier run enqueued is returned as it is. A job that stands at that id
// without naming the parent as its own was written by someone else (a
// producer, or an application that chose the id): the parent must not
// wait for it, nor take its result for its child's, so that is an error.
func (c *Client) EnqueueChild(ctx context.Context, parent, key string, j NewJob) (*WorkItem, error) {
	if key == "" {
		return nil, fmt.Errorf("enqueueing a child of job %s: %w: the child key is empty", parent, ErrInvalidJob)
	}
	j.ID, j.childOf = ChildID(parent, key), parent
	it, err := c.Enqueue(ctx, j)
	if kivik.HTTPStatus(err) == http.StatusConflict {
		// Enqueued by an earlier run of the parent, or by someone else.
		it, err = c.Get(ctx, j.ID)
		if err == nil && it.ChildOf != parent {
			err = fmt.Errorf("job %s stands at the id of this child but is not one: it was enqueued by someone else (child_of %q)",
				it.ID, it.ChildOf)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("enqueueing child %s of job %s: %w", key, parent, err)
	}
	return it, nil
}

// AwaitChildren finishes a held job's attempt as waiting for children
// (the jobs it enqueued, by id): it is released, and runs again as its
// continuation (Continuation set), once every child has finished, however
// they ended. The attempt is not charged.
func (c *Client) AwaitChildren(ctx context.Context, item *WorkItem, children []string) error {
	err := c.transition(ctx, "waiting for the children of", item, func(next *WorkItem) {
		by := item.ClaimedBy
		c.unclaim(next)
		next.Status = StatusWaiting
		next.After = append([]string(nil), children...)
		next.OnDependencyFailure = DependencyRun
		next.ReleasedAt = 0
		next.Continuation = true
		next.Attempts = max(next.Attempts-1, 0)
		c.record(next, EventAwaitingChildren, by, "")
	})
	if err != nil {
		return err
	}
	c.settleEnqueued(ctx, []*WorkItem{item})
	return nil
}

// Batches lists the batches of the database with their progress, those
// with unfinished jobs first, at most limit of them: one grouped query of
// the batches view (their callbacks are not read).
func (c *Client) Batches(ctx context.Context, limit int) ([]*BatchStatus, error) {
	byID := map[string]*BatchStatus{}
	var order []string
	rows := c.view(ctx, "batches", kivik.Param("group_level", 2))
	for rows.Next() {
		var key []any
		var n int64
		if err := rows.ScanKey(&key); err != nil || len(key) != 2 {
			continue
		}
		if err := rows.ScanValue(&n); err != nil {
			continue
		}
		id, _ := key[0].(string)
		b := byID[id]
		if b == nil {
			b = &BatchStatus{ID: id}
			byID[id] = b
			order = append(order, id)
		}
		b.count(key[1], n)
	}
	err := rows.Err()
	_ = rows.Close()
	if err != nil {
		return nil, fmt.Errorf("listing batches: %w", err)
	}
	out := make([]*BatchStatus, 0, len(order))
	for _, id := range order {
		b := byID[id]
		b.Size = b.Pending + b.Finished()
		out = append(out, b)
	}
	// Unfinished batches first, newest (ids are time-ordered) first.
	sort.SliceStable(out, func(i, j int) bool {
		if (out[i].Pending > 0) != (out[j].Pending > 0) {
			return out[i].Pending > 0
		}
		return out[i].ID > out[j].ID
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// count adds n jobs of a batch in status st: done, failed and cancelled
// by name, anything else still pending.
func (b *BatchStatus) count(st any, n int64) {
	switch st {
	case string(StatusDone):
		b.Done += n
	case string(StatusFailed):
		b.Failed += n
	case string(StatusCancelled):
		b.Cancelled += n
	default:
		b.Pending += n
	}
}
