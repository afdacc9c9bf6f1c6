package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
)

const serveUsage = `Usage: couchq serve [--addr HOST:PORT] [--cache DURATION] [--settle DURATION] [flags]

Serves the queue's metrics and a small read-only JSON API over HTTP until
interrupted:

	/metrics     Prometheus metrics (see the README for the list)
	/api/stats   what 'couchq stats --json' prints; query parameters type,
	             since and until as the flags of stats
	/api/jobs    what 'couchq ls --json' prints; query parameters type,
	             status and limit (default 100, at most 1000)
	/healthz     200 {"couchdb":"ok"} when the database answers, else 503
	             with the error

There is no authentication, and /api/jobs shows job payloads: the default
address is loopback only, and binding elsewhere prints a warning.

	--addr HOST:PORT     where to listen (default 127.0.0.1:9090; port 0 picks one)
	--cache DURATION     reuse figures read from CouchDB for this long, so that
	                     frequent scrapes do not load it (default 5s)
	--settle DURATION    counters count activity up to this long ago, so that
	                     writes in flight and small clock differences between
	                     hosts are not missed (default 10s)

The counters (couchq_*_total and the timing summaries) are kept by this
process: the first scrape counts the whole activity log in the database and
later ones add what happened since. They restart with the process, as any
process's counters do; purging jobs does not lower them.

With --json the line saying where it listens is a JSON object.
`

// HTTP server limits: reading a request is quick or hostile; writing may
// wait for one refresh from CouchDB (refreshTimeout).
const (
	serveReadHeaderTimeout = 5 * time.Second
	serveReadTimeout       = 10 * time.Second
	serveWriteTimeout      = refreshTimeout + 15*time.Second
	serveIdleTimeout       = 2 * time.Minute
	serveShutdownTimeout   = 10 * time.Second
	apiTimeout             = refreshTimeout
	healthTimeout          = 5 * time.Second
	apiJobsMax             = 1000
)

func (m *Main) runServe(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("serve", serveUsage)
	conn := addConnFlags(fs)
	var addr string
	var cache, settle time.Duration
	fs.StringVar(&addr, "addr", "127.0.0.1:9090", "listen address")
	fs.DurationVar(&cache, "cache", 5*time.Second, "how long figures are reused")
	fs.DurationVar(&settle, "settle", 10*time.Second, "how far behind now the counters count")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageErrorf("unexpected argument %q (the address goes in --addr)", rest[0])
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return usageErrorf("invalid --addr %q: want HOST:PORT, e.g. 127.0.0.1:9090", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return usageErrorf("invalid --addr %q: port %q is not a number from 0 to 65535", addr, port)
	}
	if cache < 0 || settle < 0 {
		return usageErrorf("--cache and --settle must not be negative")
	}
	if err := conn.resolve(m); err != nil {
		return err
	}
	log = log.Level(conn.level)

	q, closeQueue, err := m.openQueue(ctx, conn, log)
	if err != nil {
		return err
	}
	defer closeQueue()

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	if !isLoopback(host) {
		log.Warn().Str("addr", ln.Addr().String()).
			Msg("listening on an address that is not loopback: there is no authentication and /api/jobs shows job payloads; put a proxy or firewall in front")
	}

	// Requests and refreshes outlive an interrupt until Shutdown's grace
	// period ends: a scrape in flight is answered, not cut off.
	reqCtx := context.WithoutCancel(ctx)
	srv := &http.Server{
		Handler:           newServeHandler(reqCtx, q, conn, m.Now, cache, settle, log),
		ReadHeaderTimeout: serveReadHeaderTimeout,
		ReadTimeout:       serveReadTimeout,
		WriteTimeout:      serveWriteTimeout,
		IdleTimeout:       serveIdleTimeout,
		BaseContext:       func(net.Listener) context.Context { return reqCtx },
		ErrorLog:          stdlog.New(log.With().Str("component", "http").Logger(), "", 0),
	}
	url := "http://" + ln.Addr().String()
	if conn.json {
		// One line, so that whatever started serve can read it as it comes.
		err = json.NewEncoder(m.Stdout).Encode(map[string]string{"listening": url, "metrics": url + "/metrics", "database": conn.db})
	} else {
		_, err = fmt.Fprintf(m.Stdout, "serving %s on %s: %s/metrics, /api/stats, /api/jobs, /healthz\n", conn.db, url, url)
	}
	if err != nil {
		_ = ln.Close()
		return err
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serving on %s: %w", url, err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(reqCtx, serveShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("stopping the server on %s: %w", url, err)
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving on %s: %w", url, err)
	}
	return nil
}

// isLoopback reports whether a listen host reaches only this machine. An
// empty host listens on every interface.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// server answers the HTTP endpoints of couchq serve.
type server struct {
	q     *couchq.Client
	conn  *connFlags
	now   func() time.Time
	log   zerolog.Logger
	stats *responseCache
}

// newServeHandler returns the handler for every endpoint. ctx bounds the
// metrics refreshes, which no request carries.
func newServeHandler(ctx context.Context, q *couchq.Client, conn *connFlags, now func() time.Time, ttl, settle time.Duration, log zerolog.Logger) http.Handler {
	s := &server{q: q, conn: conn, now: now, log: log, stats: &responseCache{ttl: ttl, now: now}}
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		newMetricsCollector(ctx, q, now, ttl, settle, log),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      promLogger{log},
		ErrorHandling: promhttp.ContinueOnError,
		Timeout:       refreshTimeout + 5*time.Second,
	}))
	mux.HandleFunc("GET /api/stats", s.apiStats)
	mux.HandleFunc("GET /api/jobs", s.apiJobs)
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /{$}", s.index)
	return mux
}

// promLogger passes promhttp's errors (a metric that could not be
// encoded) to the log.
type promLogger struct{ log zerolog.Logger }

func (l promLogger) Println(v ...any) { l.log.Error().Msg(strings.TrimSpace(fmt.Sprintln(v...))) }

func (s *server) index(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "couchq serve for database %s\n\n/metrics\n/api/stats?type=&since=24h&until=\n/api/jobs?type=&status=&limit=100\n/healthz\n", s.conn.db)
}

func (s *server) apiStats(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query()
	typ, since, until := p.Get("type"), p.Get("since"), p.Get("until")
	opts, err := statsOptions(typ, since, until, s.now())
	if err != nil {
		writeAPIError(w, http.StatusBadRequest, strings.ReplaceAll(err.Error(), "--", ""))
		return
	}
	body, err := s.stats.get(typ+"\x00"+since+"\x00"+until, func() ([]byte, error) {
		// Other requests may be waiting for this answer: one client
		// going away must not fail theirs.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), apiTimeout)
		defer cancel()
		st, err := queueStats(ctx, s.q, opts)
		if err != nil {
			return nil, err
		}
		var buf bytes.Buffer
		err = writeJSON(&buf, st)
		return buf.Bytes(), err
	})
	if err != nil {
		s.serverFailed(w, err)
		return
	}
	writeAPIBody(w, http.StatusOK, body)
}

func (s *server) apiJobs(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query()
	opts := couchq.ListOptions{Worker: p.Get("type"), Limit: 100}
	if st := p.Get("status"); st != "" {
		opts.Status = couchq.Status(st)
		if !opts.Status.Valid() {
			writeAPIError(w, http.StatusBadRequest, fmt.Sprintf("invalid status %q: want one of %s", st, statusList()))
			return
		}
	}
	if l := p.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > apiJobsMax {
			writeAPIError(w, http.StatusBadRequest, fmt.Sprintf("invalid limit %q: want a number from 1 to %d", l, apiJobsMax))
			return
		}
		opts.Limit = n
	}
	ctx, cancel := context.WithTimeout(r.Context(), apiTimeout)
	defer cancel()
	batch, err := s.q.List(ctx, opts)
	if err != nil {
		s.serverFailed(w, err)
		return
	}
	var buf bytes.Buffer
	if err := printJobs(&buf, s.q, batch, opts.Limit, s.now(), true); err != nil {
		s.serverFailed(w, err)
		return
	}
	writeAPIBody(w, http.StatusOK, buf.Bytes())
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
	defer cancel()
	if _, err := s.q.DB().Stats(ctx); err != nil {
		err = fmt.Errorf("reading database %s: %w", s.conn.db, serverError(s.conn.url, err))
		var buf bytes.Buffer
		_ = writeJSON(&buf, map[string]string{"couchdb": "unavailable", "error": describeError(err)})
		writeAPIBody(w, http.StatusServiceUnavailable, buf.Bytes())
		return
	}
	writeAPIBody(w, http.StatusOK, []byte(`{"couchdb":"ok"}`+"\n"))
}

// serverFailed answers 502: the request was fine, CouchDB was not.
func (s *server) serverFailed(w http.ResponseWriter, err error) {
	msg := describeError(serverError(s.conn.url, err))
	s.log.Warn().Str("error", msg).Msg("API request failed")
	writeAPIError(w, http.StatusBadGateway, msg)
}

func writeAPIError(w http.ResponseWriter, code int, msg string) {
	var buf bytes.Buffer
	_ = writeJSON(&buf, map[string]string{"error": msg})
	writeAPIBody(w, code, buf.Bytes())
}

func writeAPIBody(w http.ResponseWriter, code int, body []byte) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// responseCacheMax bounds how many distinct queries the cache holds; past
// it the cache starts over rather than grow with every query string.
const responseCacheMax = 64

// responseCache keeps computed responses for ttl, so that a dashboard
// polling /api/stats does not load CouchDB. Concurrent requests for the
// same key wait for one computation.
type responseCache struct {
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	entries map[string]*cacheEntry
}

type cacheEntry struct {
	ready chan struct{}
	at    time.Time
	body  []byte
	err   error
}

func (c *responseCache) get(key string, compute func() ([]byte, error)) ([]byte, error) {
	now := c.now()
	c.mu.Lock()
	e := c.entries[key]
	if e != nil {
		select {
		case <-e.ready:
			if age := now.Sub(e.at); e.err != nil || age < 0 || age >= c.ttl {
				e = nil // stale or failed: compute again
			}
		default: // being computed: wait for it
		}
	}
	if e == nil {
		if c.entries == nil || len(c.entries) >= responseCacheMax {
			c.entries = map[string]*cacheEntry{}
		}
		e = &cacheEntry{ready: make(chan struct{}), at: now}
		c.entries[key] = e
		c.mu.Unlock()
		e.body, e.err = compute()
		close(e.ready)
		return e.body, e.err
	}
	c.mu.Unlock()
	<-e.ready
	return e.body, e.err
}
