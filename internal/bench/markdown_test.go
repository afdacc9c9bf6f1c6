package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestWriteMarkdown(t *testing.T) {
	r := sampleReport()
	r.Sections[0].add(numRow("  of which | piped", 2.5, "ms", 2))
	r.Sections[0].add(numRow("    twice indented", 1, "", 0))
	r.Host.LoadStart, r.Host.LoadEnd = "0.50 0.40 0.30", "1.20 0.60 0.40"
	var buf bytes.Buffer
	if err := r.WriteMarkdown(&buf); err != nil {
		t.Fatal(err)
	}
	want := `### Apache CouchDB 3.4.2

- Server: Apache CouchDB 3.4.2; --url.
- Sizes: --jobs 5000, --workers 16, --contention-jobs 400, --backlog-small 1000, --backlog-large 20000.
- Wall time 12 s; load average 0.50 0.40 0.30 at start, 1.20 0.60 0.40 at end (1, 5, 15 min).

| section | metric | value | target | met |
|---|---|--:|---|---|
| 1 server ceiling | single-doc writes/s, 1 client | 1,234 docs/s |  |  |
|  | physical limit | 412 jobs/s |  |  |
|  | ↳ of which \| piped | 2.50 ms |  |  |
|  | &emsp;↳ twice indented | 1 |  |  |
| 3 idle wake-up latency | p99 | 180 ms | < 250 ms | met |
|  | max | 2.50 ms | < 1 ms | **not met** |
| 4 claim contention | **the section stopped early** (below) | | | |

Section 4 (claim contention) failed: boom

- a note
`
	if got := buf.String(); got != want {
		t.Fatalf("Markdown:\n%s\nwant:\n%s", got, want)
	}
}

// docRun is a run of three servers: the node skipped, the cluster and
// PouchDB Server measured, with their headline figures.
func docRun() DocRun {
	started := time.Date(2026, 11, 25, 14, 2, 0, 0, time.UTC)
	host := HostInfo{CPUs: 2, CPUModel: "AMD EPYC", Memory: 24 << 30, GoVersion: "go1.26.0", OS: "linux/amd64"}
	met, notMet := true, false
	judged := func(r Row, ok bool, key string) Row {
		r.Met, r.Target, r.Key = &ok, "a target", key
		return r
	}
	keyed := func(r Row, key string) Row { r.Key = key; return r }
	measured := func(kind, vendor, version, topology string, tput float64, stale bool) *Report {
		r := &Report{Started: started, WallSeconds: 200, Host: host,
			Server: ServerInfo{Kind: kind, Vendor: vendor, Version: version, Topology: topology, Origin: "started by the bench",
				URL: "http://127.0.0.1:1234", Clients: "everything to http://127.0.0.1:1234"},
			Notes: []string{"shared note", "note of " + kind}}
		s2 := &Section{ID: SectionThroughput, Name: sectionNames[SectionThroughput]}
		s2.add(judged(numRow("throughput", tput, "jobs/s", 0), notMet, keyThroughput))
		s2.add(keyed(numRow("share", tput/30, "%", 1), keyThroughputShare))
		s3 := &Section{ID: SectionWakeup, Name: sectionNames[SectionWakeup]}
		s3.add(judged(durRow("p99", 25200*time.Microsecond), met, keyWakeupP99))
		s4 := &Section{ID: SectionContention, Name: sectionNames[SectionContention]}
		s4.add(judged(numRow("409s", 0.138, "", 3), met, keyConflicts))
		s5 := &Section{ID: SectionBacklog, Name: sectionNames[SectionBacklog]}
		s5.add(judged(numRow("enqueue", 833, "jobs/s", 0), notMet, keyEnqueue))
		share := textRow("enqueue shares", "8.1 % / 85.0 %")
		share.Value = 8.1
		s5.add(keyed(share, keyEnqueueShare))
		s5.add(judged(numRow("ratio", 1.14, "x", 2), met, keyBacklogRatio))
		if stale {
			s5.add(judged(numRow("ratio stale", 1.25, "x", 2), notMet, keyBacklogRatioStale))
		}
		s6 := &Section{ID: SectionMemory, Name: sectionNames[SectionMemory]}
		s6.add(keyed(numRow("rss", 32, "MiB", 1), keyWorkerRSS))
		s6.add(judged(numRow("rss 100", 23.9, "MiB", 1), met, keyWorkerRSS100))
		r.Sections = []*Section{s2, s3, s4, s5, s6}
		return r
	}
	return DocRun{
		Command: "go run ./cmd/couchq-bench --write-docs . --jobs 500",
		Changed: []string{"--jobs 500"},
		Reports: []*Report{
			{Started: started, WallSeconds: 0, Server: ServerInfo{Kind: ServerCouchDB}, Skipped: "no Apache CouchDB release at /opt/couchdb"},
			measured(ServerCluster, "couchdb", "3.5.0", "3-node cluster, q=2, n=3", 118, true),
			measured(ServerPouchDB, "pouchdb", "4.2.0", "", 124, false),
		},
	}
}

func TestDocRunRegions(t *testing.T) {
	d := docRun()
	d.Reports[1].Server.Nodes = []string{"http://127.0.0.1:1234", "http://127.0.0.1:1235", "http://127.0.0.1:1236"}
	d.Reports[1].Server.Clients = "the node list with failover"
	run := d.runRegion()
	for _, want := range []string{
		"Measured on 2026-11-25 (from 14:02 UTC, 6 min 40 s in all) by `go run ./cmd/couchq-bench --write-docs . --jobs 500`, " +
			"on 2 cores (AMD EPYC), 24.0 GiB of memory, linux/amd64, go1.26.0. " +
			"Servers: Apache CouchDB 3.5.0, 3-node cluster; PouchDB Server 4.2.0.\n",
		"\n**Not the default run**: `--jobs 500` changed what was measured",
		"\n**Not measured**: Apache CouchDB, single node (no Apache CouchDB release at /opt/couchdb).\n",
		"\n### Apache CouchDB, single node\n\nNot measured: no Apache CouchDB release at /opt/couchdb\n",
		"\n### Apache CouchDB 3.5.0, 3-node cluster\n\n- Server: Apache CouchDB 3.5.0, 3-node cluster, q=2, n=3; started by the bench.\n- Clients: the node list with failover.\n",
		// One server's URL, whose port changes every run, is left out.
		"\n### PouchDB Server 4.2.0\n\n- Server: PouchDB Server 4.2.0; started by the bench.\n- Wall time",
		"| 5 backlog scaling | enqueue | 833 jobs/s | a target | **not met** |\n",
		"\n- note of cluster\n",
		"\n- note of pouchdb\n",
		"\n### Notes on every server\n\n- shared note\n",
	} {
		wantIn(t, "run region", run, want)
	}
	// Each measured server has its table, with every row of its report.
	if n := strings.Count(run, "| section | metric | value | target | met |"); n != 2 {
		t.Errorf("%d tables, want 2 (one per measured server):\n%s", n, run)
	}
	if n := strings.Count(run, "shared note"); n != 1 {
		t.Errorf("the shared note is written %d times, want once", n)
	}

	targets := d.targetsRegion()
	for _, want := range []string{
		"| target | Apache CouchDB, single node | Apache CouchDB 3.5.0, 3-node cluster | PouchDB Server 4.2.0 |\n|---|---|---|---|\n",
		"| not measured | **not met**: 118 jobs/s (3.9 % of bulk with the design doc / 3) | **not met**: 124 jobs/s (4.1 % of bulk with the design doc / 3) |\n",
		"| idle wake-up, enqueue → handler start p99 < 100 ms | not measured | met: 25.2 ms | met: 25.2 ms |\n",
		"| 409s per claimed job at 16 claimants < 0.1 | not measured | met: 0.138 | met: 0.138 |\n",
		"| met: 1.14 x / **not met**: 1.25 x | met: 1.14 x |\n",
		"| enqueue of the large backlog ≥ 80 % of the bare bulk ceiling | not measured | **not met**: 833 jobs/s (8.1 %) | **not met**: 833 jobs/s (8.1 %) |\n",
		"| not measured | 32.0 MiB | 32.0 MiB |\n",
		"| peak RSS of a `couchq worker` process running 100 jobs at once < 32 MiB | not measured | met: 23.9 MiB | met: 23.9 MiB |\n",
		// Section 2's last row is missing from these reports.
		"| not measured | — | — |\n",
		"\nFrom the bench run of 2026-11-25;",
		"\n**Not the default run**",
	} {
		wantIn(t, "targets region", targets, want)
	}

	wantSummary := "| server | end to end | enqueue | wake-up p99 | 409s per claimed job (16 claimants) | peak RSS of the workers' process |\n" +
		"|---|--:|--:|--:|--:|--:|\n" +
		"| Apache CouchDB, single node | not measured | — | — | — | — |\n" +
		"| Apache CouchDB 3.5.0, 3-node cluster | 118 jobs/s | 833 jobs/s | 25.2 ms | 0.138 | 32.0 MiB |\n" +
		"| PouchDB Server 4.2.0 | 124 jobs/s | 833 jobs/s | 25.2 ms | 0.138 | 32.0 MiB |\n" +
		"\n`go run ./cmd/couchq-bench --write-docs . --jobs 500` on 2026-11-25, 2 cores (AMD EPYC), 24.0 GiB of memory, linux/amd64, go1.26.0. " +
		"What each figure measures, the targets and every table: [docs/performance.md](docs/performance.md). Not the default run: `--jobs 500`.\n"
	if got := d.summaryRegion(); got != wantSummary {
		t.Errorf("summary:\n%s\nwant:\n%s", got, wantSummary)
	}
}

func wantIn(t *testing.T, what, text, want string) {
	t.Helper()
	if !strings.Contains(text, want) {
		t.Errorf("%s lacks %q:\n%s", what, want, text)
	}
}

// writeDocsTree makes a repository root holding a guide and a README.
func writeDocsTree(t *testing.T, readme string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "docs"), 0o755); err != nil {
		t.Fatal(err)
	}
	guide := "# Performance\n\n<!-- bench:targets:begin -->\n<!-- bench:targets:end -->\n\nProse.\n\n<!-- bench:begin -->\nold\n<!-- bench:end -->\n"
	for path, text := range map[string]string{GuidePath: guide, ReadmePath: readme} {
		if err := os.WriteFile(filepath.Join(dir, path), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestWriteDocs(t *testing.T) {
	readme := "# couchq\n\n<!-- bench:summary:begin -->\n<!-- bench:summary:end -->\n\nMore.\n"
	dir := writeDocsTree(t, readme)
	if err := CheckDocs(dir); err != nil {
		t.Fatal(err)
	}
	var notes bytes.Buffer
	if err := WriteDocs(dir, docRun(), &notes); err != nil {
		t.Fatal(err)
	}
	if notes.Len() != 0 {
		t.Errorf("notes: %s", notes.String())
	}
	read := func(path string) string {
		b, err := os.ReadFile(filepath.Join(dir, path))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	guide, front := read(GuidePath), read(ReadmePath)
	if !strings.HasPrefix(guide, "# Performance\n\n<!-- bench:targets:begin -->\n| target |") || !strings.Contains(guide, "\n<!-- bench:targets:end -->\n\nProse.\n\n<!-- bench:begin -->\nMeasured on 2026-11-25") ||
		strings.Contains(guide, "old") || !strings.HasSuffix(guide, "- shared note\n<!-- bench:end -->\n") {
		t.Errorf("guide:\n%s", guide)
	}
	if !strings.HasPrefix(front, "# couchq\n\n<!-- bench:summary:begin -->\n| server |") || !strings.HasSuffix(front, "<!-- bench:summary:end -->\n\nMore.\n") {
		t.Errorf("README:\n%s", front)
	}
	// Again: the same files.
	if err := WriteDocs(dir, docRun(), &notes); err != nil {
		t.Fatal(err)
	}
	if read(GuidePath) != guide || read(ReadmePath) != front {
		t.Error("a second write of the same run changed the files")
	}
}

func TestWriteDocsWithoutMarkers(t *testing.T) {
	// A README without the summary's markers is left alone, saying so.
	dir := writeDocsTree(t, "# couchq\n")
	if err := CheckDocs(dir); err != nil {
		t.Fatal(err)
	}
	var notes bytes.Buffer
	if err := WriteDocs(dir, docRun(), &notes); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(notes.String(), filepath.Join(dir, ReadmePath)+" has no summary region (<!-- bench:summary:begin --> … <!-- bench:summary:end -->): left as it is") {
		t.Errorf("notes: %q", notes.String())
	}
	if b, err := os.ReadFile(filepath.Join(dir, ReadmePath)); err != nil || string(b) != "# couchq\n" {
		t.Errorf("README changed: %q (err %v)", b, err)
	}
	// One marker without the other is an error, before a run and after.
	dir = writeDocsTree(t, "# couchq\n<!-- bench:summary:begin -->\n")
	for _, err := range []error{CheckDocs(dir), WriteDocs(dir, docRun(), &notes)} {
		if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, ReadmePath)+": region bench:summary: no <!-- bench:summary:end -->") {
			t.Errorf("README with half a region: %v", err)
		}
	}
	// The guide's markers are required.
	dir = writeDocsTree(t, "# couchq\n")
	guide := filepath.Join(dir, GuidePath)
	if err := os.WriteFile(guide, []byte("# Performance\n<!-- bench:begin -->\n<!-- bench:end -->\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{CheckDocs(dir), WriteDocs(dir, docRun(), &notes)} {
		if err == nil || !strings.Contains(err.Error(), guide+": region bench:targets: no markers <!-- bench:targets:begin --> and <!-- bench:targets:end -->") {
			t.Errorf("guide without the targets region: %v", err)
		}
	}
	if err := os.Remove(guide); err != nil {
		t.Fatal(err)
	}
	if err := CheckDocs(dir); err == nil || !strings.Contains(err.Error(), guide) {
		t.Errorf("no guide: %v", err)
	}
}
