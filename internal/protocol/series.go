package protocol

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/designdocs"
)

// SeriesOptions choose what Series covers.
type SeriesOptions struct {
	// Worker limits the series to one job type; empty means every type.
	Worker string
	// Until ends the window (default now) and Window is its length
	// (default one hour).
	Until  time.Time
	Window time.Duration
	// Step is the bucket length: a whole number of minutes, or of hours
	// (the views count per minute and per hour). Default one minute.
	Step time.Duration
	// TimingRows bounds the timing rows read for percentiles, over every
	// type together (default 20000): the newest rows are read, and buckets
	// older than the oldest row read have no percentiles (Truncated).
	TimingRows int
}

// Series are a window's figures per bucket, each slice one value per
// bucket, in time order. Counts are per bucket; the dashboard divides by
// the step for a rate.
type Series struct {
	Worker string  `json:"type"`
	Step   float64 `json:"step"` // seconds
	// T is each bucket's start, Unix seconds.
	T        []float64 `json:"t"`
	Enqueued []int64   `json:"enqueued"`
	Started  []int64   `json:"started"`
	Finished []int64   `json:"finished"`
	// Failed are jobs that failed for good; Retried, attempts that failed
	// with a retry scheduled.
	Failed  []int64 `json:"failed"`
	Retried []int64 `json:"retried"`
	// Depth is how many jobs waited (due or scheduled) at each bucket's end.
	Depth []int64 `json:"depth"`
	// Wait (enqueued -> first claim, by claim time) and Service (enqueued
	// -> done or failed, by finish time) percentiles in seconds; nil where
	// the bucket has no timing, or is older than the rows read.
	WaitP50    []*float64 `json:"wait_p50"`
	WaitP95    []*float64 `json:"wait_p95"`
	ServiceP50 []*float64 `json:"service_p50"`
	ServiceP95 []*float64 `json:"service_p95"`
	// Truncated: some timing rows of the window were not read (see
	// SeriesOptions.TimingRows).
	Truncated bool `json:"truncated"`
}

// timingRowsDefault is SeriesOptions.TimingRows' default: enough for every
// timing of a busy hour, small enough to read in well under a second.
const timingRowsDefault = 20000

// timingRowsPerTypeMin is the fewest timing rows read for one type when
// the budget is shared by many.
const timingRowsPerTypeMin = 200

// Series reads a window's activity, queue depth and timings per bucket
// from the activity, depth and timings views: grouped range queries, never
// a scan of documents. Activity and depth are one query per figure
// whatever the number of types; percentiles need the timing rows
// themselves, one query per type and kind, bounded by TimingRows.
func (c *Client) Series(ctx context.Context, opts SeriesOptions) (*Series, error) {
	if opts.Until.IsZero() {
		opts.Until = c.now()
	}
	if opts.Window <= 0 {
		opts.Window = time.Hour
	}
	if opts.Step <= 0 {
		opts.Step = time.Minute
	}
	if opts.TimingRows <= 0 {
		opts.TimingRows = timingRowsDefault
	}
	level := 4 // activity: [event, worker, hour, minute]
	unit := 60.0
	switch {
	case opts.Step%time.Hour == 0:
		level, unit = 3, 3600
	case opts.Step%time.Minute != 0:
		return nil, fmt.Errorf("series step %s: want whole minutes or hours", opts.Step)
	}
	step := opts.Step.Seconds()
	n := int(math.Ceil(opts.Window.Seconds() / step))
	// Buckets end at the step boundary at or after Until, so that a bucket
	// keeps its start from one refresh to the next.
	end := math.Ceil(ToUnix(opts.Until)/step) * step
	start := end - float64(n)*step
	s := &Series{Worker: opts.Worker, Step: step, T: make([]float64, n)}
	for i := range s.T {
		s.T[i] = start + float64(i)*step
	}
	var typ any // null: every type
	if opts.Worker != "" {
		typ = opts.Worker
	}
	bucket := func(at float64) int {
		if at < start || at >= end {
			return -1
		}
		return min(int((at-start)/step), n-1)
	}
	for _, e := range []struct {
		event string
		dst   *[]int64
	}{
		{EventEnqueued, &s.Enqueued}, {EventClaimed, &s.Started}, {EventDone, &s.Finished},
		{EventFailed, &s.Failed}, {EventRetryScheduled, &s.Retried},
	} {
		*e.dst = make([]int64, n)
		err := c.groupedRange(ctx, "activity", level,
			[]any{e.event, typ, math.Floor(start / 3600), math.Floor(start / 60)},
			[]any{e.event, typ, map[string]any{}},
			func(key []any, v float64) {
				if i := bucket(keyNumber(key, level-1) * unit); i >= 0 {
					(*e.dst)[i] += int64(v)
				}
			})
		if err != nil {
			return nil, err
		}
	}
	if err := c.depthSeries(ctx, s, typ, start, level-1, unit, bucket); err != nil {
		return nil, err
	}
	if err := c.timingSeries(ctx, s, opts, start, end, bucket); err != nil {
		return nil, err
	}
	return s, nil
}

// depthSeries fills s.Depth: the depth at the window's start (the sum of
// every change before it), then the changes per bucket added up.
func (c *Client) depthSeries(ctx context.Context, s *Series, typ any, start float64, level int, unit float64, bucket func(float64) int) error {
	hour, minute := math.Floor(start/3600), math.Floor(start/60)
	before := []any{typ, hour, minute}
	if level == 2 {
		before = []any{typ, hour}
	}
	rows := c.view(ctx, "depth", kivik.Params(map[string]any{
		"startkey": []any{typ}, "endkey": before, "inclusive_end": false, "reduce": true,
	}))
	var depth float64
	for rows.Next() {
		var v float64
		if err := rows.ScanValue(&v); err != nil {
			rows.Close()
			return fmt.Errorf("reading view depth: %w", err)
		}
		depth += v
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading view depth: %w", err)
	}
	changes := make([]float64, len(s.T))
	err := c.groupedRange(ctx, "depth", level, []any{typ, hour, minute}, []any{typ, map[string]any{}},
		func(key []any, v float64) {
			if i := bucket(keyNumber(key, level-1) * unit); i >= 0 {
				changes[i] += v
			}
		})
	if err != nil {
		return err
	}
	s.Depth = make([]int64, len(s.T))
	for i, d := range changes {
		depth += d
		// A log with entries missing can take a type below zero; nothing
		// waits less than nothing.
		s.Depth[i] = int64(math.Max(depth, 0))
	}
	return nil
}

// timingQueries is how many timing queries Series runs at once: enough to
// hide round trips with many types, few enough not to crowd a server that
// also serves the workers.
const timingQueries = 4

// timingRange is one type's timing rows of one kind in the window.
type timingRange struct {
	typ, kind string
	at, v     []float64
	full      bool // read as many rows as allowed: some were left
	err       error
}

// timingSeries fills the percentiles from the timings view's rows, newest
// first, sharing opts.TimingRows among the types.
func (c *Client) timingSeries(ctx context.Context, s *Series, opts SeriesOptions, start, end float64, bucket func(float64) int) error {
	types := []string{opts.Worker}
	if opts.Worker == "" {
		var err error
		if types, err = c.Types(ctx); err != nil {
			return err
		}
	}
	perType := opts.TimingRows
	if len(types) > 0 {
		perType = max(opts.TimingRows/len(types), timingRowsPerTypeMin)
	}
	var ranges []*timingRange
	for _, kind := range []string{"wait", "service"} {
		for _, typ := range types {
			ranges = append(ranges, &timingRange{typ: typ, kind: kind})
		}
	}
	next := make(chan *timingRange)
	var wg sync.WaitGroup
	for range min(timingQueries, len(ranges)) {
		wg.Go(func() {
			for r := range next {
				c.readTimings(ctx, r, start, end, perType)
			}
		})
	}
	for _, r := range ranges {
		next <- r
	}
	close(next)
	wg.Wait()

	values := map[string][][]float64{"wait": make([][]float64, len(s.T)), "service": make([][]float64, len(s.T))}
	for _, r := range ranges {
		if r.err != nil {
			return r.err
		}
		s.Truncated = s.Truncated || r.full
		for j, at := range r.at {
			if i := bucket(at); i >= 0 {
				values[r.kind][i] = append(values[r.kind][i], r.v[j])
			}
		}
	}
	s.WaitP50, s.WaitP95 = percentiles(values["wait"])
	s.ServiceP50, s.ServiceP95 = percentiles(values["service"])
	return nil
}

// readTimings reads r's rows of the window, newest first, at most limit.
func (c *Client) readTimings(ctx context.Context, r *timingRange, start, end float64, limit int) {
	rows := c.view(ctx, "timings", kivik.Params(map[string]any{
		"startkey": []any{r.typ, r.kind, end}, "endkey": []any{r.typ, r.kind, start},
		"descending": true, "reduce": false, "limit": limit,
	}))
	defer rows.Close()
	read := 0
	for rows.Next() {
		read++
		var key []any
		var v float64
		if rows.ScanKey(&key) != nil || rows.ScanValue(&v) != nil {
			continue
		}
		r.at, r.v = append(r.at, keyNumber(key, 2)), append(r.v, v)
	}
	if err := rows.Err(); err != nil {
		r.err = fmt.Errorf("reading view timings: %w", err)
	}
	r.full = read == limit
}

// percentiles are the p50 and p95 of each bucket's values, nil for an
// empty bucket.
func percentiles(buckets [][]float64) (p50s, p95s []*float64) {
	p50s, p95s = make([]*float64, len(buckets)), make([]*float64, len(buckets))
	for i, vs := range buckets {
		if len(vs) == 0 {
			continue
		}
		sort.Float64s(vs)
		p50, p95 := Percentile(vs, 0.50), Percentile(vs, 0.95)
		p50s[i], p95s[i] = &p50, &p95
	}
	return p50s, p95s
}

// groupedRange runs a reduced view grouped at level over [start, end]
// (every key when start is nil) and calls row with each key and value.
func (c *Client) groupedRange(ctx context.Context, view string, level int, start, end any, row func(key []any, v float64)) error {
	params := map[string]any{"reduce": true, "group_level": level}
	if start != nil {
		params["startkey"], params["endkey"] = start, end
	}
	rows := c.view(ctx, view, kivik.Params(params))
	defer rows.Close()
	for rows.Next() {
		var key []any
		var v float64
		if err := rows.ScanKey(&key); err != nil {
			return fmt.Errorf("reading view %s: %w", view, err)
		}
		if err := rows.ScanValue(&v); err != nil {
			return fmt.Errorf("reading view %s: %w", view, err)
		}
		row(key, v)
	}
	if err := rows.Err(); err != nil {
		if isStatus(err, http.StatusNotFound) {
			// A design document from before the view: installed by a
			// couchq that did not have it, and only admins upgrade it.
			return fmt.Errorf("reading view %s (the database's design document %s lacks it: run `couchq init` as an admin to install this couchq's): %w", view, designdocs.DocFor(view), err)
		}
		return fmt.Errorf("reading view %s: %w", view, err)
	}
	return nil
}

// keyNumber is key[i] as a number, NaN when it is not one (NaN falls in no
// bucket).
func keyNumber(key []any, i int) float64 {
	if i < len(key) {
		if f, ok := key[i].(float64); ok {
			return f
		}
	}
	return math.NaN()
}

// TypeQueue is one job type's queue now, for an overview of every type.
type TypeQueue struct {
	Type string `json:"type"`
	QueueNow
}

// Queues reads every type's queue as of now in a few queries, whatever the
// number of types: the counts by status of all types in one, the waiting
// jobs of all types in one, and the due count and the oldest due job of
// every type with any in one each where the server takes several ranges in
// a request (else one per type).
func (c *Client) Queues(ctx context.Context) ([]TypeQueue, error) {
	now := ToUnix(c.now())
	counts, shifts, err := c.counts(ctx)
	if err != nil {
		return nil, err
	}
	paused, reasons, err := c.pausedWhy(ctx)
	if err != nil {
		return nil, err
	}
	waiting := map[string]int64{}
	err = c.groupedRange(ctx, "due", 1, nil, nil, func(key []any, v float64) {
		if len(key) == 1 {
			if t, ok := key[0].(string); ok {
				waiting[t] = int64(v)
			}
		}
	})
	if err != nil {
		return nil, err
	}
	types := map[string]bool{}
	for t := range counts {
		types[t] = true
	}
	for t := range paused {
		types[t] = true
	}
	for t := range waiting {
		types[t] = true
	}
	var dueOf []string // types with waiting jobs: how many are due now?
	var dueRanges [][2]any
	for t := range types {
		if t != "" && waiting[t] > 0 {
			dueOf = append(dueOf, t)
			dueRanges = append(dueRanges, [2]any{[]any{t}, []any{t, now}})
		}
	}
	due, err := c.reduceCounts(ctx, "due", dueRanges)
	if err != nil {
		return nil, err
	}
	dueNow := map[string]int64{}
	for i, t := range dueOf {
		dueNow[t] = due[i]
	}
	out := make([]TypeQueue, 0, len(types))
	var late []string // types with due jobs, not paused: how late?
	for t := range types {
		if t == "" {
			continue
		}
		q := TypeQueue{Type: t}
		byStatus := counts[t]
		q.Running, q.Failed, q.Done, q.Cancelled = byStatus[StatusRunning], byStatus[StatusFailed], byStatus[StatusDone], byStatus[StatusCancelled]
		q.Waiting = byStatus[StatusWaiting]
		q.Paused, q.PausedReason = paused[t], reasons[t]
		q.Due = dueNow[t]
		q.Scheduled = waiting[t] - q.Due
		// A conflicted job the due view lists under CouchDB's pick but
		// that will settle otherwise is not due (nor the reverse).
		q.Due = max(q.Due+shifts[t][StatusQueued], 0)
		if q.Due > 0 && !q.Paused {
			late = append(late, t)
		}
		out = append(out, q)
	}
	ages, err := c.oldestDueAges(ctx, late, now)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].OldestDueAge = ages[out[i].Type]
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Type < out[j].Type })
	return out, nil
}

// WorkersNow lists the worker processes from the registry with their
// figures as Stats reports them: alive or dead, types, running jobs,
// utilization.
func (c *Client) WorkersNow(ctx context.Context) ([]WorkerStats, error) {
	workers, err := c.Workers(ctx)
	if err != nil {
		return nil, err
	}
	now := c.now()
	out := make([]WorkerStats, 0, len(workers))
	for _, w := range workers {
		out = append(out, workerStats(w, now))
	}
	return out, nil
}

// RecentFailed returns up to limit failed jobs, the most recently failed
// first: the newest of each type from the by_status view (one range a
// type, read backwards), merged. types are the types to look at (those
// with failed jobs); nil means every type.
func (c *Client) RecentFailed(ctx context.Context, types []string, limit int) ([]*WorkItem, error) {
	if types == nil {
		var err error
		if types, err = c.Types(ctx); err != nil {
			return nil, err
		}
	}
	var out []*WorkItem
	for _, t := range types {
		rows := c.view(ctx, "by_status", kivik.Params(map[string]any{
			"startkey": []any{string(StatusFailed), t, map[string]any{}}, "endkey": []any{string(StatusFailed), t},
			"descending": true, "include_docs": true, "limit": limit,
		}))
		batch, err := c.scan(rows, "listing failed jobs")
		if err != nil {
			return nil, err
		}
		out = append(out, batch.Items...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].FinishedAt > out[j].FinishedAt })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}
