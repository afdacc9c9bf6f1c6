package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/couchtest"
)

// srv is the real server the integration tests in this package share.
var srv *couchtest.Server

func TestMain(m *testing.M) { couchtest.Main(m, func(s *couchtest.Server) { srv = s }) }

// unreachable is a URL nothing listens on: a test that expects exit 2 with
// it proves the input was rejected before any request.
const unreachable = "http://127.0.0.1:1"

type result struct {
	code           int
	stdout, stderr string
}

// cmdline runs one command in-process.
type cmdline struct {
	env      map[string]string
	stdin    string
	terminal bool
	now      func() time.Time
}

func (c cmdline) run(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return c.runContext(t, ctx, args...)
}

// runContext is run until ctx ends: a long-running command (worker) stops
// then, as on a signal.
func (c cmdline) runContext(t *testing.T, ctx context.Context, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	m := NewMain(strings.NewReader(c.stdin), &stdout, &stderr)
	m.Getenv = func(k string) string { return c.env[k] }
	m.IsTerminal = func(io.Writer) bool { return c.terminal }
	if c.now != nil {
		m.Now = c.now
	}
	code := m.Run(ctx, args)
	t.Logf("couchq %s -> %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// offline is a cmdline whose server does not exist.
func offline() cmdline {
	return cmdline{env: map[string]string{"COUCHDB_URL": unreachable}}
}

// online is a cmdline for the test server and a database of the test's own
// (dropped when the test ends; not created: see mustInit).
func online(t *testing.T) cmdline {
	t.Helper()
	user, password := srv.Credentials()
	return cmdline{env: map[string]string{
		"COUCHDB_URL":      srv.URL(),
		"COUCHDB_USER":     user,
		"COUCHDB_PASSWORD": password,
		"COUCHQ_DB":        srv.UniqueDBName(t),
	}}
}

func (c cmdline) mustInit(t *testing.T) cmdline {
	t.Helper()
	if r := c.run(t, "init"); r.code != 0 {
		t.Fatalf("couchq init: exit %d: %s", r.code, r.stderr)
	}
	return c
}

func (c cmdline) withStdin(s string) cmdline {
	c.stdin = s
	return c
}

func (c cmdline) withEnv(k, v string) cmdline {
	env := make(map[string]string, len(c.env)+1)
	for key, val := range c.env {
		env[key] = val
	}
	env[k] = v
	c.env = env
	return c
}

func expect(t *testing.T, r result, code int, stderrHas ...string) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit code %d, want %d\nstdout: %s\nstderr: %s", r.code, code, r.stdout, r.stderr)
	}
	for _, s := range stderrHas {
		if !strings.Contains(r.stderr, s) {
			t.Errorf("stderr does not contain %q:\n%s", s, r.stderr)
		}
	}
}
