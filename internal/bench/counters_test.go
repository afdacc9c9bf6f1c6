package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// The server's counters are summed over the nodes, read again after a
// failure, and a reading that keeps failing says why in the row instead of
// leaving it out (the real server's counters are checked by
// TestRunEverySectionAgainstARealServer).
func TestServerCountersSumNodesAndSayWhyWhenUnread(t *testing.T) {
	const stats = `{"couchdb":{"mrview":{"map_doc":{"value":10}},"database_reads":{"value":20},` +
		`"query_server":{"calls":{"ddoc_vdu":{"value":30}}},"commits":{"value":40},"request_time":{"value":{"n":1}}}}`
	var failures atomic.Int32 // answers to fail before the next good one
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/_node/_local/_stats" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		if failures.Add(-1) >= 0 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte(stats))
	}))
	defer srv.Close()
	tg := &target{info: ServerInfo{Vendor: "couchdb"}, nodes: []string{srv.URL, srv.URL}, raw: srv.Client()}
	ctx := context.Background()

	failures.Store(counterReads - 1) // the last try of the first node answers
	got := tg.counters(ctx)
	if want := (serverCounters{mapped: 20, read: 40, validated: 60, commits: 80, ok: true}); got != want {
		t.Errorf("counters %+v, want %+v", got, want)
	}

	failures.Store(counterReads)
	unread := tg.counters(ctx)
	if unread.ok || unread.err == nil || !strings.Contains(unread.err.Error(), "500") {
		t.Fatalf("counters of a node that keeps failing: %+v", unread)
	}
	var s Section
	counterRow(&s, got, unread, 10)
	if len(s.Rows) != 1 || s.Rows[0].Metric != counterRowMetric || !strings.HasPrefix(s.Rows[0].Text, "not read: ") {
		t.Errorf("rows %+v, want one saying why the counters were not read", s.Rows)
	}

	s = Section{}
	counterRow(&s, got, serverCounters{mapped: 40, read: 50, validated: 60, commits: 81, ok: true}, 10)
	if len(s.Rows) != 1 || s.Rows[0].Text != "2.00 / 1.00 / 0.00; 0.100" {
		t.Errorf("rows %+v, want the differences per job", s.Rows)
	}

	pouch := &target{info: ServerInfo{Vendor: "pouchdb-server"}, nodes: []string{srv.URL}, raw: srv.Client()}
	if c := pouch.counters(ctx); c.ok || c.err != nil {
		t.Errorf("PouchDB Server's counters: %+v, want none and no error", c)
	}
}
