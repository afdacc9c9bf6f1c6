package couchtest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/couchtest"
)

var srv *couchtest.Server

func TestMain(m *testing.M) { couchtest.Main(m, func(s *couchtest.Server) { srv = s }) }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// getJSON fetches a URL (credentials embedded, see DBURL) and decodes the answer.
func getJSON(t *testing.T, url string, out any) int {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx(t), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("GET %s: %v: %s", url, err, body)
		}
	}
	return resp.StatusCode
}

func TestServerChoice(t *testing.T) {
	t.Logf("server: %s (%s)", srv, srv.Reason())
	if strings.Contains(srv.URL(), "@") {
		t.Fatalf("URL() carries credentials: %s", srv.URL())
	}
	switch srv.Kind() {
	case couchtest.KindEnv, couchtest.KindLocal, couchtest.KindDocker, couchtest.KindPouchDB:
	default:
		t.Fatalf("Kind() = %q", srv.Kind())
	}
}

func TestDBNameIsValidCouchDBName(t *testing.T) {
	valid := regexp.MustCompile(`^[a-z][a-z0-9_$()+/-]*$`)
	t.Run("Mixed/Case #1 ünïcode_and-dash", func(t *testing.T) {
		a, b := couchtest.DBName(t), couchtest.DBName(t)
		if !valid.MatchString(a) || len(a) > 238 {
			t.Fatalf("DBName = %q: not a valid CouchDB database name", a)
		}
		if a == b {
			t.Fatalf("DBName returned %q twice", a)
		}
	})
}

func TestNewDBIsolation(t *testing.T) {
	var names []string
	for _, sub := range []string{"a", "b"} {
		t.Run(sub, func(t *testing.T) {
			db := srv.NewDB(t)
			names = append(names, db.Name())
			if _, err := db.Put(ctx(t), "only-in-"+sub, map[string]any{"sub": sub}); err != nil {
				t.Fatal(err)
			}
			var all struct {
				TotalRows int `json:"total_rows"`
			}
			if code := getJSON(t, srv.DBURL(db.Name())+"/_all_docs", &all); code != http.StatusOK || all.TotalRows != 1 {
				t.Fatalf("_all_docs via DBURL: status %d, %d rows; want 200 and only this test's doc", code, all.TotalRows)
			}
		})
	}
	if len(names) != 2 || names[0] == names[1] {
		t.Fatalf("databases not distinct: %v", names)
	}
	for _, name := range names {
		if code := getJSON(t, srv.DBURL(name), nil); code != http.StatusNotFound {
			t.Errorf("database %s still there after its test ended (GET status %d)", name, code)
		}
	}
}

func TestCapabilities(t *testing.T) {
	c := srv.Caps()
	t.Logf("capabilities: %+v", c)
	if c.Vendor == "" || c.Version == "" || c.ClusterN < 1 {
		t.Fatalf("incomplete capabilities: %+v", c)
	}
	switch c.Vendor {
	case "pouchdb-server":
		// Facts measured on PouchDB Server 4.2.0; if an upgrade changes them, this says so.
		if c.SelectorFilter || c.Cluster || c.ClusterN != 1 || c.NewEditsWithValidation {
			t.Errorf("PouchDB Server capabilities changed: %+v", c)
		}
	case "couchdb":
		if !c.SelectorFilter || !c.NewEditsWithValidation {
			t.Errorf("CouchDB %s without _selector filters or replication-style writes under validation: %+v", c.Version, c)
		}
	}
}

func TestInjectRevisionMakesConflict(t *testing.T) {
	for _, withValidation := range []bool{false, true} {
		name := "plain"
		if withValidation {
			name = "with_validate_doc_update"
		}
		t.Run(name, func(t *testing.T) {
			db := srv.NewDB(t)
			const vdu = `function (newDoc) { if (newDoc.reject) { throw({forbidden: "rejected"}); } }`
			if withValidation {
				if _, err := db.Put(ctx(t), "_design/guard", map[string]any{"validate_doc_update": vdu}); err != nil {
					t.Fatal(err)
				}
			}
			rev1, err := db.Put(ctx(t), "job", map[string]any{"state": "pending"})
			if err != nil {
				t.Fatal(err)
			}
			winner, err := db.Put(ctx(t), "job", map[string]any{"_rev": rev1, "state": "claimed-by-a"})
			if err != nil {
				t.Fatal(err)
			}
			hash1 := strings.SplitN(rev1, "-", 2)[1]
			const hash2 = "0123456789abcdef0123456789abcdef"
			competing := "2-" + hash2
			couchtest.InjectRevision(ctx(t), t, srv, db.Name(), map[string]any{
				"_id":        "job",
				"_rev":       competing,
				"_revisions": map[string]any{"start": 2, "ids": []string{hash2, hash1}},
				"state":      "claimed-by-b",
			})

			var doc struct {
				Rev       string   `json:"_rev"`
				Conflicts []string `json:"_conflicts"`
			}
			if code := getJSON(t, srv.DBURL(db.Name())+"/job?conflicts=true", &doc); code != http.StatusOK {
				t.Fatalf("GET job: status %d", code)
			}
			revs := map[string]bool{doc.Rev: true}
			for _, c := range doc.Conflicts {
				revs[c] = true
			}
			if len(doc.Conflicts) != 1 || !revs[winner] || !revs[competing] {
				t.Fatalf("want %s and %s in conflict, got _rev %s, _conflicts %v", winner, competing, doc.Rev, doc.Conflicts)
			}

			if withValidation {
				var ddoc map[string]any
				if code := getJSON(t, srv.DBURL(db.Name())+"/_design/guard", &ddoc); code != http.StatusOK || ddoc["validate_doc_update"] != vdu {
					t.Fatalf("validate_doc_update not restored: status %d, %v", code, ddoc)
				}
				if _, err := db.Put(ctx(t), "bad", map[string]any{"reject": true}); err == nil {
					t.Fatal("validate_doc_update no longer enforced after InjectRevision")
				}
			}
		})
	}
}

func TestRestart(t *testing.T) {
	if !srv.CanRestart() {
		if err := srv.Restart(ctx(t)); err == nil || !strings.Contains(err.Error(), "only a server couchtest started itself") {
			t.Fatalf("Restart on a %s server: err = %v, want an explanation", srv.Kind(), err)
		}
		couchtest.Skip(t, "restart is only possible on a server couchtest started itself")
	}
	db := srv.NewDB(t)
	if _, err := db.Put(ctx(t), "survivor", map[string]any{"v": 1}); err != nil {
		t.Fatal(err)
	}
	url := srv.URL()
	if err := srv.Restart(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if srv.URL() != url {
		t.Fatalf("URL changed across Restart: %s -> %s", url, srv.URL())
	}
	var doc map[string]any
	if err := db.Get(ctx(t), "survivor").ScanDoc(&doc); err != nil || doc["v"] != float64(1) {
		t.Fatalf("doc after restart: %v, %v", doc, err)
	}
}

// recorder is a testing.TB whose Fatalf records instead of stopping the test.
type recorder struct {
	testing.TB
	fatal string
}

func (r *recorder) Fatalf(format string, args ...any) { r.fatal = fmt.Sprintf(format, args...) }

func TestInjectRevisionFailsLoudly(t *testing.T) {
	db := srv.NewDB(t)
	for name, doc := range map[string]map[string]any{
		"no _rev":       {"_id": "x"},
		"no _revisions": {"_id": "x", "_rev": "2-0123456789abcdef0123456789abcdef"},
	} {
		t.Run(name, func(t *testing.T) {
			r := &recorder{TB: t}
			couchtest.InjectRevision(ctx(t), r, srv, db.Name(), doc)
			if r.fatal == "" {
				t.Fatal("InjectRevision accepted an unusable doc")
			}
			t.Logf("InjectRevision failed as it should: %s", r.fatal)
		})
	}
}

// TestClusterNodeDownAndBack: the cluster tier's cluster has three nodes that all know each
// other, databases get n=3, and a node stopped and started again catches up on what was
// written while it was down.
func TestClusterNodeDownAndBack(t *testing.T) {
	cl := srv.Cluster(t)
	if cl.Nodes() != couchtest.ClusterNodes || !cl.Caps().Cluster || cl.Caps().ClusterN != 3 {
		t.Fatalf("cluster: %d nodes, caps %+v; want 3 nodes with n=3", cl.Nodes(), cl.Caps())
	}
	for i := 1; i <= cl.Nodes(); i++ {
		var m struct {
			Cluster []string `json:"cluster_nodes"`
		}
		if status := getJSON(t, strings.TrimSuffix(cl.Node(i).DBURL("_membership"), "/"), &m); status != http.StatusOK || len(m.Cluster) != 3 {
			t.Fatalf("node %d: _membership status %d, cluster_nodes %v", i, status, m.Cluster)
		}
	}
	db := cl.NewDB(t)
	if err := cl.StopNode(ctx(t), 3); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Put(ctx(t), "written-while-3-down", map[string]any{"v": 1}); err != nil {
		t.Fatalf("write with node 3 down: %v", err)
	}
	if err := cl.StartNode(ctx(t), 3); err != nil {
		t.Fatal(err)
	}
	c3 := cl.Node(3).Client(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var doc map[string]any
		err := c3.DB(db.Name()).Get(ctx(t), "written-while-3-down").ScanDoc(&doc)
		if err == nil && doc["v"] == float64(1) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 3 never served the document written while it was down: %v%s", err, cl.LogTail(3))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
