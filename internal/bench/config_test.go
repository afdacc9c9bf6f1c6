package bench

import (
	"errors"
	"flag"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/couchq/couchq/designdocs"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseArgsDefaults(t *testing.T) {
	c, o, err := ParseArgs(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.JSON || c.URL != "" || c.URLOrigin != "" || !c.Instrument {
		t.Fatalf("defaults: %+v %+v", c, o)
	}
	if !slices.Equal(c.Sections, AllSections()) || !slices.Equal(c.ContentionWorkers, ContentionWorkersDefault()) {
		t.Fatalf("sections %v, contention %v", c.Sections, c.ContentionWorkers)
	}
	if c.Jobs != JobsDefault || c.Workers != WorkersDefault || c.Clients != ClientsDefault || c.Validation != designdocs.ValidationOn {
		t.Fatalf("defaults: %+v", c)
	}
	if c, _, err := ParseArgs([]string{"--validation", "off"}, env(nil), io.Discard); err != nil || c.Validation != designdocs.ValidationOff {
		t.Fatalf("--validation off: %v %q", err, c.Validation)
	}
	if c, _, err := ParseArgs([]string{"--language", "javascript"}, env(nil), io.Discard); err != nil || c.Language != designdocs.JavaScript {
		t.Fatalf("--language javascript: %v %q", err, c.Language)
	}
	// No --servers: every local server available.
	if c.Servers != nil || c.CouchDBHome != "" || c.ClusterScale != ClusterScaleDefault {
		t.Fatalf("servers %v, release %q, cluster scale %g", c.Servers, c.CouchDBHome, c.ClusterScale)
	}
}

func TestParseArgsServers(t *testing.T) {
	e := env(map[string]string{"COUCHQ_COUCHDB_HOME": "/srv/couchdb"})
	c, _, err := ParseArgs([]string{"--servers", "pouchdb, cluster,pouchdb", "--cluster-scale", "0.25"}, e, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Servers, []string{ServerPouchDB, ServerCluster}) || c.CouchDBHome != "/srv/couchdb" || c.ClusterScale != 0.25 {
		t.Fatalf("servers %v, release %q, scale %g", c.Servers, c.CouchDBHome, c.ClusterScale)
	}
	_, _, err = ParseArgs([]string{"--servers", "couchdb"}, env(map[string]string{"COUCHDB_URL": "http://127.0.0.1:5984"}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "COUCHDB_URL") {
		t.Fatalf("--servers with COUCHDB_URL: err = %v", err)
	}
}

func TestParseArgsURLFromFlagOrEnvironment(t *testing.T) {
	e := env(map[string]string{"COUCHDB_URL": "http://localhost:5984", "COUCHDB_USER": "u", "COUCHDB_PASSWORD": "p"})
	c, _, err := ParseArgs(nil, e, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.URL != "http://localhost:5984" || c.URLOrigin != "COUCHDB_URL" || c.User != "u" || c.Password != "p" {
		t.Fatalf("from the environment: %+v", c)
	}
	c, _, err = ParseArgs([]string{"--url", "http://127.0.0.1:1"}, e, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.URL != "http://127.0.0.1:1" || c.URLOrigin != "--url" {
		t.Fatalf("--url wins: %+v", c)
	}
}

func TestParseArgsSectionsAndScale(t *testing.T) {
	c, o, err := ParseArgs([]string{"--sections", "5, 1,5", "--jobs", "20000", "--contention-workers", "2,8", "--json"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.WithDefaults().Sections; !slices.Equal(got, []int{1, 5}) {
		t.Fatalf("sections = %v, want [1 5] (sorted, no repeats)", got)
	}
	if c.Jobs != 20000 || !slices.Equal(c.ContentionWorkers, []int{2, 8}) || !o.JSON {
		t.Fatalf("parsed: %+v %+v", c, o)
	}
}

func TestParseArgsRejects(t *testing.T) {
	for _, args := range [][]string{
		{"--sections", "11"},
		{"--sections", "x"},
		{"--sections", ""},
		{"--jobs", "-5"},
		{"--instances", "20", "--workers", "4"},
		{"--claims", "500", "--backlog-small", "100"},
		{"--rate", "1e9"},
		{"--rate", "0"},
		{"--ceiling-time", "0s"},
		{"--duration", "3h"},
		{"--instrument=false", "--client-idle-conns=8"},
		{"--servers", "mysql"},
		{"--servers", ","},
		{"--servers", "couchdb", "--url", "http://127.0.0.1:5984"},
		{"--cluster-scale", "0"},
		{"--cluster-scale", "1.5"},
		{"--validation", "sometimes"},
		{"--language", "quickjs"},
		{"extra"},
	} {
		if _, _, err := ParseArgs(args, env(nil), io.Discard); err == nil {
			t.Errorf("ParseArgs(%q) accepted it", args)
		}
	}
}

func TestParseArgsHelp(t *testing.T) {
	var out strings.Builder
	_, _, err := ParseArgs([]string{"-h"}, env(nil), &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"usage: couchq-bench", "-jobs", "-sections", "loopback", "-servers", "couchdb,cluster,pouchdb", "JSON array"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, out.String())
		}
	}
}

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		method, url string
		want        int
	}{
		{"GET", "http://h/db/_design/couchq/_view/due?include_docs=true&limit=32", kindDue},
		{"POST", "http://h/db/_design/couchq/_view/due_priority/queries", kindDue},
		{"POST", "http://h/db/_all_docs", kindFetch},
		{"GET", "http://h/db/_design/couchq/_view/leases?include_docs=true", kindView},
		{"GET", "http://h/db/_changes?feed=longpoll", kindChanges},
		{"POST", "http://h/db/_changes", kindChanges},
		{"POST", "http://h/db/_bulk_docs", kindBulk},
		{"PUT", "http://h/db/job:0190-ab", kindJobPut},
		{"PUT", "http://h/db/job%3A0190-ab", kindJobPut},
		{"DELETE", "http://h/db/job:0190-ab?rev=1-a", kindJobPut},
		{"GET", "http://h/db/job:0190-ab?conflicts=true", kindJobGet},
		{"PUT", "http://h/db/worker:host:1:w1", kindRegistry},
		{"GET", "http://h/db", kindOther},
	} {
		req, err := http.NewRequest(c.method, c.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := classify(req); got != c.want {
			t.Errorf("classify(%s %s) = %s, want %s", c.method, c.url, kindNames[got], kindNames[c.want])
		}
	}
}

// --write-docs takes a full run; what makes a run partial, and which flags
// the docs must say changed what was measured.
func TestParseArgsWriteDocs(t *testing.T) {
	for _, c := range []struct {
		name    string
		args    []string
		env     map[string]string
		partial string
		changed []string
	}{
		{"defaults", nil, nil, "", nil},
		{"every server and section named, in any order", []string{"--servers", "pouchdb,couchdb,cluster", "--sections", "10,9,8,7,6,5,4,3,2,1"}, nil, "", nil},
		{"a default given", []string{"--jobs", "10000", "--validation", "on", "--instrument"}, nil, "", nil},
		{"output flags", []string{"--json", "-v", "--timeout", "1h", "--couchq-bin", "/bin/couchq"}, nil, "", nil},
		{"sizes", []string{"--workers", "64", "--jobs", "500", "--validation", "off", "--instrument=false", "--keep"}, nil, "",
			[]string{"--instrument=false", "--jobs 500", "--keep", "--validation off", "--workers 64"}},
		{"some servers", []string{"--servers", "couchdb"}, nil, "--servers couchdb", nil},
		{"some sections", []string{"--sections", "3,2"}, nil, "--sections 3,2", nil},
		{"a URL", []string{"--url", "http://127.0.0.1:5984"}, nil, "--url", nil},
		// The URL may hold a password: the flag's name stands for it.
		{"COUCHDB_URL", nil, map[string]string{"COUCHDB_URL": "http://admin:s3cret@127.0.0.1:5984"}, "COUCHDB_URL", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, o, err := ParseArgs(c.args, env(c.env), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if o.Partial != c.partial || !slices.Equal(o.Changed, c.changed) {
				t.Errorf("partial %q, changed %q; want %q, %q", o.Partial, o.Changed, c.partial, c.changed)
			}
			_, o, err = ParseArgs(append([]string{"--write-docs", "."}, c.args...), env(c.env), io.Discard)
			switch {
			case c.partial == "" && (err != nil || o.WriteDocs != "."):
				t.Errorf("--write-docs with a full run: %v, %q", err, o.WriteDocs)
			case c.partial != "" && (err == nil || !strings.Contains(err.Error(), c.partial+" makes this one partial")):
				t.Errorf("--write-docs with a partial run: %v", err)
			case err != nil && strings.Contains(err.Error(), "s3cret"):
				t.Errorf("the password leaked: %v", err)
			}
		})
	}
}

// --fleet -1 leaves the fleet out: the defaults must not turn it into
// the default fleet, as they do a zero.
func TestFleetOffSurvivesDefaults(t *testing.T) {
	c, _, err := ParseArgs([]string{"--fleet", "-1"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.WithDefaults().Fleet; got != -1 {
		t.Errorf("--fleet -1: Fleet %d after the defaults, want -1", got)
	}
	if got := (Config{}).WithDefaults().Fleet; got != FleetDefault {
		t.Errorf("zero Fleet: %d after the defaults, want %d", got, FleetDefault)
	}
}
