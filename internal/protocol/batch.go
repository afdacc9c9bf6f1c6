package protocol

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/go-kivik/kivik/v4"
)

// maxWriteBatch bounds how many held-job writes go in one _bulk_docs.
const maxWriteBatch = 100

// batchWriteTimeout bounds one batched write; it runs detached from the
// callers' contexts, since a write already on its way may be applied
// whatever happens to the caller.
const batchWriteTimeout = 30 * time.Second

// writeBatcher coalesces the single-document writes of held jobs (outcomes,
// lease renewals, sweeps) that many goroutines make at once into one
// _bulk_docs request: a server answers a batch of 100 documents many times
// faster than 100 PUTs. The first write waits Config.WriteLinger for others
// to join it (no-op jobs claimed together end within it: without the wait
// the first of them went alone, a third of a busy worker's writes), and
// writes that arrive while a request is in flight go together in the next
// one. Idle, it has no goroutine.
type writeBatcher struct {
	mu       sync.Mutex
	pending  []*pendingWrite
	flushing bool
}

type pendingWrite struct {
	doc  *WorkItem
	rev  string
	err  error
	done chan struct{}
}

// write stores next over its revision through the batcher and returns the
// new revision. If ctx ends first, the write may still be applied.
func (c *Client) write(ctx context.Context, next *WorkItem) (string, error) {
	pw := &pendingWrite{doc: next, done: make(chan struct{})}
	b := &c.batcher
	b.mu.Lock()
	b.pending = append(b.pending, pw)
	start := !b.flushing
	b.flushing = true
	b.mu.Unlock()
	if start {
		go c.flushWrites()
	}
	select {
	case <-pw.done:
		return pw.rev, pw.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// flushWrites sends pending writes until there are none left.
func (c *Client) flushWrites() {
	b := &c.batcher
	if c.cfg.WriteLinger > 0 {
		time.Sleep(c.cfg.WriteLinger)
	}
	for {
		b.mu.Lock()
		n := min(len(b.pending), maxWriteBatch)
		if n == 0 {
			b.flushing = false
			b.mu.Unlock()
			return
		}
		batch := make([]*pendingWrite, n)
		copy(batch, b.pending)
		b.pending = append(b.pending[:0], b.pending[n:]...)
		b.mu.Unlock()
		c.sendWrites(batch)
	}
}

// sendWrites writes one batch: a PUT for a single document (cheaper for
// the server than a batch of one), _bulk_docs otherwise, each document
// winning or losing on its own.
func (c *Client) sendWrites(batch []*pendingWrite) {
	ctx, cancel := context.WithTimeout(context.Background(), batchWriteTimeout)
	defer cancel()
	defer func() {
		for _, pw := range batch {
			close(pw.done)
		}
	}()
	wctx, trace := c.traced(ctx)
	if len(batch) == 1 {
		pw := batch[0]
		pw.rev, pw.err = c.db.Put(wctx, pw.doc.ID, pw.doc, c.writeOpts()...)
		if pw.err == nil && trace.uncommitted(pw.doc.ID, pw.rev) {
			pw.err = errNoMajority
		}
		return
	}
	docs := make([]any, len(batch))
	ids := make([]string, len(batch))
	for i, pw := range batch {
		docs[i], ids[i] = pw.doc, pw.doc.ID
	}
	results, err := c.db.BulkDocs(wctx, docs, c.bulkOpts()...)
	for i, r := range c.resendUnexplained(ctx, docs, ids, results, err) {
		batch[i].rev, batch[i].err = r.Rev, r.Error
		if r.Error == nil && trace.uncommitted(r.ID, r.Rev) {
			batch[i].err = errNoMajority
		}
	}
}

// resendUnexplained aligns _bulk_docs results with the documents sent and
// resends, one PUT each, the documents whose result kivik could only call a
// 500: it maps every per-document error but "conflict" to 500, so a
// validate_doc_update rejection (403) would look like a server failure and
// be retried for ever. The PUT answers with the real status.
func (c *Client) resendUnexplained(ctx context.Context, docs []any, ids []string, results []kivik.BulkResult, reqErr error) []kivik.BulkResult {
	aligned := alignBulk(ids, results, reqErr)
	if reqErr != nil {
		return aligned
	}
	for i, r := range aligned {
		if isStatus(r.Error, http.StatusInternalServerError) {
			rev, err := c.db.Put(ctx, ids[i], docs[i], c.writeOpts()...)
			aligned[i] = kivik.BulkResult{ID: ids[i], Rev: rev, Error: err}
		}
	}
	return aligned
}
