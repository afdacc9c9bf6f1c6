package protocol

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-kivik/kivik/v4"
	"github.com/google/uuid"
)

// NewJob describes a job to enqueue.
type NewJob struct {
	// Worker is the job type (required).
	Worker string
	// Payload is handed to the handler: any value encoding/json accepts, or
	// a json.RawMessage (which must be valid JSON).
	Payload any
	// At schedules the job; the zero time means due now.
	At time.Time
	// MaxAttempts overrides the workers' default for this job; 0 keeps it,
	// or takes the enqueuing client's Config.MaxAttempts when that is set.
	MaxAttempts int
	// Priority is 1 (runs first) to 5 (last); 0 is PriorityDefault (3).
	Priority int
	// ID sets the document id; empty picks a time-ordered one (NewID).
	ID string
	// Unique makes the enqueue idempotent: at most one job of this type
	// per key (see UniqueOpts). The id is then derived from the key, so ID
	// must be empty.
	Unique UniqueOpts
	// Site names the job's owner, the one site whose workers may run it,
	// in a database of several sites (sites.go). Empty means the
	// enqueueing client's site (Config.Site), else the default site. A
	// site the sites document does not list is refused; in a database
	// with no sites document (a producer not linked yet) the job is
	// stored, no worker there runs it, and the client logs a warning
	// once.
	Site string
	// Trace is the W3C trace context the job's run continues (see
	// WorkItem.Trace); an enqueue hook (Config.BeforeEnqueue) such as
	// package otelcouchq's sets it.
	Trace map[string]string
	// Extra holds fields of the application's own, stored at the top
	// level of the document beside couchq's (a tenant, say) and read back
	// with WorkItem.Extra; each value is encoded with encoding/json. Names
	// couchq uses, and names starting with '_', are refused.
	Extra map[string]any
	// After lists the jobs this one waits for (flow.go): it is enqueued
	// waiting, and no worker claims it until every one has finished. Each
	// must exist when it is enqueued (or come earlier in the same
	// EnqueueMany), so dependencies never form a cycle.
	After []string
	// OnDependencyFailure is what a job of After failing for good (or
	// being cancelled) does to this one: DependencyCancel (the default)
	// cancels it, DependencyRun runs it anyway once all have finished.
	OnDependencyFailure string

	// childOf is the running job whose handler enqueues this one
	// (EnqueueChild), stored as child_of.
	childOf string
}

// NewID returns a time-ordered job id ("job:" + a UUIDv7): CouchDB appends
// sequential ids to its b-trees faster than random ones, and ids sort in
// enqueue order, which keeps jobs due at the same time first-in first-out.
func NewID() string {
	id, err := uuid.NewV7()
	if err != nil {
		// NewV7 fails only when the system's random source does.
		id = uuid.New()
	}
	return "job:" + id.String()
}

// documentIDPrefixes start the ids of couchq's own documents, which a job
// must not take: a job stored there would be read (and written over) as
// that document, and that document could not be made.
var documentIDPrefixes = []string{
	controlPrefix, workerIDPrefix, requestPrefix, periodicPrefix,
	"site:", "ratelimit:", "runslot:", "slot:", "sequence:",
}

// checkJobID refuses an id a job cannot have: CouchDB's own (_design/,
// _local/: no view lists them, so the job would never run) and couchq's.
func checkJobID(id string) error {
	switch {
	case id == "":
		return nil
	case strings.HasPrefix(id, "_"):
		return fmt.Errorf("%w: id %q: an id starting with _ is CouchDB's (design and local documents), never a job's", ErrInvalidJob, id)
	case id == SitesDocID:
		return fmt.Errorf("%w: id %q is the sites document's", ErrInvalidJob, id)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: id %q is not valid UTF-8", ErrInvalidJob, id)
	case HasControl(id):
		return fmt.Errorf("%w: id %q contains control characters", ErrInvalidJob, id)
	}
	for _, p := range documentIDPrefixes {
		if strings.HasPrefix(id, p) {
			return fmt.Errorf("%w: id %q: ids starting with %q are couchq's own documents', not jobs'", ErrInvalidJob, id, p)
		}
	}
	return nil
}

// item turns j into the document to store.
func (c *Client) item(j NewJob) (*WorkItem, error) {
	if j.Worker == "" {
		return nil, fmt.Errorf("%w: worker (the job type) is required", ErrInvalidJob)
	}
	if !utf8.ValidString(j.Worker) {
		// JSON would store it with U+FFFD in place of the bad bytes: a job
		// of a type no worker asked for.
		return nil, fmt.Errorf("%w: worker (the job type) %q is not valid UTF-8", ErrInvalidJob, j.Worker)
	}
	if HasControl(j.Worker) {
		return nil, fmt.Errorf("%w: worker (the job type) %q contains control characters", ErrInvalidJob, j.Worker)
	}
	if j.MaxAttempts < 0 || j.MaxAttempts > math.MaxInt32 {
		return nil, fmt.Errorf("%w: max attempts must be from 0 (the default) to %d, got %d", ErrInvalidJob, math.MaxInt32, j.MaxAttempts)
	}
	var payload json.RawMessage
	switch p := j.Payload.(type) {
	case nil:
	case json.RawMessage:
		if !json.Valid(p) {
			return nil, fmt.Errorf("%w: payload is not valid JSON", ErrInvalidJob)
		}
		payload = p
	default:
		b, err := json.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("%w: encoding payload: %w", ErrInvalidJob, err)
		}
		payload = b
	}
	date := ToUnix(j.At)
	if math.IsNaN(date) || !j.At.IsZero() && (j.At.Year() < 1 || j.At.Year() > 9999) {
		// Past year 9999 (or before year 1) Unix microseconds overflow,
		// and the job would be stored due at a date it was not given.
		return nil, fmt.Errorf("%w: invalid time %v: want a time from year 1 to 9999", ErrInvalidJob, j.At)
	}
	if j.Priority != 0 && (j.Priority < PriorityHighest || j.Priority > PriorityLowest) {
		return nil, fmt.Errorf("%w: priority must be from %d (runs first) to %d, or 0 for the default (%d), got %d",
			ErrInvalidJob, PriorityHighest, PriorityLowest, PriorityDefault, j.Priority)
	}
	if err := j.Unique.validate(j.Worker); err != nil {
		return nil, err
	}
	site := cmp.Or(j.Site, c.cfg.Site)
	if site != "" && !ValidSiteName(site) {
		return nil, fmt.Errorf("%w: site %q: want %s", ErrInvalidJob, site, SiteNameRule)
	}
	id := j.ID
	if err := checkJobID(id); err != nil {
		return nil, err
	}
	switch {
	case j.Unique.Key != "" && id != "":
		return nil, fmt.Errorf("%w: a unique job's id is derived from its key: set ID or Unique, not both", ErrInvalidJob)
	case j.Unique.Key != "":
		id = UniqueID(j.Worker, j.Unique, c.now())
	case id == "":
		id = NewID()
	}
	var trace map[string]string
	if len(j.Trace) > 0 { // an empty one is no trace context
		if err := checkTrace(j.Trace); err != nil {
			return nil, fmt.Errorf("%w: trace %w", ErrInvalidJob, err)
		}
		trace = maps.Clone(j.Trace)
	}
	extra, err := extraFields(j.Extra)
	if err != nil {
		return nil, err
	}
	maxAttempts := j.MaxAttempts
	if maxAttempts == 0 {
		maxAttempts = c.cfg.EnqueueMaxAttempts
	}
	it := &WorkItem{
		ID: id, Worker: j.Worker, Date: date, Payload: nonNull(payload), Status: StatusQueued,
		MaxAttempts: maxAttempts, CreatedAt: ToUnix(c.now()), UniqueKey: j.Unique.Key, Priority: j.Priority,
		Site: site, Trace: trace, ChildOf: j.childOf, extra: extra,
	}
	if err := c.dependencies(it, j); err != nil {
		return nil, err
	}
	c.record(it, "enqueued", c.cfg.Actor, "")
	return it, nil
}

// traceparentRE is a W3C traceparent header's value.
var traceparentRE = regexp.MustCompile(`^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// checkTrace refuses the trace contexts the design document's validation
// refuses (a given trace field must name a well-formed traceparent), so
// that the Go client stores none and the decoder reads none either.
func checkTrace(tr map[string]string) error {
	for k := range tr {
		if k != "traceparent" && k != "tracestate" {
			return fmt.Errorf("may hold only traceparent and tracestate, got %q", k)
		}
	}
	tp, ok := tr["traceparent"]
	if !ok {
		return errors.New("needs a traceparent: the W3C traceparent of the enqueue")
	}
	if !traceparentRE.MatchString(tp) || strings.HasPrefix(tp, "ff-") || tp[3:35] == strings.Repeat("0", 32) || tp[36:52] == strings.Repeat("0", 16) {
		return fmt.Errorf("traceparent must be a W3C traceparent (version-traceid-parentid-flags in lower-case hex, ids not all zero), got %q", tp)
	}
	if len(tr["tracestate"]) > 8192 {
		return errors.New("tracestate is longer than 8192 characters")
	}
	return nil
}

// extraFields encodes NewJob.Extra, refusing names couchq reads itself.
func extraFields(fields map[string]any) (map[string]json.RawMessage, error) {
	if len(fields) == 0 {
		return nil, nil
	}
	out := make(map[string]json.RawMessage, len(fields))
	for name, v := range fields {
		if name == "" || knownField(name) || strings.HasPrefix(name, "_") {
			return nil, fmt.Errorf("%w: extra field %q: the name is couchq's (or CouchDB's, starting with '_')", ErrInvalidJob, name)
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("%w: encoding extra field %q: %w", ErrInvalidJob, name, err)
		}
		out[name] = b
	}
	return out, nil
}

// beforeEnqueue runs the client's enqueue hooks (Config.BeforeEnqueue) on
// a copy of j, whose maps are copied too so that a hook that adds to them
// does not change the caller's.
func (c *Client) beforeEnqueue(ctx context.Context, j NewJob) (NewJob, error) {
	if len(c.cfg.BeforeEnqueue) == 0 {
		return j, nil
	}
	j.Trace = maps.Clone(j.Trace)
	j.Extra = maps.Clone(j.Extra)
	for i, hook := range c.cfg.BeforeEnqueue {
		if err := hook(ctx, &j); err != nil {
			return j, fmt.Errorf("enqueueing %s job: refused by enqueue hook %d: %w", j.Worker, i, err)
		}
	}
	return j, nil
}

// Enqueue stores one job and returns it as stored. For a unique job whose
// key is taken (see UniqueOpts) it returns the job that holds the key and
// an error wrapping ErrDuplicate: the job exists, nothing was written.
func (c *Client) Enqueue(ctx context.Context, j NewJob) (*WorkItem, error) {
	j, err := c.beforeEnqueue(ctx, j)
	if err != nil {
		return nil, err
	}
	it, err := c.item(j)
	if err != nil {
		return nil, err
	}
	if err := c.checkSites(ctx, []*WorkItem{it})[0]; err != nil {
		return nil, err
	}
	if len(it.After) > 0 {
		if errs := c.checkDependencies(ctx, []*WorkItem{it}); errs[0] != nil {
			return nil, errs[0]
		}
		defer c.settleEnqueued(ctx, []*WorkItem{it})
	}
	if j.Unique.Key != "" {
		rev, accepted, err := c.putJob(ctx, it)
		r := c.resolveUnique(ctx, it, j.Unique, rev, accepted, err)
		if r.Duplicate {
			return r.Item, fmt.Errorf("enqueueing %s job with unique key %q: %w: %s", j.Worker, j.Unique.Key, ErrDuplicate, r.Item.ID)
		}
		return r.Item, r.Err
	}
	rev, err := c.db.Put(ctx, it.ID, it, c.writeOpts()...)
	if err != nil {
		return nil, fmt.Errorf("enqueueing %s job %s: %w", it.Worker, it.ID, refusedJob(err))
	}
	it.Rev = rev
	return it, nil
}

// refusedJob marks an enqueue the server refused for the job itself as
// ErrInvalidJob, keeping the server's error (and its HTTP status): a
// document its validation function refuses (403 "invalid WorkItem") or
// one larger than it takes (413, max_document_size; for a request of
// several jobs, max_http_request_size). Any other error is returned as
// it is: a 403 for a missing role is no fault of the job.
func refusedJob(err error) error {
	switch {
	case err == nil:
		return nil
	case isStatus(err, http.StatusRequestEntityTooLarge):
		return fmt.Errorf("%w: larger than the server takes (its max_document_size, or max_http_request_size for a request of several jobs): %w", ErrInvalidJob, err)
	case isStatus(err, http.StatusForbidden) && strings.Contains(err.Error(), "invalid WorkItem"):
		return fmt.Errorf("%w: %w", ErrInvalidJob, err)
	case isStatus(err, http.StatusConflict):
		// An id of the caller's own (NewJob.ID) that a document has.
		return fmt.Errorf("a document with this id already exists: %w", err)
	}
	return err
}

// CheckJobs makes every check EnqueueMany would make of jobs, without
// writing anything: each job as Enqueue checks it, its site, the jobs it
// waits for (an earlier one of jobs counts, as in EnqueueMany), and that
// no document already has the id it names. errs[i] is job i's refusal;
// err is for the checks as a whole (the server could not be read). So a
// caller can refuse a whole set of jobs for one bad one (couchq enqueue
// --file). Enqueue hooks are not run.
func (c *Client) CheckJobs(ctx context.Context, jobs []NewJob) (errs []error, err error) {
	errs = make([]error, len(jobs))
	items := make([]*WorkItem, len(jobs))
	var named []string
	for i, j := range jobs {
		if items[i], errs[i] = c.item(j); errs[i] == nil && j.ID != "" {
			named = append(named, j.ID)
		}
	}
	if len(named) > 0 {
		stored, err := c.readJobs(ctx, named, false)
		if err != nil {
			return nil, fmt.Errorf("checking %d jobs' ids: %w", len(named), err)
		}
		for i, j := range jobs {
			if errs[i] == nil && j.ID != "" && stored[j.ID].exists && !stored[j.ID].deleted {
				errs[i] = fmt.Errorf("%w: a document with id %s already exists", ErrInvalidJob, j.ID)
			}
		}
	}
	var kept []*WorkItem
	var index []int
	for i, it := range items {
		if errs[i] == nil {
			kept, index = append(kept, it), append(index, i)
		}
	}
	for k, e := range c.checkSites(ctx, kept) {
		errs[index[k]] = e
	}
	refused := make([]error, len(kept))
	for k, i := range index {
		refused[k] = errs[i]
	}
	if slices.ContainsFunc(kept, func(it *WorkItem) bool { return len(it.After) > 0 }) {
		for k, e := range c.checkDependencies(ctx, kept, refused...) {
			errs[index[k]] = cmp.Or(errs[index[k]], e)
		}
	}
	return errs, nil
}

// EnqueueResult is the outcome for one job of EnqueueMany.
type EnqueueResult struct {
	// Item is the job as stored; for a duplicate, the job that holds the
	// unique key.
	Item *WorkItem
	// Duplicate reports a unique job whose key was taken: nothing was
	// written, and Item is the existing job.
	Duplicate bool
	Err       error
}

// EnqueueMany stores jobs with one _bulk_docs request. Each job succeeds or
// fails on its own; the error is only for the request as a whole.
func (c *Client) EnqueueMany(ctx context.Context, jobs []NewJob) ([]EnqueueResult, error) {
	results := make([]EnqueueResult, len(jobs))
	docs := make([]any, 0, len(jobs))
	index := make([]int, 0, len(jobs))
	jobs = slices.Clone(jobs) // the hooks' changes are not the caller's
	for i, j := range jobs {
		j, err := c.beforeEnqueue(ctx, j)
		if err != nil {
			results[i].Err = err
			continue
		}
		jobs[i] = j
		it, err := c.item(j)
		if err != nil {
			results[i].Err = err
			continue
		}
		results[i].Item = it
		docs = append(docs, it)
		index = append(index, i)
	}
	if len(docs) == 0 {
		return results, nil
	}
	docs, index = c.checkMany(ctx, results, docs, index)
	if len(docs) == 0 {
		return results, nil
	}
	tctx, trace := c.traced(ctx)
	bulk, err := c.db.BulkDocs(tctx, docs, c.bulkOpts()...)
	if err != nil {
		return nil, fmt.Errorf("enqueueing %d jobs: %w", len(docs), refusedJob(err))
	}
	ids := make([]string, len(index))
	for k, i := range index {
		ids[k] = results[i].Item.ID
	}
	for k, r := range alignBulk(ids, bulk, nil) {
		i := index[k]
		if u := jobs[i].Unique; u.Key != "" {
			// A taken key (409), or a write a cluster stored on too few
			// copies, is settled one job at a time.
			accepted := r.Error == nil && trace.uncommitted(r.ID, r.Rev)
			results[i] = c.resolveUnique(ctx, results[i].Item, u, r.Rev, accepted, r.Error)
			continue
		}
		if r.Error != nil {
			results[i] = EnqueueResult{Err: fmt.Errorf("enqueueing %s job %s: %w", jobs[i].Worker, r.ID, refusedJob(r.Error))}
			continue
		}
		results[i].Item.Rev = r.Rev
	}
	var waiting []*WorkItem
	for _, r := range results {
		if r.Err == nil && r.Item != nil && r.Item.Rev != "" && r.Item.Status == StatusWaiting {
			waiting = append(waiting, r.Item)
		}
	}
	c.settleEnqueued(ctx, waiting)
	return results, nil
}

// writeOpts makes a single-document write wait for a majority of the
// copies: CouchDB's 201 then means the write is committed (see cluster.go).
// With Config.ReadYourWrites it waits for every copy.
func (c *Client) writeOpts() []kivik.Option {
	if c.n > 1 {
		return []kivik.Option{kivik.Param("w", c.writeQuorum())}
	}
	return nil
}

// writeQuorum is the w of every write: a majority, or all n copies for a
// client that reads its own writes.
func (c *Client) writeQuorum() int {
	if c.cfg.ReadYourWrites {
		return c.n
	}
	return c.quorum()
}

// bulkOpts does the same for _bulk_docs, where CouchDB reads w from the
// query string only (kivik would put a plain Param into the body).
func (c *Client) bulkOpts() []kivik.Option {
	if c.n > 1 {
		return []kivik.Option{queryParam{key: "w", value: fmt.Sprint(c.writeQuorum())}}
	}
	return nil
}
