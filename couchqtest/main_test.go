package couchqtest_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/couchqtest"
	"github.com/couchq/couchq/internal/couchtest"
)

// srv is the test server; the examples find it through COUCHDB_URL,
// COUCHDB_USER and COUCHDB_PASSWORD, as a reader's test would.
var srv *couchtest.Server

func TestMain(m *testing.M) {
	couchtest.Main(m, func(s *couchtest.Server) {
		srv = s
		user, password := s.Credentials()
		for k, v := range map[string]string{"COUCHDB_URL": s.URL(), "COUCHDB_USER": user, "COUCHDB_PASSWORD": password} {
			if err := os.Setenv(k, v); err != nil {
				panic(err)
			}
		}
	})
}

// openQueue prepares a database of the test's own and opens a client on it.
func openQueue(t *testing.T) (context.Context, *couchq.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	user, password := srv.Credentials()
	s, err := couchq.Connect(ctx, srv.URL(), user, password)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, couchqtest.NewQueue(ctx, t, s, couchq.Config{})
}

// fakeTB records what a helper reports instead of failing the test, so
// that failure messages can be checked.
type fakeTB struct {
	testing.TB
	fatal  []string
	logged []string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatal = append(f.fatal, fmt.Sprintf(format, args...))
}

func (f *fakeTB) Logf(format string, args ...any) {
	f.logged = append(f.logged, fmt.Sprintf(format, args...))
}

// failed is the one failure f recorded; it fails t unless there was one
// mentioning each of want.
func (f *fakeTB) failed(t *testing.T, want ...string) string {
	t.Helper()
	if len(f.fatal) != 1 {
		t.Fatalf("want one failure, got %d: %q", len(f.fatal), f.fatal)
	}
	for _, w := range want {
		if !strings.Contains(f.fatal[0], w) {
			t.Errorf("failure does not mention %q:\n%s", w, f.fatal[0])
		}
	}
	return f.fatal[0]
}
