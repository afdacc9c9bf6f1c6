package protocol

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"
)

// UniqueOpts makes an enqueue idempotent (NewJob.Unique): at most one job
// of a type per key. The job's document id is derived from the type and
// the key (UniqueID), so CouchDB itself refuses the second one: every
// enqueue of the key, from any process and through any node of a cluster,
// writes the same _id, and only one can create it.
type UniqueOpts struct {
	// Key names the job among those of its type: an order id, "user 42's
	// daily digest". Empty means not unique. At most MaxUniqueKeyLen bytes
	// of UTF-8.
	Key string
	// For, when set, makes the key unique per period: one job per key in
	// each period of this length (counted from the Unix epoch, UTC), what
	// ever became of it. Zero: one job per key while it is queued or
	// running; once it is done, failed or cancelled the key is free again,
	// and the next enqueue archives the finished job under another id
	// (ArchiveID) and writes the new one.
	For time.Duration
}

// MaxUniqueKeyLen bounds a unique key, so that the document id stays a
// reasonable length.
const MaxUniqueKeyLen = 256

// ErrDuplicate is what Enqueue returns (wrapped, together with the job
// that holds the key) when a unique job is already queued or running, or
// already enqueued in the period. It is not a failure: the job exists.
var ErrDuplicate = errors.New("a job with this unique key already exists")

// UniqueID is the document id of the unique job of worker and key
// enqueued at t: "job:unique:<worker>:<key>", and with a period
// "job:unique:<worker>:<key>@<start of the period, RFC 3339 UTC>".
// Applications writing documents by hand get the same guarantee by using
// the same id.
func UniqueID(worker string, u UniqueOpts, t time.Time) string {
	id := "job:unique:" + worker + ":" + u.Key
	if u.For > 0 {
		// Periods count from the Unix epoch (time.Truncate counts from
		// year 1, which shifts periods that do not divide a day).
		start := time.Unix(0, t.UnixNano()/int64(u.For)*int64(u.For)).UTC()
		id += "@" + start.Format(time.RFC3339)
	}
	return id
}

// HoldsPeriod reports whether it is a unique job with a period (its id is
// UniqueID's with the period's start), whose document holds the key for
// the rest of the period whatever became of the job: deleted, the key is
// free again.
func HoldsPeriod(it *WorkItem) bool {
	return it.UniqueKey != "" && strings.HasPrefix(it.ID, "job:unique:"+it.Worker+":"+it.UniqueKey+"@")
}

// ArchiveID is where a finished unique job is kept when its key is
// enqueued again: its id, "~", and the revision it finished with.
func ArchiveID(id, rev string) string { return id + "~" + rev }

// validate checks unique options for a job of worker.
func (u UniqueOpts) validate(worker string) error {
	switch {
	case u.Key == "" && u.For != 0:
		return fmt.Errorf("%w: a unique period needs a unique key", ErrInvalidJob)
	case u.Key == "":
		return nil
	case len(u.Key) > MaxUniqueKeyLen:
		return fmt.Errorf("%w: unique key is %d bytes, at most %d", ErrInvalidJob, len(u.Key), MaxUniqueKeyLen)
	case !utf8.ValidString(u.Key):
		return fmt.Errorf("%w: unique key is not valid UTF-8", ErrInvalidJob)
	case strings.Contains(worker, ":"):
		// The id would be ambiguous: type "a:b" key "c" is type "a" key "b:c".
		return fmt.Errorf("%w: a unique job's type cannot contain ':' (got %q)", ErrInvalidJob, worker)
	case u.For < 0:
		return fmt.Errorf("%w: unique period must be positive, got %s", ErrInvalidJob, u.For)
	case u.For > 0 && u.For < time.Second:
		return fmt.Errorf("%w: unique period must be at least 1s, got %s", ErrInvalidJob, u.For)
	}
	return nil
}

// uniqueRounds bounds how many times one enqueue of a unique key retries
// when the key changes hands under it (finished, archived, rewritten).
const uniqueRounds = 5

// putJob writes it (over it.Rev when set) with w = a majority; accepted
// reports a write stored on fewer than a majority of the copies (202).
func (c *Client) putJob(ctx context.Context, it *WorkItem) (rev string, accepted bool, err error) {
	tctx, trace := c.traced(ctx)
	rev, err = c.db.Put(tctx, it.ID, it, c.writeOpts()...)
	return rev, err == nil && trace.uncommitted(it.ID, rev), err
}

// resolveUnique finishes the enqueue of a unique job whose first write
// answered rev, accepted, err. A write that created the job (or, on a
// cluster, one stored on fewer than a majority that nothing contests) is
// the new job. Otherwise the key is held: by a queued or running job, or
// any job in the period, which is returned as a duplicate; or by a
// finished job, which is archived (ArchiveID) and written over.
func (c *Client) resolveUnique(ctx context.Context, it *WorkItem, u UniqueOpts, rev string, accepted bool, err error) EnqueueResult {
	fail := func(format string, args ...any) EnqueueResult {
		return EnqueueResult{Err: fmt.Errorf("enqueueing unique %s job %s: "+format, append([]any{it.Worker, it.ID}, args...)...)}
	}
	parent := ""
	for range uniqueRounds {
		switch {
		case err == nil && !accepted:
			it.Rev = rev
			return EnqueueResult{Item: it}
		case err == nil:
			// Stored on fewer than a majority: another enqueue of the key
			// through another node may have reached the others.
			alone, serr := c.HeldWriteStands(ctx, it.ID, parent, rev)
			if serr != nil {
				return fail("stored on fewer than a majority of the copies, and reading it back: %w", serr)
			}
			if alone {
				it.Rev = rev
				return EnqueueResult{Item: it}
			}
		case !isStatus(err, http.StatusConflict):
			return fail("%w", refusedJob(err))
		}
		existing, gerr := c.Get(ctx, it.ID)
		switch {
		case errors.Is(gerr, ErrNotFound):
			parent = "" // deleted in between: create it again
		case gerr != nil:
			return fail("reading the job that holds the key: %w", gerr)
		case rev != "" && existing.Rev == rev && c.onlyLeaf(ctx, it.ID, rev):
			// Our own write: stored on fewer than a majority at first and
			// not shown to stand (a member may not read _membership), it
			// is now the job's only leaf on a majority. Without this the
			// enqueue reported its own job as the duplicate.
			it.Rev = rev
			return EnqueueResult{Item: existing}
		case existing.Worker != it.Worker:
			return fail("the id is held by a %s job", existing.Worker)
		case u.For > 0 || !existing.Status.Terminal():
			return EnqueueResult{Item: existing, Duplicate: true}
		default:
			if aerr := c.archive(ctx, existing); aerr != nil {
				return fail("archiving the finished job that held the key: %w", aerr)
			}
			parent = existing.Rev
		}
		it.Rev = parent
		rev, accepted, err = c.putJob(ctx, it)
	}
	return fail("the key changed hands %d times while enqueueing; try again", uniqueRounds)
}

// archive copies a finished unique job to ArchiveID, so that enqueueing its
// key again loses nothing: the copy keeps its result and history. A copy
// that already exists (another enqueue archived it) is fine.
func (c *Client) archive(ctx context.Context, old *WorkItem) error {
	cp := old.Clone()
	cp.ID, cp.Rev = ArchiveID(old.ID, old.Rev), ""
	c.record(cp, EventArchived, c.cfg.Actor, "archived from "+old.ID+" when its unique key was enqueued again")
	if _, err := c.db.Put(ctx, cp.ID, cp, c.writeOpts()...); err != nil && !isStatus(err, http.StatusConflict) {
		return err
	}
	return nil
}

// onlyLeaf reports whether rev is the job's one live leaf, read from a
// majority of the copies: a write of ours that no other enqueue of the key
// competes with.
func (c *Client) onlyLeaf(ctx context.Context, id, rev string) bool {
	leaves, err := c.Leaves(ctx, id)
	return err == nil && whole(leaves, rev)
}
