package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func sampleReport() *Report {
	r := &Report{
		Started:     time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		WallSeconds: 12.34,
		Server: ServerInfo{Kind: "url", URL: "http://127.0.0.1:5984", Vendor: "couchdb", Version: "3.4.2", Origin: "--url",
			Clients: "queue clients, ceiling writers and housekeeping: http://127.0.0.1:5984"},
		Settings: map[string]any{"jobs": 5000, "workers": 16, "contention_jobs": 400, "backlog_small": 1000, "backlog_large": 20000},
		Host:     HostInfo{CPUs: 2, GoVersion: "go1.26", OS: "linux/amd64"},
		Notes:    []string{"a note"},
	}
	s1 := &Section{ID: 1, Name: "server ceiling"}
	s1.add(numRow("single-doc writes/s, 1 client", 1234.4, "docs/s", 0))
	s1.add(numRow("physical limit", 411.5, "jobs/s", 0))
	s2 := &Section{ID: 3, Name: "idle wake-up latency"}
	row := s2.add(durRow("p99", 180*time.Millisecond))
	row.target("< 250 ms", true)
	row = s2.add(durRow("max", 2500*time.Microsecond))
	row.target("< 1 ms", false)
	s3 := &Section{ID: 4, Name: "claim contention", Error: "boom"}
	r.Sections = []*Section{s1, s2, s3}
	return r
}

func TestWriteTable(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReport().WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	want := `couchq-bench  2026-01-02T03:04:05Z  [url]
server:  Apache CouchDB 3.4.2; --url
url:     http://127.0.0.1:5984
clients: queue clients, ceiling writers and housekeeping: http://127.0.0.1:5984
sizes:   --jobs 5000, --workers 16, --contention-jobs 400, --backlog-small 1000, --backlog-large 20000
host:    2 CPUs, linux/amd64, go1.26; wall time 12.3 s

SECTION                 METRIC                                   VALUE  TARGET    MET
1 server ceiling        single-doc writes/s, 1 client     1,234 docs/s
                        physical limit                      412 jobs/s
3 idle wake-up latency  p99                                     180 ms  < 250 ms  met
                        max                                    2.50 ms  < 1 ms    NOT MET
4 claim contention      ERROR: the section stopped early     see below

section 4 (claim contention) failed: boom

* a note
`
	if out != want {
		t.Fatalf("table:\n%s\nwant:\n%s", out, want)
	}
	for i, line := range strings.Split(out, "\n") {
		if strings.HasSuffix(line, " ") {
			t.Errorf("line %d has trailing blanks: %q", i+1, line)
		}
	}
}

// A cluster's table says what it is, where the clients went, what the CPU
// figures add up and that its sizes are scaled; a skipped server says why,
// and nothing else.
func TestWriteTablesPerServer(t *testing.T) {
	cluster := sampleReport()
	cluster.Server = ServerInfo{Kind: ServerCluster, URL: "http://127.0.0.1:1", Vendor: "couchdb", Version: "3.5.0",
		Nodes:    []string{"http://127.0.0.1:1", "http://127.0.0.2:2", "http://127.0.0.3:3"},
		Origin:   "3-node cluster started by the bench from /opt/couchdb (the default location)",
		Topology: "3-node cluster, q=2, n=3", Clients: "queue clients: the node list with failover", CPU: "the 3 nodes summed"}
	cluster.Settings = settings(Config{Jobs: 2000, Workers: 16, ContentionJobs: 400, BacklogSmall: 1000, BacklogLarge: 8000, ClusterScale: 0.4}, ServerCluster)
	skipped := &Report{Started: cluster.Started, Server: ServerInfo{Kind: ServerCouchDB}, Skipped: "no Apache CouchDB release at /x"}
	var buf bytes.Buffer
	if err := WriteTables(&buf, []*Report{cluster, skipped}); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"couchq-bench  2026-01-02T03:04:05Z  [cluster]\n",
		"server:  Apache CouchDB 3.5.0, 3-node cluster, q=2, n=3; 3-node cluster started by the bench from /opt/couchdb (the default location)\n",
		"nodes:   http://127.0.0.1:1 http://127.0.0.2:2 http://127.0.0.3:3\n",
		"clients: queue clients: the node list with failover\n",
		"server CPU: the 3 nodes summed\n",
		"sizes:   --jobs 2000, --workers 16, --contention-jobs 400, --backlog-small 1000, --backlog-large 8000 (the cluster's: --jobs, --backlog-large and --rate scaled by --cluster-scale 0.4)\n",
		"* a note\n\ncouchq-bench  2026-01-02T03:04:05Z  [couchdb]\nserver:  couchdb: skipped: no Apache CouchDB release at /x\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("tables lack %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "SECTION") != 1 {
		t.Errorf("want one table (the skipped server has none):\n%s", out)
	}
}

func TestWriteJSONRoundTrips(t *testing.T) {
	var buf bytes.Buffer
	skipped := &Report{Server: ServerInfo{Kind: ServerCluster}, Skipped: "no release"}
	if err := WriteJSON(&buf, []*Report{sampleReport(), skipped}); err != nil {
		t.Fatal(err)
	}
	var all []Report
	if err := json.Unmarshal(buf.Bytes(), &all); err != nil {
		t.Fatalf("decoding %s: %v", buf.String(), err)
	}
	if len(all) != 2 || all[0].Server.Kind != "url" || all[1].Server.Kind != ServerCluster || all[1].Skipped != "no release" {
		t.Fatalf("reports = %+v", all)
	}
	back := all[0]
	got := back.Sections[1].Rows[0]
	if got.Value != 180 || got.Unit != "ms" || got.Met == nil || !*got.Met || got.Target != "< 250 ms" {
		t.Fatalf("row = %+v", got)
	}
	if back.Sections[0].Rows[0].Met != nil {
		t.Fatalf("a row without target has met set")
	}
	if back.Sections[2].Error != "boom" {
		t.Fatalf("section error lost: %+v", back.Sections[2])
	}
}

func TestFormatting(t *testing.T) {
	for in, want := range map[string]string{
		"0": "0", "999": "999", "1000": "1,000", "1234567": "1,234,567", "-1234": "-1,234", "12345.5": "12,345.5",
	} {
		if got := groupThousands(in); got != want {
			t.Errorf("groupThousands(%q) = %q, want %q", in, got, want)
		}
	}
	for ms, want := range map[float64]string{0.123: "0.12 ms", 12.34: "12.3 ms", 250: "250 ms", 30012.4: "30012 ms"} {
		if got := formatMillis(ms); got != want {
			t.Errorf("formatMillis(%g) = %q, want %q", ms, got, want)
		}
	}
}

func BenchmarkWriteTable(b *testing.B) {
	r := sampleReport()
	var buf bytes.Buffer
	b.ReportAllocs()
	for b.Loop() {
		buf.Reset()
		_ = r.WriteTable(&buf)
	}
}
