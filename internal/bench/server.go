package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/localserver"
)

// target is the server a run measures: where it is, what it is, and the
// clients the sections use.
type target struct {
	base           string // no credentials
	user, password string
	info           ServerInfo
	// srv is what couchq.Connect returned; queue clients come from queue.
	srv *couchq.Server
	// queue opens the couchq clients the sections measure: srv itself, or
	// a copy whose kivik client counts requests (see Config.Instrument).
	queue *couchq.Server
	kivik *kivik.Client // queue's kivik client when instrumented, to close
	// raw is for the ceiling section and housekeeping: plain net/http with
	// enough idle connections for every ceiling writer, so the ceiling is
	// the server's and not the client's.
	raw   *http.Client
	stats *httpStats
	stop  func(context.Context) error // stops a local server; nil otherwise
	// serverPID is the local server's process, 0 when unknown (a --url
	// server, or no /proc).
	serverPID int
}

// connect reaches the configured server, or starts a local PouchDB Server
// when none is configured.
func connect(ctx context.Context, cfg Config, log zerolog.Logger) (*target, error) {
	t := &target{stats: &httpStats{}}
	rawURL := cfg.URL
	origin := cfg.URLOrigin
	if rawURL == "" {
		dir, err := os.MkdirTemp("", "couchq-bench-*")
		if err != nil {
			return nil, fmt.Errorf("creating a data directory for PouchDB Server: %w", err)
		}
		log.Info().Str("data_dir", dir).Msg("starting a local PouchDB Server")
		p, err := localserver.Start(ctx, localserver.Options{DataDir: dir, Logger: log})
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("starting a local PouchDB Server: %w", err)
		}
		t.stop = func(ctx context.Context) error {
			err := p.Stop(ctx)
			return errors.Join(err, os.RemoveAll(dir))
		}
		rawURL, origin = p.URL(), "local PouchDB Server started by the bench"
		if pid, err := findServerPID(p.DataDir()); err == nil {
			t.serverPID = pid
		} else {
			log.Info().Err(err).Msg("no CPU and memory figures for the server")
		}
	}
	if err := t.setup(ctx, cfg, rawURL, origin); err != nil {
		_ = t.close(context.WithoutCancel(ctx))
		return nil, err
	}
	return t, nil
}

func (t *target) setup(ctx context.Context, cfg Config, rawURL, origin string) error {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return fmt.Errorf("server URL %s: want http(s)://host:port", couchq.Redact(rawURL))
	}
	t.user, t.password = cfg.User, cfg.Password
	if u.User != nil {
		// As couchq.Dial: credentials in the URL fill in what is not given.
		if t.user == "" {
			t.user = u.User.Username()
		}
		if pw, ok := u.User.Password(); ok && t.password == "" {
			t.password = pw
		}
		u.User = nil
	}
	t.base = strings.TrimRight(u.String(), "/")
	if err := checkLoopback(ctx, u.Hostname()); err != nil {
		return fmt.Errorf("server %s: %w", t.base, err)
	}
	t.srv, err = couchq.Connect(ctx, t.base, t.user, t.password)
	if err != nil {
		return err
	}
	t.info = ServerInfo{URL: t.base, Vendor: t.srv.Caps.Vendor, Version: t.srv.Caps.Version, Origin: origin}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = max(cfg.Clients, 64)
	t.raw = &http.Client{Transport: tr}
	t.queue = t.srv
	if cfg.Instrument {
		// couchq's own HTTP client, counted: the workers see exactly what
		// couchq.Connect gives them, _selector feed included.
		counted := &http.Client{Transport: newCountingTransport(t.stats, cfg.ClientIdleConns)}
		if t.queue, err = couchq.ConnectHTTP(ctx, t.base, t.user, t.password, counted); err != nil {
			return err
		}
		t.kivik = t.queue.Client
	}
	return nil
}

// close releases the clients and stops a local server.
func (t *target) close(ctx context.Context) error {
	var errs []error
	if t.kivik != nil {
		errs = append(errs, t.kivik.Close())
	}
	if t.srv != nil {
		errs = append(errs, t.srv.Client.Close())
	}
	if t.raw != nil {
		t.raw.CloseIdleConnections()
	}
	if t.stop != nil {
		errs = append(errs, t.stop(ctx))
	}
	return errors.Join(errs...)
}

// checkLoopback refuses servers off this machine: the bench floods its
// target with writes and creates and drops databases.
func checkLoopback(ctx context.Context, host string) error {
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsLoopback() {
			return nil
		}
		return fmt.Errorf("%s is not a loopback address; the bench only runs against this machine", host)
	}
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return fmt.Errorf("resolving %s: %w", host, err)
	}
	for _, a := range addrs {
		if !a.IP.IsLoopback() {
			return fmt.Errorf("%s resolves to %s, not a loopback address; the bench only runs against this machine", host, a.IP)
		}
	}
	if len(addrs) == 0 {
		return fmt.Errorf("%s resolves to no address", host)
	}
	return nil
}

// newDB creates a fresh database with couchq's design document.
func (t *target) newDB(ctx context.Context, section string, log zerolog.Logger) (string, error) {
	name := "couchq_bench_" + section + "_" + randomHex(4)
	if _, err := couchq.Init(ctx, t.srv.Client, name, log); err != nil {
		return "", fmt.Errorf("creating database %s: %w", name, err)
	}
	return name, nil
}

// dropDB deletes a database the bench created.
func (t *target) dropDB(ctx context.Context, name string) error {
	if err := t.srv.Client.DestroyDB(ctx, name); err != nil && kivik.HTTPStatus(err) != http.StatusNotFound {
		return fmt.Errorf("dropping database %s: %w", name, err)
	}
	return nil
}

// open returns a queue client on db, as the workers use it.
func (t *target) open(ctx context.Context, db string) (*couchq.Client, error) {
	return t.queue.Open(ctx, db, couchq.Config{})
}

// cpuUse is CPU time used so far by the bench process and the server.
type cpuUse struct {
	bench, server time.Duration
	ok, serverOK  bool
}

func (t *target) cpu() cpuUse {
	var u cpuUse
	var err error
	u.bench, err = processCPU(os.Getpid())
	u.ok = err == nil
	if t.serverPID != 0 {
		u.server, err = processCPU(t.serverPID)
		u.serverOK = err == nil
	}
	return u
}

// cpuRows adds CPU time per job between two readings.
func cpuRows(s *Section, prefix string, before, after cpuUse, jobs int) {
	if jobs == 0 {
		return
	}
	per := func(d time.Duration) time.Duration { return d / time.Duration(jobs) }
	if before.ok && after.ok {
		s.add(durRow(prefix+"CPU per job, bench process (queue clients + workers)", per(after.bench-before.bench)))
	}
	if before.serverOK && after.serverOK {
		s.add(durRow(prefix+"CPU per job, server process", per(after.server-before.server)))
	}
}

// httpStats counts the queue clients' HTTP traffic by kind of request.
type httpStats struct {
	dials    atomic.Int64
	requests [numKinds]atomic.Int64
}

// The kinds of request told apart.
const (
	kindDue      = iota // due view with documents (Due)
	kindNext            // due view without documents (Next)
	kindView            // any other view (sweeps, listings)
	kindChanges         // _changes long-polls
	kindBulk            // _bulk_docs (bulk enqueue, ClaimMany)
	kindJobPut          // PUT/DELETE of a job (Enqueue, Claim, Complete, ...)
	kindJobGet          // GET of a job (confirming reads)
	kindRegistry        // worker registry documents
	kindOther
	numKinds
)

var kindNames = [numKinds]string{
	"due view with docs (Due)", "due view, no docs (Next)", "other views", "_changes", "_bulk_docs",
	"job PUT/DELETE", "job GET", "worker registry", "other",
}

// snapshot returns the counters: requests by kind and TCP connections opened.
func (s *httpStats) snapshot() (reqs [numKinds]int64, dials int64) {
	for i := range reqs {
		reqs[i] = s.requests[i].Load()
	}
	return reqs, s.dials.Load()
}

type countingTransport struct {
	next  http.RoundTripper
	stats *httpStats
}

// newCountingTransport wraps couchq's transport (couchq.NewHTTPClient),
// counting dials and requests; idle > 0 overrides its idle connections
// per host.
func newCountingTransport(stats *httpStats, idle int) http.RoundTripper {
	tr := couchq.NewHTTPClient().Transport.(*http.Transport)
	if idle > 0 {
		tr.MaxIdleConnsPerHost = idle
	}
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		stats.dials.Add(1)
		return dial(ctx, network, addr)
	}
	return &countingTransport{next: tr, stats: stats}
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.stats.requests[classify(req)].Add(1)
	return c.next.RoundTrip(req)
}

// classify sorts a request into a kind by method and path.
func classify(req *http.Request) int {
	p := req.URL.Path
	switch {
	case strings.Contains(p, "/_view/due"):
		if req.URL.Query().Get("include_docs") == "true" {
			return kindDue
		}
		return kindNext
	case strings.Contains(p, "/_view/"):
		return kindView
	case strings.HasSuffix(p, "/_changes"):
		return kindChanges
	case strings.HasSuffix(p, "/_bulk_docs"):
		return kindBulk
	case strings.Contains(p, "/worker:"), strings.Contains(p, "/worker%3A"):
		return kindRegistry
	case strings.Contains(p, "/job:"), strings.Contains(p, "/job%3A"):
		if req.Method == http.MethodGet || req.Method == http.MethodHead {
			return kindJobGet
		}
		return kindJobPut
	}
	return kindOther
}
