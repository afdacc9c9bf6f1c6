// Package couchtest gives tests a real CouchDB-compatible server: COUCHDB_URL if set, else a
// single Apache CouchDB node started from a local release (COUCHQ_COUCHDB_HOME, else
// /opt/couchdb), else Apache CouchDB (couchdb:3) in Docker when a Docker engine answers, else
// PouchDB Server started from tools/pouchdb-server. Each test gets its own database via NewDB.
//
// With a local release, Server.Cluster also gives the cluster tier a 3-node cluster of its own
// (q=2, n=3), whose nodes tests can stop, kill and restart.
//
// A package's tests typically share one server per test binary:
//
//	var srv *couchtest.Server
//
//	func TestMain(m *testing.M) { couchtest.Main(m, func(s *couchtest.Server) { srv = s }) }
package couchtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/go-kivik/kivik/v4/couchdb"
	"github.com/ory/dockertest/v3"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/localserver"
)

// Kind says where the server came from.
type Kind string

const (
	KindEnv     Kind = "env"     // COUCHDB_URL
	KindLocal   Kind = "local"   // a single Apache CouchDB node started from a local release
	KindDocker  Kind = "docker"  // couchdb:3 container started by couchtest
	KindPouchDB Kind = "pouchdb" // PouchDB Server child process started by couchtest
)

// Environment variables read by Start.
const (
	EnvURL      = "COUCHDB_URL"      // use this server; credentials in the URL or in the next two
	EnvUser     = "COUCHDB_USER"     //
	EnvPassword = "COUCHDB_PASSWORD" //
	// EnvServer forces the choice when COUCHDB_URL is unset: "couchdb" (the local Apache CouchDB
	// release; fail rather than fall back), "docker" (skip the local release; fail rather than
	// fall back) or "pouchdb" (neither of them).
	EnvServer = "COUCHQ_TEST_SERVER"
)

// Values of EnvServer.
const (
	ServerCouchDB = "couchdb"
	ServerDocker  = "docker"
	ServerPouchDB = "pouchdb"
)

const (
	startTimeout   = 10 * time.Minute // covers a docker pull or an npm ci
	cleanupTimeout = 30 * time.Second
)

// Server is a running test server. Its methods are safe for concurrent use.
type Server struct {
	kind     Kind
	reason   string
	base     *url.URL // no credentials, no trailing slash
	user     string
	password string
	caps     Capabilities
	httpc    *http.Client
	logger   zerolog.Logger

	pouch   *localserver.PouchDB // KindPouchDB
	couch   *localserver.CouchDB // KindLocal, and each node set a Cluster runs
	dataDir string               // KindPouchDB and KindLocal; removed by Stop
	cluster clusterState         // the cluster tier's 3-node cluster, started on first use
	pool    *dockertest.Pool     // KindDocker
	res     *dockertest.Resource // KindDocker

	stopOnce sync.Once
	stopErr  error
}

// Main starts a server, hands it to use (typically to store it in a package variable), runs the
// tests, stops the server and exits. Interrupting the test binary stops the server too, so that no
// container is left behind.
func Main(m *testing.M, use func(*Server)) {
	os.Exit(runMain(m, use))
}

func runMain(m *testing.M, use func(*Server)) int {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	srv, err := Start(ctx)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "couchtest: no test server: %v\n", err)
		return 1
	}
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if err := srv.Stop(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "couchtest: stopping test server: %v\n", err)
		}
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		sig := <-sigs
		fmt.Fprintf(os.Stderr, "couchtest: %v: stopping test server\n", sig)
		stop()
		os.Exit(1)
	}()
	defer stop()
	use(srv)
	return m.Run()
}

// Start picks and starts a server (see the package comment), logs which one and why to stderr,
// and detects its capabilities.
func Start(ctx context.Context) (*Server, error) {
	logger := zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: "15:04:05.000"}).
		With().Timestamp().Str("component", "couchtest").Logger()
	s, err := selectServer(ctx, logger)
	if err != nil {
		return nil, err
	}
	if s.caps, err = detectCapabilities(ctx, s); err != nil {
		_ = s.Stop(ctx)
		return nil, fmt.Errorf("detecting capabilities of %s: %w", s, err)
	}
	logger.Info().Str("kind", string(s.kind)).Str("url", s.URL()).Str("why", s.reason).
		Str("vendor", s.caps.Vendor).Str("version", s.caps.Version).Msg("test server ready")
	return s, nil
}

func selectServer(ctx context.Context, logger zerolog.Logger) (*Server, error) {
	if raw := os.Getenv(EnvURL); raw != "" {
		return fromEnv(raw, logger)
	}
	force := os.Getenv(EnvServer)
	switch force {
	case "", ServerCouchDB, ServerDocker, ServerPouchDB:
	default:
		return nil, fmt.Errorf("%s=%q: want %s, %s or %s", EnvServer, force, ServerCouchDB, ServerDocker, ServerPouchDB)
	}
	why := []string{EnvURL + " is unset"}
	if force == "" || force == ServerCouchDB {
		home, err := localserver.FindCouchDB(os.Getenv)
		if err == nil {
			var s *Server
			if s, err = startLocal(ctx, home, logger); err == nil {
				s.reason = strings.Join(append(why, "a local Apache CouchDB release is installed at "+home), "; ")
				return s, nil
			}
			// Said in the run's first line, and the next server is tried.
			err = fmt.Errorf("starting the local Apache CouchDB at %s failed: %w", home, err)
		}
		if force == ServerCouchDB {
			return nil, fmt.Errorf("%s=%s: %w", EnvServer, ServerCouchDB, err)
		}
		why = append(why, err.Error())
	} else {
		why = append(why, EnvServer+"="+force)
	}
	if force == "" || force == ServerDocker {
		pool, err := dockerPool(ctx)
		if err == nil {
			s, err := startDocker(ctx, pool, logger)
			if err == nil {
				s.reason = strings.Join(append(why, "a Docker engine answers"), "; ")
				return s, nil
			}
			if force == ServerDocker {
				return nil, err
			}
			why = append(why, "a Docker engine answers, but "+err.Error())
		} else {
			if force == ServerDocker {
				return nil, fmt.Errorf("%s=docker but no Docker engine answers: %w", EnvServer, err)
			}
			why = append(why, "no Docker engine answers ("+err.Error()+")")
		}
	}
	s, err := startPouchDB(ctx, logger)
	if err != nil {
		return nil, fmt.Errorf("%s; falling back to PouchDB Server failed: %w", strings.Join(why, "; "), err)
	}
	s.reason = strings.Join(why, "; ")
	return s, nil
}

func newServer(kind Kind, rawURL, user, password string, logger zerolog.Logger) (*Server, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("parsing server URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("server URL %q: want http(s)://host[:port][/path]", u.Redacted())
	}
	if u.User != nil {
		user = u.User.Username()
		password, _ = u.User.Password()
		u.User = nil
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath, u.RawQuery, u.Fragment = "", "", ""
	return &Server{
		kind:     kind,
		base:     u,
		user:     user,
		password: password,
		httpc:    &http.Client{Timeout: 2 * time.Minute}, // a backstop; requests carry contexts
		logger:   logger,
	}, nil
}

func fromEnv(raw string, logger zerolog.Logger) (*Server, error) {
	s, err := newServer(KindEnv, raw, os.Getenv(EnvUser), os.Getenv(EnvPassword), logger)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvURL, err)
	}
	s.reason = EnvURL + " is set"
	return s, nil
}

func startPouchDB(ctx context.Context, logger zerolog.Logger) (*Server, error) {
	dir, err := os.MkdirTemp("", "couchq-pouchdb-*")
	if err != nil {
		return nil, fmt.Errorf("creating PouchDB Server data dir: %w", err)
	}
	p, err := localserver.Start(ctx, localserver.Options{DataDir: dir, Logger: logger, RestartOnCrash: true})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s, err := newServer(KindPouchDB, p.URL(), "", "", logger) // PouchDB Server runs in "admin party" mode
	if err != nil {
		_ = p.Stop(ctx)
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s.pouch, s.dataDir = p, dir
	return s, nil
}

// Kind says where the server came from.
func (s *Server) Kind() Kind { return s.kind }

// Reason says why this server was chosen.
func (s *Server) Reason() string { return s.reason }

// Caps are the capabilities detected by Start.
func (s *Server) Caps() Capabilities { return s.caps }

// URL is the server's base URL, without credentials and without a trailing slash.
func (s *Server) URL() string { return s.base.String() }

// Credentials returns the basic-auth user and password; both are empty when the server needs none.
func (s *Server) Credentials() (user, password string) { return s.user, s.password }

func (s *Server) String() string {
	return fmt.Sprintf("%s server %s %s at %s", s.kind, s.caps.Vendor, s.caps.Version, s.URL())
}

// DBURL is the URL of database name, with credentials embedded, for raw HTTP tests
// (net/http turns URL user info into basic auth).
func (s *Server) DBURL(name string) string {
	u := *s.base
	if s.user != "" {
		u.User = url.UserPassword(s.user, s.password)
	}
	return u.String() + "/" + url.PathEscape(name)
}

// NewClient returns a kivik client for the server; the caller closes it.
func (s *Server) NewClient() (*kivik.Client, error) {
	var opts []kivik.Option
	if s.user != "" {
		// Not in the URL: kivik would switch to cookie auth, an extra session round trip per client.
		opts = append(opts, couchdb.BasicAuth(s.user, s.password))
	}
	c, err := kivik.New("couch", s.URL(), opts...)
	if err != nil {
		return nil, fmt.Errorf("creating kivik client for %s: %w", s.URL(), err)
	}
	return c, nil
}

// Client returns a kivik client that is closed when the test ends.
func (s *Server) Client(t testing.TB) *kivik.Client {
	t.Helper()
	c, err := s.NewClient()
	if err != nil {
		t.Fatalf("couchtest: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// UniqueDBName returns a database name unique to this test (it does not create the database) and
// drops that database, if it exists by then, when the test ends.
func (s *Server) UniqueDBName(t testing.TB) string {
	t.Helper()
	name := DBName(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		status, err := s.do(ctx, http.MethodDelete, "/"+url.PathEscape(name), nil, nil)
		if err != nil && status != http.StatusNotFound {
			t.Logf("couchtest: dropping test database %s: %v", name, err)
		}
	})
	return name
}

// NewDB creates a database unique to this test and drops it when the test ends.
func (s *Server) NewDB(t testing.TB) *kivik.DB {
	t.Helper()
	name := s.UniqueDBName(t)
	c := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := c.CreateDB(ctx, name); err != nil {
		t.Fatalf("couchtest: creating test database %s: %v", name, err)
	}
	return c.DB(name)
}

// Restart stops and restarts the server on the same data and URL. Only a server couchtest
// started from a local release (Apache CouchDB or PouchDB Server) can be restarted.
func (s *Server) Restart(ctx context.Context) error {
	switch {
	case s.couch != nil:
		if err := s.couch.StopNode(ctx, 1); err != nil {
			return fmt.Errorf("restarting the test server: %w", err)
		}
		if err := s.couch.StartNode(ctx, 1); err != nil {
			return fmt.Errorf("restarting the test server: %w", err)
		}
		return nil
	case s.pouch != nil:
		if err := s.pouch.Restart(ctx); err != nil {
			return fmt.Errorf("restarting the test server: %w", err)
		}
		return nil
	}
	return fmt.Errorf("restarting the test server: only a server couchtest started itself can be restarted; this is a %s server (%s)", s.kind, s.reason)
}

// CanRestart reports whether Restart can work on this server.
func (s *Server) CanRestart() bool { return s.couch != nil || s.pouch != nil }

// Stop stops the server if couchtest started it (an env server is left alone) and removes its
// data. Later calls return the first call's result.
func (s *Server) Stop(ctx context.Context) error {
	s.stopOnce.Do(func() {
		s.stopErr = s.cluster.stop(ctx)
		switch {
		case s.couch != nil:
			s.stopErr = errors.Join(s.stopErr, s.couch.Stop(ctx))
			if err := os.RemoveAll(s.dataDir); err != nil {
				s.stopErr = errors.Join(s.stopErr, fmt.Errorf("removing CouchDB data: %w", err))
			}
		case s.pouch != nil:
			s.stopErr = errors.Join(s.stopErr, s.pouch.Stop(ctx))
			if err := os.RemoveAll(s.dataDir); err != nil {
				s.stopErr = errors.Join(s.stopErr, fmt.Errorf("removing PouchDB Server data: %w", err))
			}
		case s.res != nil:
			if err := s.pool.Purge(s.res); err != nil {
				s.stopErr = errors.Join(s.stopErr, fmt.Errorf("removing CouchDB container %s: %w", s.res.Container.ID, err))
			}
		}
	})
	return s.stopErr
}

// Skip skips the test, saying why (t.Skip output is shown with -v).
func Skip(t testing.TB, reason string) {
	t.Helper()
	t.Skipf("couchtest: skipped: %s", reason)
}

// DBName derives a valid CouchDB database name from the test name plus a random suffix:
// ^[a-z][a-z0-9_$()+/-]*$, at most 238 characters. The couchq_test_ prefix makes leftovers on a
// shared COUCHDB_URL server easy to find.
func DBName(t testing.TB) string {
	var b strings.Builder
	for _, r := range strings.ToLower(t.Name()) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_', r == '-':
			b.WriteRune(r)
		default: // '/' is legal but needs escaping in every URL; keep names plain
			b.WriteByte('_')
		}
	}
	name := b.String()
	if len(name) > 100 {
		name = name[:100]
	}
	return "couchq_test_" + name + "_" + randomHex(4)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b)
}

// do sends a request to path (escaped, starting with '/') with a JSON body, if any, and decodes a
// JSON answer into out, if non-nil. Statuses >= 400 are errors carrying the server's answer; the
// status is returned either way so callers can accept specific ones.
func (s *Server) do(ctx context.Context, method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return 0, fmt.Errorf("%s %s: encoding body: %w", method, path, err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.URL()+path, rd)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json") // PouchDB Server stores other bodies as empty docs
	}
	if s.user != "" {
		req.SetBasicAuth(s.user, s.password)
	}
	resp, err := s.httpc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return resp.StatusCode, fmt.Errorf("%s %s: reading answer: %w", method, path, err)
	}
	if resp.StatusCode >= 400 {
		return resp.StatusCode, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(data))
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: decoding answer %q: %w", method, path, data, err)
		}
	}
	return resp.StatusCode, nil
}

// docPath is the escaped path of a document; design doc ids keep their slash, which both
// CouchDB and PouchDB Server route on.
func docPath(db, id string) string {
	if name, ok := strings.CutPrefix(id, "_design/"); ok {
		return "/" + url.PathEscape(db) + "/_design/" + url.PathEscape(name)
	}
	return "/" + url.PathEscape(db) + "/" + url.PathEscape(id)
}
