package opshttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/forms"
	"github.com/couchq/couchq/internal/protocol"
)

const (
	// healthTimeout bounds /healthz's one request: a probe that waits
	// longer than a load balancer's check is no use.
	healthTimeout = 5 * time.Second
	// jobsLimitDefault and jobsLimitMax bound /api/jobs?limit: one answer
	// must not read a whole database.
	jobsLimitDefault = 100
	jobsLimitMax     = 1000
	// scrapeMargin is what a scrape may take beyond one refresh: encoding
	// the runtime and process metrics.
	scrapeMargin = 5 * time.Second
)

// server answers the endpoints of NewHandler.
type server struct {
	q   *protocol.Client
	db  string
	cfg Config // with its defaults
	// cache holds the answers of the read-only endpoints but /api/jobs, by
	// path and query, and by user with ReadAuth.
	cache *responseCache
	// logins are the users recently logged in with ReadAuth.
	logins *loginCache
	// failedLogins are the logins CouchDB refused lately (login).
	failedLogins *failedLoginLog
	// hidden are the types of Config.HidePayload.
	hidden map[string]bool
}

// NewHandler returns the handler for every endpoint of the package (see
// the package documentation), reading q. Its paths are absolute: mount it
// at the root of a mux, or under a prefix with http.StripPrefix. ctx
// bounds the metrics refreshes, which no request carries; API requests are
// bounded by their own context and cfg.RefreshTimeout.
//
// /metrics serves NewCollector's metrics from a registry of the handler's
// own, with the Go runtime's and the process's. A service that has a
// registry already can register NewCollector on it instead and mount this
// handler for the API alone.
func NewHandler(ctx context.Context, queue *couchq.Client, cfg Config) http.Handler {
	q := (*protocol.Client)(queue)
	cfg = cfg.WithDefaults()
	s := &server{q: q, db: q.DB().Name(), cfg: cfg, cache: &responseCache{ttl: cfg.ttl(), now: cfg.Now},
		logins: &loginCache{ttl: cfg.ttl()}, failedLogins: &failedLoginLog{}, hidden: map[string]bool{}}
	for _, typ := range cfg.HidePayload {
		s.hidden[typ] = true
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		newCollector(ctx, q, cfg),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      promLogger{cfg},
		ErrorHandling: promhttp.ContinueOnError,
		Timeout:       cfg.RefreshTimeout + scrapeMargin,
	}))
	mux.HandleFunc("GET /api/stats", s.apiStats)
	mux.HandleFunc("GET /api/jobs", s.apiJobs)
	mux.HandleFunc("GET /api/jobs/{id}", s.apiJob)
	mux.HandleFunc("GET /api/sites", s.cached(s.apiSites))
	mux.HandleFunc("GET /healthz", s.healthz)
	s.dashboardRoutes(mux)
	return mux
}

// promLogger passes promhttp's errors (a metric that could not be
// encoded) to the log.
type promLogger struct{ cfg Config }

func (l promLogger) Println(v ...any) {
	l.cfg.Logger.Error().Msg(strings.TrimSpace(fmt.Sprintln(v...)))
}

func (s *server) apiStats(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query()
	typ, since, until := p.Get("type"), p.Get("since"), p.Get("until")
	opts, err := forms.StatsOptions(typ, since, until, s.cfg.Now())
	if err != nil {
		writeAPIError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.cached(func(ctx context.Context, q *protocol.Client, _ *http.Request) (any, error) {
		return forms.Stats(ctx, q, opts)
	})(w, r)
}

func (s *server) apiJobs(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query()
	opts := protocol.ListOptions{Worker: p.Get("type"), Limit: jobsLimitDefault}
	var err error
	if opts.Status, err = forms.ParseStatus(p.Get("status")); err != nil {
		writeAPIError(w, http.StatusBadRequest, err.Error())
		return
	}
	if l := p.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > jobsLimitMax {
			writeAPIError(w, http.StatusBadRequest, fmt.Sprintf("invalid limit %q: want a number from 1 to %d", l, jobsLimitMax))
			return
		}
		opts.Limit = n
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RefreshTimeout)
	defer cancel()
	rd, code, err := s.readerFor(ctx, r)
	if err != nil {
		refused(w, r, code, err)
		return
	}
	batch, err := rd.q.List(ctx, opts)
	if err != nil {
		s.readFailed(w, r, rd, err)
		return
	}
	jobs, err := s.hidePayloads(forms.Jobs(batch))
	if err != nil {
		s.serverFailed(w, err)
		return
	}
	s.writeJSON(w, jobs)
}

// apiJob is one job, as it will be settled if it is conflicted (the
// document Get reads), with the same reader and hidden payloads as
// apiJobs; 404 for an id that holds no job.
func (s *server) apiJob(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RefreshTimeout)
	defer cancel()
	rd, code, err := s.readerFor(ctx, r)
	if err != nil {
		refused(w, r, code, err)
		return
	}
	it, err := rd.q.Get(ctx, r.PathValue("id"))
	var bad *protocol.MalformedError
	switch {
	case errors.Is(err, protocol.ErrNotFound):
		writeAPIError(w, http.StatusNotFound, err.Error())
		return
	case errors.As(err, &bad):
		writeAPIError(w, http.StatusUnprocessableEntity, err.Error())
		return
	case err != nil:
		s.readFailed(w, r, rd, err)
		return
	}
	jobs, err := s.hidePayloads([]any{it})
	if err != nil {
		s.serverFailed(w, err)
		return
	}
	s.writeJSON(w, jobs[0])
}

// apiSites is the sites with their heartbeats' age and, when they can be
// read, the links this server holds for the database.
func (s *server) apiSites(ctx context.Context, q *protocol.Client, _ *http.Request) (any, error) {
	sites, err := forms.Sites(ctx, q, s.cfg.Now())
	if err != nil {
		return nil, err
	}
	report := forms.SitesReport{Sites: sites}
	if len(sites) == 0 {
		return report, nil
	}
	// The links are extra: the replicator's state is a server admin's to
	// read, and a client not opened through a Server has no way to it.
	// Without them the sites still answer.
	if links, err := q.Links(ctx); err == nil {
		report.Links = forms.Links(links)
	} else {
		s.cfg.Logger.Debug().Err(err).Msg("/api/sites without the links")
	}
	return report, nil
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
	defer cancel()
	if _, err := s.q.DB().Stats(ctx); err != nil {
		var buf bytes.Buffer
		_ = forms.WriteJSON(&buf, map[string]string{"couchdb": "unavailable",
			"error": fmt.Sprintf("reading database %s: %s", s.db, s.cfg.ErrorMessage(err))})
		writeAPIBody(w, http.StatusServiceUnavailable, buf.Bytes())
		return
	}
	writeAPIBody(w, http.StatusOK, []byte(`{"couchdb":"ok"}`+"\n"))
}

// serverFailed answers 502: the request was fine, CouchDB was not.
func (s *server) serverFailed(w http.ResponseWriter, err error) {
	msg := s.cfg.ErrorMessage(err)
	s.cfg.Logger.Warn().Str("error", msg).Msg("API request failed")
	writeAPIError(w, http.StatusBadGateway, msg)
}

func writeAPIError(w http.ResponseWriter, code int, msg string) {
	var buf bytes.Buffer
	_ = forms.WriteJSON(&buf, map[string]string{"error": msg})
	writeAPIBody(w, code, buf.Bytes())
}

func writeAPIBody(w http.ResponseWriter, code int, body []byte) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
