package opshttp

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
)

// scaleEnv sets how many jobs TestDashboardAtScale writes; unset, the test
// skips: at 100k it takes minutes, most of them CouchDB building indexes.
const scaleEnv = "COUCHQ_DASH_SCALE"

// scaleAnswerMax is how long one dashboard endpoint may take once the
// indexes are built, for the page to stay usable.
const scaleAnswerMax = 5 * time.Second

// The dashboard's endpoints at size (COUCHQ_DASH_SCALE jobs over 50 types,
// with a day of history, written straight into the database): once the
// indexes are built, each answers within scaleAnswerMax, and the figures
// add up to what was written.
func TestDashboardAtScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv(scaleEnv))
	if n <= 0 {
		t.Skipf("set %s=100000 to run the dashboard against that many jobs over 50 types (minutes)", scaleEnv)
	}
	const types = 50
	_, db := newDB(t)
	// Writing and indexing that many take longer than newDB's context.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	q, err := protocol.New(ctx, db, protocol.Config{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	at := func(ago time.Duration) string { return now.Add(-ago).UTC().Format(protocol.HistoryTimeFormat) }
	var failed int
	start := time.Now()
	for lo := 0; lo < n; lo += 1000 {
		var docs []any
		for i := lo; i < min(lo+1000, n); i++ {
			// Spread over the last day; one in ten failed, one in ten
			// still queued, the rest done.
			ago := time.Duration(i%86400) * time.Second
			created := protocol.ToUnix(now.Add(-ago - 90*time.Second))
			doc := map[string]any{
				"_id": fmt.Sprintf("job:%07d", i), "type": "WorkItem", "worker": fmt.Sprintf("type-%02d", i%types),
				"date": 0, "created_at": created, "attempts": 1,
			}
			switch i % 10 {
			case 0:
				doc["status"] = "queued"
				doc["attempts"] = 0
				doc["history"] = []map[string]any{{"at": at(ago + 90*time.Second), "event": "enqueued"}}
			case 1:
				failed++
				doc["status"], doc["last_error"] = "failed", "boom"
				doc["started_at"], doc["finished_at"] = created+30, created+90
				doc["history"] = []map[string]any{
					{"at": at(ago + 90*time.Second), "event": "enqueued"},
					{"at": at(ago + 60*time.Second), "event": "claimed", "by": "w"},
					{"at": at(ago), "event": "failed", "error": "boom"},
				}
			default:
				doc["status"] = "done"
				doc["started_at"], doc["finished_at"] = created+30, created+90
				doc["history"] = []map[string]any{
					{"at": at(ago + 90*time.Second), "event": "enqueued"},
					{"at": at(ago + 60*time.Second), "event": "claimed", "by": "w"},
					{"at": at(ago), "event": "done"},
				}
			}
			docs = append(docs, doc)
		}
		if _, err := db.BulkDocs(ctx, docs); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("wrote %d jobs in %s", n, time.Since(start).Round(time.Millisecond))
	hs := serveHandler(ctx, t, q, Config{CacheTTL: -1})

	// The first query of each view waits for its index (all of the design
	// document's are built together).
	start = time.Now()
	if _, err := q.Queues(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("indexes built in %s", time.Since(start).Round(time.Millisecond))

	for _, path := range []string{
		"/api/queues", "/api/workers", "/api/failed",
		"/api/series?window=1h", "/api/series?window=24h", "/api/series?window=7d",
		"/api/series?window=24h&type=type-07", "/api/jobs?status=running&limit=50", "/",
	} {
		start := time.Now()
		code, body := opstest.Get(t, hs.URL+path)
		took := time.Since(start)
		t.Logf("%-40s %d, %6d bytes, %s", path, code, len(body), took.Round(time.Millisecond))
		if code != http.StatusOK || took > scaleAnswerMax {
			t.Errorf("%s: %d in %s, want 200 within %s", path, code, took, scaleAnswerMax)
		}
	}
	var queues []protocol.TypeQueue
	getJSON(t, hs.URL+"/api/queues", &queues)
	var sumFailed, sumDue int64
	for _, q := range queues {
		sumFailed += q.Failed
		sumDue += q.Due
	}
	if len(queues) != types || sumFailed != int64(failed) || sumDue != int64((n+9)/10) {
		t.Errorf("queues: %d types, %d failed, %d due; want %d, %d, %d", len(queues), sumFailed, sumDue, types, failed, (n+9)/10)
	}
	var s protocol.Series
	getJSON(t, hs.URL+"/api/series?window=24h", &s)
	// The newest timing rows are read first: the newest bucket that had
	// jobs started has percentiles, however many rows the window holds.
	var finished int64
	newest := -1
	for i := range s.T {
		finished += s.Finished[i]
		if s.Started[i] > 0 {
			newest = i
		}
	}
	if finished == 0 || newest < 0 || s.WaitP50[newest] == nil || s.ServiceP95[newest] == nil {
		t.Errorf("24h series: %d finished; the newest bucket with jobs started (%d) has no percentiles", finished, newest)
	}
}
