package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/couchtest"
)

var srv *couchtest.Server

func TestMain(m *testing.M) { couchtest.Main(m, func(s *couchtest.Server) { srv = s }) }

// tiny is every section at a size that runs in seconds.
func tiny() Config {
	user, password := srv.Credentials()
	return Config{
		URL: srv.URL(), User: user, Password: password, URLOrigin: "test harness",
		Clients: 2, CeilingTime: 200 * time.Millisecond,
		Jobs: 40, Workers: 4, Instances: 2,
		Rate: 20, Duration: time.Second,
		ContentionJobs: 24, ContentionWorkers: []int{1, 3}, ContentionConcurrency: 2,
		BacklogSmall: 20, BacklogLarge: 60, Claims: 8,
		// Generous: the whole run, on a machine that may be busy with other tests.
		Instrument: true, Timeout: 6 * time.Minute,
	}
}

func TestRunEverySectionAgainstARealServer(t *testing.T) {
	u, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	if err := checkLoopback(context.Background(), u.Hostname()); err != nil {
		couchtest.Skip(t, "the bench only runs against loopback servers: "+err.Error())
	}
	rep, err := Run(context.Background(), tiny())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	var ids []int
	for _, s := range rep.Sections {
		ids = append(ids, s.ID)
		if s.Error != "" || len(s.Rows) == 0 {
			t.Errorf("section %d: error %q, %d rows", s.ID, s.Error, len(s.Rows))
		}
	}
	if !slices.Equal(ids, AllSections()) {
		t.Fatalf("sections %v, want %v", ids, AllSections())
	}
	// The figures that carry the targets are there and judged.
	want := map[string]bool{"throughput": false, "p99": false}
	for _, s := range rep.Sections {
		for _, r := range s.Rows {
			for key := range want {
				if strings.Contains(r.Metric, key) && r.Met != nil {
					want[key] = true
				}
			}
			if strings.Contains(r.Metric, "throughput, ") && r.Value <= 0 {
				t.Errorf("throughput row %+v", r)
			}
		}
	}
	for key, found := range want {
		if !found {
			t.Errorf("no judged %q row", key)
		}
	}
	// Every database the bench made is gone.
	dbs, err := srv.Client(t).AllDBs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Sections {
		for _, db := range s.Databases {
			if slices.Contains(dbs, db) {
				t.Errorf("database %s was left behind", db)
			}
		}
	}
	var table, js bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if err := rep.WriteJSON(&js); err != nil || !json.Valid(js.Bytes()) {
		t.Fatalf("JSON report: %v", err)
	}
	t.Logf("\n%s", table.String())
}

func TestRunRefusesRemoteServers(t *testing.T) {
	cfg := tiny()
	cfg.URL = "http://192.0.2.1:5984" // TEST-NET-1: never reached
	_, err := Run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("Run against a remote server: err = %v, want a loopback refusal", err)
	}
}

func TestRunWithWorkerProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the couchq CLI")
	}
	u, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	if err := checkLoopback(context.Background(), u.Hostname()); err != nil {
		couchtest.Skip(t, "the bench only runs against loopback servers: "+err.Error())
	}
	cfg := tiny()
	cfg.Sections = []int{SectionThroughput, SectionMemory}
	cfg.Jobs, cfg.Instances, cfg.Procs = 30, 1, 2
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	var found []string
	for _, s := range rep.Sections {
		for _, r := range s.Rows {
			if strings.Contains(r.Metric, "process") && r.Value > 0 {
				found = append(found, r.Metric)
			}
		}
	}
	for _, want := range []string{"throughput, 4 goroutines over 2 processes", "peak RSS of a worker process"} {
		if !slices.ContainsFunc(found, func(m string) bool { return strings.Contains(m, want) }) {
			t.Errorf("no %q row among %q", want, found)
		}
	}
	var table bytes.Buffer
	_ = rep.WriteTable(&table)
	t.Logf("\n%s", table.String())
}
