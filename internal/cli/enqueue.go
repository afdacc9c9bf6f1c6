package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/internal/protocol"
)

// bulkBatch is how many jobs one _bulk_docs request carries.
const bulkBatch = 500

// maxLine bounds one line of a --file (CouchDB's default document limit is 8 MiB).
const maxLine = 16 << 20

// maxReported bounds how many bad lines or failed jobs are listed one by one.
const maxReported = 10

// JobSpec is one job as given on the command line or on a line of --file,
// before its schedule is resolved.
type JobSpec struct {
	Type        string          `json:"type"`
	Worker      string          `json:"worker"`
	Payload     json.RawMessage `json:"payload"`
	At          string          `json:"at"`
	In          string          `json:"in"`
	MaxAttempts *int            `json:"max_attempts"`
	ID          string          `json:"id"`
	UniqueKey   string          `json:"unique_key"`
	UniqueFor   string          `json:"unique_for"`
	Priority    *int            `json:"priority"`
	// After and OnDependencyFailure make the job wait for others (see
	// docs/workflows.md).
	After               []string `json:"after"`
	OnDependencyFailure string   `json:"on_dependency_failure"`
	// Site names the job's owner in a queue of several sites; empty
	// means the command's --site, else the default site.
	Site string `json:"site"`
}

// FileJob is a validated job of a --file and the line it came from.
type FileJob struct {
	Line int
	Job  protocol.NewJob
}

// EnqueueOne stores job, explaining the failures a user can act on. dup
// reports a unique job whose key was taken: it is the existing job.
func EnqueueOne(ctx context.Context, q *protocol.Client, job protocol.NewJob) (it *protocol.WorkItem, dup bool, err error) {
	it, err = q.Enqueue(ctx, job)
	switch {
	case err == nil:
		return it, false, nil
	case errors.Is(err, protocol.ErrDuplicate):
		return it, true, nil
	case errors.Is(err, protocol.ErrInvalidJob):
		return nil, false, &UsageError{Err: err}
	}
	return nil, false, err // a document with the id already there says so
}

// NoteNoSites says on w that jobs for sites were stored in a database
// without a sites document. That is right for a producer not linked yet,
// whose jobs run once its link carries them to their owner, but in a
// database that is not a site nothing ever runs them.
func NoteNoSites(q *protocol.Client, w io.Writer, sites ...string) {
	sites = slices.DeleteFunc(sites, func(s string) bool { return s == "" })
	if len(sites) == 0 {
		return
	}
	if _, haveSites := q.SiteListed(sites[0]); haveSites {
		return // read by the enqueue's own check of the jobs' sites
	}
	fmt.Fprintf(w, "note: this database has no sites: jobs for site %s run only once a link carries them to a database of sites that lists it (couchq sites link); no worker here runs them\n",
		strings.Join(sites, ", "))
}

// Enqueued is a new job as printed with --json.
type Enqueued struct {
	ID        string     `json:"id"`
	Rev       string     `json:"rev"`
	Type      string     `json:"type"`
	DueAt     *time.Time `json:"due_at,omitempty"`
	UniqueKey string     `json:"unique_key,omitempty"`
	// Duplicate: the unique key was taken; this is the existing job.
	Duplicate bool `json:"duplicate,omitempty"`
}

func newEnqueued(it *protocol.WorkItem, dup bool) Enqueued {
	e := Enqueued{ID: it.ID, Rev: it.Rev, Type: it.Worker, UniqueKey: it.UniqueKey, Duplicate: dup}
	if it.Date != 0 {
		due := it.DueAt()
		e.DueAt = &due
	}
	return e
}

// PrintEnqueued prints a new job's id, or says the unique key was taken.
func PrintEnqueued(w io.Writer, it *protocol.WorkItem, dup, asJSON bool) error {
	switch {
	case asJSON:
		return WriteJSON(w, newEnqueued(it, dup))
	case dup:
		_, err := fmt.Fprintf(w, "already queued: %s (%s)\n", it.ID, it.Status)
		return err
	}
	_, err := fmt.Fprintln(w, it.ID)
	return err
}

// CheckTypeName refuses a job type that no couchq worker command could
// run: one with a comma (--type a,b runs two types), surrounding spaces
// (--type trims them) or control characters.
func CheckTypeName(typ string) error {
	switch {
	case typ == "":
		return errors.New("the job type is empty")
	case strings.Contains(typ, ","):
		return fmt.Errorf("job type %q has a comma: couchq worker --type a,b runs two types, so no worker command would run it", typ)
	case strings.TrimSpace(typ) != typ:
		return fmt.Errorf("job type %q has surrounding spaces, which couchq worker --type trims: no worker command would run it", typ)
	case protocol.HasControl(typ):
		return fmt.Errorf("job type %q contains control characters", typ)
	}
	return nil
}

// NewJob validates s and turns it into a protocol.NewJob; errors name the
// JSON field at fault.
func (s JobSpec) NewJob(now time.Time) (protocol.NewJob, error) {
	job := protocol.NewJob{Worker: s.Type, ID: s.ID, Unique: protocol.UniqueOpts{Key: s.UniqueKey}}
	if s.Worker != "" {
		if s.Type != "" && s.Type != s.Worker {
			return job, fmt.Errorf(`"type" %q and "worker" %q disagree: give one of them`, s.Type, s.Worker)
		}
		job.Worker = s.Worker
	}
	if job.Worker == "" {
		return job, errors.New(`"type" is required: the job type, e.g. "email"`)
	}
	if err := CheckTypeName(job.Worker); err != nil {
		return job, fmt.Errorf(`invalid "type": %w`, err)
	}
	if strings.HasPrefix(s.ID, "_") {
		return job, fmt.Errorf(`invalid "id" %q: ids starting with _ are reserved by CouchDB`, s.ID)
	}
	if s.ID != "" && s.UniqueKey != "" {
		return job, errors.New(`give "id" or "unique_key", not both: a unique job's id is derived from its key`)
	}
	if s.UniqueFor != "" {
		d, err := time.ParseDuration(s.UniqueFor)
		if err != nil || d < time.Second {
			return job, fmt.Errorf(`invalid "unique_for" %q: want a duration of at least 1s, such as 1h or 24h`, s.UniqueFor)
		}
		if s.UniqueKey == "" {
			return job, errors.New(`"unique_for" needs a "unique_key"`)
		}
		job.Unique.For = d
	}
	if len(s.UniqueKey) > protocol.MaxUniqueKeyLen {
		return job, fmt.Errorf(`"unique_key" is %d bytes, at most %d`, len(s.UniqueKey), protocol.MaxUniqueKeyLen)
	}
	if s.UniqueKey != "" && strings.Contains(job.Worker, ":") {
		return job, fmt.Errorf(`"type" %q cannot contain ':' in a unique job`, job.Worker)
	}
	if s.Priority != nil {
		if *s.Priority < protocol.PriorityHighest || *s.Priority > protocol.PriorityLowest {
			return job, fmt.Errorf(`invalid "priority" %d: want 1 (runs first) to 5 (last)`, *s.Priority)
		}
		job.Priority = *s.Priority
	}
	if s.MaxAttempts != nil {
		if *s.MaxAttempts < 0 {
			return job, fmt.Errorf("invalid max_attempts %d: must be >= 0", *s.MaxAttempts)
		}
		job.MaxAttempts = *s.MaxAttempts
	}
	if len(s.Payload) > 0 && string(s.Payload) != "null" {
		job.Payload = s.Payload
	}
	if s.OnDependencyFailure != "" && s.OnDependencyFailure != protocol.DependencyCancel && s.OnDependencyFailure != protocol.DependencyRun {
		return job, fmt.Errorf(`invalid "on_dependency_failure" %q: want %q or %q`, s.OnDependencyFailure, protocol.DependencyCancel, protocol.DependencyRun)
	}
	if s.OnDependencyFailure != "" && len(s.After) == 0 {
		return job, errors.New(`"on_dependency_failure" needs "after": it applies only to a job that waits for others`)
	}
	job.After, job.OnDependencyFailure = s.After, s.OnDependencyFailure
	if s.Site != "" && !protocol.ValidSiteName(s.Site) {
		return job, fmt.Errorf(`invalid "site" %q: want a site name, %s`, s.Site, protocol.SiteNameRule)
	}
	job.Site = s.Site
	at, err := s.Schedule(now)
	if err != nil {
		return job, err
	}
	job.At = at
	return job, nil
}

// Schedule resolves "at" or "in" against now; the zero time means due now.
func (s JobSpec) Schedule(now time.Time) (time.Time, error) {
	switch {
	case s.At != "" && s.In != "":
		return time.Time{}, errors.New(`give "at" or "in", not both`)
	case s.At != "":
		t, err := time.Parse(time.RFC3339, s.At)
		if err != nil {
			return time.Time{}, fmt.Errorf(`invalid "at" %q: want an RFC 3339 time such as 2030-01-02T15:04:05Z`, s.At)
		}
		return t, nil
	case s.In != "":
		d, err := time.ParseDuration(s.In)
		if err != nil {
			return time.Time{}, fmt.Errorf(`invalid "in" %q: want a duration such as 90s, 10m or 2h`, s.In)
		}
		if d < 0 {
			return time.Time{}, fmt.Errorf(`invalid "in" %q: must not be negative (use "at" for a past time)`, s.In)
		}
		return now.Add(d), nil
	}
	return time.Time{}, nil
}

// CheckJSON reports why b is not one JSON value.
func CheckJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	var v any
	if err := dec.Decode(&v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("more than one JSON value")
	}
	return nil
}

// ReadJobFile reads and validates every line of the --file before anything
// is written, so a bad line never leaves half a file enqueued. Bad lines are
// listed on stderr and make a usage error.
func ReadJobFile(stdin io.Reader, stderr io.Writer, name string, defaults JobSpec, now time.Time) ([]FileJob, error) {
	r := stdin
	label := "stdin"
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, &UsageError{Err: fmt.Errorf("reading --file: %w", err)}
		}
		defer f.Close()
		r, label = f, name
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	var jobs []FileJob
	bad := 0
	ids := map[string]int{}
	for line := 1; sc.Scan(); line++ {
		text := bytes.TrimSpace(sc.Bytes())
		if line == 1 {
			text = bytes.TrimPrefix(text, []byte("\uFEFF"))
		}
		if len(text) == 0 {
			continue
		}
		job, err := parseJobLine(text, defaults, now)
		if err == nil && job.ID != "" {
			if first, dup := ids[job.ID]; dup {
				err = fmt.Errorf("id %q is already used on line %d", job.ID, first)
			}
			ids[job.ID] = line
		}
		if err != nil {
			bad++
			if bad <= maxReported {
				fmt.Fprintf(stderr, "%s:%d: %v\n", label, line, err)
			}
			continue
		}
		jobs = append(jobs, FileJob{Line: line, Job: job})
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, Usagef("%s:%d: line longer than %d MiB; nothing was enqueued", label, len(jobs)+bad+1, maxLine>>20)
		}
		return nil, &UsageError{Err: fmt.Errorf("reading %s: %w; nothing was enqueued", label, err)}
	}
	if bad > maxReported {
		fmt.Fprintf(stderr, "%s: ... and %d more bad lines\n", label, bad-maxReported)
	}
	if bad > 0 {
		return nil, Usagef("%d bad %s in %s; nothing was enqueued", bad, Plural(bad, "line", "lines"), label)
	}
	return jobs, nil
}

// parseJobLine decodes one line strictly: an unknown field is an error,
// since a misspelt "paylaod" would otherwise silently enqueue no payload.
func parseJobLine(text []byte, defaults JobSpec, now time.Time) (protocol.NewJob, error) {
	var s JobSpec
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field == "" {
			return protocol.NewJob{}, fmt.Errorf(`want a JSON object such as {"type": "email", "payload": {...}}, got a JSON %s`, te.Value)
		}
		if errors.As(err, &te) {
			return protocol.NewJob{}, fmt.Errorf("%q must be %s, got a JSON %s", te.Field, jsonKind(te.Field), te.Value)
		}
		if field, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return protocol.NewJob{}, fmt.Errorf("unknown field %s (want type, payload, at or in, max_attempts, priority, id, unique_key, unique_for, after, on_dependency_failure, site)", field)
		}
		if text[0] != '{' {
			return protocol.NewJob{}, errors.New(`want a JSON object such as {"type": "email", "payload": {...}}`)
		}
		return protocol.NewJob{}, fmt.Errorf("invalid JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return protocol.NewJob{}, errors.New("more than one JSON value on the line")
	}
	var given struct {
		UniqueKey *string `json:"unique_key"`
	}
	if json.Unmarshal(text, &given) == nil && given.UniqueKey != nil && *given.UniqueKey == "" {
		return protocol.NewJob{}, errors.New(`"unique_key" is empty: give the key, or leave the field out for a job that is not unique`)
	}
	if s.Type == "" && s.Worker == "" {
		s.Type = defaults.Type
	}
	if s.At == "" && s.In == "" {
		s.At, s.In = defaults.At, defaults.In
	}
	if s.MaxAttempts == nil {
		s.MaxAttempts = defaults.MaxAttempts
	}
	if s.Priority == nil {
		s.Priority = defaults.Priority
	}
	if s.After == nil {
		s.After = defaults.After
	}
	if s.OnDependencyFailure == "" && len(s.After) > 0 {
		s.OnDependencyFailure = defaults.OnDependencyFailure
	}
	return s.NewJob(now)
}

func jsonKind(field string) string {
	switch field {
	case "max_attempts", "priority":
		return "a whole number"
	case "after":
		return "an array of job ids"
	default:
		return "a string"
	}
}

// CheckFileJobs makes the checks that need the server (the jobs waited
// for exist, the ids are free, the sites are the database's) of every job
// of a file before any is written: one bad line and nothing is enqueued.
func CheckFileJobs(ctx context.Context, q *protocol.Client, label string, jobs []FileJob, stderr io.Writer) error {
	if label == "-" {
		label = "stdin"
	}
	newJobs := make([]protocol.NewJob, len(jobs))
	for i, fj := range jobs {
		newJobs[i] = fj.Job
	}
	errs, err := q.CheckJobs(ctx, newJobs)
	if err != nil {
		return fmt.Errorf("checking %s: %w; nothing was enqueued", label, err)
	}
	bad := 0
	for i, e := range errs {
		if e == nil {
			continue
		}
		if bad++; bad <= maxReported {
			fmt.Fprintf(stderr, "%s:%d: %s\n", label, jobs[i].Line, DescribeError(e))
		}
	}
	if bad > maxReported {
		fmt.Fprintf(stderr, "%s: ... and %d more bad lines\n", label, bad-maxReported)
	}
	if bad > 0 {
		return Usagef("%d bad %s in %s; nothing was enqueued", bad, Plural(bad, "line", "lines"), label)
	}
	return nil
}

// EnqueueFile stores jobs in batches. Once validated (ReadJobFile, then
// CheckFileJobs), the jobs are written batch by batch: a failure part way
// (the server, or a job another writer took the id of meanwhile) leaves
// earlier batches enqueued, which the summary says.
func EnqueueFile(ctx context.Context, q *protocol.Client, label string, jobs []FileJob, out Output) error {
	if label == "-" {
		label = "stdin"
	}
	bar := newProgress(out.Stderr, out.Terminal, len(jobs))
	type failure struct {
		Line  int    `json:"line"`
		ID    string `json:"id,omitempty"`
		Error string `json:"error"`
	}
	var ids, dups, sites []string
	var failed []failure
	for start := 0; start < len(jobs); start += bulkBatch {
		batch := jobs[start:min(start+bulkBatch, len(jobs))]
		newJobs := make([]protocol.NewJob, len(batch))
		for i, fj := range batch {
			newJobs[i] = fj.Job
		}
		results, err := q.EnqueueMany(ctx, newJobs)
		if err != nil {
			bar.done()
			return fmt.Errorf("%s: lines %d-%d: %w (%d jobs from earlier lines were enqueued)",
				label, batch[0].Line, batch[len(batch)-1].Line, err, len(ids))
		}
		for i, r := range results {
			if r.Err != nil {
				msg := DescribeError(r.Err)
				if kivik.HTTPStatus(r.Err) == http.StatusConflict {
					msg = fmt.Sprintf("a document with id %s already exists", batch[i].Job.ID)
				}
				failed = append(failed, failure{Line: batch[i].Line, ID: batch[i].Job.ID, Error: msg})
				continue
			}
			if r.Duplicate {
				dups = append(dups, r.Item.ID)
				continue
			}
			ids = append(ids, r.Item.ID)
			if site := r.Item.Site; site != "" && !slices.Contains(sites, site) {
				sites = append(sites, site)
			}
		}
		bar.set(start + len(batch))
	}
	bar.done()
	NoteNoSites(q, out.Stderr, sites...)
	for i, f := range failed {
		if i == maxReported {
			fmt.Fprintf(out.Stderr, "%s: ... and %d more failed jobs\n", label, len(failed)-maxReported)
			break
		}
		fmt.Fprintf(out.Stderr, "%s:%d: %s\n", label, f.Line, f.Error)
	}
	if out.JSON {
		if ids == nil {
			ids = []string{}
		}
		if failed == nil {
			failed = []failure{}
		}
		if dups == nil {
			dups = []string{}
		}
		if err := WriteJSON(out.Stdout, map[string]any{"enqueued": len(ids), "failed": failed, "ids": ids,
			"already_queued": dups}); err != nil {
			return err
		}
	} else {
		line := fmt.Sprintf("%d enqueued", len(ids))
		if len(dups) > 0 {
			line += fmt.Sprintf(", %d already queued (unique keys)", len(dups))
		}
		if len(failed) > 0 {
			line += fmt.Sprintf(", %d failed", len(failed))
		}
		fmt.Fprintln(out.Stdout, line)
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d jobs from %s failed", len(failed), len(jobs), label)
	}
	return nil
}

// progress draws a one-line bar on a terminal's stderr; elsewhere it is
// silent, so logs and pipes stay clean.
type progress struct {
	w     io.Writer
	on    bool
	total int
}

func newProgress(w io.Writer, terminal bool, total int) *progress {
	return &progress{w: w, on: terminal && total > bulkBatch, total: total}
}

func (p *progress) set(n int) {
	if !p.on {
		return
	}
	const width = 30
	filled := width * n / p.total
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d", strings.Repeat("=", filled), strings.Repeat(" ", width-filled), n, p.total)
}

// done erases the bar.
func (p *progress) done() {
	if p.on {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
