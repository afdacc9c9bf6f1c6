package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/couchq/couchq/internal/bench"
)

func noEnv(string) string { return "" }

// noCouchDB is an environment whose Apache CouchDB release is an empty
// directory: no local node or cluster, whatever this machine has.
func noCouchDB(t *testing.T) (empty string, getenv func(string) string) {
	empty = t.TempDir()
	return empty, func(k string) string {
		if k == "COUCHQ_COUCHDB_HOME" {
			return empty
		}
		return ""
	}
}

func TestRunExitCodes(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		code int
		err  string
	}{
		{"help", []string{"-h"}, 0, "usage: couchq-bench"},
		{"unknown flag", []string{"--nope"}, 2, "flag provided but not defined"},
		{"bad section", []string{"--sections", "11"}, 2, "unknown section 11"},
		{"unknown server", []string{"--servers", "couchdb,mysql"}, 2, `unknown server "mysql"`},
		{"servers and a URL", []string{"--servers", "pouchdb", "--url", "http://127.0.0.1:5984"}, 2, "measures that one alone"},
		// --write-docs with a partial run is refused before anything runs.
		{"docs from some servers", []string{"--write-docs", ".", "--servers", "pouchdb"}, 2, "--servers pouchdb makes this one partial"},
		{"docs from some sections", []string{"--write-docs", ".", "--sections", "2,3"}, 2, "--sections 2,3 makes this one partial"},
		{"docs from a URL", []string{"--write-docs", ".", "--url", "http://127.0.0.1:5984"}, 2, "--url makes this one partial"},
		{"docs without a guide", []string{"--write-docs", "/nonexistent"}, 2, "/nonexistent/docs/performance.md"},
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
	empty, getenv := noCouchDB(t)
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
	empty, getenv := noCouchDB(t)
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
		"_bulk_docs docs/s, batch 100, bare database (no design doc)",
		"_bulk_docs docs/s, batch 100, with couchq's design doc",
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

// The command line as the docs give it: what a reader types, quoted for
// a shell where needed.
func TestCommandLine(t *testing.T) {
	got := commandLine([]string{"--write-docs", ".", "--jobs", "500", "--contention-workers", "1, 4", ""})
	want := "go run ./cmd/couchq-bench --write-docs . --jobs 500 --contention-workers '1, 4' ''"
	if got != want {
		t.Fatalf("commandLine = %q, want %q", got, want)
	}
}

// A full run with --write-docs (every local server, every section, at
// small sizes: here PouchDB Server, with no Apache CouchDB release)
// rewrites the guide's regions and the README's summary with its tables,
// and nothing else.
func TestWriteDocsAfterAFullRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PouchDB Server")
	}
	empty, getenv := noCouchDB(t)
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "docs"), 0o755); err != nil {
		t.Fatal(err)
	}
	guide := "# Performance\n\n<!-- bench:targets:begin -->\n<!-- bench:targets:end -->\n\nProse.\n\n<!-- bench:begin -->\n<!-- bench:end -->\n"
	readme := "# couchq\n\n<!-- bench:summary:begin -->\n<!-- bench:summary:end -->\n"
	for path, text := range map[string]string{bench.GuidePath: guide, bench.ReadmePath: readme} {
		if err := os.WriteFile(filepath.Join(dir, path), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"--write-docs", dir, "--ceiling-time", "200ms", "--clients", "2", "--jobs", "40", "--workers", "4",
		"--duration", "1s", "--contention-jobs", "24", "--contention-workers", "1,16", "--contention-concurrency", "2",
		"--backlog-small", "20", "--backlog-large", "60", "--claims", "8"}
	var stdout, stderr strings.Builder
	if code := run(context.Background(), args, getenv, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d; stderr:\n%s\nstdout:\n%s", code, stderr.String(), stdout.String())
	}
	read := func(path string) string {
		b, err := os.ReadFile(filepath.Join(dir, path))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	gotGuide, gotReadme := read(bench.GuidePath), read(bench.ReadmePath)
	t.Logf("\n%s\n%s", gotGuide, gotReadme)
	for _, want := range []string{
		"by `go run ./cmd/couchq-bench --write-docs " + dir + " --ceiling-time 200ms",
		"**Not the default run**: `--backlog-large 60 --backlog-small 20 --ceiling-time 200ms --claims 8 --clients 2 ", // in the flags' order
		"**Not measured**: Apache CouchDB, single node (no Apache CouchDB release at " + empty,
		"**Not measured**: Apache CouchDB, 3-node cluster (",
		"\n### PouchDB Server ",
		"\n| 1 server ceiling | ",
		"\n| 8 claim index | ",
		"\n<!-- bench:targets:end -->\n\nProse.\n\n<!-- bench:begin -->\nMeasured on ",
	} {
		if !strings.Contains(gotGuide, want) {
			t.Errorf("guide lacks %q", want)
		}
	}
	// The targets' verdicts, whichever they are at these sizes.
	if re := regexp.MustCompile(`\n\| 409s per claimed job at 16 claimants < 0\.1 \| not measured \| not measured \| (met|\*\*not met\*\*): \d\.\d{3} \|\n`); !re.MatchString(gotGuide) {
		t.Errorf("guide lacks a 409s target row matching %s", re)
	}
	if !strings.Contains(gotReadme, "\n| PouchDB Server ") || !strings.Contains(gotReadme, "[docs/performance.md](docs/performance.md)") {
		t.Errorf("README summary:\n%s", gotReadme)
	}
}
