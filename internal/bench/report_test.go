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
		Server:      ServerInfo{URL: "http://127.0.0.1:5984", Vendor: "couchdb", Version: "3.4.2", Origin: "--url"},
		Host:        HostInfo{CPUs: 2, GoVersion: "go1.26", OS: "linux/amd64"},
		Notes:       []string{"a note"},
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
	want := `couchq-bench  2026-01-02T03:04:05Z
server: couchdb 3.4.2 at http://127.0.0.1:5984 (--url)
host:   2 CPUs, linux/amd64, go1.26; wall time 12.3 s

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

func TestWriteJSONRoundTrips(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReport().WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatalf("decoding %s: %v", buf.String(), err)
	}
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
