package protocol

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"sort"
	"time"

	"github.com/go-kivik/kivik/v4"
)

// percentileRows is the most rows Stats reads from a view to compute
// percentiles; above it, only the reduce's count, min, mean and max are
// given. Reading rows is a range query on an index, never a scan of
// documents, but it grows with the window.
const percentileRows = 50000

// Events counted by Stats, as recorded in the activity log.
const (
	EventEnqueued       = "enqueued"
	EventClaimed        = "claimed"
	EventDone           = "done"
	EventFailed         = "failed"
	EventRetryScheduled = "retry-scheduled"
	EventSnoozed        = "snoozed"
	EventLeaseExpired   = "lease-expired"
	EventReleased       = "released"
	EventCancelled      = "cancelled"
	EventRequeued       = "requeued"
	// EventClaimWithdrawn names a claimant whose claim of the same revision
	// reached only a minority of a cluster's copies and was withdrawn.
	EventClaimWithdrawn = "claim-withdrawn"
	// EventClaimConceded ends a claim its claimant gave up without running
	// the job: on a cluster, a claim that reached fewer than a majority of
	// the copies, or one that found the job live or finished on another
	// branch. The conceded claim stands in place of the claimant's
	// "claimed" entry (no attempt is charged); the claim's lease ends at
	// once, so the sweeper settles the job without waiting for it.
	EventClaimConceded = "claim-conceded"
	// EventArchived ends the history of a finished unique job's copy,
	// made when its key was enqueued again (see UniqueOpts).
	EventArchived = "archived"
	// EventClaimCleared: the sweeper cleared the claim of a job that had
	// finished (written so by hand), leaving it finished.
	EventClaimCleared = "claim-cleared"
)

// StatsOptions choose what Stats covers.
type StatsOptions struct {
	// Worker limits the stats to one job type; empty means every type.
	Worker string
	// Since and Until bound the window; Until defaults to now and Since to
	// 24 hours before Until. The queue figures (QueueNow) are always as of
	// now, whatever the window.
	Since, Until time.Time
	// NoPercentiles skips reading timing rows for p50/p95 (the reduce's
	// count, min, mean and max are still given): for callers that only
	// want sums, such as a metrics exporter.
	NoPercentiles bool
}

// Summary describes a set of durations, in seconds.
type Summary struct {
	Count int64   `json:"count"`
	Min   float64 `json:"min"`
	Mean  float64 `json:"mean"`
	Max   float64 `json:"max"`
	// P50 and P95 are nil when the window holds more rows than Stats reads.
	P50 *float64 `json:"p50,omitempty"`
	P95 *float64 `json:"p95,omitempty"`
}

// QueueNow is a job type's queue at the moment Stats ran.
type QueueNow struct {
	Due       int64 `json:"due"`
	Scheduled int64 `json:"scheduled"`
	Running   int64 `json:"running"`
	Failed    int64 `json:"failed"`
	Done      int64 `json:"done"`
	Cancelled int64 `json:"cancelled"`
	// Waiting counts jobs that wait for other jobs (StatusWaiting).
	Waiting int64 `json:"waiting"`
	// OldestDueAge is how long the oldest due job has been waiting, in
	// seconds: the "are we keeping up" number. 0 when nothing is due, and
	// for a paused type: its due jobs wait on purpose, they are not late.
	OldestDueAge float64 `json:"oldest_due_age"`
	// Paused: the type's workers claim nothing (see Client.Pause), and
	// PausedReason is the reason the pause was given, if any.
	Paused       bool   `json:"paused"`
	PausedReason string `json:"paused_reason,omitempty"`
}

// SiteDue is a job type's jobs due now at one owner site, in a database of
// sites: the backlog that site's workers have to claim.
type SiteDue struct {
	Site string `json:"site"`
	Type string `json:"type"`
	Due  int64  `json:"due"`
}

// TypeStats are one job type's figures.
type TypeStats struct {
	Type string `json:"type"`
	// Events in the window, from the activity log.
	Added    int64 `json:"added"`
	Started  int64 `json:"started"`
	Finished int64 `json:"finished"`
	Failed   int64 `json:"failed"`
	Retried  int64 `json:"retried"`
	// Throughput is finished jobs per second over the window.
	Throughput float64 `json:"throughput"`
	// Wait is enqueued -> first claim, for jobs first claimed in the window.
	Wait Summary `json:"wait"`
	// Service is enqueued -> done or failed, for jobs finished in the window.
	Service Summary `json:"service"`
	// Execution is how long each attempt that ended in the window ran.
	Execution Summary  `json:"execution"`
	Queue     QueueNow `json:"queue"`
}

// WorkerStats are one worker process's figures, from its registry document.
type WorkerStats struct {
	Claimant      string   `json:"claimant"`
	Types         []string `json:"types"`
	Concurrency   int      `json:"concurrency"`
	Running       int      `json:"running"`
	Completed     int64    `json:"completed"`
	Failed        int64    `json:"failed"`
	UptimeSeconds float64  `json:"uptime_seconds"`
	// Throughput is completed jobs per second of uptime.
	Throughput float64 `json:"throughput"`
	// Utilization is busy time / available slot time (0..1).
	Utilization float64 `json:"utilization"`
	// HeartbeatAge is how long ago the worker last reported, in seconds;
	// Alive is false once that is over three heartbeat intervals.
	HeartbeatAge float64 `json:"heartbeat_age"`
	Alive        bool    `json:"alive"`
}

// Stats is a report of the queue over a window.
type Stats struct {
	Since   time.Time     `json:"since"`
	Until   time.Time     `json:"until"`
	Types   []TypeStats   `json:"types"`
	Workers []WorkerStats `json:"workers"`
	// Periodic lists the periodic schedules (all of them, or those of
	// StatsOptions.Worker's type): last and next tick.
	Periodic []PeriodicState `json:"periodic"`
	// DueBySite, in a database of sites, splits each type's due jobs
	// (QueueNow.Due) by owner site, in type then site order: what a site
	// scales its workers on. Empty in a database without sites.
	DueBySite []SiteDue `json:"due_by_site,omitempty"`
}

// Stats computes per-type metrics over a window from the design
// document's views (map plus _count/_stats reduce, keyed by type and time
// so that each figure is one range query) and the worker registry.
func (c *Client) Stats(ctx context.Context, opts StatsOptions) (*Stats, error) {
	now := c.now()
	if opts.Until.IsZero() || opts.Until.After(now) {
		// Nothing has happened after now: a window that runs past it
		// would spread its throughput over time to come.
		opts.Until = now
	}
	if opts.Since.IsZero() {
		opts.Since = opts.Until.Add(-24 * time.Hour)
	}
	if !opts.Since.Before(opts.Until) {
		return nil, fmt.Errorf("stats window: since %s is not before until %s", opts.Since, opts.Until)
	}
	types := []string{opts.Worker}
	if opts.Worker == "" {
		var err error
		if types, err = c.Types(ctx); err != nil {
			return nil, err
		}
	}
	paused, reasons, err := c.pausedWhy(ctx)
	if err != nil {
		return nil, err
	}
	// A paused type with no jobs at all is still worth a row.
	for typ := range paused {
		if (opts.Worker == "" || opts.Worker == typ) && !contains(types, typ) {
			types = append(types, typ)
		}
	}
	sort.Strings(types)
	shifts, err := c.conflictShifts(ctx)
	if err != nil {
		return nil, err
	}
	out := &Stats{Since: opts.Since.UTC(), Until: opts.Until.UTC()}
	for _, typ := range types {
		ts, err := c.typeStats(ctx, typ, opts, now)
		if err != nil {
			return nil, err
		}
		ts.Queue.shift(shifts[typ])
		if paused[typ] {
			ts.Queue.Paused, ts.Queue.PausedReason, ts.Queue.OldestDueAge = true, reasons[typ], 0
		}
		out.Types = append(out.Types, *ts)
		if ts.Queue.Due > 0 {
			due, err := c.dueBySite(ctx, typ, ToUnix(now))
			if err != nil {
				return nil, err
			}
			out.DueBySite = append(out.DueBySite, due...)
		}
	}
	periodic, err := c.PeriodicStates(ctx)
	if err != nil {
		return nil, err
	}
	for _, p := range periodic {
		if opts.Worker == "" || p.Worker == opts.Worker {
			out.Periodic = append(out.Periodic, p)
		}
	}
	workers, err := c.Workers(ctx)
	if err != nil {
		return nil, err
	}
	for _, w := range workers {
		if opts.Worker != "" && !contains(w.Types, opts.Worker) {
			continue
		}
		out.Workers = append(out.Workers, workerStats(w, now))
	}
	return out, nil
}

// Types lists the job types that have documents.
func (c *Client) Types(ctx context.Context) ([]string, error) {
	rows := c.view(ctx, "status", kivik.Params(map[string]any{"group_level": 1}))
	defer rows.Close()
	var types []string
	for rows.Next() {
		var key []any
		if err := rows.ScanKey(&key); err != nil {
			return nil, fmt.Errorf("listing job types: %w", err)
		}
		if len(key) == 1 {
			if s, ok := key[0].(string); ok && s != "" {
				types = append(types, s)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing job types: %w", err)
	}
	return types, nil
}

// Counts returns the number of jobs of each type in each status.
func (c *Client) Counts(ctx context.Context) (map[string]map[Status]int64, error) {
	out, _, err := c.counts(ctx)
	return out, err
}

// counts is Counts, and the conflict shifts it applied (conflictShifts),
// for readers that count from other views too.
func (c *Client) counts(ctx context.Context) (map[string]map[Status]int64, map[string]map[Status]int64, error) {
	rows := c.view(ctx, "status", kivik.Params(map[string]any{"group": true}))
	defer rows.Close()
	out := map[string]map[Status]int64{}
	for rows.Next() {
		var key []any
		var n int64
		if err := rows.ScanKey(&key); err != nil {
			return nil, nil, fmt.Errorf("counting jobs: %w", err)
		}
		if err := rows.ScanValue(&n); err != nil {
			return nil, nil, fmt.Errorf("counting jobs: %w", err)
		}
		if len(key) != 2 {
			continue
		}
		typ, _ := key[0].(string)
		st, _ := key[1].(string)
		if out[typ] == nil {
			out[typ] = map[Status]int64{}
		}
		out[typ][Status(st)] += n
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("counting jobs: %w", err)
	}
	shifts, err := c.conflictShifts(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("counting jobs: %w", err)
	}
	for typ, byStatus := range shifts {
		if out[typ] == nil {
			out[typ] = map[Status]int64{}
		}
		for st, n := range byStatus {
			out[typ][st] += n
		}
	}
	return out, shifts, nil
}

func (c *Client) typeStats(ctx context.Context, typ string, opts StatsOptions, now time.Time) (*TypeStats, error) {
	ts := &TypeStats{Type: typ}
	since, until := opts.Since, opts.Until
	from, to := ToUnix(since), ToUnix(until)
	rows := percentileRows
	if opts.NoPercentiles {
		rows = 0
	}
	counts := []struct {
		event string
		dst   *int64
	}{
		{EventEnqueued, &ts.Added}, {EventClaimed, &ts.Started}, {EventDone, &ts.Finished},
		{EventFailed, &ts.Failed}, {EventRetryScheduled, &ts.Retried},
	}
	for _, e := range counts {
		n, err := c.reduceCount(ctx, "events", []any{typ, e.event, from}, []any{typ, e.event, to})
		if err != nil {
			return nil, err
		}
		*e.dst = n
	}
	ts.Throughput = float64(ts.Finished) / until.Sub(since).Seconds()
	var err error
	if ts.Wait, err = c.summary(ctx, "timings", []any{typ, "wait", from}, []any{typ, "wait", to}, rows); err != nil {
		return nil, err
	}
	if ts.Service, err = c.summary(ctx, "timings", []any{typ, "service", from}, []any{typ, "service", to}, rows); err != nil {
		return nil, err
	}
	if ts.Execution, err = c.summary(ctx, "attempt_times", []any{typ, from}, []any{typ, to}, rows); err != nil {
		return nil, err
	}
	if ts.Queue, err = c.queueNow(ctx, typ, now); err != nil {
		return nil, err
	}
	return ts, nil
}

// queueNow reads a type's current queue from the due and status views.
func (c *Client) queueNow(ctx context.Context, typ string, now time.Time) (QueueNow, error) {
	var q QueueNow
	t := ToUnix(now)
	var err error
	if q.Due, err = c.reduceCount(ctx, "due", []any{typ}, []any{typ, t}); err != nil {
		return q, err
	}
	if q.Scheduled, err = c.reduceCount(ctx, "due", []any{typ, math.Nextafter(t, math.Inf(1))}, []any{typ, map[string]any{}}); err != nil {
		return q, err
	}
	for st, dst := range map[Status]*int64{
		StatusRunning: &q.Running, StatusFailed: &q.Failed, StatusDone: &q.Done, StatusCancelled: &q.Cancelled,
		StatusWaiting: &q.Waiting,
	} {
		if *dst, err = c.reduceCount(ctx, "status", []any{typ, string(st)}, []any{typ, string(st)}); err != nil {
			return q, err
		}
	}
	if q.Due > 0 {
		if q.OldestDueAge, err = c.oldestDueAge(ctx, typ, t); err != nil {
			return q, err
		}
	}
	return q, nil
}

// dueBySite counts typ's jobs due at now by owner site, in a database of
// sites (nil in one without), in site order: one grouped read for the
// sites that have any queued, then one range each for those due now. A
// job that names no site is the default site's.
func (c *Client) dueBySite(ctx context.Context, typ string, now float64) ([]SiteDue, error) {
	if err := c.loadSites(ctx); err != nil {
		return nil, err
	}
	st := c.siteView()
	if !st.multi {
		return nil, nil
	}
	var sites []string
	err := c.groupedRange(ctx, "site_due", 2, []any{typ}, []any{typ, map[string]any{}}, func(key []any, _ float64) {
		if len(key) == 2 {
			if s, ok := key[1].(string); ok {
				sites = append(sites, s)
			}
		}
	})
	if isStatus(err, http.StatusNotFound) {
		// Design documents of an older couchq (schema 6): the totals
		// stand without the split until an admin runs couchq init.
		c.log.Debug().Err(err).Msg("due jobs by site left out")
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, s := range sites {
		n, err := c.reduceCount(ctx, "site_due", []any{typ, s}, []any{typ, s, now})
		if err != nil {
			return nil, err
		}
		owner := s
		if owner == "" {
			owner = st.def
		}
		if n > 0 {
			out[owner] += n
		}
	}
	var due []SiteDue
	for _, s := range slices.Sorted(maps.Keys(out)) {
		due = append(due, SiteDue{Site: s, Type: typ, Due: out[s]})
	}
	return due, nil
}

// shift counts conflicted jobs as they will be settled (conflictShifts):
// a queued job counts as due, as the views count it when it is due now.
func (q *QueueNow) shift(by map[Status]int64) {
	for st, n := range by {
		switch st {
		case StatusQueued:
			q.Due = max(q.Due+n, 0)
		case StatusRunning:
			q.Running = max(q.Running+n, 0)
		case StatusFailed:
			q.Failed = max(q.Failed+n, 0)
		case StatusDone:
			q.Done = max(q.Done+n, 0)
		case StatusCancelled:
			q.Cancelled = max(q.Cancelled+n, 0)
		case StatusWaiting:
			q.Waiting = max(q.Waiting+n, 0)
		}
	}
}

// oldestDueAge is how long the oldest due job of typ has waited at now
// (Unix seconds): since its due date, or its creation when it was due at
// once. The due view keys the jobs due at once by creation and the others
// by due date, so it is the older of the first row of each range (a job
// due at once with no created_at, written by hand, has no age to give).
func (c *Client) oldestDueAge(ctx context.Context, typ string, now float64) (float64, error) {
	oldest := math.Inf(1)
	for _, r := range [][2][]any{
		{{typ, 0, math.SmallestNonzeroFloat64}, {typ, 0, map[string]any{}}}, // due at once, by creation
		{{typ, 0, map[string]any{}}, {typ, now}},                            // due by date
	} {
		rows := c.view(ctx, "due", kivik.Params(map[string]any{
			"startkey": r[0], "endkey": r[1], "reduce": false, "limit": 1,
		}))
		for rows.Next() {
			var key []any
			if err := rows.ScanKey(&key); err != nil {
				_ = rows.Close()
				return 0, fmt.Errorf("reading the oldest due %s job: %w", typ, err)
			}
			if since, ok := key[len(key)-1].(float64); ok && since > 0 {
				oldest = math.Min(oldest, since)
			}
		}
		err := rows.Err()
		_ = rows.Close()
		if err != nil {
			return 0, fmt.Errorf("reading the oldest due %s job: %w", typ, err)
		}
	}
	if math.IsInf(oldest, 1) {
		return 0, nil
	}
	return math.Max(now-oldest, 0), nil
}

// reduceCount runs a view's reduce over [start, end] and reads a count
// (_count) or the count field of _stats.
func (c *Client) reduceCount(ctx context.Context, view string, start, end any) (int64, error) {
	rows := c.view(ctx, view, kivik.Params(map[string]any{
		"startkey": start, "endkey": end, "reduce": true,
	}))
	defer rows.Close()
	var n int64
	for rows.Next() {
		var raw json.RawMessage
		if err := rows.ScanValue(&raw); err != nil {
			return 0, fmt.Errorf("reading view %s: %w", view, err)
		}
		var count int64
		if json.Unmarshal(raw, &count) != nil {
			var st struct {
				Count int64 `json:"count"`
			}
			if err := json.Unmarshal(raw, &st); err != nil {
				return 0, fmt.Errorf("reading view %s: unexpected value %s", view, raw)
			}
			count = st.Count
		}
		n += count
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("reading view %s: %w", view, err)
	}
	return n, nil
}

// summary reads a _stats view's reduce over [start, end] and, when the
// range holds at most maxRows rows, the rows for percentiles.
func (c *Client) summary(ctx context.Context, view string, start, end any, maxRows int) (Summary, error) {
	var s Summary
	rows := c.view(ctx, view, kivik.Params(map[string]any{
		"startkey": start, "endkey": end, "reduce": true,
	}))
	var st struct {
		Sum   float64 `json:"sum"`
		Count int64   `json:"count"`
		Min   float64 `json:"min"`
		Max   float64 `json:"max"`
	}
	for rows.Next() {
		if err := rows.ScanValue(&st); err != nil {
			rows.Close()
			return s, fmt.Errorf("reading view %s: %w", view, err)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return s, fmt.Errorf("reading view %s: %w", view, err)
	}
	if st.Count == 0 {
		return s, nil
	}
	s = Summary{Count: st.Count, Min: st.Min, Max: st.Max, Mean: st.Sum / float64(st.Count)}
	if st.Count > int64(maxRows) {
		return s, nil
	}
	values := make([]float64, 0, st.Count)
	rows = c.view(ctx, view, kivik.Params(map[string]any{
		"startkey": start, "endkey": end, "reduce": false,
	}))
	defer rows.Close()
	for rows.Next() {
		var v float64
		if err := rows.ScanValue(&v); err == nil {
			values = append(values, v)
		}
	}
	if err := rows.Err(); err != nil {
		return s, fmt.Errorf("reading view %s rows: %w", view, err)
	}
	if len(values) > 0 {
		sort.Float64s(values)
		p50, p95 := Percentile(values, 0.50), Percentile(values, 0.95)
		s.P50, s.P95 = &p50, &p95
	}
	return s, nil
}

// Percentile is the nearest-rank percentile (0 < p <= 1) of sorted values.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}

func workerStats(w *WorkerInfo, now time.Time) WorkerStats {
	uptime := math.Max(w.LastHeartbeat-w.StartedAt, 0)
	alive, age := w.Liveness(now)
	ws := WorkerStats{
		Claimant: w.Claimant, Types: w.Types, Concurrency: w.Concurrency, Running: len(w.Running),
		Completed: w.Completed, Failed: w.Failed, UptimeSeconds: uptime, HeartbeatAge: age, Alive: alive,
	}
	if uptime > 0 {
		ws.Throughput = float64(w.Completed) / uptime
		if slots := float64(w.Concurrency * max(len(w.Types), 1)); slots > 0 {
			ws.Utilization = math.Min(w.BusySeconds/(uptime*slots), 1)
		}
	}
	return ws
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
