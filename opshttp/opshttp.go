// Package opshttp serves a couchq queue's dashboard, metrics and JSON API
// over HTTP, so that a service that runs couchq workers can mount them on
// its own mux; couchq serve is this package behind a listener.
//
// NewHandler returns one http.Handler for every endpoint:
//
//	/            the dashboard: a page (assets embedded, no network needed)
//	             that polls the endpoints below
//	/metrics     Prometheus metrics: the queue's (see NewCollector) and the
//	             Go runtime's and process's
//	/api/stats   the stats report (couchq stats --json); query parameters
//	             type, since and until
//	/api/jobs    jobs as stored (couchq ls --json); query parameters type,
//	             status and limit (default 100, at most 1000)
//	/api/queues  every type's queue now: due, scheduled, running, failed,
//	             oldest due age, paused
//	/api/series  per-bucket activity, queue depth and wait and service
//	             percentiles; query parameters window (1h, 24h or 7d) and
//	             type
//	/api/workers the worker processes: alive, types, running, utilization
//	/api/failed  the most recently failed jobs with their history; query
//	             parameters type and limit (default 50, at most 500)
//	/api/sites   the sites of a queue of several databases (couchq sites
//	             --json): {"sites": [{site, default, heartbeat_age_seconds,
//	             taken_over_by}], "links": [...]}, the links only when they
//	             can be read (a server admin, and a client opened through
//	             couchq.Server); "sites" is [] for a single database
//	/healthz     200 {"couchdb":"ok"} when the database answers, else 503
//	             with the error
//
// and the actions, POST only, which need CouchDB credentials (see
// Config.CouchURL):
//
//	/api/jobs/{id}/retry, /api/jobs/{id}/cancel
//	/api/types/{type}/pause, /api/types/{type}/resume
//
// and the agents' (agents.go), as the authenticated user:
//
//	/api/claim, /api/jobs/{id}/complete, /api/jobs/{id}/fail,
//	/api/jobs/{id}/extend, /api/jobs/{id}/progress, /api/jobs/{id}/release
//
// NewCollector returns the queue's metrics alone, for a service that
// already serves /metrics from its own prometheus.Registry.
//
// By default only the actions authenticate; the rest, including /api/jobs
// with its payloads, is read by anyone who reaches it, with the queue
// client's own CouchDB account: mount the handler behind whatever guards
// the rest of the service's private endpoints, or set Config.ReadAuth to
// make every read but /healthz and /metrics need a CouchDB login and read
// as that user. Config.HidePayload keeps the payloads of some job types
// out of every answer.
package opshttp

import (
	"net/http"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// Defaults for Config.
const (
	CacheTTLDefault       = 5 * time.Second
	SettleDefault         = 10 * time.Second
	RefreshTimeoutDefault = 30 * time.Second
)

// Config configures NewHandler and NewCollector. The zero value of every
// field means its default; see WithDefaults.
type Config struct {
	// CacheTTL is how long figures read from CouchDB are reused, so that
	// frequent scrapes and a dashboard polling /api/stats do not load the
	// database. Negative reads CouchDB on every scrape and request.
	CacheTTL time.Duration
	// Settle is how far behind now the counters count: an event is
	// stamped with its writer's clock before the write reaches CouchDB, so
	// one stamped just before now may not be visible yet, and once the
	// counters have passed it, it would never be counted. Negative counts
	// up to now: for one process that writes and serves, or a test that
	// controls the clock.
	Settle time.Duration
	// RefreshTimeout bounds one read from CouchDB: a metrics refresh or an
	// API request. A scrape whose refresh times out still answers, with
	// couchq_up 0, within RefreshTimeout + 5s: keep an http.Server's
	// WriteTimeout above that, or the answer is cut off.
	RefreshTimeout time.Duration
	// Now is the clock; default time.Now. Tests set it, with the queue
	// client's, to get exact figures.
	Now func() time.Time
	// Logger receives warnings: failed refreshes and API requests, and
	// metrics that could not be encoded. The zero value discards them.
	Logger zerolog.Logger
	// ErrorMessage renders a failure of CouchDB for the "error" field of a
	// JSON answer (502 from the API, 503 from /healthz) and the log;
	// default err.Error(). couchq serve sets one that says where the
	// server is when it cannot be reached.
	ErrorMessage func(err error) string
	// CouchURL is the CouchDB server's base URL, without credentials:
	// the action endpoints (retry, cancel, pause, resume) check the
	// credentials a request carries with GET /_session there, and that
	// they may read the database. Empty turns the actions off (403); the
	// read-only endpoints never need it.
	CouchURL string
	// HTTPClient makes those requests; default http.DefaultClient. couchq
	// serve passes the client it reaches CouchDB with (its CA, its
	// failover between nodes).
	HTTPClient *http.Client
	// ReadAuth makes every read but /healthz, /metrics and the page's
	// static files (the page and its scripts, which hold no figures) need
	// the CouchDB login the actions need, and makes the read as that user,
	// through CouchURL and HTTPClient: the database's _security applies,
	// so a user it leaves out gets 403, and a request without a login 401.
	// Answers are cached per user. Off, every read is made with the
	// queue client's own account, for anyone who reaches the handler.
	ReadAuth bool
	// HidePayload lists job types whose payloads the API does not show:
	// their jobs come without "payload" and with "payload_hidden": true,
	// and the dashboard says "hidden". The agents' claims still carry the
	// payload, which the agent needs to do the job.
	HidePayload []string
}

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.CacheTTL == 0 {
		c.CacheTTL = CacheTTLDefault
	}
	if c.Settle == 0 {
		c.Settle = SettleDefault
	}
	if c.RefreshTimeout <= 0 {
		c.RefreshTimeout = RefreshTimeoutDefault
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.HTTPClient == nil {
		c.HTTPClient = http.DefaultClient
	}
	c.CouchURL = strings.TrimSuffix(c.CouchURL, "/")
	if c.ErrorMessage == nil {
		c.ErrorMessage = func(err error) string { return err.Error() }
	}
	return c
}

// ttl is CacheTTL as the caches use it: a negative one caches nothing.
func (c Config) ttl() time.Duration { return max(c.CacheTTL, 0) }

// settle is Settle as the counters use it: a negative one counts to now.
func (c Config) settle() time.Duration { return max(c.Settle, 0) }
