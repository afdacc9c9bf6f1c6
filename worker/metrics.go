package worker

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a worker process's own Prometheus metrics: what its handlers
// did, how its claims and lease renewals fared, whether its changes feed
// held, and how busy it is. couchq serve's couchq_* metrics describe the
// queue as a whole (read from CouchDB); these describe one process, so every
// name starts couchq_worker_ and none is one of serve's: both can be
// registered on one registry.
//
// Create it with NewMetrics, give it to one or more Workers through
// Config.Metrics and register it (it is a prometheus.Collector) or serve
// it with HealthHandler. A nil *Metrics records nothing.
type Metrics struct {
	started, succeeded, failed, retried *prometheus.CounterVec
	handlerDuration                     *prometheus.HistogramVec
	claimsWon, claimsLost               *prometheus.CounterVec
	renewals                            *prometheus.CounterVec
	renewalDuration                     *prometheus.HistogramVec
	feedReconnects                      prometheus.Counter
	clockSkew                           prometheus.Gauge
	inFlight, freeSlots                 *prometheus.GaugeVec
}

// Label values of couchq_worker_claims_lost_total's reason and
// couchq_worker_lease_renewals_total's result.
const (
	// LostConflict: the claim itself was refused (409: another worker was
	// first, or a cluster's copies disagreed).
	LostConflict = "conflict"
	// LostLease: a claim this worker held was gone when it renewed the
	// lease or wrote the outcome (swept, cancelled or requeued meanwhile).
	LostLease = "lease"

	RenewalOK      = "ok"
	RenewalRefused = "refused" // the claim was gone: the handler is cancelled
	RenewalError   = "error"   // the server failed or was unreachable: retried
)

// NewMetrics returns metrics with nothing recorded yet.
func NewMetrics() *Metrics {
	typ := []string{"type"}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	return &Metrics{
		started: counter("couchq_worker_jobs_started_total",
			"Attempts this process claimed and started, by job type.", typ...),
		succeeded: counter("couchq_worker_jobs_succeeded_total",
			"Attempts whose handler succeeded and whose outcome was recorded.", typ...),
		failed: counter("couchq_worker_jobs_failed_total",
			"Attempts that failed for good (out of attempts, or failed as final) and were recorded so.", typ...),
		retried: counter("couchq_worker_jobs_retried_total",
			"Failed attempts recorded with another try scheduled.", typ...),
		handlerDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "couchq_worker_handler_duration_seconds",
			Help: "How long handlers ran, whatever their outcome.",
			// 5ms to about 22 minutes: jobs range from webhooks to reports.
			Buckets: prometheus.ExponentialBuckets(0.005, 4, 10),
		}, typ),
		claimsWon: counter("couchq_worker_claims_won_total",
			"Claims this process won.", typ...),
		claimsLost: counter("couchq_worker_claims_lost_total",
			"Claims refused (reason conflict: 409, another worker won) or lost while held (reason lease: swept or cancelled before the lease renewal or the outcome).",
			"type", "reason"),
		renewals: counter("couchq_worker_lease_renewals_total",
			"Lease renewals of running jobs by result: ok, refused (the claim was gone) or error (retried at the next heartbeat).",
			"type", "result"),
		renewalDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "couchq_worker_lease_renewal_duration_seconds",
			Help: "Latency of lease renewals; near a third of the lease, leases may lapse while jobs run.",
			// 1ms to about 16s.
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
		}, typ),
		feedReconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "couchq_worker_feed_reconnects_total",
			Help: "Times the changes feed broke and was connected again.",
		}),
		clockSkew: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "couchq_worker_clock_skew_seconds",
			Help: "How far this process's clock is ahead of the CouchDB server's (negative: behind), checked every minute; workers whose clocks differ by the lease less a heartbeat sweep each other's running jobs.",
		}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "couchq_worker_jobs_in_flight",
			Help: "Jobs running in this process now.",
		}, typ),
		freeSlots: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "couchq_worker_free_slots",
			Help: "Jobs of the type this process could start now (its concurrency less the jobs running).",
		}, typ),
	}
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		m.started, m.succeeded, m.failed, m.retried, m.handlerDuration,
		m.claimsWon, m.claimsLost, m.renewals, m.renewalDuration,
		m.feedReconnects, m.clockSkew, m.inFlight, m.freeSlots,
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

// The recording methods below are the worker's only way in; each is a
// no-op on a nil *Metrics so that a worker without metrics pays nothing.

// addSlots makes n more slots of typ free: the concurrency at Start, its
// negative at Stop (several workers may share one Metrics).
func (m *Metrics) addSlots(typ string, n int) {
	if m == nil {
		return
	}
	m.freeSlots.WithLabelValues(typ).Add(float64(n))
	m.inFlight.WithLabelValues(typ) // present at 0 before the first job
}

func (m *Metrics) jobStarted(typ string) {
	if m == nil {
		return
	}
	m.claimsWon.WithLabelValues(typ).Inc()
	m.started.WithLabelValues(typ).Inc()
	m.inFlight.WithLabelValues(typ).Inc()
	m.freeSlots.WithLabelValues(typ).Dec()
}

// jobEnded frees the job's slot.
func (m *Metrics) jobEnded(typ string) {
	if m == nil {
		return
	}
	m.inFlight.WithLabelValues(typ).Dec()
	m.freeSlots.WithLabelValues(typ).Inc()
}

func (m *Metrics) handlerRan(typ string, took time.Duration) {
	if m == nil {
		return
	}
	m.handlerDuration.WithLabelValues(typ).Observe(took.Seconds())
}

func (m *Metrics) succeededJob(typ string) {
	if m == nil {
		return
	}
	m.succeeded.WithLabelValues(typ).Inc()
}

// failedAttempt counts a recorded failure: final, or retried.
func (m *Metrics) failedAttempt(typ string, final bool) {
	if m == nil {
		return
	}
	if final {
		m.failed.WithLabelValues(typ).Inc()
	} else {
		m.retried.WithLabelValues(typ).Inc()
	}
}

func (m *Metrics) claimsLostBy(typ, reason string, n int) {
	if m == nil || n == 0 {
		return
	}
	m.claimsLost.WithLabelValues(typ, reason).Add(float64(n))
}

func (m *Metrics) renewal(typ, result string, took time.Duration) {
	if m == nil {
		return
	}
	m.renewals.WithLabelValues(typ, result).Inc()
	m.renewalDuration.WithLabelValues(typ).Observe(took.Seconds())
}

func (m *Metrics) feedReconnected() {
	if m == nil {
		return
	}
	m.feedReconnects.Inc()
}

func (m *Metrics) clockSkewIs(skew time.Duration) {
	if m == nil {
		return
	}
	m.clockSkew.Set(skew.Seconds())
}
