package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/protocol"
)

// warmUpTime is spent writing before the ceiling is timed.
const warmUpTime = 500 * time.Millisecond

// maxCeilingWrites bounds each ceiling measurement whatever its duration.
const maxCeilingWrites = 1_000_000

// ceilingResult is what section 1 found; section 2 compares against it.
type ceilingResult struct {
	// documents per second: single-document writes (with couchq's design
	// document), and _bulk_docs into a bare database, into one with the
	// design document and into one with it but validation off (each the
	// better of one writer and C).
	put1, putC, bulkBare, bulkDesign, bulkNoValidation float64
	// bulkMango is the rate into a database validated by the Mango
	// selector (validation mango), zero where the server runs none.
	bulkMango float64
}

// bulkRate is one database's _bulk_docs rate: with one writer, with C at
// once, and the server's CPU per document in the faster run. The ceiling
// is the faster: one writer leaves the server idle while it waits for each
// answer, so on a server with cores to spare C writers store more; on a
// busy one they may store less.
type bulkRate struct {
	one, many float64
	cpu       time.Duration
}

func (r bulkRate) best() float64 { return max(r.one, r.many) }

// bulkBatch is the documents per _bulk_docs request of the ceiling.
const bulkBatch = 100

// jobsLimit is the physical limit for jobs/s: what the server stores at
// its fastest, in bulk and with nothing of couchq's on the write path,
// over the three writes a job takes at least (insert, claim, finish).
func (r ceilingResult) jobsLimit() float64 { return r.bulkBare / 3 }

// designLimit is the limit of a queue that keeps couchq's design document
// (validation and views) on its database: what the server stores in bulk
// with it, over the three writes a job takes.
func (r ceilingResult) designLimit() float64 { return r.bulkDesign / 3 }

// putLimit is the single-document limit: the best single-document rate,
// with couchq's design document, over three writes a job. The queue
// writes one document at a time where it must (a claim), so this is the
// limit of a queue that batches nothing.
func (r ceilingResult) putLimit() float64 { return max(r.put1, r.putC) / 3 }

// runCeiling measures the server's own write rates, with the queue out of
// the way: plain HTTP, documents shaped like jobs. Every bulk rate is taken
// with one writer and with C at once, and the better one is the server's.
// Single-document writes write each document three times (insert, then
// two updates carrying the revision, like claim and finish) into a
// database with couchq's design document, so validate_doc_update runs on
// every write as it does for jobs. _bulk_docs inserts go into a bare
// database (the server alone: the physical limit), into one with the
// design document, so that what couchq's validation and views cost the
// server shows as its own line, into one with the design document but
// validation off, and into one whose only design document is a one-line
// validate_doc_update, which shows what calling a validation function
// costs whatever the function does.
func (b *run) runCeiling(ctx context.Context, s *Section) error {
	db, err := b.newDBValidation(ctx, s, "ceiling", designdocs.ValidationOn)
	if err != nil {
		return err
	}
	novdu, err := b.newDBValidation(ctx, s, "ceilingnovdu", designdocs.ValidationOff)
	if err != nil {
		return err
	}
	bare, err := b.newBareDB(ctx, s, "ceilingbare")
	if err != nil {
		return err
	}
	oneLine, err := b.newOneLineValidationDB(ctx, s)
	if err != nil {
		return err
	}
	// The bare database first, before anything is written into the other:
	// CouchDB indexes a design document's views in the background (ken)
	// after writes, which must not run while the bare rate is timed.
	// Each database is warmed up first: every writer's connection opened,
	// the server's caches and JIT (and for the design document, its
	// couchjs processes) settled before anything is timed; the bulk path
	// too, whose first requests on a fresh server are the slowest.
	wb := &docWriter{t: b.t, db: bare}
	if _, err := wb.puts(ctx, b.cfg.Clients, warmUpTime); err != nil {
		return err
	}
	if _, err := wb.bulk(ctx, b.cfg.Clients, bulkBatch, warmUpTime); err != nil {
		return err
	}
	bulkBare, err := b.timedBulk(ctx, wb)
	if err != nil {
		return err
	}
	// The one-line validation next: its database has no views, so the
	// server indexes nothing in the background while it is timed, and
	// nothing has been written into the others yet.
	bulkOneLine, err := b.warmedBulk(ctx, oneLine)
	if err != nil {
		return err
	}
	w := &docWriter{t: b.t, db: db}
	if _, err := w.puts(ctx, b.cfg.Clients, warmUpTime); err != nil {
		return err
	}
	put1, err := w.puts(ctx, 1, b.cfg.CeilingTime)
	if err != nil {
		return err
	}
	putC, err := w.puts(ctx, b.cfg.Clients, b.cfg.CeilingTime)
	if err != nil {
		return err
	}
	bulkDesign, err := b.timedBulk(ctx, w)
	if err != nil {
		return err
	}
	bulkNoValidation, err := b.warmedBulk(ctx, novdu)
	if err != nil {
		return err
	}
	// Validation as a Mango selector, where the server runs it: last, as
	// its database indexes the same views as the design doc's.
	var bulkMango bulkRate
	mango, err := b.newDBValidation(ctx, s, "ceilingmango", designdocs.ValidationMango)
	switch {
	case errors.Is(err, protocol.ErrNoMangoValidation):
		b.noMango = err
	case err != nil:
		return err
	default:
		if bulkMango, err = b.warmedBulk(ctx, mango); err != nil {
			return err
		}
	}
	s.add(numRow("single-doc writes/s, 1 client (with couchq's design doc)", put1, "docs/s", 0))
	s.add(numRow(fmt.Sprintf("single-doc writes/s, %d clients (with couchq's design doc)", b.cfg.Clients), putC, "docs/s", 0))
	bulkRows := func(what string, r bulkRate) {
		s.add(numRow(fmt.Sprintf("_bulk_docs docs/s, batch %d, %s", bulkBatch, what), r.best(), "docs/s", 0))
		s.add(textRow(fmt.Sprintf("  %s: 1 client / %d clients", what, b.cfg.Clients),
			numRow("", r.one, "", 0).Text+" / "+numRow("", r.many, "docs/s", 0).Text))
	}
	bulkRows("bare database (no design doc)", bulkBare)
	bulkRows("with couchq's design doc", bulkDesign)
	s.add(numRow("  bulk rate lost to the design doc (validate_doc_update, views)", 100*(1-ratio(bulkDesign.best(), bulkBare.best())), "%", 1))
	bulkRows("design doc with validation off", bulkNoValidation)
	s.add(numRow("  bulk rate lost to the design doc without validation (views)", 100*(1-ratio(bulkNoValidation.best(), bulkBare.best())), "%", 1))
	if bulkMango.best() > 0 {
		bulkRows("design doc with validation mango (a Mango selector)", bulkMango)
		s.add(numRow("  bulk rate lost to the design doc with validation mango", 100*(1-ratio(bulkMango.best(), bulkBare.best())), "%", 1))
	} else {
		s.add(textRow("_bulk_docs docs/s, batch 100, design doc with validation mango", "not measured: the server runs no Mango validate_doc_update"))
	}
	bulkRows("a one-line validate_doc_update alone", bulkOneLine)
	s.add(numRow("  bulk rate lost to calling validate_doc_update at all", 100*(1-ratio(bulkOneLine.best(), bulkBare.best())), "%", 1))
	if bulkBare.cpu > 0 {
		s.add(textRow("server CPU per document in _bulk_docs: bare / couchq's design doc / validation off / one-line validation",
			fmt.Sprintf("%s / %s / %s / %s", formatDuration(bulkBare.cpu), formatDuration(bulkDesign.cpu), formatDuration(bulkNoValidation.cpu), formatDuration(bulkOneLine.cpu))))
		if bulkMango.cpu > 0 {
			s.add(durRow("server CPU per document in _bulk_docs: design doc with validation mango", bulkMango.cpu))
		}
	}
	b.ceiling = &ceilingResult{put1: put1, putC: putC, bulkBare: bulkBare.best(), bulkDesign: bulkDesign.best(), bulkNoValidation: bulkNoValidation.best(), bulkMango: bulkMango.best()}
	s.add(numRow("physical limit: bulk (bare) / 3", b.ceiling.jobsLimit(), "jobs/s", 0))
	s.add(numRow("single-doc limit: best single-doc rate / 3", b.ceiling.putLimit(), "jobs/s", 0))
	return nil
}

// timedBulk times w.bulk for the configured ceiling time, with one writer
// and then with C, and gives the server's CPU per document written in the
// faster run (zero when the bench cannot read the server's processes).
func (b *run) timedBulk(ctx context.Context, w *docWriter) (bulkRate, error) {
	var r bulkRate
	for _, clients := range []int{1, b.cfg.Clients} {
		before, written := b.t.cpu(), w.seq.Load()
		rate, err := w.bulk(ctx, clients, bulkBatch, b.cfg.CeilingTime)
		if err != nil {
			return bulkRate{}, err
		}
		after, docs := b.t.cpu(), w.seq.Load()-written
		var cpu time.Duration
		if before.serverOK && after.serverOK && docs > 0 {
			cpu = (after.server - before.server) / time.Duration(docs)
		}
		if clients == 1 {
			r.one, r.cpu = rate, cpu
		} else if r.many = rate; rate > r.one {
			r.cpu = cpu
		}
	}
	return r, nil
}

// warmedBulk is timedBulk into db after warmUpTime of the same writes.
func (b *run) warmedBulk(ctx context.Context, db string) (bulkRate, error) {
	w := &docWriter{t: b.t, db: db}
	if _, err := w.bulk(ctx, b.cfg.Clients, bulkBatch, warmUpTime); err != nil {
		return bulkRate{}, err
	}
	return b.timedBulk(ctx, w)
}

// oneLineValidation is the whole validate_doc_update of section 1's
// one-line validation database. It refuses only a document marked
// couchq_bench_refuse, which the bench writes to see that the function is
// in force; every other write passes after one call.
const oneLineValidation = `function (newDoc) { if (newDoc.couchq_bench_refuse === true) { throw({forbidden: 'refused by the bench'}); } }`

// newOneLineValidationDB creates a database whose only design document
// holds oneLineValidation, in the language couchq's design documents get
// on this server, and checks that the server runs it.
func (b *run) newOneLineValidationDB(ctx context.Context, s *Section) (string, error) {
	db, err := b.newBareDB(ctx, s, "ceilingvdu")
	if err != nil {
		return "", err
	}
	w := &docWriter{t: b.t, db: db}
	ddoc, err := json.Marshal(map[string]any{"language": b.t.designLanguage(), "validate_doc_update": oneLineValidation})
	if err != nil {
		return "", err
	}
	if err := w.do(ctx, http.MethodPut, w.docURL("_design/couchq_bench_validation"), ddoc, nil); err != nil {
		return "", fmt.Errorf("installing the one-line validate_doc_update: %w", err)
	}
	err = w.do(ctx, http.MethodPut, w.docURL("refuse-me"), []byte(`{"couchq_bench_refuse":true}`), nil)
	var se *statusError
	if !errors.As(err, &se) || se.status != http.StatusForbidden {
		return "", fmt.Errorf("the one-line validate_doc_update in %s did not refuse the document it must refuse (want 403 forbidden): %v", db, err)
	}
	return db, nil
}

// docWriter writes job-shaped documents with plain HTTP.
type docWriter struct {
	t   *target
	db  string
	seq atomic.Int64
}

// jobDoc is a job document as it stands after enqueue, claim or finish.
func (w *docWriter) jobDoc(id, rev string, step int) ([]byte, error) {
	now := time.Now()
	it := protocol.WorkItem{
		ID: id, Rev: rev, Worker: "ceiling", Status: protocol.StatusQueued, CreatedAt: protocol.ToUnix(now),
		History: []protocol.Event{{At: now.UTC().Format(protocol.HistoryTimeFormat), Event: "enqueued", By: "cli"}},
	}
	if step >= 1 {
		it.Claimed, it.Status, it.Attempts = true, protocol.StatusRunning, 1
		it.ClaimedBy, it.ClaimedAt, it.StartedAt = "bench/1/w1", it.CreatedAt, it.CreatedAt
		it.LeaseUntil = it.CreatedAt + 30
		it.History = append(it.History, protocol.Event{At: it.History[0].At, Event: "claimed", By: it.ClaimedBy, Attempt: 1})
	}
	if step >= 2 {
		it.Claimed, it.Status, it.ClaimedBy, it.ClaimedAt, it.LeaseUntil = false, protocol.StatusDone, "", 0, 0
		it.FinishedAt = it.CreatedAt
		it.History = append(it.History, protocol.Event{At: it.History[0].At, Event: "done", By: "bench/1/w1", Attempt: 1})
	}
	return json.Marshal(it)
}

func (w *docWriter) docURL(id string) string {
	return w.t.base + "/" + url.PathEscape(w.db) + "/" + url.PathEscape(id)
}

// do sends a JSON request and decodes the answer into out.
func (w *docWriter) do(ctx context.Context, method, u string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if w.t.user != "" {
		req.SetBasicAuth(w.t.user, w.t.password)
	}
	resp, err := w.t.raw.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%s %s: reading answer: %w", method, u, err)
	}
	if resp.StatusCode >= 300 {
		answer := fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(data))
		return &statusError{status: resp.StatusCode, answer: answer, msg: fmt.Sprintf("%s %s: %s", method, u, answer)}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decoding answer: %w", method, u, err)
		}
	}
	return nil
}

// statusError is a server's answer other than 2xx to a docWriter request.
type statusError struct {
	status      int
	answer, msg string // the status and body; the whole message
}

func (e *statusError) Error() string { return e.msg }

// answerOf is the server's answer in a docWriter error (status and body,
// without the URL), else the error's text.
func answerOf(err error) string {
	var se *statusError
	if errors.As(err, &se) {
		return se.answer
	}
	return err.Error()
}

// httpStatusOf is the HTTP status of a docWriter error, 0 for none.
func httpStatusOf(err error) int {
	var se *statusError
	if errors.As(err, &se) {
		return se.status
	}
	return 0
}

// job writes one document three times: insert, claim, finish.
func (w *docWriter) job(ctx context.Context) (int, error) {
	id := fmt.Sprintf("ceiling:%012d", w.seq.Add(1))
	rev := ""
	for step := range 3 {
		body, err := w.jobDoc(id, rev, step)
		if err != nil {
			return step, err
		}
		var ok struct {
			Rev string `json:"rev"`
		}
		if err := w.do(ctx, http.MethodPut, w.docURL(id), body, &ok); err != nil {
			return step, fmt.Errorf("writing %s: %w", id, err)
		}
		rev = ok.Rev
	}
	return 3, nil
}

// puts runs clients writers for d (or maxCeilingWrites writes) and
// returns the documents written per second.
func (w *docWriter) puts(ctx context.Context, clients int, d time.Duration) (float64, error) {
	return writeFor(ctx, clients, d, w.job)
}

// bulk posts batches of new job documents for d, from clients writers at
// once, and returns documents stored per second.
func (w *docWriter) bulk(ctx context.Context, clients, batch int, d time.Duration) (float64, error) {
	return writeFor(ctx, clients, d, func(ctx context.Context) (int, error) {
		if err := w.postBatch(ctx, batch); err != nil {
			return 0, err
		}
		return batch, nil
	})
}

// writeFor calls write from clients goroutines at once for d (or until
// maxCeilingWrites documents), each call writing the documents it
// returns, and gives the documents written per second. The first error
// stops every writer.
func writeFor(ctx context.Context, clients int, d time.Duration, write func(context.Context) (int, error)) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var written atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < d && written.Load() < maxCeilingWrites && ctx.Err() == nil {
				n, err := write(ctx)
				written.Add(int64(n))
				if err != nil {
					once.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return rate(written.Load(), time.Since(start)), nil
}

// fill stores n new job documents, batch at a time: their ids are
// bulkID(1) to bulkID(n) in a docWriter that wrote nothing before.
func (w *docWriter) fill(ctx context.Context, n, batch int) error {
	for done := 0; done < n; done += batch {
		if err := w.postBatch(ctx, min(batch, n-done)); err != nil {
			return err
		}
	}
	return nil
}

// bulkID is the id of the i-th document bulk and fill write.
func bulkID(i int64) string { return fmt.Sprintf("bulk:%012d", i) }

// postBatch stores batch new job documents in one _bulk_docs request.
func (w *docWriter) postBatch(ctx context.Context, batch int) error {
	u := w.t.base + "/" + url.PathEscape(w.db) + "/_bulk_docs"
	docs := make([]json.RawMessage, batch)
	for i := range docs {
		doc, err := w.jobDoc(bulkID(w.seq.Add(1)), "", 0)
		if err != nil {
			return err
		}
		docs[i] = doc
	}
	body, err := json.Marshal(map[string]any{"docs": docs})
	if err != nil {
		return err
	}
	var res []struct {
		Error  string `json:"error"`
		Reason string `json:"reason"`
	}
	if err := w.do(ctx, http.MethodPost, u, body, &res); err != nil {
		return err
	}
	for _, r := range res {
		if r.Error != "" {
			return fmt.Errorf("_bulk_docs refused a document: %s: %s", r.Error, r.Reason)
		}
	}
	if len(res) != batch {
		return fmt.Errorf("_bulk_docs answered %d results for %d documents", len(res), batch)
	}
	return nil
}
