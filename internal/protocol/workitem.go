package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// DocType is the "type" of every job document.
const DocType = "WorkItem"

// Status is where a job stands. A document without a status is queued.
type Status string

// The statuses a WorkItem can have.
const (
	StatusQueued    Status = "queued"
	StatusRunning   Status = "running"
	StatusDone      Status = "done"
	StatusFailed    Status = "failed"
	StatusCancelled Status = "cancelled"
	// StatusWaiting is a job that waits for other jobs (its After, the
	// jobs of the batch it is the callback of, or the children its handler
	// enqueued): no worker claims it until it is released (flow.go).
	StatusWaiting Status = "waiting"
)

// Statuses lists every valid status, in lifecycle order.
func Statuses() []Status {
	return []Status{StatusWaiting, StatusQueued, StatusRunning, StatusDone, StatusFailed, StatusCancelled}
}

// Valid reports whether s is one of Statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusWaiting, StatusQueued, StatusRunning, StatusDone, StatusFailed, StatusCancelled:
		return true
	}
	return false
}

// Terminal reports whether a job in status s will never run again by itself.
func (s Status) Terminal() bool {
	return s == StatusDone || s == StatusFailed || s == StatusCancelled
}

// Event is one entry of a job's activity log.
type Event struct {
	// At is when it happened, RFC 3339 in UTC.
	At string `json:"at"`
	// Event names the transition: enqueued, claimed, done, failed, ...
	Event string `json:"event"`
	// By is the actor: a claimant (host/pid/worker-id) or "cli".
	By string `json:"by,omitempty"`
	// Attempt is the job's attempt count when it happened.
	Attempt int `json:"attempt,omitempty"`
	// Error is the error that caused the transition, if any.
	Error string `json:"error,omitempty"`
}

// WorkItem is a job document. The JSON field names are a public contract:
// applications write these documents straight into CouchDB. Fields couchq
// does not know are kept as they are on every write couchq makes.
type WorkItem struct {
	ID  string
	Rev string

	// Worker is the job type; workers run the types they are configured for.
	Worker string
	// Date is when the job is due, in Unix seconds; 0 means now.
	Date float64
	// Payload is handed to the handler as it is.
	Payload json.RawMessage

	Claimed    bool
	ClaimedBy  string
	ClaimedAt  float64
	LeaseUntil float64

	// Status is never empty after decoding: a missing status reads as queued.
	Status      Status
	Attempts    int
	MaxAttempts int // 0 means the configured default
	// Priority is 1 (runs first) to 5 (last); 0 means PriorityDefault.
	Priority  int
	LastError string
	Result    json.RawMessage
	CreatedAt float64
	// StartedAt is when the job was first claimed (wait time ends there).
	StartedAt  float64
	FinishedAt float64
	History    []Event
	// UniqueKey is the key of a unique job (NewJob.Unique); its ID is
	// derived from it (UniqueID).
	UniqueKey string
	// Site is the job's owner among several sites (sites.go): the one
	// site whose workers may run it. Empty means the default site of the
	// sites document, or, in a database without one, any worker.
	Site string
	// Progress is how far the running (or last) attempt got, as its handler
	// or agent last reported it; nil when none did. It is kept across
	// attempts, so a retry may resume from it, until the next report.
	Progress *Progress
	// Trace is the W3C trace context of the code that enqueued the job,
	// so that its run joins the same trace: "traceparent" (required when
	// Trace is set) and "tracestate", as in the HTTP headers of that name.
	// Any producer may write it; package otelcouchq writes and reads it.
	Trace map[string]string

	// After lists the jobs this one waits for (NewJob.After): it is
	// waiting until every one of them is finished.
	After []string
	// OnDependencyFailure is what happens when a job of After fails for
	// good or is cancelled: DependencyCancel (also for "") or DependencyRun.
	OnDependencyFailure string
	// ReleasedAt is when a waiting job was released (its dependencies
	// finished); 0 while it waits, or for a job that never waited. A
	// document with After and no ReleasedAt is waiting whatever its
	// status says (a hand-written one).
	ReleasedAt float64
	// Batch is the batch the job belongs to (EnqueueBatch).
	Batch string
	// CallbackOf is, for a batch's callback job, the batch it waits for;
	// BatchSize is how many jobs that batch has.
	CallbackOf string
	BatchSize  int
	// Continuation is set on a job whose handler enqueued children and
	// waits for them (AwaitChildren): its next run is its continuation.
	Continuation bool
	// ChildOf is, for a job a running handler enqueued as its child
	// (EnqueueChild), the parent's id, which the child's id starts with.
	ChildOf string

	// Conflicts lists conflicting revisions when the document was read with
	// conflicts=true. It is never written back.
	Conflicts []string

	extra map[string]json.RawMessage
}

// Progress is what a handler or agent reported of a running job: Done
// out of Total units (Total 0 when unknown), with a Note ("page 40") and
// when it was reported (At, Unix seconds). Stored as the document's
// "progress" field, {done, total, note, at}.
type Progress struct {
	Done  int     `json:"done"`
	Total int     `json:"total"`
	Note  string  `json:"note,omitempty"`
	At    float64 `json:"at,omitempty"`
}

// MaxProgressNote bounds a progress note, in bytes: longer ones are cut
// (it is rewritten with every report, so it must stay small).
const MaxProgressNote = 200

// NewProgress checks a report and returns it stamped with at; the note is
// cut to MaxProgressNote bytes.
func NewProgress(done, total int, note string, at time.Time) (*Progress, error) {
	switch {
	case done < 0 || total < 0 || done > math.MaxInt32 || total > math.MaxInt32:
		return nil, fmt.Errorf("%w: progress %d of %d: done and total are whole numbers from 0 to 2147483647", ErrInvalidJob, done, total)
	case total > 0 && done > total:
		return nil, fmt.Errorf("%w: progress %d of %d: done is more than the total", ErrInvalidJob, done, total)
	}
	if len(note) > MaxProgressNote {
		note = strings.ToValidUTF8(note[:MaxProgressNote-3], "") + "..."
	}
	return &Progress{Done: done, Total: total, Note: note, At: ToUnix(at)}, nil
}

// String reads "40/120 (33%) page 40", "40" without a total.
func (p *Progress) String() string {
	if p == nil {
		return ""
	}
	s := fmt.Sprintf("%d", p.Done)
	if p.Total > 0 {
		s = fmt.Sprintf("%d/%d (%d%%)", p.Done, p.Total, int(math.Floor(100*float64(p.Done)/float64(p.Total))))
	}
	if p.Note != "" {
		s += " " + p.Note
	}
	return s
}

// DueAt is the time the job becomes due (the zero Unix time for "now").
func (w *WorkItem) DueAt() time.Time { return FromUnix(w.Date) }

// Lease returns when the current claim's lease runs out.
func (w *WorkItem) Lease() time.Time { return FromUnix(w.LeaseUntil) }

// Conceded reports whether the job holds a claim its claimant gave up
// without running it (see EventClaimConceded): its lease ended when it was
// made, and the sweeper requeues it without charging an attempt.
// Entries that settling a conflict appends after it (claim-withdrawn) do
// not hide it.
func (w *WorkItem) Conceded() bool {
	if !w.Claimed {
		return false
	}
	for i := len(w.History) - 1; i >= 0; i-- {
		if e := w.History[i].Event; e != EventClaimWithdrawn {
			return e == EventClaimConceded
		}
	}
	return false
}

// Extra returns a field couchq does not model, as raw JSON.
func (w *WorkItem) Extra(name string) (json.RawMessage, bool) {
	v, ok := w.extra[name]
	return v, ok
}

// Clone returns a deep enough copy for a protocol write: slices that a
// transition appends to or replaces are copied.
func (w *WorkItem) Clone() *WorkItem {
	c := *w
	c.History = append([]Event(nil), w.History...)
	c.After = append([]string(nil), w.After...)
	c.Conflicts = nil
	return &c
}

// wireItem is the stored shape of the fields couchq knows.
type wireItem struct {
	ID          string            `json:"_id,omitempty"`
	Rev         string            `json:"_rev,omitempty"`
	Type        string            `json:"type"`
	Worker      string            `json:"worker"`
	Date        float64           `json:"date"`
	Payload     json.RawMessage   `json:"payload,omitempty"`
	Claimed     bool              `json:"claimed"`
	ClaimedBy   string            `json:"claimed_by,omitempty"`
	ClaimedAt   float64           `json:"claimed_at,omitempty"`
	LeaseUntil  float64           `json:"lease_until,omitempty"`
	Status      Status            `json:"status"`
	Attempts    int               `json:"attempts"`
	MaxAttempts int               `json:"max_attempts,omitempty"`
	LastError   string            `json:"last_error,omitempty"`
	Result      json.RawMessage   `json:"result,omitempty"`
	CreatedAt   float64           `json:"created_at,omitempty"`
	StartedAt   float64           `json:"started_at,omitempty"`
	FinishedAt  float64           `json:"finished_at,omitempty"`
	History     []Event           `json:"history,omitempty"`
	UniqueKey   string            `json:"unique_key,omitempty"`
	Priority    int               `json:"priority,omitempty"`
	Site        string            `json:"site,omitempty"`
	Trace       map[string]string `json:"trace,omitempty"`
	Progress    *Progress         `json:"progress,omitempty"`
	After       []string          `json:"after,omitempty"`
	OnDepFail   string            `json:"on_dependency_failure,omitempty"`
	ReleasedAt  float64           `json:"released_at,omitempty"`
	Batch       string            `json:"batch,omitempty"`
	CallbackOf  string            `json:"callback_of,omitempty"`
	BatchSize   int               `json:"batch_size,omitempty"`
	Continue    bool              `json:"continuation,omitempty"`
	ChildOf     string            `json:"child_of,omitempty"`
}

// knownField reports whether UnmarshalJSON consumes key; anything else is kept.
func knownField(key string) bool {
	switch key {
	case "_id", "_rev", "_conflicts", "type", "worker", "date", "payload", "claimed", "claimed_by",
		"claimed_at", "lease_until", "status", "attempts", "max_attempts", "last_error", "result",
		"created_at", "started_at", "finished_at", "history", "unique_key", "priority", "site", "trace", "progress",
		"after", "on_dependency_failure", "released_at", "batch", "callback_of", "batch_size", "continuation", "child_of":
		return true
	}
	return false
}

// MarshalJSON writes the known fields and every kept unknown field.
func (w WorkItem) MarshalJSON() ([]byte, error) {
	status := w.Status
	if status == "" {
		status = StatusQueued
	}
	b, err := json.Marshal(wireItem{
		ID: w.ID, Rev: w.Rev, Type: DocType, Worker: w.Worker, Date: w.Date, Payload: w.Payload,
		Claimed: w.Claimed, ClaimedBy: w.ClaimedBy, ClaimedAt: w.ClaimedAt, LeaseUntil: w.LeaseUntil,
		Status: status, Attempts: w.Attempts, MaxAttempts: w.MaxAttempts, LastError: w.LastError,
		Result: w.Result, CreatedAt: w.CreatedAt, StartedAt: w.StartedAt, FinishedAt: w.FinishedAt, History: w.History,
		UniqueKey: w.UniqueKey, Priority: w.Priority, Site: w.Site, Trace: w.Trace, Progress: w.Progress,
		After: w.After, OnDepFail: w.OnDependencyFailure, ReleasedAt: w.ReleasedAt, Batch: w.Batch,
		CallbackOf: w.CallbackOf, BatchSize: w.BatchSize, Continue: w.Continuation, ChildOf: w.ChildOf,
	})
	if err != nil || len(w.extra) == 0 {
		return b, err
	}
	keys := make([]string, 0, len(w.extra))
	for k := range w.extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var buf bytes.Buffer
	buf.Write(b[:len(b)-1])
	for _, k := range keys {
		kb, _ := json.Marshal(k)
		buf.WriteByte(',')
		buf.Write(kb)
		buf.WriteByte(':')
		buf.Write(w.extra[k])
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// UnmarshalJSON decodes a stored document strictly: a field of the wrong
// shape yields a *MalformedError naming it, never a half-decoded job.
func (w *WorkItem) UnmarshalJSON(data []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return &MalformedError{Field: "document", Reason: "is not a JSON object: " + err.Error()}
	}
	if nesting(data) > MaxNesting {
		// As validate_doc_update refuses it: views fail on such a document.
		var id string
		_ = json.Unmarshal(raw["_id"], &id)
		return &MalformedError{ID: id, Field: "document", Reason: fmt.Sprintf("nests objects and arrays more than %d levels deep", MaxNesting)}
	}
	*w = WorkItem{}
	p := fieldParser{raw: raw}
	p.str("_id", &w.ID)
	p.str("_rev", &w.Rev)
	var docType string
	p.str("type", &docType)
	if p.err == nil && docType != DocType {
		p.fail("type", fmt.Sprintf("must be %q, got %q", DocType, docType))
	}
	p.str("worker", &w.Worker)
	if p.err == nil && w.Worker == "" {
		p.fail("worker", "is required: the job type, a non-empty string")
	}
	if p.err == nil && HasControl(w.Worker) {
		p.fail("worker", fmt.Sprintf("must not contain control characters, got %q", w.Worker))
	}
	p.num("date", &w.Date)
	w.Payload = nonNull(raw["payload"])
	p.boolean("claimed", &w.Claimed)
	p.str("claimed_by", &w.ClaimedBy)
	p.time("claimed_at", &w.ClaimedAt)
	p.time("lease_until", &w.LeaseUntil)
	var status string
	p.str("status", &status)
	w.Status = Status(status)
	if w.Status == "" {
		w.Status = StatusQueued
	}
	if p.err == nil && !w.Status.Valid() {
		p.fail("status", fmt.Sprintf("must be one of waiting, queued, running, done, failed, cancelled, got %q", status))
	}
	if p.err == nil && w.Status == StatusRunning && !w.Claimed {
		// couchq never writes one: a running job is claimed. Written by
		// hand, nobody holds it, no lease of it runs out, and it would read
		// running for ever.
		p.fail("status", `is "running" but the job is not claimed ("claimed" is not true): no worker holds it`)
	}
	p.count("attempts", &w.Attempts)
	p.count("max_attempts", &w.MaxAttempts)
	p.str("last_error", &w.LastError)
	w.Result = nonNull(raw["result"])
	p.time("created_at", &w.CreatedAt)
	p.time("started_at", &w.StartedAt)
	p.time("finished_at", &w.FinishedAt)
	p.history(&w.History)
	p.str("unique_key", &w.UniqueKey)
	if p.err == nil && w.UniqueKey != "" && w.ID != "" && !strings.HasPrefix(w.ID, "job:unique:"+w.Worker+":"+w.UniqueKey) {
		// As validate_doc_update has it: a key on any other id promises a
		// uniqueness nothing enforces, and the function refuses every
		// write of such a job, claims included.
		p.fail("unique_key", fmt.Sprintf("needs the id job:unique:%s:%s (got %q)", w.Worker, w.UniqueKey, w.ID))
	}
	if v, ok := raw["priority"]; ok && string(v) != "null" && p.err == nil {
		var f float64
		if json.Unmarshal(v, &f) != nil || f != math.Trunc(f) || f < PriorityHighest || f > PriorityLowest {
			p.fail("priority", fmt.Sprintf("must be a whole number from %d (runs first) to %d, got %s", PriorityHighest, PriorityLowest, describeJSON(v)))
		} else {
			w.Priority = int(f)
		}
	}
	if v, ok := raw["site"]; ok && string(v) != "null" {
		p.str("site", &w.Site)
		if p.err == nil && !ValidSiteName(w.Site) {
			p.fail("site", fmt.Sprintf("must be a site name (%s), got %q", SiteNameRule, w.Site))
		}
	}
	p.trace(&w.Trace)
	p.progress(&w.Progress)
	p.flow(w)
	if c, ok := raw["_conflicts"]; ok {
		_ = json.Unmarshal(c, &w.Conflicts) // informational only
	}
	if p.err != nil {
		p.err.ID = w.ID
		if p.err.ID == "" {
			var id string
			_ = json.Unmarshal(raw["_id"], &id)
			p.err.ID = id
		}
		*w = WorkItem{} // never a half-decoded job
		return p.err
	}
	for k, v := range raw {
		if knownField(k) {
			continue
		}
		// Server-computed members (_revisions, _deleted_conflicts, ...) are
		// rejected by CouchDB on write; attachments are the one to keep.
		if strings.HasPrefix(k, "_") && k != "_attachments" {
			continue
		}
		if w.extra == nil {
			w.extra = map[string]json.RawMessage{}
		}
		w.extra[k] = v
	}
	return nil
}

// HasControl reports whether s holds a control character (U+0000 to
// U+001F, U+007F), which a job type may not: validate_doc_update refuses
// it, as it would break the tables that list the type or reach the
// terminal of the operator who reads it.
func HasControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// MaxNesting is how deep a job may nest objects and arrays, the document
// itself the first level: validate_doc_update refuses deeper ones, since
// CouchDB's and PouchDB's JavaScript engines overflow their stacks on them
// when they index them.
const MaxNesting = 1000

// nesting is how deep the JSON value data nests objects and arrays.
func nesting(data []byte) int {
	depth, deepest, inString, escaped := 0, 0, false, false
	for _, b := range data {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case b == '\\':
				escaped = true
			case b == '"':
				inString = false
			}
		case b == '"':
			inString = true
		case b == '{' || b == '[':
			depth++
			deepest = max(deepest, depth)
		case b == '}' || b == ']':
			depth--
		}
	}
	return deepest
}

func nonNull(v json.RawMessage) json.RawMessage {
	if len(v) == 0 || string(v) == "null" {
		return nil
	}
	return v
}

// fieldParser decodes one field at a time and keeps the first failure.
type fieldParser struct {
	raw map[string]json.RawMessage
	err *MalformedError
}

func (p *fieldParser) fail(field, reason string) {
	if p.err == nil {
		p.err = &MalformedError{Field: field, Reason: reason}
	}
}

// get returns the field's raw value, or nil when it is missing or null.
func (p *fieldParser) get(field string) json.RawMessage {
	if p.err != nil {
		return nil
	}
	return nonNull(p.raw[field])
}

func (p *fieldParser) str(field string, dst *string) {
	if v := p.get(field); v != nil {
		if json.Unmarshal(v, dst) != nil {
			p.fail(field, "must be a string, got "+describeJSON(v))
		}
	}
}

func (p *fieldParser) num(field string, dst *float64) {
	if v := p.get(field); v != nil {
		if json.Unmarshal(v, dst) != nil || math.IsInf(*dst, 0) || math.IsNaN(*dst) {
			p.fail(field, "must be a number of Unix seconds, got "+describeJSON(v))
		}
	}
}

// maxUnixSeconds bounds the times a job records, either way (about
// 3,000 years): CouchDB's _stats reduce squares the durations the ops
// views emit, and a square past 1e308 fails every query of the view.
// validate_doc_update holds writes to the same bound.
const maxUnixSeconds = 1e11

// time is num for a time the job records (not its due date).
func (p *fieldParser) time(field string, dst *float64) {
	if v := p.get(field); v != nil {
		if json.Unmarshal(v, dst) != nil || math.IsInf(*dst, 0) || math.IsNaN(*dst) || math.Abs(*dst) >= maxUnixSeconds {
			p.fail(field, "must be a number of Unix seconds, less than 1e11 either way, got "+describeJSON(v))
		}
	}
}

func (p *fieldParser) boolean(field string, dst *bool) {
	if v := p.get(field); v != nil {
		if json.Unmarshal(v, dst) != nil {
			p.fail(field, "must be a boolean, got "+describeJSON(v))
		}
	}
}

func (p *fieldParser) count(field string, dst *int) {
	v := p.get(field)
	if v == nil {
		return
	}
	var f float64
	if json.Unmarshal(v, &f) != nil || f < 0 || f != math.Trunc(f) || f > math.MaxInt32 {
		p.fail(field, "must be a whole number from 0 to 2147483647, got "+describeJSON(v))
		return
	}
	*dst = int(f)
}

func (p *fieldParser) history(dst *[]Event) {
	if v := p.get("history"); v != nil {
		if json.Unmarshal(v, dst) != nil {
			p.fail("history", "must be an array of {at, event, by, attempt, error}, got "+describeJSON(v))
		}
	}
}

// progress decodes {done, total, note, at} as the design document's
// validate_doc_update checks it.
func (p *fieldParser) progress(dst **Progress) {
	v := p.get("progress")
	if v == nil {
		return
	}
	const want = "must be an object {done, total, note, at}: whole numbers done and total (done at most total when total is above 0), a string note, Unix seconds at; got "
	var fields map[string]json.RawMessage
	if json.Unmarshal(v, &fields) != nil || fields == nil {
		p.fail("progress", want+describeJSON(v))
		return
	}
	sub := fieldParser{raw: fields}
	var pr Progress
	sub.count("done", &pr.Done)
	sub.count("total", &pr.Total)
	sub.str("note", &pr.Note)
	sub.num("at", &pr.At)
	if sub.err != nil || (pr.Total > 0 && pr.Done > pr.Total) {
		p.fail("progress", want+describeJSON(v))
		return
	}
	*dst = &pr
}

// trace decodes the trace context: an object of strings with a
// well-formed traceparent, as the design document's validation requires
// (a job stored while validation was off is quarantined rather than
// claimed and refused).
func (p *fieldParser) trace(dst *map[string]string) {
	v := p.get("trace")
	if v == nil {
		return
	}
	if json.Unmarshal(v, dst) != nil {
		p.fail("trace", `must be an object of strings {"traceparent": ..., "tracestate": ...}, got `+describeJSON(v))
		return
	}
	if err := checkTrace(*dst); err != nil {
		p.fail("trace", err.Error())
	}
}

// flow decodes the workflow fields (flow.go) and reads a queued job that
// names dependencies it was never released from as waiting: a document
// written by hand with an after field and no status waits like one
// couchq enqueued (the due views skip both alike).
func (p *fieldParser) flow(w *WorkItem) {
	if v := p.get("after"); v != nil {
		if json.Unmarshal(v, &w.After) != nil {
			p.fail("after", "must be an array of job ids (non-empty strings), got "+describeJSON(v))
		}
		for _, id := range w.After {
			switch {
			case p.err != nil:
			case id == "":
				p.fail("after", "must be an array of job ids (non-empty strings), got an empty string")
			case id == w.ID:
				p.fail("after", "names the job itself: a job cannot wait for itself")
			}
		}
	}
	p.str("on_dependency_failure", &w.OnDependencyFailure)
	if p.err == nil && !validDependencyPolicy(w.OnDependencyFailure) {
		p.fail("on_dependency_failure", fmt.Sprintf("must be %q or %q, got %q", DependencyCancel, DependencyRun, w.OnDependencyFailure))
	}
	p.time("released_at", &w.ReleasedAt)
	p.str("batch", &w.Batch)
	p.str("callback_of", &w.CallbackOf)
	p.count("batch_size", &w.BatchSize)
	p.boolean("continuation", &w.Continuation)
	p.str("child_of", &w.ChildOf)
	if p.err == nil && w.ChildOf != "" && w.ID != "" && !strings.HasPrefix(w.ID, w.ChildOf+":") {
		p.fail("child_of", fmt.Sprintf("must be the id of the job whose handler enqueued this one, which this job's id starts with (parent:key), got %q", w.ChildOf))
	}
	if p.err == nil && w.Status == StatusQueued && !w.Claimed && w.ReleasedAt == 0 && (len(w.After) > 0 || w.CallbackOf != "") {
		w.Status = StatusWaiting
	}
}

// describeJSON names a raw JSON value's kind, with the value when short.
func describeJSON(v json.RawMessage) string {
	s := strings.TrimSpace(string(v))
	kind := "a value"
	switch {
	case s == "":
		return "nothing"
	case s[0] == '"':
		kind = "a string"
	case s[0] == '{':
		kind = "an object"
	case s[0] == '[':
		kind = "an array"
	case s == "true" || s == "false":
		kind = "a boolean"
	default:
		kind = "a number"
	}
	if len(s) > 40 {
		return kind
	}
	return kind + " " + s
}

// ToUnix converts t to the Unix seconds couchq stores (fractions kept to
// the microsecond, which JSON numbers carry exactly).
func ToUnix(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return math.Round(float64(t.UnixMicro())) / 1e6
}

// FromUnix converts stored Unix seconds back to a time.
func FromUnix(s float64) time.Time {
	switch {
	case s == 0 || math.IsNaN(s):
		return time.Unix(0, 0).UTC()
	case s > maxUnix || math.IsInf(s, 1):
		// Past what Unix microseconds hold (a hand-written 1e300): the
		// end of year 9999, not a date that wrapped into the past.
		return time.Unix(int64(maxUnix), 0).UTC()
	case s < -maxUnix || math.IsInf(s, -1):
		return time.Unix(-int64(maxUnix), 0).UTC()
	}
	return time.UnixMicro(int64(math.Round(s * 1e6))).UTC()
}

// maxUnix is the end of year 9999 in Unix seconds.
const maxUnix = 253402300799
