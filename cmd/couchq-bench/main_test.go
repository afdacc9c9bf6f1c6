package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/couchq/couchq/internal/bench"
)

func noEnv(string) string { return "" }

func TestRunExitCodes(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		code int
		err  string
	}{
		{"help", []string{"-h"}, 0, "usage: couchq-bench"},
		{"unknown flag", []string{"--nope"}, 2, "flag provided but not defined"},
		{"bad section", []string{"--sections", "9"}, 2, "unknown section 9"},
		{"unknown server", []string{"--servers", "couchdb,mysql"}, 2, `unknown server "mysql"`},
		{"servers and a URL", []string{"--servers", "pouchdb", "--url", "http://127.0.0.1:5984"}, 2, "measures that one alone"},
		// Refused before any connection is made.
		{"remote server", []string{"--url", "http://192.0.2.1:5984", "--sections", "1"}, 1, "loopback"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			code := run(context.Background(), c.args, noEnv, &stdout, &stderr)
			if code != c.code {
				t.Fatalf("exit code %d, want %d; stderr:\n%s", code, c.code, stderr.String())
			}
			if !strings.Contains(stderr.String(), c.err) {
				t.Fatalf("stderr lacks %q:\n%s", c.err, stderr.String())
			}
			if stdout.Len() != 0 {
				t.Fatalf("stdout: %s", stdout.String())
			}
		})
	}
}

// A named server that cannot start is an error before anything runs.
func TestNamedServerWithoutItsRelease(t *testing.T) {
	empty := t.TempDir()
	getenv := func(k string) string {
		if k == "COUCHQ_COUCHDB_HOME" {
			return empty
		}
		return ""
	}
	var stdout, stderr strings.Builder
	code := run(context.Background(), []string{"--servers", "cluster", "--sections", "1"}, getenv, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "--servers cluster: no Apache CouchDB release at "+empty) || stdout.Len() != 0 {
		t.Fatalf("exit %d, stdout %q, stderr:\n%s", code, stdout.String(), stderr.String())
	}
}

// With no URL and no --servers the command measures every local server
// there is: here, with no Apache CouchDB release, PouchDB Server alone,
// the other two reported as skipped and why. --json is an array, one
// report per server.
func TestEveryServerAvailableAsJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PouchDB Server")
	}
	empty := t.TempDir()
	getenv := func(k string) string {
		if k == "COUCHQ_COUCHDB_HOME" {
			return empty
		}
		return ""
	}
	var stdout, stderr strings.Builder
	code := run(context.Background(), []string{"--sections", "1", "--ceiling-time", "200ms", "--clients", "2", "--json"}, getenv, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr.String())
	}
	var reps []bench.Report
	if err := json.Unmarshal([]byte(stdout.String()), &reps); err != nil {
		t.Fatalf("decoding %s: %v", stdout.String(), err)
	}
	if len(reps) != 3 {
		t.Fatalf("%d reports, want 3 (couchdb and cluster skipped, pouchdb):\n%s", len(reps), stdout.String())
	}
	for i, kind := range []string{bench.ServerCouchDB, bench.ServerCluster} {
		if reps[i].Server.Kind != kind || !strings.Contains(reps[i].Skipped, "no Apache CouchDB release at "+empty) || len(reps[i].Sections) != 0 {
			t.Errorf("report %d: %+v, want %s skipped", i, reps[i], kind)
		}
	}
	p := reps[2]
	if p.Server.Kind != bench.ServerPouchDB || p.Server.Vendor != "pouchdb" || p.Skipped != "" || len(p.Sections) != 1 {
		t.Fatalf("PouchDB Server's report: %+v", p)
	}
	found := map[string]float64{}
	for _, r := range p.Sections[0].Rows {
		found[r.Metric] = r.Value
	}
	for _, m := range []string{
		"_bulk_docs docs/s, batch 100, 1 client, bare database (no design doc)",
		"_bulk_docs docs/s, batch 100, 1 client, with couchq's design doc",
		"physical limit: bulk (bare) / 3",
		"single-doc limit: best single-doc rate / 3",
	} {
		if found[m] <= 0 {
			t.Errorf("PouchDB Server: %q = %g", m, found[m])
		}
	}
}

func TestPasswordStaysOutOfErrors(t *testing.T) {
	var stdout, stderr strings.Builder
	run(context.Background(), []string{"--url", "http://admin:s3cret@192.0.2.1:5984"}, noEnv, &stdout, &stderr)
	if strings.Contains(stderr.String()+stdout.String(), "s3cret") {
		t.Fatalf("the password leaked:\n%s", stderr.String())
	}
}
