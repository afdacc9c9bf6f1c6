package opshttp

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/forms"
	"github.com/couchq/couchq/internal/protocol"
)

// The metrics of NewCollector (and so of couchq serve's /metrics). The
// operating guide (docs/operating.md) lists them; keep the two in step.
//
// Gauges are the queue as it is at the scrape. Counters and summaries are
// cumulative over the activity log: the first scrape counts every event
// the log holds, and each later scrape adds the events of the time since.
// They are kept by the collector rather than re-counted from the
// database each time because the log shrinks (purge deletes jobs, long
// histories are trimmed), and a counter that goes down reads as a reset to
// Prometheus: rate() would show a spike the size of the purge. Like any
// process's counters, they start again when the process restarts.

// statsSource is what the collector reads; *protocol.Client is one.
type statsSource interface {
	Stats(ctx context.Context, opts protocol.StatsOptions) (*protocol.Stats, error)
	Counts(ctx context.Context) (map[string]map[protocol.Status]int64, error)
	forms.SitesSource
}

// metricsCollector is a prometheus.Collector that computes couchq's
// metrics from protocol.Stats and protocol.Counts when scraped, at most once
// per CacheTTL: scrapes in between (several Prometheus servers, a dashboard)
// get the cached figures and do not reach CouchDB.
type metricsCollector struct {
	src statsSource
	ctx context.Context // for the CouchDB requests; scrapes carry none
	cfg Config          // with its defaults
	d   metricDescs

	mu sync.Mutex
	// refreshed is when the figures were last fetched (or tried).
	refreshed time.Time
	// snap is the last fetch's queue figures; nil when it failed, so that
	// stale gauges are never served as current.
	snap *metricsSnapshot
	// cursor is how far the counters have counted: every event at or
	// before it, none after.
	cursor        time.Time
	totals        map[string]*typeTotals
	refreshErrors float64
	lastDuration  float64
}

type metricsSnapshot struct {
	stats  *protocol.Stats
	counts map[string]map[protocol.Status]int64
	// sites are the sites document's, none for a database without one.
	sites []forms.Site
}

// typeTotals are one job type's cumulative figures.
type typeTotals struct {
	added, started, finished, failed, retried float64
	wait, service, execution                  summaryTotals
}

type summaryTotals struct {
	count uint64
	sum   float64
}

func (s *summaryTotals) add(sum protocol.Summary) {
	s.count += uint64(sum.Count)
	s.sum += sum.Mean * float64(sum.Count)
}

type metricDescs struct {
	jobs, due, scheduled, oldestDue, paused              *prometheus.Desc
	added, started, finished, failed, retried            *prometheus.Desc
	wait, service, execution                             *prometheus.Desc
	workersAlive, workersDead                            *prometheus.Desc
	workerRunning, workerUtilization, workerHeartbeatAge *prometheus.Desc
	siteHeartbeatAge, siteDue                            *prometheus.Desc
	up, refreshErrors, refreshDuration                   *prometheus.Desc
}

func newMetricDescs() metricDescs {
	typ := []string{"type"}
	claimant := []string{"claimant"}
	return metricDescs{
		jobs: prometheus.NewDesc("couchq_jobs", "Jobs in the database by type and status (waiting, queued, running, done, failed, cancelled).",
			[]string{"type", "status"}, nil),
		due:       prometheus.NewDesc("couchq_queue_due", "Queued jobs that are due now: the backlog workers have yet to claim.", typ, nil),
		scheduled: prometheus.NewDesc("couchq_queue_scheduled", "Queued jobs due later (scheduled, or waiting to retry).", typ, nil),
		oldestDue: prometheus.NewDesc("couchq_oldest_due_age_seconds",
			"How long the oldest due job has waited since it became due; 0 when nothing is due, and for a paused type. Alert on this to know the workers keep up.", typ, nil),
		paused: prometheus.NewDesc("couchq_type_paused", "1 while the job type is paused (couchq pause): its workers claim nothing.", typ, nil),

		added:    prometheus.NewDesc("couchq_jobs_added_total", "Jobs enqueued (activity log event enqueued).", typ, nil),
		started:  prometheus.NewDesc("couchq_jobs_started_total", "Attempts started: claims by a worker, retries included (event claimed).", typ, nil),
		finished: prometheus.NewDesc("couchq_jobs_finished_total", "Jobs completed successfully (event done).", typ, nil),
		failed:   prometheus.NewDesc("couchq_jobs_failed_total", "Jobs failed for good, out of attempts or failed as final (event failed).", typ, nil),
		retried:  prometheus.NewDesc("couchq_jobs_retried_total", "Failed attempts scheduled for another try (event retry-scheduled).", typ, nil),

		wait: prometheus.NewDesc("couchq_job_wait_seconds",
			"Time from enqueue to a job's first claim, counted when it is first claimed (_sum/_count is the mean).", typ, nil),
		service: prometheus.NewDesc("couchq_job_service_seconds",
			"Time from enqueue to done or failed, counted when the job finishes.", typ, nil),
		execution: prometheus.NewDesc("couchq_attempt_duration_seconds",
			"How long each attempt ran, claim to its outcome, counted when the attempt ends.", typ, nil),

		workersAlive: prometheus.NewDesc("couchq_workers_alive",
			"Registered worker processes running this type whose heartbeat is recent (at most three intervals old).", typ, nil),
		workersDead: prometheus.NewDesc("couchq_workers_dead",
			"Registered worker processes running this type whose heartbeat stopped: crashed or frozen; their claims are swept when the leases run out.", typ, nil),
		workerRunning: prometheus.NewDesc("couchq_worker_running_jobs", "Jobs a worker process had in flight at its last heartbeat.", claimant, nil),
		workerUtilization: prometheus.NewDesc("couchq_worker_utilization_ratio",
			"A worker process's busy time over its available slot time since it started (0 to 1).", claimant, nil),
		workerHeartbeatAge: prometheus.NewDesc("couchq_worker_heartbeat_age_seconds", "How long ago a worker process last reported.", claimant, nil),
		siteHeartbeatAge: prometheus.NewDesc("couchq_site_heartbeat_age_seconds",
			"How long ago the site's workers last wrote its heartbeat, as this database has it: how far behind this copy of that site is, plus up to a heartbeat interval. "+
				"One series per site of the sites document whose heartbeat has reached this database: a site none of whose workers has run yet, or whose link never delivered, has none (alert on absent() for it); none for a site taken over by another, until it beats again. "+
				"None for a database without sites.", []string{"site"}, nil),

		siteDue: prometheus.NewDesc("couchq_site_queue_due",
			"Queued jobs due now by owner site and type, in a database of sites: the backlog that site's workers have to claim, and what a site's autoscaler scales on (couchq_queue_due counts every site's). "+
				"A series for every site of the sites document not taken over (or come back since), 0 when it has none due; none for a database without sites.", []string{"site", "type"}, nil),

		up: prometheus.NewDesc("couchq_up",
			"1 if the last refresh from CouchDB succeeded, else 0; the gauges are left out while it is 0.", nil, nil),
		refreshErrors: prometheus.NewDesc("couchq_stats_refresh_errors_total", "Refreshes from CouchDB that failed.", nil, nil),
		refreshDuration: prometheus.NewDesc("couchq_stats_refresh_duration_seconds",
			"How long the last refresh from CouchDB took.", nil, nil),
	}
}

// NewCollector returns a prometheus.Collector of the queue's metrics, the
// couchq_* families the operating guide (docs/operating.md) lists,
// computed from q's stats when scraped: gauges of the queue and the
// workers as they are, and counters and summaries of the activity log
// that this collector keeps (the first
// scrape counts the whole log, later ones add what happened since, up to
// cfg.Settle ago). A scrape within cfg.CacheTTL of the last refresh gets
// the cached figures, so that several Prometheus servers do not each load
// CouchDB. ctx bounds the refreshes, which no scrape carries: cancel it
// when the collector is done with.
//
// Register it on one registry only: a second registry would keep counters
// of its own, and read CouchDB as often again.
func NewCollector(ctx context.Context, queue *couchq.Client, cfg Config) prometheus.Collector {
	return newCollector(ctx, (*protocol.Client)(queue), cfg)
}

func newCollector(ctx context.Context, src statsSource, cfg Config) *metricsCollector {
	return &metricsCollector{
		src: src, ctx: ctx, cfg: cfg.WithDefaults(),
		d: newMetricDescs(), totals: map[string]*typeTotals{},
	}
}

// Describe sends every metric's description.
func (c *metricsCollector) Describe(ch chan<- *prometheus.Desc) {
	d := c.d
	for _, desc := range []*prometheus.Desc{
		d.jobs, d.due, d.scheduled, d.oldestDue, d.paused, d.added, d.started, d.finished, d.failed, d.retried,
		d.wait, d.service, d.execution, d.workersAlive, d.workersDead, d.workerRunning,
		d.workerUtilization, d.workerHeartbeatAge, d.siteHeartbeatAge, d.siteDue, d.up, d.refreshErrors, d.refreshDuration,
	} {
		ch <- desc
	}
}

// Collect refreshes the figures if they are older than CacheTTL and sends
// them.
func (c *metricsCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refreshLocked()

	send := func(desc *prometheus.Desc, vt prometheus.ValueType, v float64, labels ...string) {
		m, err := prometheus.NewConstMetric(desc, vt, v, labels...)
		if err != nil {
			m = prometheus.NewInvalidMetric(desc, err)
		}
		ch <- m
	}
	summary := func(desc *prometheus.Desc, s summaryTotals, typ string) {
		m, err := prometheus.NewConstSummary(desc, s.count, s.sum, nil, typ)
		if err != nil {
			m = prometheus.NewInvalidMetric(desc, err)
		}
		ch <- m
	}
	d := c.d
	up := 0.0
	if c.snap != nil {
		up = 1
	}
	send(d.up, prometheus.GaugeValue, up)
	send(d.refreshErrors, prometheus.CounterValue, c.refreshErrors)
	send(d.refreshDuration, prometheus.GaugeValue, c.lastDuration)
	for typ, t := range c.totals {
		send(d.added, prometheus.CounterValue, t.added, typ)
		send(d.started, prometheus.CounterValue, t.started, typ)
		send(d.finished, prometheus.CounterValue, t.finished, typ)
		send(d.failed, prometheus.CounterValue, t.failed, typ)
		send(d.retried, prometheus.CounterValue, t.retried, typ)
		summary(d.wait, t.wait, typ)
		summary(d.service, t.service, typ)
		summary(d.execution, t.execution, typ)
	}
	if c.snap == nil {
		return
	}
	for typ, byStatus := range c.snap.counts {
		if typ == "" {
			continue
		}
		for _, st := range protocol.Statuses() {
			send(d.jobs, prometheus.GaugeValue, float64(byStatus[st]), typ, string(st))
		}
	}
	types := map[string]bool{}
	for _, t := range c.snap.stats.Types {
		types[t.Type] = true
		send(d.due, prometheus.GaugeValue, float64(t.Queue.Due), t.Type)
		send(d.scheduled, prometheus.GaugeValue, float64(t.Queue.Scheduled), t.Type)
		send(d.oldestDue, prometheus.GaugeValue, t.Queue.OldestDueAge, t.Type)
		send(d.paused, prometheus.GaugeValue, map[bool]float64{true: 1}[t.Queue.Paused], t.Type)
	}
	alive, dead := map[string]float64{}, map[string]float64{}
	seen := map[string]bool{}
	for _, w := range c.snap.stats.Workers {
		for _, typ := range w.Types {
			types[typ] = true
			if w.Alive {
				alive[typ]++
			} else {
				dead[typ]++
			}
		}
		if seen[w.Claimant] {
			continue // one series per claimant, whatever the registry holds
		}
		seen[w.Claimant] = true
		send(d.workerRunning, prometheus.GaugeValue, float64(w.Running), w.Claimant)
		send(d.workerUtilization, prometheus.GaugeValue, w.Utilization, w.Claimant)
		send(d.workerHeartbeatAge, prometheus.GaugeValue, w.HeartbeatAge, w.Claimant)
	}
	for typ := range types {
		send(d.workersAlive, prometheus.GaugeValue, alive[typ], typ)
		send(d.workersDead, prometheus.GaugeValue, dead[typ], typ)
	}
	due := map[[2]string]int64{}
	for _, sd := range c.snap.stats.DueBySite {
		due[[2]string{sd.Site, sd.Type}] = sd.Due
	}
	for _, s := range c.snap.sites {
		// A taken-over site's jobs run elsewhere: its silence is expected,
		// and a series growing for ever would only trip alerts. One that
		// came back runs its new jobs again, and is watched as before.
		if s.TakenOverBy != "" && !s.Returned {
			continue
		}
		if s.HeartbeatAge != nil {
			send(d.siteHeartbeatAge, prometheus.GaugeValue, *s.HeartbeatAge, s.Site)
		}
		for _, t := range c.snap.stats.Types {
			send(d.siteDue, prometheus.GaugeValue, float64(due[[2]string{s.Site, t.Type}]), s.Site, t.Type)
		}
	}
}

// refreshLocked fetches the figures when the cached ones are older than
// CacheTTL. c.mu is held, so concurrent scrapes wait for one fetch.
func (c *metricsCollector) refreshLocked() {
	now := c.cfg.Now()
	if age := now.Sub(c.refreshed); !c.refreshed.IsZero() && age >= 0 && age < c.cfg.ttl() {
		return
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.RefreshTimeout)
	defer cancel()
	snap, err := c.fetch(ctx, now)
	// The figures are as fresh as the end of their fetch: the scrapes that
	// waited for it use them. Stamped with its start, a fetch slower than
	// CacheTTL left them stale on arrival, and each waiting scrape fetched
	// again in turn.
	c.refreshed = c.cfg.Now()
	c.lastDuration = c.refreshed.Sub(now).Seconds()
	if err != nil {
		c.snap = nil
		c.refreshErrors++
		c.cfg.Logger.Warn().Err(err).Msg("refreshing metrics from CouchDB failed; serving couchq_up 0 and the counters so far")
		return
	}
	c.snap = snap
}

// fetch reads the queue and adds the activity since the cursor to the
// counters. The counters stop Settle short of now (see Config.Settle).
func (c *metricsCollector) fetch(ctx context.Context, now time.Time) (*metricsSnapshot, error) {
	// Events are stamped to the millisecond; a cursor half-way between two
	// milliseconds can never equal one, so the inclusive ranges that follow
	// each other neither count an event twice nor miss one.
	until := now.Add(-c.cfg.settle()).Truncate(time.Millisecond).Add(500 * time.Microsecond)
	since := c.cursor
	if since.IsZero() {
		since = time.Unix(0, 0) // the first refresh counts the whole log
	}
	counting := until.After(since)
	// Prometheus summaries carry only sums and counts: no percentile rows.
	opts := protocol.StatsOptions{Since: since, Until: until, NoPercentiles: true}
	if !counting {
		// No time has passed since the last refresh (a stopped test clock):
		// read the queue with a window whose events are ignored.
		opts.Since = until.Add(-time.Millisecond)
	}
	st, err := c.src.Stats(ctx, opts)
	if err != nil {
		return nil, err
	}
	counts, err := c.src.Counts(ctx)
	if err != nil {
		return nil, err
	}
	// A sites document that cannot be read fails the refresh like the
	// rest: a site's gauge left out would read as a healthy single
	// database, not as an unknown.
	sites, err := forms.Sites(ctx, c.src, now)
	if err != nil {
		return nil, err
	}
	if counting {
		for _, t := range st.Types {
			tt := c.totals[t.Type]
			if tt == nil {
				tt = &typeTotals{}
				c.totals[t.Type] = tt
			}
			tt.added += float64(t.Added)
			tt.started += float64(t.Started)
			tt.finished += float64(t.Finished)
			tt.failed += float64(t.Failed)
			tt.retried += float64(t.Retried)
			tt.wait.add(t.Wait)
			tt.service.add(t.Service)
			tt.execution.add(t.Execution)
		}
		c.cursor = until
	}
	return &metricsSnapshot{stats: st, counts: counts, sites: sites}, nil
}
