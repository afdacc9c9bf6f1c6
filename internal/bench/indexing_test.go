package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
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
