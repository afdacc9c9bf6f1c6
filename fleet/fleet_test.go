package fleet_test

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/fleet"
	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// srv is the real server the tests that run workers share.
var srv *couchtest.Server

func TestMain(m *testing.M) { couchtest.Main(m, func(s *couchtest.Server) { srv = s }) }

// testLog logs to the test's output.
func testLog(t *testing.T) zerolog.Logger { return zerolog.New(zerolog.NewTestWriter(t)) }

// Load applies [defaults] and the built-in defaults to every type, and
// the environment over the file's [couchdb] table.
func TestLoad(t *testing.T) {
	for _, name := range []string{"COUCHDB_URL", "COUCHDB_USER", "COUCHDB_PASSWORD", "COUCHDB_PASSWORD_FILE", "COUCHQ_DB"} {
		t.Setenv(name, "")
	}
	t.Setenv("FLEET_TEST_PW", "s3cret-pw")
	path := filepath.Join("testdata", "workers.toml")
	cfg, err := fleet.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	wantConn := fleet.Connection{URL: "http://127.0.0.1:1,http://127.0.0.2:1", User: "couchq-worker", Password: "s3cret-pw", DB: "couchq_jobs"}
	if cfg.Connection != wantConn {
		t.Errorf("connection %+v, want %+v", cfg.Connection, wantConn)
	}
	if s := cfg.Connection.String(); strings.Contains(s, "s3cret") || s != "http://127.0.0.1:1,http://127.0.0.2:1 database couchq_jobs" {
		t.Errorf("Connection.String() = %q", s)
	}
	if len(cfg.Types) != 2 {
		t.Fatalf("types %+v, want email and ping", cfg.Types)
	}
	email, ping := cfg.Types[0], cfg.Types[1]
	if email.Name != "email" || email.Handler != "exec" || email.Exec != "/bin/cat" || email.Concurrency != 2 ||
		email.Lease != time.Minute || email.MaxAttempts != 7 || email.Rate != "10/s" || email.FleetConcurrency != 5 ||
		email.RetryDelay != nil || email.HTTPTimeout != 10*time.Second {
		t.Errorf("email: %+v", email)
	}
	if ping.Name != "ping" || ping.Handler != "" || ping.Concurrency != 8 || ping.Lease != worker.LeaseDurationDefault ||
		ping.RetryDelay == nil || *ping.RetryDelay != 2*time.Second || !ping.DeleteDone {
		t.Errorf("ping: %+v", ping)
	}
	if cfg.ShutdownTimeout != 45*time.Second || cfg.LogLevel != "warn" || cfg.HealthAddr != "" {
		t.Errorf("process settings: %+v", cfg)
	}
	if len(cfg.Periodic) != 1 || cfg.Periodic[0].Name != "report" || cfg.Periodic[0].Location.String() != "Europe/Berlin" ||
		cfg.Periodic[0].Job.Priority != 1 {
		t.Errorf("periodic: %+v", cfg.Periodic)
	} else if payload, err := json.Marshal(cfg.Periodic[0].Job.Payload); err != nil || string(payload) != `{"format":"pdf","pages":[1,2]}` {
		t.Errorf("periodic payload: %s, %v", payload, err)
	}

	// The environment wins over the file, as for couchq worker.
	t.Setenv("COUCHDB_URL", "http://couch.example:5984")
	t.Setenv("COUCHDB_PASSWORD", "from-env")
	if cfg, err = fleet.Load(path); err != nil {
		t.Fatal(err)
	}
	wantConn = fleet.Connection{URL: "http://couch.example:5984", User: "couchq-worker", Password: "from-env", DB: "couchq_jobs"}
	if cfg.Connection != wantConn {
		t.Errorf("connection with the environment %+v, want %+v", cfg.Connection, wantConn)
	}
	t.Setenv("COUCHDB_PASSWORD", "")
	t.Setenv("FLEET_TEST_PW", "")
	if _, err := fleet.Load(path); err == nil || !strings.Contains(err.Error(), "$FLEET_TEST_PW is empty or unset") {
		t.Errorf("password_env unset: %v", err)
	}
}

// Mistakes in the file name the file, the line and the key, in the
// settings' own names rather than the couchq command's flags.
func TestLoadErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, body, want string }{
		{"unknown key", "[types.a]\nhandler = \"noop\"\nconcurency = 3\n", ":3: types.a.concurency: unknown key"},
		{"unknown table", "[type.a]\nhandler = \"noop\"\n", ":1: type.a: unknown key"},
		{"bad duration", "[types.a]\nhandler = \"noop\"\nlease = \"3x\"\n", `:3: types.a.lease: invalid duration "3x"`},
		{"wrong type", "[types.a]\nhandler = \"noop\"\nconcurrency = \"many\"\n", ":3: types.a.concurrency: want a whole number, got a TOML string"},
		{"duration as a number", "[types.a]\nhandler = \"noop\"\nlease = 30\n", `:3: types.a.lease: invalid duration "30": want a string such as "30s"`},
		{"exec without a command", "[types.a]\nhandler = \"exec\"\n", ":1: types.a: no command given"},
		{"negative job timeout", "[types.a]\nhandler = \"noop\"\njob_timeout = \"-1s\"\n", ":3: types.a.job_timeout: must not be negative (0 sets no bound), got -1s"},
		{"too many attempts", "[types.a]\nhandler = \"noop\"\nmax_attempts = 3000000000\n", ":3: types.a.max_attempts: must be at most 2147483647"},
		{"zero", "[types.a]\nhandler = \"noop\"\n\nconcurrency = 0\n", ":4: types.a.concurrency: must be at least 1, got 0"},
		{"from defaults", "[defaults]\nmax_attempts = 0\n[types.a]\nhandler = \"noop\"\n", ":2: defaults.max_attempts: must be at least 1"},
		{"unknown handler", "[types.a]\nhandler = \"smtp\"\n", `:2: types.a.handler: unknown handler "smtp"`},
		{"exec elsewhere", "[types.a]\nhandler = \"noop\"\nexec = \"x\"\n", `:3: types.a.exec: only for handler "exec"`},
		{"bad exec", "[types.a]\nhandler = \"exec\"\nexec = \"sh -c 'x\"\n", `:1: types.a: invalid exec "sh -c 'x": unterminated quote`},
		{"bad rate", "[types.a]\nhandler = \"noop\"\nrate = \"ten\"\n", ":3: types.a.rate:"},
		{"heartbeat", "[types.a]\nhandler = \"noop\"\nheartbeat = \"1m\"\n", ":1: types.a: invalid heartbeat 1m0s: must be shorter than the lease"},
		{"health addr", "[worker]\nhealth_addr = \"8081\"\n[types.a]\nhandler = \"noop\"\n", `:2: worker.health_addr: invalid health_addr "8081": want HOST:PORT`},
		{"log level", "[worker]\nlog_level = \"chatty\"\n[types.a]\n", `:2: worker.log_level: invalid "chatty"`},
		{"no types", "[couchdb]\ndb = \"x\"\n", ": no [types.NAME] tables"},
		{"two types in one table", "[types.a]\nhandler = \"noop\"\n[types.\"b,c\"]\nhandler = \"noop\"\n", `:3: invalid job type "b,c": a [types.NAME] table names one job type`},
		{"spaces", "[types.\" a\"]\nhandler = \"noop\"\n", `:1: invalid job type " a"`},
		{"periodic", "[types.a]\nhandler = \"noop\"\n[[periodic]]\ntype = \"r\"\nschedule = \"every day\"\n", ":3: periodic[0]:"},
		{"timezone", "[types.a]\nhandler = \"noop\"\n[[periodic]]\ntype = \"r\"\nschedule = \"@daily\"\ntimezone = \"Mars/Base\"\n", ":3: periodic[0]: timezone:"},
		{"priority", "[types.a]\nhandler = \"noop\"\n[[periodic]]\ntype = \"r\"\nschedule = \"@daily\"\npriority = 9\n", ":3: periodic[0]: priority: want 1 (first) to 5, got 9"},
		{"url", "[couchdb]\nurl = 5\n[types.a]\nhandler = \"noop\"\n", ":2: couchdb.url: want a string or a list of strings"},
		{"inline password", "[couchdb]\npassword = \"x\"\n[types.a]\nhandler = \"noop\"\n", ":2: couchdb.password: unknown key"},
		{"two passwords", "[couchdb]\npassword_file = \"f\"\npassword_env = \"E\"\n[types.a]\n", "[couchdb] gives both password_file and password_env"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "workers.toml")
			if err := os.WriteFile(path, []byte(tc.body), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := fleet.Load(path)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load: %v, want an error with %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), path) && tc.name != "two passwords" {
				t.Errorf("the error does not start with the file's path: %v", err)
			}
			if strings.Contains(err.Error(), "--") {
				t.Errorf("the error names a flag: %v", err)
			}
		})
	}
	_, err := fleet.Load(filepath.Join(t.TempDir(), "none.toml"))
	if !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "reading config: ") {
		t.Errorf("a missing file: %v", err)
	}
}

// Run refuses a configuration it cannot run before it connects: every
// case has a server that does not exist.
func TestRunRefuses(t *testing.T) {
	t.Parallel()
	noop := worker.HandlerFunc(func(context.Context, *worker.Job) error { return nil })
	conn := fleet.Connection{URL: "http://127.0.0.1:1"}
	for _, tc := range []struct {
		name string
		cfg  fleet.Config
		own  map[string]worker.Handler
		want string
	}{
		{"no types", fleet.Config{}, nil, "no job types to run"},
		{"no handler", fleet.Config{Types: []fleet.Type{{Name: "a"}}}, nil, "type a: no handler"},
		{"two handlers", fleet.Config{Types: []fleet.Type{{Name: "a", Handler: "noop"}}}, map[string]worker.Handler{"a": noop},
			`type a: handler "noop" and a Go handler: give one`},
		{"stray handler", fleet.Config{Types: []fleet.Type{{Name: "a", Handler: "noop"}}}, map[string]worker.Handler{"b": noop},
			"a Go handler for b, which is none of the configuration's types"},
		{"twice", fleet.Config{Types: []fleet.Type{{Name: "a", Handler: "noop"}, {Name: "a", Handler: "noop"}}}, nil, "job type a is given twice"},
		{"comma", fleet.Config{Types: []fleet.Type{{Name: "a,b", Handler: "noop"}}}, nil, `invalid job type "a,b"`},
		{"setting", fleet.Config{Types: []fleet.Type{{Name: "a", Handler: "noop", Concurrency: -1}}}, nil,
			"type a: invalid concurrency -1: must be at least 1"},
		{"rate", fleet.Config{Types: []fleet.Type{{Name: "a", Handler: "noop", Rate: "often"}}}, nil, `type a: invalid rate "a=often"`},
		{"log level", fleet.Config{Types: []fleet.Type{{Name: "a", Handler: "noop"}}, LogLevel: "chatty"}, nil, `invalid log level "chatty"`},
		{"url", fleet.Config{Types: []fleet.Type{{Name: "a", Handler: "noop"}}, Connection: fleet.Connection{URL: "couch:5984"}}, nil,
			`invalid url "couch:5984"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg.Connection == (fleet.Connection{}) {
				cfg.Connection = conn
			}
			err := fleet.Run(context.Background(), &cfg, fleet.Options{Handlers: tc.own})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Run: %v, want an error with %q", err, tc.want)
			}
		})
	}
	if err := fleet.Run(context.Background(), nil, fleet.Options{}); err == nil || !strings.Contains(err.Error(), "no configuration") {
		t.Errorf("Run of no configuration: %v", err)
	}
}

// A file's types run in one process, a built-in handler's and a Go
// handler's side by side, until the context ends.
func TestRunGoAndBuiltInHandlers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	user, password := srv.Credentials()
	db := srv.UniqueDBName(t)
	cfg, err := fleet.Load(filepath.Join("testdata", "mixed.toml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Connection = fleet.Connection{URL: srv.URL(), User: user, Password: password, DB: db}
	if _, err := protocol.Init(ctx, srv.Client(t), db, testLog(t)); err != nil {
		t.Fatal(err)
	}
	q, closeQueue, err := cfg.Connection.Open(ctx, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer closeQueue()
	for _, typ := range []string{"builtin", "mine"} {
		if _, err := q.Enqueue(ctx, protocol.NewJob{ID: typ + "-1", Worker: typ}); err != nil {
			t.Fatal(err)
		}
	}
	ran := make(chan string, 1)
	mine := worker.HandlerFunc(func(_ context.Context, job *worker.Job) error {
		ran <- job.ID
		return nil
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- fleet.Run(runCtx, cfg, fleet.Options{Handlers: map[string]worker.Handler{"mine": mine}})
	}()
	select {
	case id := <-ran:
		if id != "mine-1" {
			t.Errorf("the Go handler ran %s", id)
		}
	case err := <-done:
		t.Fatalf("Run returned before running the job: %v", err)
	case <-ctx.Done():
		t.Fatal("the Go handler never ran")
	}
	// The built-in noop handler deletes its job when done.
	for {
		if _, err := q.Get(ctx, "builtin-1"); errors.Is(err, protocol.ErrNotFound) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the built-in handler's job was never done")
		case <-time.After(50 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run after its context ended: %v", err)
	}
}

// Open needs a database couchq init prepared, and says so.
func TestOpenNeedsInit(t *testing.T) {
	t.Parallel()
	user, password := srv.Credentials()
	conn := fleet.Connection{URL: srv.URL(), User: user, Password: password, DB: srv.UniqueDBName(t)}
	_, _, err := conn.Open(context.Background(), testLog(t))
	if err == nil || !strings.Contains(err.Error(), "run 'couchq init' first") {
		t.Errorf("Open of a missing database: %v", err)
	}
}

// Options.Middleware wraps built-in and Go handlers alike, and
// Options.BeforeEnqueue runs on the fleet's periodic jobs.
func TestRunMiddlewareAndHooks(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	user, password := srv.Credentials()
	db := srv.UniqueDBName(t)
	cfg, err := fleet.Load(filepath.Join("testdata", "mixed.toml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Connection = fleet.Connection{URL: srv.URL(), User: user, Password: password, DB: db}
	cfg.Periodic = []couchq.Periodic{{Name: "tick", Schedule: "@every 1s", Job: couchq.NewJob{Worker: "mine"}}}
	if _, err := protocol.Init(ctx, srv.Client(t), db, testLog(t)); err != nil {
		t.Fatal(err)
	}
	q, closeQueue, err := cfg.Connection.Open(ctx, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer closeQueue()
	if _, err := q.Enqueue(ctx, protocol.NewJob{ID: "builtin-1", Worker: "builtin"}); err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 100)
	tenants := make(chan string, 100)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- fleet.Run(runCtx, cfg, fleet.Options{
			Handlers: map[string]worker.Handler{"mine": worker.HandlerFunc(func(_ context.Context, job *worker.Job) error {
				tenant, _ := job.Item.Extra("tenant")
				tenants <- string(tenant)
				return nil
			})},
			Middleware: []worker.Middleware{func(ctx context.Context, job *worker.Job, next func(context.Context) error) error {
				seen <- job.Type
				return next(ctx)
			}},
			BeforeEnqueue: []func(context.Context, *couchq.NewJob) error{func(_ context.Context, job *couchq.NewJob) error {
				job.Extra = map[string]any{"tenant": "acme"}
				return nil
			}},
		})
	}()
	types := map[string]bool{}
	for len(types) < 2 {
		select {
		case typ := <-seen:
			types[typ] = true
		case err := <-done:
			t.Fatalf("Run returned: %v", err)
		case <-ctx.Done():
			t.Fatalf("the middleware saw only %v", types)
		}
	}
	if tenant := <-tenants; tenant != `"acme"` {
		t.Errorf("a periodic job's tenant: %s", tenant)
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run after its context ended: %v", err)
	}
}
