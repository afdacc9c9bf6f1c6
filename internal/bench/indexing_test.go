package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-kivik/kivik/v4"
	_ "github.com/go-kivik/kivik/v4/couchdb" // the "couch" driver
)

// indexing counts the index builds of one database from CouchDB's
// _active_tasks: a single node names the database, a cluster each copy of
// each shard; other databases' builds and other tasks do not count.
func TestIndexingCountsTheDatabasesIndexBuilds(t *testing.T) {
	answer := `[
		{"type": "indexer", "database": "shards/00000000-7fffffff/couchq_bench_backlog100000_ab12.1732470000", "node": "n1"},
		{"type": "indexer", "database": "shards/80000000-ffffffff/couchq_bench_backlog100000_ab12.1732470000", "node": "n2"},
		{"type": "indexer", "database": "couchq_bench_backlog100000_ab12"},
		{"type": "indexer", "database": "shards/00000000-7fffffff/couchq_bench_backlog100000_ab123.1732470000"},
		{"type": "view_compaction", "database": "shards/00000000-7fffffff/couchq_bench_backlog100000_ab12.1732470000"}
	]`
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/_active_tasks" {
			http.NotFound(w, r)
			return
		}
		if u, p, _ := r.BasicAuth(); u != "admin" || p != "secret" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(answer))
	}))
	defer srv.Close()
	tg := &target{base: srv.URL, user: "admin", password: "secret", raw: srv.Client()}
	if n, ok := tg.indexing(context.Background(), "couchq_bench_backlog100000_ab12"); !ok || n != 3 {
		t.Errorf("indexing: %d, %v; want 3, true", n, ok)
	}
	status = http.StatusForbidden
	if _, ok := tg.indexing(context.Background(), "couchq_bench_backlog100000_ab12"); ok {
		t.Error("a server that refuses _active_tasks said how many builds run")
	}
}

// The bench asks again only when CouchDB says a query outlasted its
// timeout while an index builds; any other failure, a 500 included, ends
// the section at once instead of being asked again for half an hour.
func TestAskWhileBuildingRetriesOnlyTheTimeout(t *testing.T) {
	var answers []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := answers[0]
		answers = answers[1:]
		if body == "" {
			_, _ = w.Write([]byte(`{"total_rows":0,"offset":0,"rows":[]}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(body))
	}))
	defer srv.Close()
	client, err := kivik.New("couch", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	db := client.DB("jobs")
	calls := 0
	query := func() error {
		calls++
		rows := db.Query(context.Background(), "_design/couchq", "due_priority")
		defer rows.Close()
		for rows.Next() {
		}
		return rows.Err()
	}
	timeout := `{"error":"timeout","reason":"The request could not be processed in a reasonable amount of time."}`
	answers = []string{timeout, ""}
	if err := askWhileBuilding(context.Background(), time.Now(), query); err != nil || calls != 2 {
		t.Errorf("after a timeout: %v after %d calls, want an answer after 2", err, calls)
	}
	calls = 0
	answers = []string{`{"error":"unknown_error","reason":"function_clause"}`, ""}
	if err := askWhileBuilding(context.Background(), time.Now(), query); err == nil || calls != 1 {
		t.Errorf("after another 500: %v after %d calls, want the error after 1", err, calls)
	}
}
