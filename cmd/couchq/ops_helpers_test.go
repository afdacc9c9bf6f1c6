package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
)

// opsRun is opstest's known script of jobs, played in a database of the
// test's own that couchq init prepared, with the cmdline on the script's clock.
type opsRun struct {
	*opstest.Run
	c cmdline // online, database initialized, clock set
}

func runOpsScript(t *testing.T) *opsRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	c := online(t).mustInit(t)
	r := &opsRun{Run: opstest.Play(ctx, t, srv.Client(t).DB(c.env["COUCHQ_DB"])), c: c}
	r.c.now = r.Clock.Now
	return r
}

// serving is a couchq serve running in-process.
type serving struct {
	url    string
	stderr *couchtest.SyncBuffer
	cancel context.CancelFunc
	done   chan int
	once   sync.Once
	code   int
}

// startServe runs couchq serve --json with args in-process and waits
// until it listens.
func startServe(t *testing.T, c cmdline, args ...string) *serving {
	t.Helper()
	pr, pw := io.Pipe()
	s := &serving{stderr: &couchtest.SyncBuffer{}, done: make(chan int, 1)}
	m := NewMain(strings.NewReader(""), pw, s.stderr)
	m.Getenv = func(k string) string { return c.env[k] }
	m.IsTerminal = func(io.Writer) bool { return false }
	if c.now != nil {
		m.Now = c.now
	}
	var ctx context.Context
	ctx, s.cancel = context.WithCancel(context.Background())
	go func() {
		code := m.Run(ctx, append([]string{"serve", "--json"}, args...))
		_ = pw.Close()
		s.done <- code
	}()
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		line := ""
		if sc.Scan() {
			line = sc.Text()
		}
		first <- line
		_, _ = io.Copy(io.Discard, pr)
	}()
	t.Cleanup(func() { s.stop(t) })
	select {
	case line := <-first:
		var out struct {
			Listening string `json:"listening"`
		}
		if err := json.Unmarshal([]byte(line), &out); err != nil || out.Listening == "" {
			t.Fatalf("serve did not say where it listens: %q (%v); stderr:\n%s", line, err, s.stderr)
		}
		s.url = out.Listening
	case <-time.After(time.Minute):
		t.Fatalf("serve did not start; stderr:\n%s", s.stderr)
	}
	return s
}

// stop interrupts serve and returns its exit code.
func (s *serving) stop(t *testing.T) int {
	t.Helper()
	s.once.Do(func() {
		s.cancel()
		select {
		case s.code = <-s.done:
		case <-time.After(30 * time.Second):
			t.Errorf("serve did not stop within 30s of the interrupt")
			s.code = -1
		}
		t.Logf("couchq serve -> %d\nstderr:\n%s", s.code, s.stderr)
	})
	return s.code
}

// get fetches a path of the server and returns the status and body.
func (s *serving) get(t *testing.T, path string) (int, string) {
	t.Helper()
	return opstest.Get(t, s.url+path)
}

// bulkWrite stores documents as they are, 1,000 per request, bypassing
// couchq as an application writing its own documents would.
func bulkWrite(t *testing.T, db string, docs []any) {
	t.Helper()
	kdb := srv.Client(t).DB(db)
	for start := 0; start < len(docs); start += 1000 {
		results, err := kdb.BulkDocs(context.Background(), docs[start:min(start+1000, len(docs))])
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range results {
			if r.Error != nil {
				t.Fatalf("writing %s: %v", r.ID, r.Error)
			}
		}
	}
}

// statusTotals counts a database's jobs by type and status, as "type/status".
func statusTotals(t *testing.T, db string) string {
	t.Helper()
	q, err := protocol.New(context.Background(), srv.Client(t).DB(db), protocol.Config{})
	if err != nil {
		t.Fatal(err)
	}
	counts, err := q.Counts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for typ, byStatus := range counts {
		for st, n := range byStatus {
			if n > 0 {
				parts = append(parts, fmt.Sprintf("%s/%s=%d", typ, st, n))
			}
		}
	}
	return sortedJoin(parts)
}

func sortedJoin(parts []string) string {
	slices.Sort(parts)
	return strings.Join(parts, " ")
}
