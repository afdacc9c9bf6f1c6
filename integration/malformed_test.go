package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// What must become of a document the malformed test writes.
type malOutcome int

const (
	// malQuarantined: status failed, claimed false, last_error naming
	// every bad field, each bad value kept under invalid.<field>, every
	// other field kept.
	malQuarantined malOutcome = iota
	// malUntouched: couchq cannot see or repair it; its _rev must not
	// change, and the test lists it with the reason.
	malUntouched
	// malDone: odd but runnable; it runs once and ends done.
	malDone
)

func (o malOutcome) String() string {
	return [...]string{"quarantined", "untouched", "done"}[o]
}

// malShape is one kind of bad (or odd) document.
type malShape struct {
	name string
	// head replaces the default `"type":"WorkItem","worker":<type>`
	// members; "%s" in it is the job type as a JSON string.
	head   string
	fields string // further members, raw JSON (may hold invalid UTF-8)
	want   malOutcome
	bad    []string // fields couchq must report and move aside
	why    string   // malUntouched: why couchq leaves it alone
	// status is the status the status view files an untouched document of
	// one of our types under; "" when it is not filed under our types.
	status string
	weight int  // documents of this shape; 0 shares what the others leave of 1,000
	alone  bool // sent in a request of its own (large, deep, invalid UTF-8)
	// serverMay: the server may reject or rewrite it; the expectation is
	// then taken from what it stored.
	serverMay bool
	// classify, when set, decides the outcome from the stored document.
	classify func(stored map[string]json.RawMessage) (malOutcome, []string, string)
}

// malDoc is one document as written.
type malDoc struct {
	id      string
	shape   *malShape
	typ     string // the job type it was filed under ("" when worker is not ours)
	body    string
	want    malOutcome
	bad     []string
	rev     string // as written
	refused string // the server's answer when it refused the document
}

const (
	malTotal    = 1000 // malformed documents
	malGoodEach = 25   // good jobs written by hand, and as many enqueued by couchq
)

// Two job types the worker runs: a short one and one with a 1 KB name.
var malTypes = [2]string{"mal", "long-" + strings.Repeat("x", 1019)}

// nested is a value nested depth objects deep.
func malNested(depth int, leaf string) string {
	return strings.Repeat(`{"d":`, depth) + leaf + strings.Repeat("}", depth)
}

// malShapes lists every kind of bad document; quarantine first.
func malShapes() []*malShape {
	big := func(n int, c string) string { return `"` + strings.Repeat(c, n) + `"` }
	q := func(name, fields string, bad ...string) *malShape {
		return &malShape{name: name, fields: fields, want: malQuarantined, bad: bad}
	}
	u := func(name, head, fields, status, why string) *malShape {
		return &malShape{name: name, head: head, fields: fields, want: malUntouched, status: status, why: why}
	}
	weighted := func(s *malShape, n int, alone, serverMay bool) *malShape {
		s.weight, s.alone, s.serverMay = n, alone, serverMay
		return s
	}
	const (
		noWorker = "worker is not a non-empty string: never in the due view, so never claimed or quarantined"
		notItem  = `type is not "WorkItem": not a job document, invisible to every couchq view`
	)
	return []*malShape{
		// Wrong types, field by field.
		q("date-string", `"date":"tomorrow"`, "date"),
		q("date-object", `"date":{"$date":"2026-11-21"}`, "date"),
		q("date-bool", `"date":true`, "date"),
		q("date-array", `"date":[1763700000]`, "date"),
		q("attempts-negative", `"attempts":-1`, "attempts"),
		q("attempts-fraction", `"attempts":1.5`, "attempts"),
		q("attempts-string", `"attempts":"3"`, "attempts"),
		q("attempts-huge", `"attempts":1e300`, "attempts"),
		// validate_doc_update would accept this one (a whole number >= 0).
		q("attempts-over-int32", `"attempts":3000000000`, "attempts"),
		q("max-attempts-negative", `"max_attempts":-5`, "max_attempts"),
		q("max-attempts-object", `"max_attempts":{"n":3}`, "max_attempts"),
		q("status-unknown", `"status":"paused"`, "status"),
		q("status-case", `"status":"Queued"`, "status"),
		q("status-number", `"status":3`, "status"),
		// validate_doc_update refuses every write of it, claims included.
		q("unique-key-wrong-id", `"unique_key":"abc"`, "unique_key"),
		// Waiting (a callback): not in the due view; the sweeper's pass
		// over waiting jobs finds it.
		q("callback-bad-size", `"callback_of":"zz","batch_size":"x"`, "batch_size"),
		q("child-of-number", `"child_of":7`, "child_of"),
		q("child-of-another-id", `"child_of":"job:someone-else"`, "child_of"),
		q("claimed-string", `"claimed":"yes"`, "claimed"),
		q("claimed-string-true", `"claimed":"true"`, "claimed"),
		q("claimed-number", `"claimed":1`, "claimed"),
		q("claimed-by-number", `"claimed_by":42`, "claimed_by"),
		q("claimed-at-string", `"claimed_at":"yesterday"`, "claimed_at"),
		q("lease-until-bool", `"lease_until":false`, "lease_until"),
		q("created-at-string", `"created_at":"2026-11-21T07:00:00Z"`, "created_at"),
		q("started-at-object", `"started_at":{}`, "started_at"),
		q("finished-at-array", `"finished_at":[0]`, "finished_at"),
		q("last-error-object", `"last_error":{"code":500}`, "last_error"),
		q("last-error-number", `"last_error":404`, "last_error"),
		q("history-object", `"history":{}`, "history"),
		q("history-string", `"history":"none"`, "history"),
		q("history-entries-wrong", `"history":[1,"x",true]`, "history"),
		q("history-attempt-string", `"history":[{"at":"2026-11-21T07:00:00.000Z","event":"enqueued","attempt":"one"}]`, "history"),
		q("history-event-deep", `"history":[{"at":"2026-11-21T07:00:00.000Z","event":`+malNested(50, "1")+`}]`, "history"),
		q("many-bad", `"date":"x","claimed":"no","claimed_by":1,"status":"paused","attempts":-2,"max_attempts":"9",`+
			`"last_error":[],"history":{}`,
			"date", "claimed", "claimed_by", "status", "attempts", "max_attempts", "last_error", "history"),
		q("unknown-fields", `"tenant":"acme","meta":{"tags":["a",1,null],"n":1.5e300},"date":"x"`, "date"),
		// An "invalid" member already there (an application's own field).
		q("prior-invalid", `"invalid":"the application's own value","date":"x"`, "date"),
		// Huge fields.
		weighted(q("last-error-100k", `"last_error":`+big(100<<10, "e")+`,"status":"paused"`, "status"), 3, true, false),
		weighted(q("payload-1mb", `"payload":`+big(1<<20, "p")+`,"date":"x"`, "date"), 3, true, false),
		weighted(q("claimed-by-10k", `"claimed_by":`+big(10<<10, "c")+`,"date":"x"`, "date"), 3, true, false),
		// Deep nesting: the server may refuse it.
		weighted(q("payload-deep-200", `"payload":`+malNested(200, `"leaf"`)+`,"attempts":-1`, "attempts"), 3, true, true),
		// Invalid UTF-8, sent as raw bytes: the server may refuse or replace it.
		weighted(q("utf8-last-error", "\"last_error\":\"bad \xff\xfe bytes\",\"date\":\"x\"", "date"), 3, true, true),
		weighted(q("utf8-payload", "\"payload\":{\"s\":\"\xc3\x28\xed\xa0\x80\"},\"status\":\"paused\"", "status"), 3, true, true),
		weighted(q("utf8-key", "\"n\xffote\":1,\"claimed\":\"yes\"", "claimed"), 3, true, true),
		weighted(q("utf8-bad-value", "\"status\":\"pa\xffused\"", "status"), 3, true, true),
		// A number no float64 holds: what it becomes is the server's call.
		weighted(&malShape{name: "date-1e400", fields: `"date":1e400`, classify: malClassifyDate}, 3, true, true),

		u("worker-missing", `"type":"WorkItem"`, `"date":"x"`, "", noWorker),
		u("worker-number", `"type":"WorkItem","worker":5`, `"date":"x"`, "", noWorker),
		u("worker-empty", `"type":"WorkItem","worker":""`, `"date":"x"`, "", noWorker),
		u("worker-null", `"type":"WorkItem","worker":null`, `"attempts":-1`, "", noWorker),
		u("worker-object", `"type":"WorkItem","worker":{"name":"mal"}`, `"status":"paused"`, "", noWorker),
		u("worker-array", `"type":"WorkItem","worker":["mal"]`, `"claimed":"yes"`, "", noWorker),
		u("type-lowercase", `"type":"workitem","worker":%s`, `"date":"x"`, "", notItem),
		u("type-missing", `"worker":%s`, `"date":"x"`, "", notItem),
		u("type-number", `"type":1,"worker":%s`, `"history":{}`, "", notItem),
		// Claimed: not in the due view; the sweeper finds them in the leases
		// view (a malformed lease sorts first) and quarantines them.
		q("claimed-running", `"claimed":true,"status":"running","attempts":"x"`, "attempts"),
		q("claimed-bad-lease", `"claimed":true,"lease_until":"soon"`, "lease_until"),
		// A time out of any sane range (an ops view's _stats reduce
		// squares durations: see TestOpsViewsSurviveATimeOutOfRange).
		q("created-far", `"created_at":-1e300`, "created_at"),
		// Running but not claimed (validate_doc_update accepts it): no
		// lease of it runs out, so the leases view lists it at 0 too.
		q("running-unclaimed", `"status":"running"`, "status"),
		u("done-bad", "", `"status":"done","attempts":-1`, "done", "status done: finished, never looked at again"),
		u("failed-bad", "", `"status":"failed","date":"x","last_error":"an old failure"`, "failed",
			"status failed: already in the failed view, never looked at again"),
		u("cancelled-bad", "", `"status":"cancelled","history":{}`, "cancelled",
			"status cancelled: finished, never looked at again"),
		weighted(u("worker-100k", `"type":"WorkItem","worker":`+big(100<<10, "w"), `"date":"x"`, "",
			"a job type no worker here runs (a 100 KB name)"), 2, true, false),
		weighted(u("worker-utf8", "\"type\":\"WorkItem\",\"worker\":\"mal\xff\"", `"date":"x"`, "",
			"worker is not valid UTF-8: whatever the server stored, no worker here runs that type"), 3, true, true),
	}
}

// malOddShapes are runnable despite looking wrong: each must end done.
func malOddShapes() []*malShape {
	d := func(name, fields string, alone, serverMay bool) *malShape {
		return &malShape{name: name, fields: fields, want: malDone, weight: 1, alone: alone, serverMay: serverMay}
	}
	return []*malShape{
		d("ok-nulls", `"date":null,"status":null,"attempts":null,"claimed":null,"history":null,"payload":null`, false, false),
		d("ok-unknown-fields", `"tenant":"acme","nested":{"a":[1,{"b":null}]}`, false, false),
		d("ok-payload-1mb", `"payload":"`+strings.Repeat("p", 1<<20)+`"`, true, false),
		d("ok-last-error-100k", `"last_error":"`+strings.Repeat("e", 100<<10)+`"`, true, false),
		d("ok-payload-deep-200", `"payload":`+malNested(200, "true"), true, true),
		d("ok-utf8-payload", "\"payload\":\"caf\xe9 \xff\"", true, true),
	}
}

// malClassifyDate: a date the server could not keep as a number may be stored
// as null (valid: due now) or kept as text no float64 holds (malformed).
func malClassifyDate(stored map[string]json.RawMessage) (malOutcome, []string, string) {
	raw, ok := stored["date"]
	if !ok || string(raw) == "null" {
		return malDone, nil, fmt.Sprintf("server stored date 1e400 as %s: valid (due now)", malOrMissing(raw))
	}
	return malQuarantined, []string{"date"}, "server kept date as " + string(raw)
}

func malOrMissing(raw json.RawMessage) string {
	if raw == nil {
		return "(missing)"
	}
	return string(raw)
}

// malMakeDocs expands the shapes into documents: exactly total of the bad
// shapes, round-robin over the two job types.
func malMakeDocs(t *testing.T, shapes []*malShape, total int, prefix string) []*malDoc {
	t.Helper()
	fixed, shared := 0, 0
	for _, s := range shapes {
		fixed += s.weight
		if s.weight == 0 {
			shared++
		}
	}
	if total > 0 && (shared == 0 || fixed > total) {
		t.Fatalf("shapes: %d fixed, %d shared for %d documents", fixed, shared, total)
	}
	var out []*malDoc
	left, seen := total-fixed, 0
	for _, s := range shapes {
		n := s.weight
		if n == 0 {
			n = left / shared
			if seen < left%shared {
				n++
			}
			seen++
		}
		for range n {
			typ := malTypes[len(out)%2]
			id := fmt.Sprintf("%s-%04d-%s", prefix, len(out), s.name)
			head := s.head
			if head == "" {
				head = `"type":"WorkItem","worker":%s`
			}
			if strings.Contains(head, "%s") {
				head = fmt.Sprintf(head, malQuote(typ))
			} else {
				typ = "" // filed under no type of ours
			}
			if s.want == malUntouched && s.status == "" {
				typ = ""
			}
			body := `{"_id":` + malQuote(id) + `,` + head
			if s.fields != "" {
				body += `,` + s.fields
			}
			out = append(out, &malDoc{id: id, shape: s, typ: typ, body: body + `}`, want: s.want, bad: s.bad})
		}
	}
	if total > 0 && len(out) != total {
		t.Fatalf("made %d documents, want %d", len(out), total)
	}
	return out
}

// malQuote is s as a JSON string.
func malQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// malWriteDocs stores docs as an application with no couchq code would:
// _bulk_docs in chunks, and a request of its own for each large, deep or
// invalid-UTF-8 document so that a refusal concerns that document only.
func malWriteDocs(t *testing.T, tb *testBundle, docs []*malDoc) {
	t.Helper()
	var chunk []*malDoc
	flush := func() {
		if len(chunk) == 0 {
			return
		}
		bodies := make([]string, len(chunk))
		for i, d := range chunk {
			bodies[i] = d.body
		}
		code, resp := tb.raw(t, http.MethodPost, "/_bulk_docs", `{"docs":[`+strings.Join(bodies, ",")+`]}`)
		if code != http.StatusCreated && code != http.StatusOK {
			t.Fatalf("_bulk_docs: %d %.500s", code, resp)
		}
		var results []struct{ ID, Rev, Error, Reason string }
		if err := json.Unmarshal([]byte(resp), &results); err != nil {
			t.Fatalf("_bulk_docs answer: %v: %.500s", err, resp)
		}
		byID := map[string]int{}
		for i, r := range results {
			byID[r.ID] = i
		}
		for _, d := range chunk {
			i, ok := byID[d.id]
			switch {
			case !ok:
				t.Fatalf("_bulk_docs: no result for %s", d.id)
			case results[i].Error != "":
				d.refused = results[i].Error + ": " + results[i].Reason
			default:
				d.rev = results[i].Rev
			}
		}
		chunk = chunk[:0]
	}
	for _, d := range docs {
		if !d.shape.alone {
			if chunk = append(chunk, d); len(chunk) == 100 {
				flush()
			}
			continue
		}
		code, resp := tb.raw(t, http.MethodPut, "/"+d.id, d.body)
		var r struct{ Rev, Error, Reason string }
		_ = json.Unmarshal([]byte(resp), &r)
		if code == http.StatusCreated || code == http.StatusAccepted {
			d.rev = r.Rev
		} else {
			d.refused = fmt.Sprintf("%d %s: %s", code, r.Error, r.Reason)
		}
	}
	flush()
	for _, d := range docs {
		if d.refused != "" && !d.shape.serverMay {
			t.Fatalf("server refused %s, which any CouchDB should store: %s", d.id, d.refused)
		}
		if d.refused == "" && d.rev == "" {
			t.Fatalf("no revision for %s", d.id)
		}
	}
}

// malFetchDocs reads the stored documents by id, as raw members.
func malFetchDocs(t *testing.T, tb *testBundle, ids []string) map[string]map[string]json.RawMessage {
	t.Helper()
	out := map[string]map[string]json.RawMessage{}
	for start := 0; start < len(ids); start += 50 {
		keys, _ := json.Marshal(map[string]any{"keys": ids[start:min(start+50, len(ids))]})
		code, resp := tb.raw(t, http.MethodPost, "/_all_docs?include_docs=true", string(keys))
		if code != http.StatusOK {
			t.Fatalf("_all_docs: %d %.500s", code, resp)
		}
		var page struct {
			Rows []struct {
				Key   string
				Error string
				Doc   json.RawMessage
			}
		}
		if err := json.Unmarshal([]byte(resp), &page); err != nil {
			t.Fatalf("_all_docs answer: %v", err)
		}
		for _, r := range page.Rows {
			if r.Error != "" || len(r.Doc) == 0 || string(r.Doc) == "null" {
				t.Fatalf("document %s is gone: %s", r.Key, r.Error)
			}
			var doc map[string]json.RawMessage
			if err := json.Unmarshal(r.Doc, &doc); err != nil {
				t.Fatalf("document %s: %v", r.Key, err)
			}
			out[r.Key] = doc
		}
	}
	return out
}

// malStatusCounts reads the status view grouped by [type, status] for our
// job types.
func malStatusCounts(t *testing.T, tb *testBundle) map[string]int {
	t.Helper()
	rows := tb.db.Query(tb.ctx, designdocs.OpsID, "_view/status", kivik.Params(map[string]any{"group": true}))
	defer rows.Close()
	counts := map[string]int{}
	for rows.Next() {
		var key []json.RawMessage
		var n int
		if err := rows.ScanKey(&key); err != nil || len(key) != 2 {
			continue // a worker or status that is not a string: not ours
		}
		if err := rows.ScanValue(&n); err != nil {
			t.Fatal(err)
		}
		var typ, status string
		if json.Unmarshal(key[0], &typ) != nil || json.Unmarshal(key[1], &status) != nil {
			continue
		}
		if typ == malTypes[0] || typ == malTypes[1] {
			counts[malTypeName(typ)+"/"+status] += n
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return counts
}

// malTypeName shortens the 1 KB type for messages.
func malTypeName(typ string) string {
	if len(typ) > 20 {
		return typ[:8] + fmt.Sprintf("...(%d bytes)", len(typ))
	}
	return typ
}

// malFailedIDs lists the failed view's rows for a job type.
func malFailedIDs(t *testing.T, tb *testBundle, typ string) map[string]bool {
	t.Helper()
	rows := tb.db.Query(tb.ctx, designdocs.OpsID, "_view/failed", kivik.Params(map[string]any{
		"startkey": []any{typ}, "endkey": []any{typ, map[string]any{}},
	}))
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		id, _ := rows.ID()
		var v struct {
			LastError *string `json:"last_error"`
		}
		if err := rows.ScanValue(&v); err != nil {
			t.Fatal(err)
		}
		out[id] = v.LastError != nil && *v.LastError != ""
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// malServerDid describes how the stored document differs from the body
// sent, for the log: servers differ on invalid UTF-8 and extreme shapes.
func malServerDid(body string, stored map[string]json.RawMessage) string {
	var sent map[string]json.RawMessage
	if !utf8.ValidString(body) {
		var fffd []string
		for k, v := range stored {
			if strings.Contains(k, "\ufffd") || bytes.Contains(v, []byte("\ufffd")) ||
				bytes.Contains(bytes.ToLower(v), []byte(`\ufffd`)) {
				fffd = append(fffd, strings.ToValidUTF8(k, "?"))
			}
		}
		sort.Strings(fffd)
		if len(fffd) > 0 {
			return "stored, invalid bytes replaced with U+FFFD in " + strings.Join(fffd, ", ")
		}
		return "stored, invalid bytes not replaced with U+FFFD (kept or dropped)"
	}
	if err := json.Unmarshal([]byte(body), &sent); err != nil {
		return "stored (the body does not decode in Go: " + err.Error() + ")"
	}
	var changed []string
	for k, v := range sent {
		if !malSameJSON(v, stored[k]) {
			changed = append(changed, k)
		}
	}
	if len(changed) > 0 {
		sort.Strings(changed)
		return "stored, changed: " + strings.Join(changed, ", ")
	}
	return "stored as sent"
}

// malAsJob decodes a stored document as couchq reads it (Client.Get without
// the round trip: a thousand reads would cost the server seconds).
func malAsJob(doc map[string]json.RawMessage) (*protocol.WorkItem, error) {
	raw, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	var it protocol.WorkItem
	if err := json.Unmarshal(raw, &it); err != nil {
		return nil, err
	}
	return &it, nil
}

// malSameJSON compares raw JSON by meaning.
func malSameJSON(a, b json.RawMessage) bool {
	var va, vb any
	da, db := json.NewDecoder(bytes.NewReader(a)), json.NewDecoder(bytes.NewReader(b))
	da.UseNumber()
	db.UseNumber()
	return da.Decode(&va) == nil && db.Decode(&vb) == nil && reflect.DeepEqual(va, vb)
}

// 1,000 malformed WorkItems written before validate_doc_update existed,
// beside 50 good jobs: a worker runs every good job, never crashes, and
// every bad document ends where an operator finds it: failed with the
// reason (quarantined), or untouched and listed here with why.
func TestMalformedWorkItemsDoNotStopTheQueue(t *testing.T) {
	for _, lang := range languages() {
		t.Run(string(lang), func(t *testing.T) { testMalformedWorkItemsDoNotStopTheQueue(t, lang) })
	}
}

// testMalformedWorkItemsDoNotStopTheQueue is the test with the design
// documents' functions in lang.
func testMalformedWorkItemsDoNotStopTheQueue(t *testing.T, lang designdocs.Language) {
	began := time.Now()
	tb := setupWithout(t, protocol.Config{})
	ctx := tb.ctx

	bad := malMakeDocs(t, malShapes(), malTotal, "bad")
	odd := malMakeDocs(t, malOddShapes(), 0, "odd")
	var good []*malDoc
	goodShape := &malShape{name: "good", want: malDone}
	for i := range malGoodEach {
		typ := malTypes[i%2]
		id := fmt.Sprintf("good-raw-%02d", i)
		good = append(good, &malDoc{id: id, shape: goodShape, typ: typ, want: malDone,
			body: fmt.Sprintf(`{"_id":%q,"type":"WorkItem","worker":%s,"payload":{"n":%d}}`, id, malQuote(typ), i)})
	}
	all := append(append(append([]*malDoc{}, bad...), odd...), good...)
	malWriteDocs(t, tb, all)
	wrote := time.Now()
	tb.installLanguage(t, lang) // validation arrives after the documents

	var jobs []protocol.NewJob
	for i := range malGoodEach {
		jobs = append(jobs, protocol.NewJob{ID: fmt.Sprintf("good-enq-%02d", i), Worker: malTypes[i%2], Payload: map[string]int{"n": i}})
	}
	res, err := tb.client.EnqueueMany(ctx, jobs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		good = append(good, &malDoc{id: jobs[i].ID, shape: goodShape, typ: jobs[i].Worker, want: malDone, rev: r.Item.Rev})
	}
	all = append(all, good[malGoodEach:]...)

	// What the server stored decides server-dependent expectations, and is
	// what quarantine must keep.
	var stored []*malDoc
	var storedIDs []string
	refused := map[string][]string{}
	for _, d := range all {
		if d.refused != "" {
			refused[d.shape.name] = append(refused[d.shape.name], d.id+" ("+d.refused+")")
			continue
		}
		stored = append(stored, d)
		storedIDs = append(storedIDs, d.id)
	}
	for name, ids := range refused {
		t.Logf("server refused %d %s documents (not counted): %s", len(ids), name, strings.Join(ids, ", "))
	}
	before := malFetchDocs(t, tb, storedIDs)
	serverDid := map[string]string{}
	for _, d := range stored {
		doc := before[d.id]
		if d.shape.classify != nil {
			var note string
			d.want, d.bad, note = d.shape.classify(doc)
			serverDid[d.shape.name] = note
		}
		if d.shape.serverMay && d.shape.classify == nil {
			serverDid[d.shape.name] = malServerDid(d.body, doc)
		}
	}
	for name, note := range serverDid {
		t.Logf("server on %s: %s", name, note)
	}

	runnable := map[string]bool{}
	for _, d := range stored {
		if d.want == malDone {
			runnable[d.id] = true
		}
	}
	var mu sync.Mutex
	ran := map[string]int{}
	var strays []string
	noop := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		mu.Lock()
		defer mu.Unlock()
		ran[job.ID]++
		if !runnable[job.ID] {
			strays = append(strays, job.ID)
		}
		return nil
	})
	cfg := fastWorker(tb, map[string]worker.Handler{malTypes[0]: noop, malTypes[1]: noop})
	// Sweep logs every malformed claimed document on every pass: once a
	// second is plenty here. A longer lease keeps a slow server (the
	// 1 MB documents) from having a live claim swept and run twice.
	cfg.SweepInterval = time.Second
	cfg.LeaseDuration = 10 * time.Second
	w, err := worker.New((*couchq.Client)(tb.client), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	started := time.Now()

	// Expected rows of the status view for our types.
	want := map[string]int{}
	for _, d := range stored {
		if d.typ == "" {
			continue
		}
		switch d.want {
		case malQuarantined:
			want[malTypeName(d.typ)+"/failed"]++
		case malDone:
			want[malTypeName(d.typ)+"/done"]++
		case malUntouched:
			want[malTypeName(d.typ)+"/"+d.shape.status]++
		}
	}
	// Settled: every runnable job ran (counted in memory, free), nothing of
	// our types is due any more and the status view shows every outcome.
	// The views are queried only once the handler counts add up, so that
	// the test does not compete with the worker for a small server.
	settled := func() (bool, string) {
		mu.Lock()
		n := len(ran)
		mu.Unlock()
		if n < len(runnable) {
			return false, fmt.Sprintf("%d of %d runnable jobs ran; worker %+v", n, len(runnable), w.Stats())
		}
		for _, typ := range malTypes {
			b, err := tb.client.Due(ctx, typ, 10)
			if err != nil {
				return false, err.Error()
			}
			if n := len(b.Items) + len(b.Malformed); n > 0 {
				return false, fmt.Sprintf("%d still due for %s", n, malTypeName(typ))
			}
		}
		got := malStatusCounts(t, tb)
		for k, n := range want {
			if got[k] != n && (strings.HasSuffix(k, "/done") || strings.HasSuffix(k, "/failed")) {
				return false, fmt.Sprintf("status %v, want %v", got, want)
			}
		}
		return true, ""
	}
	// Typically 20-35 s here; the margin is for a machine shared with
	// other work.
	const settleWithin = 75 * time.Second
	deadline := time.Now().Add(settleWithin)
	nextNote := time.Now().Add(5 * time.Second)
	for {
		ok, why := settled()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("not settled after %s: %s", settleWithin, why)
			break
		}
		if time.Now().After(nextNote) {
			t.Logf("after %s: %s", time.Since(started).Round(time.Second), why)
			nextNote = time.Now().Add(5 * time.Second)
		}
		time.Sleep(250 * time.Millisecond)
	}
	settledAt := time.Now()

	stopped := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		stopped <- w.Stop(sctx)
	}()
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("Stop: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Stop did not return")
	}
	stats := w.Stats()

	// Precise counts, from the views an operator uses.
	if got := malStatusCounts(t, tb); !reflect.DeepEqual(got, want) {
		t.Errorf("status view for our types: %v, want %v", got, want)
	}
	after := malFetchDocs(t, tb, storedIDs)
	counts := map[malOutcome]int{}
	noted := map[string]bool{}
	untouched := map[string][]string{}
	for _, typ := range malTypes {
		failed := malFailedIDs(t, tb, typ)
		wantFailed := 0
		for _, d := range stored {
			if d.typ != typ || (d.want != malQuarantined && d.shape.status != "failed") {
				continue
			}
			wantFailed++
			if hasReason, ok := failed[d.id]; !ok || !hasReason {
				t.Errorf("%s: not in the failed view with a reason (listed %v)", d.id, ok)
			}
		}
		if len(failed) != wantFailed {
			t.Errorf("failed view for %s: %d rows, want %d", malTypeName(typ), len(failed), wantFailed)
		}
	}
	for _, d := range stored {
		doc, was := after[d.id], before[d.id]
		var rev string
		_ = json.Unmarshal(doc["_rev"], &rev)
		if d.bad != nil && d.shape.classify == nil && d.want != malQuarantined {
			t.Fatalf("test bug: %s lists bad fields but wants %s", d.shape.name, d.want)
		}
		counts[d.want]++
		switch d.want {
		case malUntouched:
			if rev != d.rev {
				t.Errorf("%s (%s): rewritten (rev %s -> %s) though couchq cannot repair it", d.id, d.shape.name, d.rev, rev)
			}
			untouched[d.shape.why] = append(untouched[d.shape.why], d.id)
			// couchq still says what is wrong with it, to whoever looks.
			var m *protocol.MalformedError
			if _, err := malAsJob(doc); !errors.As(err, &m) || m.Field == "" {
				t.Errorf("%s (%s): reading it should say what is malformed, got %v", d.id, d.shape.name, err)
			}
		case malDone:
			if ran[d.id] != 1 {
				t.Errorf("%s (%s): handler ran %d times, want 1", d.id, d.shape.name, ran[d.id])
			}
			it, err := malAsJob(doc)
			if err != nil || it.Status != protocol.StatusDone || it.Attempts != 1 {
				t.Errorf("%s (%s): want done after one attempt, got %+v (%v)", d.id, d.shape.name, it, err)
			}
		case malQuarantined:
			for _, n := range malCheckQuarantined(t, d, was, doc) {
				if !noted[d.shape.name+n[:20]] {
					noted[d.shape.name+n[:20]] = true
					t.Logf("quarantine of %s (e.g. %s): %s", d.shape.name, d.id, n)
				}
			}
		}
	}
	if len(strays) > 0 {
		t.Errorf("the handler ran documents that are not runnable: %v", strays)
	}
	wantRan := int64(counts[malDone])
	if stats.Claimed != wantRan || stats.Completed != wantRan || stats.Failed != 0 {
		t.Errorf("worker stats %+v: want %d claimed and completed, none failed", stats, wantRan)
	}

	// The operator's list of what couchq leaves alone, and why.
	whys := make([]string, 0, len(untouched))
	for why := range untouched {
		whys = append(whys, why)
	}
	sort.Strings(whys)
	for _, why := range whys {
		ids := untouched[why]
		t.Logf("left untouched, %d documents: %s: %s", len(ids), why, strings.Join(ids, " "))
	}
	badStored := 0
	for _, d := range bad {
		if d.refused == "" {
			badStored++
		}
	}
	t.Logf("%d malformed written (%d stored), %d odd, %d good: %d quarantined, %d untouched, %d done; "+
		"worker %+v; write %s, run %s, total %s",
		len(bad), badStored, len(odd), len(good), counts[malQuarantined], counts[malUntouched], counts[malDone],
		stats, wrote.Sub(began).Round(time.Millisecond), settledAt.Sub(started).Round(time.Millisecond),
		time.Since(began).Round(time.Millisecond))
}

// malCheckQuarantined: failed with a reason naming every bad field, each bad
// value kept under invalid.<field>, every other member kept.
func malCheckQuarantined(t *testing.T, d *malDoc, was, doc map[string]json.RawMessage) (notes []string) {
	t.Helper()
	var st struct {
		Status    string                     `json:"status"`
		Claimed   *bool                      `json:"claimed"`
		LastError string                     `json:"last_error"`
		Invalid   map[string]json.RawMessage `json:"invalid"`
	}
	raw, _ := json.Marshal(doc)
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Errorf("%s (%s): quarantined shape unreadable: %v", d.id, d.shape.name, err)
		return nil
	}
	if st.Status != "failed" || st.Claimed == nil || *st.Claimed || !strings.Contains(st.LastError, "malformed WorkItem") {
		t.Errorf("%s (%s): want failed, unclaimed, with the reason; got status %q claimed %v last_error %.200q",
			d.id, d.shape.name, st.Status, st.Claimed, st.LastError)
		return nil
	}
	for _, f := range d.bad {
		if !strings.Contains(st.LastError, f+" ") {
			t.Errorf("%s (%s): last_error does not name %s: %.300q", d.id, d.shape.name, f, st.LastError)
		}
		if v, ok := st.Invalid[f]; !ok || !malSameJSON(v, was[f]) {
			t.Errorf("%s (%s): invalid.%s = %.100s, want the original %.100s", d.id, d.shape.name, f, v, was[f])
		}
	}
	// couchq rewrites only these; the rest must survive as it was.
	rewritten := map[string]bool{"_rev": true, "status": true, "claimed": true, "last_error": true,
		"finished_at": true, "history": true, "invalid": true}
	for _, f := range d.bad {
		rewritten[f] = true
	}
	for k, v := range was {
		if rewritten[k] {
			continue
		}
		if got, ok := doc[k]; !ok || !malSameJSON(got, v) {
			t.Errorf("%s (%s): member %s lost or changed by quarantine: %.100s -> %.100s", d.id, d.shape.name, k, v, got)
		}
	}
	// Members quarantine overwrites that were not bad are kept too: an
	// application's own "invalid" under invalid.invalid, an earlier
	// last_error under previous_last_error.
	if v, ok := was["invalid"]; ok && !bytes.Contains(doc["invalid"], v) {
		t.Errorf("%s (%s): the document's own \"invalid\" member %.100s was lost (now %.100s)", d.id, d.shape.name, v, doc["invalid"])
	}
	if v, ok := was["last_error"]; ok && !slices.Contains(d.bad, "last_error") && !malSameJSON(v, doc["previous_last_error"]) {
		t.Errorf("%s (%s): a valid last_error (%d bytes) was not kept as previous_last_error", d.id, d.shape.name, len(v))
	}
	it, err := malAsJob(doc)
	if err != nil || it.Status != protocol.StatusFailed {
		t.Errorf("%s (%s): couchq cannot read the quarantined job: %+v %v", d.id, d.shape.name, it, err)
	}
	return notes
}

// Claimed documents with a malformed field, written before validation,
// sort first in the leases view (a lease_until that is not a number is
// keyed 0). There are more of them than one sweep reads: a real expired
// claim behind them must still be swept.
func TestMalformedClaimsDoNotStarveTheSweeper(t *testing.T) {
	tb := setupWithout(t, protocol.Config{})
	const page = 500 // what Sweep reads per call when given no limit
	bodies := make([]string, 0, page+10)
	for i := range page + 10 {
		bodies = append(bodies, fmt.Sprintf(`{"_id":"bad-claim-%04d","type":"WorkItem","worker":"sweep","claimed":true,`+
			`"status":"running","claimed_by":"gone/1/w","lease_until":"soon"}`, i))
	}
	if code, resp := tb.raw(t, http.MethodPost, "/_bulk_docs", `{"docs":[`+strings.Join(bodies, ",")+`]}`); code != http.StatusCreated {
		t.Fatalf("_bulk_docs: %d %.300s", code, resp)
	}
	tb.install(t)
	job, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "sweep"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tb.client.Claim(tb.ctx, job, "dead/1/w", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the lease runs out; its claimant is gone
	res, err := tb.client.Sweep(tb.ctx, "test/1/sweeper", 0)
	if err != nil {
		t.Fatal(err)
	}
	it, err := tb.client.Get(tb.ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if res.Requeued != 1 || it.Status != protocol.StatusQueued || it.Claimed {
		t.Fatalf("sweep %+v: the expired claim of %s stays %s (claimed %v) behind %d malformed claims",
			res, job.ID, it.Status, it.Claimed, page+10)
	}
}

// A malformed document that quarantine cannot rewrite (here an application's
// own validate_doc_update refuses the rewrite) must not make the worker
// query the due view in a tight loop.
func TestMalformedUnrepairableDocumentDoesNotSpin(t *testing.T) {
	tb := setupWithout(t, protocol.Config{})
	if code, resp := tb.raw(t, http.MethodPut, "/bad-1", `{"type":"WorkItem","worker":"spin","date":"x"}`); code != http.StatusCreated {
		t.Fatalf("PUT: %d %s", code, resp)
	}
	tb.install(t)
	rule := `{"validate_doc_update":"function (doc) { if (doc.invalid) { throw({forbidden: 'no invalid member'}); } }"}`
	if code, resp := tb.raw(t, http.MethodPut, "/_design/app", rule); code != http.StatusCreated {
		t.Fatalf("PUT app design doc: %d %s", code, resp)
	}
	w := startWorker(t, tb, fastWorker(tb, map[string]worker.Handler{
		"spin": worker.HandlerFunc(func(context.Context, *worker.Job) error { return nil }),
	}))
	time.Sleep(3 * time.Second)
	// FallbackPoll is a minute: a handful of queries is normal, hundreds is a spin.
	if q := w.Stats().Queries; q > 20 {
		t.Fatalf("%d due-view queries in 3 s for one document quarantine cannot rewrite: a busy loop", q)
	}
}

// A finished job written with a claim is never run again: the sweep clears
// the claim and leaves it finished, whatever its lease says.
func TestSweepLeavesAFinishedClaimedJobFinished(t *testing.T) {
	tb := setup(t, protocol.Config{})
	for id, status := range map[string]string{"hand-done": "done", "hand-cancelled": "cancelled"} {
		body := fmt.Sprintf(`{"type":"WorkItem","worker":"invoice","status":%q,"claimed":true,"claimed_by":"billing-app","lease_until":1795850000}`, status)
		if code, resp := tb.raw(t, http.MethodPut, "/"+id, body); code != http.StatusCreated {
			t.Fatalf("%s: %d %s", id, code, resp)
		}
	}
	res, err := tb.client.Sweep(tb.ctx, "test/1/sweeper", 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.Requeued != 0 {
		t.Errorf("sweep requeued %d finished jobs", res.Requeued)
	}
	for id, status := range map[string]protocol.Status{"hand-done": protocol.StatusDone, "hand-cancelled": protocol.StatusCancelled} {
		it, err := tb.client.Get(tb.ctx, id)
		if err != nil || it.Status != status || it.Claimed || len(it.History) == 0 || it.History[len(it.History)-1].Event != protocol.EventClaimCleared {
			t.Errorf("%s after a sweep: %+v (%v)", id, it, err)
		}
	}
	if due := tb.due(t, "invoice"); len(due) != 0 {
		t.Errorf("finished jobs due after a sweep: %v", due)
	}
}

// A job within a claim's few hundred bytes of CouchDB's document size
// limit cannot be claimed; the job claimed beside it still is, and the
// error says why.
func TestAJobTooLargeToClaimBlocksNoOther(t *testing.T) {
	tb := setup(t, protocol.Config{})
	const limit = 8000000 // Apache CouchDB's max_document_size by default
	doc := map[string]any{"type": "WorkItem", "worker": "edge", "payload": map[string]string{"s": ""}}
	body, _ := json.Marshal(doc)
	doc["payload"] = map[string]string{"s": strings.Repeat("q", limit-150-len(body))}
	if _, err := tb.client.DB().Put(tb.ctx, "big", doc); err != nil {
		t.Fatal(err)
	}
	small, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "edge"})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := tb.client.Due(tb.ctx, "edge", 10)
	if err != nil || len(batch.Items) != 2 {
		t.Fatalf("due: %v %v", batch, err)
	}
	for _, res := range tb.client.ClaimMany(tb.ctx, batch.Items, "test/1/w", time.Minute) {
		switch {
		case res.Item != nil && res.Item.ID == small.ID:
			if res.Err != nil {
				t.Errorf("the small job beside the big one: %v", res.Err)
			}
		case res.Err == nil:
			if server.Caps().Vendor == "couchdb" {
				t.Errorf("the big job was claimed on a server that limits documents to %d bytes", limit)
			}
		case !strings.Contains(res.Err.Error(), "larger than the server stores"):
			t.Errorf("the big job's claim: %v", res.Err)
		}
	}
	if it, err := tb.client.Get(tb.ctx, small.ID); err != nil || !it.Claimed {
		t.Errorf("the small job after the round: %+v %v", it, err)
	}
}

// A job written with its attempts used up is failed without running, not
// run as attempt 8 of 3.
func TestAJobWithNoAttemptsLeftDoesNotRun(t *testing.T) {
	tb := setup(t, protocol.Config{})
	if status, body := tb.raw(t, http.MethodPut, "/spent", `{"type":"WorkItem","worker":"w","attempts":7,"max_attempts":3}`); status != http.StatusCreated {
		t.Fatalf("%d %s", status, body)
	}
	var runs atomic.Int32
	cfg := fastWorker(tb, map[string]worker.Handler{"w": worker.HandlerFunc(func(context.Context, *worker.Job) error {
		runs.Add(1)
		return nil
	})})
	cfg.Drain = true
	w, err := worker.New((*couchq.Client)(tb.client), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(tb.ctx); err != nil {
		t.Fatal(err)
	}
	it, err := tb.client.Get(tb.ctx, "spent")
	if err != nil || it.Status != protocol.StatusFailed || !strings.Contains(it.LastError, "no attempts left: this would be attempt 8 of 3") {
		t.Errorf("the job with no attempts left: %+v %v", it, err)
	}
	if n := runs.Load(); n != 0 {
		t.Errorf("its handler ran %d times", n)
	}
}
