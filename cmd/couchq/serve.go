package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/opshttp"
)

const serveUsage = `Usage: couchq serve [--addr HOST:PORT] [--read-auth=true|false] [--hide-payload TYPES] [flags]

Serves the queue's dashboard, metrics and a JSON API over HTTP until
interrupted:

	/            the dashboard: queues per type, plots over 1h, 24h or 7d,
	             workers, failed jobs with their history; retry, cancel,
	             pause and resume from the page (see below)
	/metrics     Prometheus metrics (docs/operating.md lists them)
	/api/stats   what 'couchq stats --json' prints; query parameters type,
	             since and until as the flags of stats
	/api/jobs    what 'couchq ls --json' prints; query parameters type,
	             status and limit (default 100, at most 1000)
	/api/queues, /api/series?window=1h|24h|7d&type=, /api/workers,
	/api/failed?type=&limit=
	             what the dashboard reads
	/healthz     200 {"couchdb":"ok"} when the database answers, else 503
	             with the error

The actions (POST /api/jobs/ID/retry, /api/jobs/ID/cancel,
/api/types/TYPE/pause, /api/types/TYPE/resume) need a CouchDB user who may
read the database and, where couchq init set roles, has the worker role:
basic auth or CouchDB's AuthSession cookie, checked with the server's
/_session, and named in the job's history.

With --read-auth, every read but /healthz and /metrics needs that login
too (401 without one; the page's own form asks for it), and is made as
that user: the database's _security applies, so a user it leaves out gets
403, as from CouchDB itself. --read-auth is on by default when --addr is
not a loopback address, and off on loopback, where anyone who can reach
the port already runs on the machine; --read-auth=false turns it off
anywhere (then /api/jobs shows job payloads to anyone who reaches the
port: put a proxy or firewall in front). Either way /metrics and /healthz
stay open, for Prometheus and load balancers, and so do the page and its
scripts, which hold no figures, so that the login form shows. With
--read-auth, figures are cached per user (--cache), never shared between
users.

	--addr HOST:PORT     where to listen (default 127.0.0.1:9090; port 0 picks one)
	--read-auth          reads need a CouchDB login and are made as that user
	                     (default: on unless --addr is loopback)
	--hide-payload TYPES comma-separated job types whose payloads the API and
	                     the dashboard do not show ("hidden")
	--cache DURATION     reuse figures read from CouchDB for this long, so that
	                     frequent scrapes do not load it (default 5s)
	--settle DURATION    counters count activity up to this long ago, so that
	                     writes in flight and small clock differences between
	                     hosts are not missed (default 10s)

The counters (couchq_*_total and the timing summaries) are kept by this
process: the first scrape counts the whole activity log in the database and
later ones add what happened since. They restart with the process, as any
process's counters do; purging jobs does not lower them. In a queue of
several sites, other sites' activity arrives over the links: what arrives
later than --settle after it happened (a cut link, an offline producer) is
not added; raise --settle to the lag to allow for, or count at the owner.

With --json the line saying where it listens is a JSON object.

A Go service can serve the same endpoints on its own mux: they are the
package github.com/couchq/couchq/opshttp.
`

// serveWriteTimeout bounds writing an answer: it may wait for one refresh
// from CouchDB (opshttp.Config.RefreshTimeout, which serve leaves at its
// default).
const serveWriteTimeout = opshttp.RefreshTimeoutDefault + 15*time.Second

func (m *Main) runServe(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("serve", serveUsage)
	conn := addConnFlags(fs)
	var addr, hide string
	var cache, settle time.Duration
	var readAuth bool
	fs.StringVar(&addr, "addr", "127.0.0.1:9090", "listen address")
	fs.BoolVar(&readAuth, "read-auth", false, "reads need a CouchDB login (default: unless --addr is loopback)")
	fs.StringVar(&hide, "hide-payload", "", "job types whose payloads are not shown")
	fs.DurationVar(&cache, "cache", opshttp.CacheTTLDefault, "how long figures are reused")
	fs.DurationVar(&settle, "settle", opshttp.SettleDefault, "how far behind now the counters count")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return cli.Usagef("unexpected argument %q (the address goes in --addr)", rest[0])
	}
	host, err := cli.CheckListenAddr("addr", addr, "127.0.0.1:9090")
	if err != nil {
		return err
	}
	if cache < 0 || settle < 0 {
		return cli.Usagef("--cache and --settle must not be negative")
	}
	if !flagSet(fs, "read-auth") {
		// Whoever can reach a loopback address is on this machine already;
		// anywhere else, the job payloads would be anyone's to read.
		readAuth = !cli.IsLoopback(host)
	}
	hidden, err := typeList("hide-payload", hide)
	if err != nil {
		return err
	}
	if err := conn.resolve(m); err != nil {
		return err
	}
	log = log.Level(conn.level)

	// Through a Server, unlike the other commands: /api/sites reads the
	// links this server holds through that connection.
	q, closeQueue, err := conn.Open(ctx, cli.CommandConfig(log, m.Now, conn.Site))
	if err != nil {
		return err
	}
	defer closeQueue()
	if conn.Site == "" {
		// Everything else works for no site; the agents' claims cannot.
		if err := q.RefreshSites(ctx); err != nil {
			return cli.ServerError(conn.URL, err)
		}
		if _, haveSites := q.SiteListed(""); haveSites {
			log.Warn().Msg("the database has sites and this server works for none: agents' claims (POST /api/claim) are refused until it runs with --site (or COUCHQ_SITE); a cancel or retry goes to the job's owner site as a request")
		}
	}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	// The actions check the credentials a request carries against the
	// server's /_session, reached as serve reaches it but without serve's
	// own credentials.
	hc, err := conn.HTTPClient(log)
	if err != nil {
		return err
	}
	couchURL, err := url.Parse(protocol.SplitNodeURLs(conn.RawURL)[0])
	if err != nil {
		return cli.Usagef("invalid --url %q", conn.URL)
	}
	couchURL.User = nil

	if !cli.IsLoopback(host) && !readAuth {
		log.Warn().Str("addr", ln.Addr().String()).
			Msg("listening on an address that is not loopback with --read-auth=false: only the dashboard's actions authenticate, and /api/jobs shows job payloads; put a proxy or firewall in front")
	}

	// Requests and refreshes outlive an interrupt until Shutdown's grace
	// period ends: a scrape in flight is answered, not cut off.
	reqCtx := context.WithoutCancel(ctx)
	var handler http.Handler = opshttp.NewHandler(reqCtx, (*couchq.Client)(q), opshttp.Config{
		CacheTTL: zeroIsNone(cache),
		Settle:   zeroIsNone(settle),
		Now:      m.Now,
		Logger:   log,
		// Say where the server is when it cannot be reached, as
		// every command does.
		ErrorMessage: func(err error) string { return cli.DescribeError(cli.ServerError(conn.URL, err)) },
		CouchURL:     couchURL.String(),
		HTTPClient:   hc,
		ReadAuth:     readAuth,
		HidePayload:  hidden,
	})
	if cli.IsLoopback(host) && !readAuth {
		handler = cli.LoopbackNamesOnly(handler)
	}
	srv := cli.NewHTTPServer(reqCtx, handler, serveWriteTimeout, log)
	base := "http://" + ln.Addr().String()
	if conn.json {
		// One line, so that whatever started serve can read it as it comes.
		err = json.NewEncoder(m.Stdout).Encode(map[string]any{"listening": base, "metrics": base + "/metrics", "database": conn.DB, "read_auth": readAuth})
	} else {
		reads := "reads open to anyone who reaches the port"
		if readAuth {
			reads = "reads need a CouchDB login"
		}
		_, err = fmt.Fprintf(m.Stdout, "serving %s: the dashboard at %s/, metrics at %s/metrics (%s)\n", conn.DB, base, base, reads)
	}
	if err != nil {
		_ = ln.Close()
		return err
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serving on %s: %w", base, err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(reqCtx, cli.ServeShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("stopping the server on %s: %w", base, err)
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving on %s: %w", base, err)
	}
	return nil
}

// zeroIsNone maps a flag's 0s, which means none, to opshttp.Config's
// negative none: Config's zero means the default.
func zeroIsNone(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// typeList reads a comma-separated list of job types ("" is none).
func typeList(flagName, s string) ([]string, error) {
	var types []string
	for _, t := range strings.Split(s, ",") {
		if t = strings.TrimSpace(t); t != "" {
			types = append(types, t)
		}
	}
	if s != "" && len(types) == 0 {
		return nil, cli.Usagef("invalid --%s %q: want job types separated by commas", flagName, s)
	}
	return types, nil
}
