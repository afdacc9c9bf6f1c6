package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-kivik/kivik/v4"
)

// ErrWrongState means an operator action does not apply to the job's
// current status (retrying a job that is running, say).
var ErrWrongState = errors.New("job is not in a state this action applies to")

// operate reads a job, checks allowed, and writes change over the revision
// it read. A 409 means someone (a worker, another operator) wrote in
// between: it reads again and re-checks, a few times.
//
// In a database of several sites only the job's owner writes it: an
// action on another site's job becomes a request for its owner (forward),
// and the call returns a *ForwardedError.
func (c *Client) operate(ctx context.Context, what, id string, allowed func(*WorkItem) error, change func(*WorkItem)) (*WorkItem, error) {
	return c.operateOr(ctx, what, id, allowed, change, nil)
}

// operateOr is operate with forward, which writes the request for another
// site's job (nil: the action cannot be forwarded).
func (c *Client) operateOr(ctx context.Context, what, id string, allowed func(*WorkItem) error, change func(*WorkItem), forward func(*WorkItem) error) (*WorkItem, error) {
	// uncertain: an earlier round's write reached fewer than a majority
	// of a cluster's copies and could not be shown to stand (a node cut
	// off from the others): what the job reads as now may be that write.
	uncertain := false
	for range 5 {
		it, err := c.Get(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if err := allowed(it); err != nil {
			if uncertain {
				return nil, fmt.Errorf("%s %s: the write reached fewer than a majority of the copies (a node cut off from the others?) and the job now reads %s, maybe from that write: it stands or is withdrawn once the cluster is whole; look again then (couchq show %s)",
					what, id, it.Status, id)
			}
			return nil, fmt.Errorf("%s %s: %w", what, id, err)
		}
		elsewhere, err := c.forward(ctx, it)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", what, id, err)
		}
		if elsewhere {
			if forward == nil {
				// Not ErrNotOwner, which is a claim's conflict with another
				// worker: nobody claimed anything here.
				return nil, fmt.Errorf("%s %s: %w: it belongs to site %s, and this is not asked of another site; run it there", what, id, ErrWrongState, c.Owner(it))
			}
			return it, forward(it)
		}
		next := it.Clone()
		change(next)
		err = c.put(ctx, next)
		if err == nil {
			return next, nil
		}
		if !isStatus(err, http.StatusConflict) && !errors.Is(err, ErrClaimLost) {
			return nil, fmt.Errorf("%s %s: %w", what, id, err)
		}
		uncertain = errors.Is(err, ErrClaimLost) // the 202 of put
	}
	return nil, fmt.Errorf("%s %s: the job kept changing under us; try again", what, id)
}

// Retry puts a failed or cancelled job back in the queue, due now, with
// its attempts reset. by names the operator in the activity log.
func (c *Client) Retry(ctx context.Context, id, by string) (*WorkItem, error) {
	it, err := c.operateOr(ctx, "retrying job", id, func(it *WorkItem) error {
		if it.Status != StatusFailed && it.Status != StatusCancelled {
			return fmt.Errorf("%w: status is %s; only failed or cancelled jobs are retried", ErrWrongState, it.Status)
		}
		if archived(it) {
			original := it.ID
			if i := strings.LastIndex(it.ID, "~"); i > 0 {
				original = it.ID[:i]
			}
			return fmt.Errorf("%w: it is the archived copy of unique job %s, kept when its key was enqueued again: retry that job or enqueue the key again, not this copy",
				ErrWrongState, original)
		}
		return nil
	}, func(next *WorkItem) {
		c.retried(next, by)
	}, func(it *WorkItem) error { return c.request(ctx, it, requestRetry, by, "") })
	if err != nil || it.Status != StatusWaiting {
		return it, err
	}
	// Checked again now, not at the next sweep: released if what it waits
	// for has finished, ended again if a dependency still stands failed.
	c.settleEnqueued(ctx, []*WorkItem{it})
	if now, gerr := c.Get(ctx, it.ID); gerr == nil {
		it = now
	}
	return it, nil
}

// archived reports whether it is the copy of a finished unique job kept
// when its key was enqueued again (ArchiveID): a record, which running
// again would make a second job of the key.
func archived(it *WorkItem) bool {
	return it.UniqueKey != "" && len(it.History) > 0 && it.History[len(it.History)-1].Event == EventArchived
}

// retried makes next, a finished job, a job to run again from its first
// attempt, due now. A job that waits for others and was never released
// (it ended because one of them failed, or went missing) waits again.
func (c *Client) retried(next *WorkItem, by string) {
	c.unclaim(next)
	next.Status = StatusQueued
	if next.ReleasedAt == 0 && (len(next.After) > 0 || next.CallbackOf != "") {
		next.Status = StatusWaiting
	}
	next.Attempts = 0
	next.Date = 0
	next.FinishedAt = 0
	c.record(next, EventRequeued, by, "retried by operator")
}

// CancelJob cancels a queued or running job for good. A running job's
// worker finds out at its next lease renewal, stops the handler, and its
// result is refused.
func (c *Client) CancelJob(ctx context.Context, id, by, reason string) (*WorkItem, error) {
	if reason == "" {
		reason = "cancelled by operator"
	}
	it, err := c.operateOr(ctx, "cancelling job", id, func(it *WorkItem) error {
		if it.Status.Terminal() {
			return fmt.Errorf("%w: status is already %s", ErrWrongState, it.Status)
		}
		return nil
	}, func(next *WorkItem) { c.cancel(next, by, reason) },
		func(it *WorkItem) error { return c.request(ctx, it, requestCancel, by, reason) })
	if err == nil && it.Status == StatusCancelled {
		// What waited for it follows now rather than at the next sweep.
		if ferr := c.Finished(ctx, it, by); ferr != nil {
			c.log.Warn().Err(ferr).Str("job", id).Msg("could not release what waited for the cancelled job; the sweeper will")
		}
	}
	return it, err
}

// cancel makes next, an unfinished job, cancelled by by for reason.
func (c *Client) cancel(next *WorkItem, by, reason string) {
	c.unclaim(next)
	next.Status = StatusCancelled
	next.LastError = truncate(reason)
	next.FinishedAt = ToUnix(c.now())
	c.record(next, EventCancelled, by, reason)
}

// ClaimantGone returns nil when nobody may still be running it: it is not
// running, or its claimant's worker has stopped beating. Otherwise an
// ErrWrongState says who may be: a worker whose heartbeat is fresh, or a
// claimant with no heartbeat of its own (an agent, which claims through
// couchq claim or the agents' API), alive for all anyone knows until its
// lease runs out. Requeueing such a job would run it twice at once.
func (c *Client) ClaimantGone(ctx context.Context, it *WorkItem) error {
	if it.Status != StatusRunning || it.ClaimedBy == "" {
		return nil
	}
	workers, err := c.Workers(ctx)
	if err != nil {
		return fmt.Errorf("checking the worker of job %s: %w", it.ID, err)
	}
	now := c.now()
	for _, w := range workers {
		if w.Claimant != it.ClaimedBy {
			continue
		}
		if alive, age := w.Liveness(now); alive {
			return fmt.Errorf("%w: its worker %s is alive (last heartbeat %s ago); requeueing would run it twice at once",
				ErrWrongState, it.ClaimedBy, seconds(age))
		}
		return nil
	}
	if left := it.Lease().Sub(now); left > 0 {
		return fmt.Errorf("%w: its claimant %s has no worker heartbeat (an agent, say) and its lease runs %s more; requeueing would run it twice at once: wait for the lease to run out",
			ErrWrongState, it.ClaimedBy, seconds(left.Seconds()))
	}
	return nil
}

// seconds is s seconds, rounded to the second, as a duration reads.
func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Second).String()
}

// Requeue returns a running job whose worker is gone to the queue at once,
// without waiting for its lease to run out. The attempt it was running
// stays counted.
func (c *Client) Requeue(ctx context.Context, id, by string) (*WorkItem, error) {
	return c.operate(ctx, "requeueing job", id, func(it *WorkItem) error {
		if it.Status != StatusRunning {
			return fmt.Errorf("%w: status is %s; only running jobs are requeued (use retry for failed ones)", ErrWrongState, it.Status)
		}
		return nil
	}, func(next *WorkItem) {
		claimant := next.ClaimedBy
		c.unclaim(next)
		next.Status = StatusQueued
		c.record(next, EventRequeued, by, "requeued by operator; claimant "+claimant)
	})
}

// RetryFailed retries every failed job of type worker, a page at a time
// with one _bulk_docs write per page, and returns how many it retried. A job
// changed or deleted since its page was listed is skipped. In a queue of
// several sites another site's failed job is asked of its owner (a retry
// request, as Retry writes one) and counted. progress, when
// set, is called after each page with the running total.
func (c *Client) RetryFailed(ctx context.Context, worker, by string, progress func(retried int)) (int, error) {
	n := 0
	// skip counts the rows of the failed range that stay there: archived
	// copies of unique jobs, which are never retried, and conflicted jobs
	// that will not settle as failed. Paging past them, rather than
	// stopping at a page of them, retries the failed jobs listed after any
	// number of them. A job whose write fails is listed again, and retried
	// if it is still failed, until a page retries nothing new.
	skip := 0
	for {
		batch, listed, err := c.listFrom(ctx, ListOptions{Worker: worker, Status: StatusFailed, Limit: 500}, skip)
		if err != nil {
			return n, err
		}
		if listed == 0 {
			return n, nil
		}
		var docs []any
		var nexts []*WorkItem
		var ids []string
		stays := listed - len(batch.Items)
		for _, it := range batch.Items {
			if archived(it) {
				stays++
				continue // a record of a unique job: see Retry
			}
			if elsewhere, err := c.forward(ctx, it); err != nil {
				return n, fmt.Errorf("retrying failed %s jobs: %w", worker, err)
			} else if elsewhere {
				// Another site's job: only its owner writes it, so it is
				// asked for, as a retry of that job alone is. The job
				// stays failed here until the owner's retry comes back.
				stays++
				if _, err := c.Retry(ctx, it.ID, by); err == nil || errors.Is(err, ErrForwarded) {
					n++
				} else {
					c.log.Warn().Err(err).Str("job", it.ID).Msg("asking another site to retry its failed job")
				}
				continue
			}
			next := it.Clone()
			c.retried(next, by)
			docs, nexts, ids = append(docs, next), append(nexts, next), append(ids, it.ID)
		}
		page := 0
		if len(docs) > 0 {
			results, err := c.db.BulkDocs(ctx, docs, c.bulkOpts()...)
			if err != nil {
				return n, fmt.Errorf("retrying %d failed %s jobs: %w", len(docs), worker, err)
			}
			var waiting []*WorkItem
			for k, r := range alignBulk(ids, results, nil) {
				if r.Error == nil {
					page++
					if nexts[k].Status == StatusWaiting {
						nexts[k].Rev = r.Rev
						waiting = append(waiting, nexts[k])
					}
				}
			}
			c.settleEnqueued(ctx, waiting)
			n += page
			if progress != nil {
				progress(n)
			}
		}
		if page == 0 && stays == 0 {
			return n, nil // every one changed under us: nothing more to gain now
		}
		skip += stays
	}
}

// PurgeOptions choose what Purge removes.
type PurgeOptions struct {
	// Status is a finished status: done, failed or cancelled.
	Status Status
	// OlderThan removes jobs finished longer ago than this.
	OlderThan time.Duration
	// Worker limits the purge to one job type; empty means every type.
	Worker string
	// Progress, when set, is called after each batch with the running total.
	Progress func(deleted int)
}

// purgeBatch is how many documents one _bulk_docs deletion carries.
const purgeBatch = 500

// Purge deletes finished jobs in bulk and returns how many it deleted.
// Each deletion leaves a tombstone (CouchDB keeps deleted documents' ids
// and revisions so replicas learn of the deletion); compaction reclaims the
// bodies but not the tombstones, which is why a queue that churns through
// millions of jobs is better rotated to a fresh database.
func (c *Client) Purge(ctx context.Context, opts PurgeOptions) (int, error) {
	if !opts.Status.Terminal() {
		return 0, fmt.Errorf("purge: status must be done, failed or cancelled, got %q", opts.Status)
	}
	if opts.OlderThan < 0 {
		return 0, fmt.Errorf("purge: older-than must not be negative")
	}
	cutoff := ToUnix(c.now().Add(-opts.OlderThan))
	types := []string{opts.Worker}
	if opts.Worker == "" {
		var err error
		if types, err = c.Types(ctx); err != nil {
			return 0, err
		}
	}
	awaited, err := c.awaitedJobs(ctx)
	if err != nil {
		return 0, err
	}
	deleted := 0
	for _, typ := range types {
		// kept counts the rows of typ's range left in place on purpose
		// (awaited, conflicted): they stay at its start, so the next page
		// skips them.
		kept := 0
		for {
			docs, err := c.finishedBefore(ctx, opts.Status, typ, cutoff, kept)
			if err != nil {
				return deleted, err
			}
			listed := len(docs)
			if listed == 0 {
				break
			}
			docs = slices.DeleteFunc(docs, func(d any) bool { return awaited[d.(map[string]any)["_id"].(string)] })
			if docs, err = c.dropConflicted(ctx, docs); err != nil {
				return deleted, err
			}
			n := 0
			if len(docs) > 0 {
				n, err = c.deleteSeen(ctx, docs)
				deleted += n
				if opts.Progress != nil {
					opts.Progress(deleted)
				}
				if err != nil {
					return deleted, err
				}
			}
			kept += listed - len(docs)
			if listed < purgeBatch || (len(docs) > 0 && n == 0) {
				break // the last page, or every one changed under us: left for next time
			}
		}
	}
	return deleted, nil
}

// awaitedJobs are the jobs a purge must leave: those a waiting job waits
// for (its after), and the finished jobs of a batch whose callback still
// waits. The callback is released once the batch's finished jobs number
// its size, and a dependent once its dependencies have finished; a purge
// before then would leave the callback waiting for good, and a dependent
// that takes a deleted job for a done one would run after a failure.
func (c *Client) awaitedJobs(ctx context.Context) (map[string]bool, error) {
	awaited := map[string]bool{}
	var batches []string
	rows := c.view(ctx, "waiting")
	for rows.Next() {
		var v struct {
			After      []string `json:"after"`
			CallbackOf *string  `json:"callback_of"`
		}
		if rows.ScanValue(&v) != nil {
			continue
		}
		for _, id := range v.After {
			awaited[id] = true
		}
		if v.CallbackOf != nil && *v.CallbackOf != "" {
			batches = append(batches, *v.CallbackOf)
		}
	}
	err := rows.Err()
	_ = rows.Close()
	if err != nil {
		return nil, fmt.Errorf("purge: listing waiting jobs: %w", err)
	}
	for _, b := range batches {
		rows := c.view(ctx, "batches", kivik.Params(map[string]any{
			"reduce": false, "startkey": []any{b}, "endkey": []any{b, map[string]any{}},
		}))
		for rows.Next() {
			if id, err := rows.ID(); err == nil {
				awaited[id] = true
			}
		}
		err := rows.Err()
		_ = rows.Close()
		if err != nil {
			return nil, fmt.Errorf("purge: listing the jobs of batch %s: %w", b, err)
		}
	}
	return awaited, nil
}

// dropConflicted leaves out of a purge's deletions the jobs with more
// than one live revision, read from every leaf (on a cluster from a
// majority of the copies, so a branch just written is seen): deleting the
// revision CouchDB picks would bring another branch up in its place, and
// an unfinished one would run again. The sweeper settles them; a later
// purge deletes them.
func (c *Client) dropConflicted(ctx context.Context, docs []any) ([]any, error) {
	if len(docs) == 0 {
		return docs, nil
	}
	ids := make([]string, len(docs))
	for i, d := range docs {
		ids[i] = d.(map[string]any)["_id"].(string)
	}
	all, err := c.leavesMany(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("reading the revisions of jobs to purge: %w", err)
	}
	return slices.DeleteFunc(docs, func(d any) bool {
		live := 0
		for _, l := range all[d.(map[string]any)["_id"].(string)] {
			if !l.Deleted {
				live++
			}
		}
		return live > 1
	}), nil
}

// finishedBefore lists jobs of typ in status finished before cutoff, as
// deletions at the revision the view saw, past the first skip.
func (c *Client) finishedBefore(ctx context.Context, status Status, typ string, cutoff float64, skip int) ([]any, error) {
	rows := c.view(ctx, "by_status", kivik.Params(map[string]any{
		"startkey": []any{string(status), typ},
		"endkey":   []any{string(status), typ, cutoff},
		"limit":    purgeBatch,
		"skip":     skip,
	}))
	defer rows.Close()
	var docs []any
	for rows.Next() {
		id, _ := rows.ID()
		var v struct {
			Rev string `json:"rev"`
		}
		if rows.ScanValue(&v) != nil || v.Rev == "" {
			continue
		}
		docs = append(docs, map[string]any{"_id": id, "_rev": v.Rev, "_deleted": true})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing %s %s jobs to purge: %w", status, typ, err)
	}
	return docs, nil
}

// deleteSeen deletes documents at the revisions given in one _bulk_docs
// request; documents that changed since (a 409) are skipped. Any other
// refusal (a user without the worker role: validate_doc_update's
// forbidden) is an error, after counting what was deleted: a purge that
// deleted nothing must not read as one that found nothing.
func (c *Client) deleteSeen(ctx context.Context, docs []any) (int, error) {
	results, err := c.db.BulkDocs(ctx, docs, c.bulkOpts()...)
	if err != nil {
		return 0, fmt.Errorf("deleting %d jobs: %w", len(docs), err)
	}
	n, refused := 0, 0
	var first error
	for _, r := range results {
		switch {
		case r.Error == nil:
			n++
		case kivik.HTTPStatus(r.Error) != http.StatusConflict:
			refused++
			if first == nil {
				first = fmt.Errorf("%s: %w", r.ID, r.Error)
			}
		}
	}
	if first != nil {
		return n, fmt.Errorf("deleting %d jobs: %d refused, the first %w", len(docs), refused, first)
	}
	return n, nil
}

// Tombstones reports how many deleted documents the database keeps
// (doc_del_count); known is false when the server does not report it
// (PouchDB Server).
func (c *Client) Tombstones(ctx context.Context) (n int64, known bool, err error) {
	st, err := c.db.Stats(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("reading database info: %w", err)
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(st.RawResponse, &fields) != nil {
		return st.DeletedCount, false, nil
	}
	_, known = fields["doc_del_count"]
	return st.DeletedCount, known, nil
}
