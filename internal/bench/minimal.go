package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/couchq/couchq/designdocs"
)

// A minimal queue is the yardstick between the server's bulk ceiling and
// couchq: the least any queue on this server can ask of it per job. Plain
// HTTP, no leases, confirmations, history beyond the document's, feed or
// retries: claimers each take a batch, claim it with one _bulk_docs and
// finish it with another. Run six times: finding the jobs by id (no
// index at all: the cost of reading and writing alone), in a bare database
// and in one with couchq's design documents (what keeping their views up
// to date, and validation if on, costs a queue that reads no index),
// through couchq's claim view (what finding due work by a view adds, which
// every view-claimed queue pays), and in the changes feed, filtered to
// queued jobs and unfiltered (the ways to find new work without reading an
// index), and in a partial Mango index (an index CouchDB builds without
// JavaScript). The 80 % of bulk/3 is about what the first reaches in a
// bare database here (73-88 % on 2026-11-25) and above what any of them
// reaches in a database with couchq's design documents once their views'
// catch-up is counted (about 55 % on the node without validation, 22-24 %
// with it), so these rows show how far the target is from what a queue
// that keeps couchq's views can reach and how much of the rest is couchq's.
const (
	minimalClaimers = 4
	minimalBatch    = 100
)

// minimalStall ends a minimal queue's run in which no job finished for
// this long, rather than waiting for the server's timeout.
const minimalStall = 20 * time.Second

// autoIndexed are the design documents whose views CouchDB keeps up to
// date by itself, behind the writes: the claim and sweep ones (the ops one
// is indexed when read).
func autoIndexed() []string { return []string{designdocs.ID, designdocs.SweepID} }

// minimalQueue works n job documents (bulkID(1) to bulkID(n), written by
// fill) through claim and finish.
type minimalQueue struct {
	w    *docWriter
	n    int
	find minimalFind
	// designDocs says the database holds couchq's design documents; the
	// by-id queue runs in both kinds, so that what those documents cost a
	// queue that reads no index (CouchDB's background indexer keeping
	// their views up to date, validation if on) is a row of its own.
	designDocs bool
}

// minimalFind is how a minimal queue's claimers find due jobs.
type minimalFind int

const (
	findByID   minimalFind = iota // ids handed out in order, revisions from _all_docs
	findInView                    // couchq's claim view brought up to date
	// findInFeed follows the database's _changes feed, filtered by a
	// Mango selector to queued jobs, and takes each job's id and revision
	// from its row: no index is read, though CouchDB's background indexer
	// still keeps the design documents' views up to date.
	findInFeed
	// findInPlainFeed follows the _changes feed with no filter, which
	// CouchDB answers from its by-sequence index without opening a
	// document, and takes the first revisions ("1-…"): jobs as inserted.
	// It is the cheapest way for a queue to learn of new jobs without an
	// index, if it could tell them from the id and revision alone.
	findInPlainFeed
	// findInMango reads a partial Mango (JSON) index on [worker, date]
	// over the queued jobs, which CouchDB builds in Erlang without the
	// JavaScript server: what a claim path reading such an index instead
	// of the claim view could reach, couchq's design documents and their
	// self-updating views kept as they are.
	findInMango
)

// minimalRun is what a minimal queue's run measured.
type minimalRun struct {
	jobs int64
	wall time.Duration
	cpu0 cpuUse
	cpu1 cpuUse
}

// run works the jobs and returns the jobs done and the time taken.
func (q *minimalQueue) run(ctx context.Context, cpu func() cpuUse) (minimalRun, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64                    // by id: the last id handed out
	since := make([]string, minimalClaimers) // in the feed: each claimer's last sequence
	var done atomic.Int64
	var firstErr error
	var once sync.Once
	fail := func(err error) {
		if done.Load() >= int64(q.n) {
			return // the end of the run cancelled the request
		}
		once.Do(func() { firstErr = err; cancel() })
	}
	res := minimalRun{cpu0: cpu()}
	start := time.Now()
	var progress atomic.Int64 // when a batch last finished, in ns since start
	var wg sync.WaitGroup
	for g := range minimalClaimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done.Load() < int64(q.n) && ctx.Err() == nil {
				var batch []minimalJob
				var err error
				switch q.find {
				case findInView:
					batch, err = q.dueInView(ctx, g)
				case findInFeed, findInPlainFeed:
					batch, err = q.dueInFeed(ctx, g, &since[g])
				case findInMango:
					batch, err = q.dueInMango(ctx, g)
				default:
					batch, err = q.byID(ctx, &next)
				}
				if err != nil {
					fail(err)
					return
				}
				if stalled := time.Since(start) - time.Duration(progress.Load()); stalled > minimalStall {
					fail(fmt.Errorf("no job finished in %v (%d of %d done)", stalled.Round(time.Second), done.Load(), q.n))
					return
				}
				if len(batch) == 0 {
					switch q.find {
					case findByID:
						return // every id handed out
					case findInView, findInMango:
						// Others' claims not yet finished: look again.
						time.Sleep(5 * time.Millisecond)
					}
					continue // the feed waited for changes itself
				}
				n, err := q.claimAndFinish(ctx, batch)
				if err != nil {
					fail(err)
					return
				}
				if n > 0 {
					progress.Store(int64(time.Since(start)))
				}
				if done.Add(int64(n)) >= int64(q.n) {
					cancel() // others may be waiting on the feed
				}
			}
		}()
	}
	wg.Wait()
	// The run ends with its last job: not with a claimer still waiting
	// on the feed.
	res.wall, res.cpu1, res.jobs = time.Duration(progress.Load()), cpu(), done.Load()
	if firstErr != nil {
		return res, fmt.Errorf("minimal queue: %w", firstErr)
	}
	// More than n is possible on a cluster: the minimal queue has no
	// confirming read, so two claimers writing one revision through
	// different nodes both win it (as couchq's claims would without
	// theirs). The yardstick counts what it ran; fewer than n is a failure.
	if res.jobs < int64(q.n) {
		return res, fmt.Errorf("minimal queue: %d of %d jobs done", res.jobs, q.n)
	}
	return res, nil
}

// minimalJob is a job a claimer took: its id and revision.
type minimalJob struct{ id, rev string }

// byID hands out the next batch of ids and reads their revisions.
func (q *minimalQueue) byID(ctx context.Context, next *atomic.Int64) ([]minimalJob, error) {
	last := next.Add(minimalBatch)
	first := last - minimalBatch + 1
	if first > int64(q.n) {
		return nil, nil
	}
	keys := make([]string, 0, minimalBatch)
	for i := first; i <= min(last, int64(q.n)); i++ {
		keys = append(keys, bulkID(i))
	}
	return q.revsOf(ctx, keys)
}

// revsOf reads the current revisions of the jobs keys from _all_docs.
func (q *minimalQueue) revsOf(ctx context.Context, keys []string) ([]minimalJob, error) {
	body, err := json.Marshal(map[string]any{"keys": keys})
	if err != nil {
		return nil, err
	}
	var res struct {
		Rows []struct {
			ID    string `json:"id"`
			Value struct {
				Rev string `json:"rev"`
			} `json:"value"`
		} `json:"rows"`
	}
	if err := q.w.do(ctx, http.MethodPost, q.dbURL()+"/_all_docs", body, &res); err != nil {
		return nil, err
	}
	jobs := make([]minimalJob, 0, len(res.Rows))
	for _, r := range res.Rows {
		jobs = append(jobs, minimalJob{r.ID, r.Value.Rev})
	}
	return jobs, nil
}

// claimerOf is the claimer (of minimalClaimers) whose share job id is, so
// that claimers do not race for the same jobs.
func claimerOf(id string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % minimalClaimers)
}

// dueInFeed reads the next changes after *since that are queued jobs
// (waiting up to a second for some) and takes claimer g's share (about a
// batch); it moves *since past the rows it read. In the plain feed a
// queued job is a first revision; otherwise a selector passes them.
func (q *minimalQueue) dueInFeed(ctx context.Context, g int, since *string) ([]minimalJob, error) {
	v := url.Values{
		"feed":    {"longpoll"},
		"timeout": {"1000"},
		"limit":   {fmt.Sprint(minimalClaimers * minimalBatch)},
	}
	if *since != "" {
		v.Set("since", *since)
	}
	method, body := http.MethodGet, []byte(nil)
	if q.find == findInFeed {
		v.Set("filter", "_selector")
		method, body = http.MethodPost, []byte(`{"selector":{"type":"WorkItem","worker":"ceiling","status":"queued"}}`)
	}
	var res struct {
		Results []struct {
			ID      string `json:"id"`
			Changes []struct {
				Rev string `json:"rev"`
			} `json:"changes"`
		} `json:"results"`
		LastSeq json.RawMessage `json:"last_seq"`
	}
	if err := q.w.do(ctx, method, q.dbURL()+"/_changes?"+v.Encode(), body, &res); err != nil {
		return nil, err
	}
	var last string
	if err := json.Unmarshal(res.LastSeq, &last); err != nil {
		return nil, fmt.Errorf("the feed's last_seq %s: %w", res.LastSeq, err)
	}
	*since = last
	var jobs []minimalJob
	for _, r := range res.Results {
		if claimerOf(r.ID) != g || len(r.Changes) == 0 {
			continue
		}
		rev := r.Changes[0].Rev
		if q.find == findInPlainFeed && (!strings.HasPrefix(rev, "1-") || strings.HasPrefix(r.ID, "_design/")) {
			continue // claimed or finished since, or not a job
		}
		jobs = append(jobs, minimalJob{r.ID, rev})
	}
	return jobs, nil
}

// dueInView reads the claim view brought up to date, with the documents,
// and takes the rows of claimer g's share (by a hash of the id, so that
// claimers do not race for the same jobs).
func (q *minimalQueue) dueInView(ctx context.Context, g int) ([]minimalJob, error) {
	v := url.Values{
		"startkey":     {`["ceiling",3,0]`},
		"endkey":       {`["ceiling",3,{}]`},
		"include_docs": {"true"},
		"limit":        {fmt.Sprint(minimalClaimers * minimalBatch)},
	}
	var res viewRowsWithRevs
	if err := q.w.do(ctx, http.MethodGet, q.dbURL()+"/_design/couchq/_view/due_priority?"+v.Encode(), nil, &res); err != nil {
		return nil, err
	}
	var jobs []minimalJob
	for _, r := range res.Rows {
		if claimerOf(r.ID) == g && len(jobs) < minimalBatch {
			jobs = append(jobs, minimalJob{r.ID, r.Doc.Rev})
		}
	}
	return jobs, nil
}

// dueInMango reads the ids of the jobs the Mango index lists as due and
// takes claimer g's share, as dueInView does, then reads their revisions
// from _all_docs. The query asks for nothing the index does not hold (the
// partial index keeps only queued jobs, so the selector need not say so):
// CouchDB answers it from the index alone, reading no document.
func (q *minimalQueue) dueInMango(ctx context.Context, g int) ([]minimalJob, error) {
	body, err := json.Marshal(map[string]any{
		"selector":  map[string]any{"worker": "ceiling", "date": map[string]any{"$lte": float64(time.Now().Unix())}},
		"sort":      []map[string]string{{"worker": "asc"}, {"date": "asc"}},
		"limit":     minimalClaimers * minimalBatch,
		"use_index": []string{"claimindex", "due"},
		"fields":    []string{"_id"},
	})
	if err != nil {
		return nil, err
	}
	var res struct {
		Docs []struct {
			ID string `json:"_id"`
		} `json:"docs"`
	}
	if err := q.w.do(ctx, http.MethodPost, q.dbURL()+"/_find", body, &res); err != nil {
		return nil, err
	}
	var keys []string
	for _, d := range res.Docs {
		if claimerOf(d.ID) == g && len(keys) < minimalBatch {
			keys = append(keys, d.ID)
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	return q.revsOf(ctx, keys)
}

// claimAndFinish claims the batch with one _bulk_docs and finishes the
// claims that stood with another; it returns the jobs finished.
func (q *minimalQueue) claimAndFinish(ctx context.Context, jobs []minimalJob) (int, error) {
	for step := 1; step <= 2; step++ {
		docs := make([]json.RawMessage, len(jobs))
		for i, j := range jobs {
			doc, err := q.w.jobDoc(j.id, j.rev, step)
			if err != nil {
				return 0, err
			}
			docs[i] = doc
		}
		body, err := json.Marshal(map[string]any{"docs": docs})
		if err != nil {
			return 0, err
		}
		var res []struct {
			ID    string `json:"id"`
			Rev   string `json:"rev"`
			Error string `json:"error"`
		}
		if err := q.w.do(ctx, http.MethodPost, q.dbURL()+"/_bulk_docs", body, &res); err != nil {
			return 0, err
		}
		stood := jobs[:0]
		for i, r := range res {
			if r.Error == "" && i < len(jobs) {
				stood = append(stood, minimalJob{jobs[i].id, r.Rev})
			}
		}
		jobs = stood
	}
	return len(jobs), nil
}

func (q *minimalQueue) dbURL() string { return q.w.t.base + "/" + url.PathEscape(q.w.db) }

// minimalNote explains section 2's minimal-queue rows.
func minimalNote() string {
	return fmt.Sprintf("Section 2's minimal queue is a yardstick, not a queue: %d claimers over plain HTTP, each reading a batch of %d jobs "+
		"(by id from _all_docs, in a bare database and in one with couchq's design documents; from the claim view due_priority brought up to date, "+
		"with the documents; or, ids and revisions, from the _changes feed filtered by a Mango selector to queued jobs, or unfiltered, "+
		"taking first revisions, or from a partial Mango index on [worker, date] over the queued jobs; each claimer taking its share by a hash of the id), "+
		"claiming it with one _bulk_docs and finishing it with another; no leases, confirming reads or retries. "+
		"The job documents are the ceiling's (section 1); the databases with couchq's design documents have them as section 2 installs them, "+
		"their self-updating views (claim and sweep) built before the run, and are given again with the time and server CPU "+
		"their views took to catch up after the last job, which CouchDB's background indexer leaves behind a queue that reads no index. "+
		"Each queue, couchq's too, has the server's own counters per job (GET /_node/_local/_stats, every node summed), from before its run "+
		"to after its views caught up: documents the views' map functions were given (each self-updating design document maps each job's "+
		"last revision once on each copy, and again each revision it indexed before the next was written), documents read, "+
		"validate_doc_update calls and shard commits (one per shard copy a write request touched). "+
		"The section's last row takes the fastest of the queues in a database with couchq's design documents, catch-up counted: "+
		"about as fast as any queue keeping couchq's views gets on this server, so when it is under the end-to-end target's share of its limit "+
		"(%.0f%% of bulk with couchq's design document / 3 with validation on, %.0f%% of bare bulk / 3 with it off) "+
		"the target is out of reach for couchq's design, not only for its runtime.",
		minimalClaimers, minimalBatch, TargetThroughputShare*100, TargetNoValidationShare*100)
}

// runMinimalQueues runs the minimal queues over n jobs and adds their
// rows, with couchq's throughput tput as a share of the view-claimed one.
func (b *run) runMinimalQueues(ctx context.Context, s *Section, n int, tput float64) error {
	if b.t.info.Vendor != "couchdb" {
		// On PouchDB Server 4.2.0 it did not finish: in one run 2 of 300
		// jobs found by id were not finished, in another the claim view,
		// read with the documents, went on listing jobs the claimers did
		// not get until the run timed out. Not looked into: the yardstick
		// is for the reference server.
		s.add(textRow("minimal queue (yardstick)", "not run: Apache CouchDB only (on PouchDB Server it did not finish)"))
		return nil
	}
	var viewRate float64
	var fastest float64 // of the queues in a database with couchq's design documents, catch-up counted
	var viewWithCatchUp float64
	var mangoWithCatchUp float64
	for _, q := range []*minimalQueue{
		{n: n},
		{n: n, designDocs: true},
		{n: n, designDocs: true, find: findInView},
		{n: n, designDocs: true, find: findInFeed},
		{n: n, designDocs: true, find: findInPlainFeed},
		{n: n, designDocs: true, find: findInMango},
	} {
		newDB := b.newDB
		if !q.designDocs {
			newDB = b.newBareDB
		}
		db, err := newDB(ctx, s, "minimal")
		if err != nil {
			return err
		}
		q.w = &docWriter{t: b.t, db: db}
		if err := q.w.fill(ctx, n, minimalBatch); err != nil {
			return fmt.Errorf("minimal queue: storing %d jobs: %w", n, err)
		}
		// The views CouchDB keeps up to date by itself start from the
		// stored jobs, as they would after enqueue, so the run pays for
		// claims and outcomes.
		if q.designDocs {
			if _, err := b.bringIndexesUpToDate(ctx, db, autoIndexed()...); err != nil {
				return fmt.Errorf("minimal queue: %w", err)
			}
		}
		if q.find == findInMango {
			// Built over the stored jobs before the run, as the views are
			// (the first query builds it).
			if err := installMangoDue(ctx, q.w); err != nil {
				return fmt.Errorf("minimal queue: creating the Mango index: %w", err)
			}
			if _, err := mangoDueOf(ctx, q.w, "ceiling", 0, 1); err != nil {
				return fmt.Errorf("minimal queue: building the Mango index: %w", err)
			}
		}
		counters0 := b.t.counters(ctx)
		r, err := q.run(ctx, b.t.cpu)
		if err != nil {
			return err
		}
		jobsPerSec := rate(r.jobs, r.wall)
		s.add(numRow(q.what(), jobsPerSec, "jobs/s", 0))
		b.minimalShareRow(s, jobsPerSec)
		if r.cpu0.serverOK && r.cpu1.serverOK {
			s.add(durRow("  CPU per job, server processes", (r.cpu1.server-r.cpu0.server)/time.Duration(r.jobs)))
		}
		if q.designDocs {
			// CouchDB's background indexer runs behind the writes: a
			// queue that reads no index ends its run with the views
			// not yet indexing its last rounds, work a queue running
			// for good pays all along. So the run is given again with
			// that catch-up counted in.
			catchUp, err := b.bringIndexesUpToDate(ctx, db, autoIndexed()...)
			if err != nil {
				return fmt.Errorf("minimal queue: %w", err)
			}
			cpu2 := b.t.cpu()
			withCatchUp := rate(r.jobs, r.wall+catchUp)
			s.add(durRow("  views' catch-up after the last job", catchUp))
			s.add(numRow("  counting the views' catch-up", withCatchUp, "jobs/s", 0))
			fastest = max(fastest, withCatchUp)
			switch q.find {
			case findInView:
				viewWithCatchUp = withCatchUp
			case findInMango:
				mangoWithCatchUp = withCatchUp
			}
			b.minimalShareRow(s, withCatchUp)
			if r.cpu0.serverOK && cpu2.serverOK {
				s.add(durRow("  CPU per job, server processes, with the catch-up", (cpu2.server-r.cpu0.server)/time.Duration(r.jobs)))
			}
		}
		// After the catch-up, where there is one: each job's revisions
		// are then all indexed.
		counterRow(s, counters0, b.t.counters(ctx), r.jobs)
		if !b.cfg.Keep {
			// Dropped now, so that no index of it is built while the
			// next queue runs.
			if err := b.t.dropDB(ctx, db); err != nil {
				return fmt.Errorf("minimal queue: %w", err)
			}
		}
		if q.find == findInView {
			viewRate = jobsPerSec
		}
	}
	s.add(numRow("couchq's throughput as a share of the minimal queue in the claim view", 100*ratio(tput, viewRate), "%", 1))
	if b.ceiling != nil {
		limit, target, what := b.ceiling.designLimit(), TargetThroughputShare, "bulk with couchq's design doc / 3"
		if b.cfg.Validation == designdocs.ValidationOff {
			limit, target, what = b.ceiling.jobsLimit(), TargetNoValidationShare, "bare bulk/3"
		}
		s.add(reachRow(fastest, limit, target, what))
		// The same for a queue that finds its work in the claim view, as
		// couchq does: what the claim path's index allows, whatever the
		// runtime around it.
		r := s.add(reachRow(viewWithCatchUp, limit, target, what))
		r.Metric, r.Key = reachViewRowMetric, keyReachView
		// And for one that finds them in a Mango index: what a claim
		// path moved off the JavaScript views could reach.
		r = s.add(reachRow(mangoWithCatchUp, limit, target, what))
		r.Metric, r.Key = reachMangoRowMetric, ""
	}
	return nil
}

// reachRowMetric names the row that says whether the end-to-end target is
// within reach of a queue that keeps couchq's design documents.
const reachRowMetric = "end-to-end target within reach of a queue keeping couchq's views? (fastest minimal queue there, catch-up counted, vs the target's limit)"

// reachViewRowMetric names the row that says the same of the minimal
// queue that reads the claim view.
const reachViewRowMetric = "… within reach of a queue that finds its jobs in the claim view? (the minimal one, catch-up counted)"

// reachMangoRowMetric names the row that says the same of the minimal
// queue that reads a partial Mango index.
const reachMangoRowMetric = "… within reach of a queue that finds its jobs in a Mango index? (the minimal one, catch-up counted)"

// reachRow says whether fastest, the rate of the fastest minimal queue in a
// database with couchq's design documents with its views' catch-up counted
// in, reached the target's share (target) of limit, which the text names
// (what); the share is the row's value. The queue that finds its jobs by id does nothing but claim and
// finish them, 100 a request, and leaves the server only the validation
// and indexing every write there costs: no queue keeping those views does
// much better on this server, so when the fastest stays under the target, the
// target is out of reach for couchq's design, not only for its runtime.
func reachRow(fastest, limit, target float64, what string) Row {
	share := 100 * ratio(fastest, limit)
	verdict := "no"
	if fastest >= target*limit {
		verdict = "yes"
	}
	r := textRow(reachRowMetric, fmt.Sprintf("%s: %.1f %% of %s", verdict, share, what))
	r.Value, r.Unit, r.Key = share, "%", keyReach
	return r
}

// minimalShareRow gives a minimal queue's rate as a share of bulk/3 when
// section 1 measured it.
func (b *run) minimalShareRow(s *Section, jobsPerSec float64) {
	if b.ceiling != nil {
		s.add(numRow("  share of the physical limit (bulk, bare / 3)", 100*ratio(jobsPerSec, b.ceiling.jobsLimit()), "%", 1))
	}
}

// what names the queue's row.
func (q *minimalQueue) what() string {
	switch q.find {
	case findInView:
		return "minimal queue: jobs found in the claim view"
	case findInFeed:
		return "minimal queue: jobs found in the changes feed, database with couchq's design documents"
	case findInPlainFeed:
		return "minimal queue: first revisions found in the unfiltered changes feed, database with couchq's design documents"
	case findInMango:
		return "minimal queue: jobs found in a partial Mango index on [worker, date], database with couchq's design documents"
	}
	if q.designDocs {
		return "minimal queue: jobs found by id, database with couchq's design documents"
	}
	return "minimal queue: jobs found by id, bare database"
}
