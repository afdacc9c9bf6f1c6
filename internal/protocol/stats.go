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
	queues, err := c.Queues(ctx)
	if err != nil {
		return nil, err
	}
	var types []string
	byType := map[string]QueueNow{}
	for _, q := range queues {
		if opts.Worker == "" || q.Type == opts.Worker {
			types = append(types, q.Type)
			byType[q.Type] = q.QueueNow
		}
	}
	if opts.Worker != "" && len(types) == 0 {
		types = []string{opts.Worker} // a row of zeros, as asked
	}
	out := &Stats{Since: opts.Since.UTC(), Until: opts.Until.UTC()}
	if out.Types, err = c.windowStats(ctx, types, opts); err != nil {
		return nil, err
	}
	for i := range out.Types {
		ts := &out.Types[i]
		ts.Queue = byType[ts.Type]
		if ts.Queue.Due > 0 {
			due, err := c.dueBySite(ctx, ts.Type, ToUnix(now))
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

// windowStats reads the events and timings of types in the window of
// opts: for all types at once, a request for each of the three views
// (events, timings, attempt_times), and one more for each view's rows
// when percentiles are asked, where the server takes several ranges in a
// request. A metrics scrape then costs the same few requests at 50 types
// as at one.
func (c *Client) windowStats(ctx context.Context, types []string, opts StatsOptions) ([]TypeStats, error) {
	out := make([]TypeStats, len(types))
	from, to := ToUnix(opts.Since), ToUnix(opts.Until)
	events := []string{EventEnqueued, EventClaimed, EventDone, EventFailed, EventRetryScheduled}
	counted := func(ts *TypeStats) []*int64 {
		return []*int64{&ts.Added, &ts.Started, &ts.Finished, &ts.Failed, &ts.Retried}
	}
	var eventRanges [][2]any
	for _, typ := range types {
		for _, e := range events {
			eventRanges = append(eventRanges, [2]any{[]any{typ, e, from}, []any{typ, e, to}})
		}
	}
	counts, err := c.reduceCounts(ctx, "events", eventRanges)
	if err != nil {
		return nil, err
	}
	rows := percentileRows
	if opts.NoPercentiles {
		rows = 0
	}
	var timingRanges, attemptRanges [][2]any
	for _, typ := range types {
		timingRanges = append(timingRanges,
			[2]any{[]any{typ, "wait", from}, []any{typ, "wait", to}},
			[2]any{[]any{typ, "service", from}, []any{typ, "service", to}})
		attemptRanges = append(attemptRanges, [2]any{[]any{typ, from}, []any{typ, to}})
	}
	timings, err := c.summaries(ctx, "timings", timingRanges, rows)
	if err != nil {
		return nil, err
	}
	attempts, err := c.summaries(ctx, "attempt_times", attemptRanges, rows)
	if err != nil {
		return nil, err
	}
	for i, typ := range types {
		ts := &out[i]
		ts.Type = typ
		for j, dst := range counted(ts) {
			*dst = counts[i*len(events)+j]
		}
		ts.Throughput = float64(ts.Finished) / opts.Until.Sub(opts.Since).Seconds()
		ts.Wait, ts.Service, ts.Execution = timings[2*i], timings[2*i+1], attempts[i]
	}
	return out, nil
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

// oldestDueAges is how long the oldest due job of each of types has
// waited at now (Unix seconds): since its due date, or its creation when
// it was due at once. The due view keys the jobs due at once by creation
// and the others by due date, so it is the older of the first row of each
// range (a job due at once with no created_at, written by hand, has no
// age to give: 0).
func (c *Client) oldestDueAges(ctx context.Context, types []string, now float64) (map[string]float64, error) {
	var ranges []map[string]any
	for _, typ := range types {
		for _, r := range [][2][]any{
			{{typ, 0, math.SmallestNonzeroFloat64}, {typ, 0, map[string]any{}}}, // due at once, by creation
			{{typ, 0, map[string]any{}}, {typ, now}},                            // due by date
		} {
			ranges = append(ranges, map[string]any{"startkey": r[0], "endkey": r[1], "reduce": false, "limit": 1})
		}
	}
	oldest := map[string]float64{}
	err := c.viewRanges(ctx, "due", ranges, "reading the oldest due jobs", func(i int, rows *kivik.ResultSet) (bool, error) {
		typ := types[i/2]
		for rows.Next() {
			var key []any
			if err := rows.ScanKey(&key); err != nil {
				return false, err
			}
			if since, ok := key[len(key)-1].(float64); ok && since > 0 {
				if o, seen := oldest[typ]; !seen || since < o {
					oldest[typ] = since
				}
			}
		}
		return false, nil
	})
	if err != nil {
		return nil, err
	}
	ages := map[string]float64{}
	for typ, since := range oldest {
		ages[typ] = math.Max(now-since, 0)
	}
	return ages, nil
}

// reduceCount runs a view's reduce over [start, end] and reads a count
// (scanCount).
func (c *Client) reduceCount(ctx context.Context, view string, start, end any) (int64, error) {
	rows := c.view(ctx, view, kivik.Params(reduceRange(start, end)))
	defer rows.Close()
	n, err := scanCount(rows)
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		return 0, fmt.Errorf("reading view %s: %w", view, err)
	}
	return n, nil
}

// reduceCounts is reduceCount over each of ranges, in one request where
// the server takes several ranges in one (viewRanges).
func (c *Client) reduceCounts(ctx context.Context, view string, ranges [][2]any) ([]int64, error) {
	out := make([]int64, len(ranges))
	err := c.viewRanges(ctx, view, reduceRanges(ranges), "reading view "+view, func(i int, rows *kivik.ResultSet) (bool, error) {
		var err error
		out[i], err = scanCount(rows)
		return false, err
	})
	return out, err
}

func reduceRange(start, end any) map[string]any {
	return map[string]any{"startkey": start, "endkey": end, "reduce": true}
}

func reduceRanges(ranges [][2]any) []map[string]any {
	out := make([]map[string]any, len(ranges))
	for i, r := range ranges {
		out[i] = reduceRange(r[0], r[1])
	}
	return out
}

// scanCount reads a reduce's rows as a count: of _count, or the count
// field of _stats.
func scanCount(rows *kivik.ResultSet) (int64, error) {
	var n int64
	for rows.Next() {
		var raw json.RawMessage
		if err := rows.ScanValue(&raw); err != nil {
			return 0, err
		}
		var count int64
		if json.Unmarshal(raw, &count) != nil {
			var st struct {
				Count int64 `json:"count"`
			}
			if err := json.Unmarshal(raw, &st); err != nil {
				return 0, fmt.Errorf("unexpected value %s", raw)
			}
			count = st.Count
		}
		n += count
	}
	return n, nil
}

// summaries reads a _stats view's reduce over each of ranges and, for
// those that hold at most maxRows rows, the rows for percentiles: one
// request for the reduces and one for the rows, where the server takes
// several ranges in one (viewRanges).
func (c *Client) summaries(ctx context.Context, view string, ranges [][2]any, maxRows int) ([]Summary, error) {
	out := make([]Summary, len(ranges))
	err := c.viewRanges(ctx, view, reduceRanges(ranges), "reading view "+view, func(i int, rows *kivik.ResultSet) (bool, error) {
		var st struct {
			Sum   float64 `json:"sum"`
			Count int64   `json:"count"`
			Min   float64 `json:"min"`
			Max   float64 `json:"max"`
		}
		for rows.Next() {
			if err := rows.ScanValue(&st); err != nil {
				return false, err
			}
		}
		if st.Count > 0 {
			out[i] = Summary{Count: st.Count, Min: st.Min, Max: st.Max, Mean: st.Sum / float64(st.Count)}
		}
		return false, nil
	})
	if err != nil {
		return nil, err
	}
	var listed []int
	var rowRanges []map[string]any
	for i, s := range out {
		if s.Count > 0 && s.Count <= int64(maxRows) {
			listed = append(listed, i)
			rowRanges = append(rowRanges, map[string]any{"startkey": ranges[i][0], "endkey": ranges[i][1], "reduce": false})
		}
	}
	err = c.viewRanges(ctx, view, rowRanges, "reading view "+view+" rows", func(j int, rows *kivik.ResultSet) (bool, error) {
		s := &out[listed[j]]
		values := make([]float64, 0, s.Count)
		for rows.Next() {
			var v float64
			if err := rows.ScanValue(&v); err == nil {
				values = append(values, v)
			}
		}
		if len(values) > 0 {
			sort.Float64s(values)
			p50, p95 := Percentile(values, 0.50), Percentile(values, 0.95)
			s.P50, s.P95 = &p50, &p95
		}
		return false, nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
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
