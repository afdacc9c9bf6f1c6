package protocol

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestWorkItemMinimalDocumentIsDueNow(t *testing.T) {
	var it WorkItem
	if err := json.Unmarshal([]byte(`{"type":"WorkItem","worker":"email"}`), &it); err != nil {
		t.Fatal(err)
	}
	if it.Worker != "email" || it.Date != 0 || it.Status != StatusQueued || it.Claimed || it.Attempts != 0 {
		t.Fatalf("unexpected decode: %+v", it)
	}
	if err := json.Unmarshal([]byte(`{"type":"WorkItem","worker":"email","date":null,"status":null}`), &it); err != nil {
		t.Fatalf("null date and status mean defaults: %v", err)
	}
}

func TestWorkItemKeepsUnknownFields(t *testing.T) {
	in := `{"_id":"a","_rev":"1-x","_revisions":{"start":1,"ids":["x"]},"type":"WorkItem","worker":"email",` +
		`"date":12.5,"payload":{"to":"a@b"},"tenant":"acme","tags":["x",1],"_attachments":{"f":{"stub":true}}}`
	var it WorkItem
	if err := json.Unmarshal([]byte(in), &it); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(it)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]json.RawMessage
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"tenant": `"acme"`, "tags": `["x",1]`, "payload": `{"to":"a@b"}`, "date": `12.5`,
		"status": `"queued"`, "type": `"WorkItem"`, "_attachments": `{"f":{"stub":true}}`,
	} {
		if string(got[k]) != want {
			t.Errorf("field %s = %s, want %s", k, got[k], want)
		}
	}
	if _, ok := got["_revisions"]; ok {
		t.Error("server-computed _revisions must not be written back")
	}
}

func TestWorkItemMalformedNamesTheField(t *testing.T) {
	cases := map[string]string{
		`{"type":"WorkItem"}`:                                "worker",
		`{"type":"WorkItem","worker":5}`:                     "worker",
		`{"type":"WorkItem","worker":""}`:                    "worker",
		`{"type":"WorkItem","worker":"a\u0007"}`:             "worker",
		`{"type":"WorkItem","worker":"a","date":"tomorrow"}`: "date",
		`{"type":"WorkItem","worker":"a","status":"paused"}`: "status",
		`{"type":"WorkItem","worker":"a","attempts":-1}`:     "attempts",
		`{"type":"WorkItem","worker":"a","attempts":1.5}`:    "attempts",
		`{"type":"WorkItem","worker":"a","claimed":"yes"}`:   "claimed",
		`{"type":"WorkItem","worker":"a","history":{}}`:      "history",
		`{"type":"Other","worker":"a"}`:                      "type",
		`{"type":"WorkItem","worker":"a","trace":"00-x"}`:    "trace",
		`{"type":"WorkItem","worker":"a","trace":{}}`:        "trace",
		`{"type":"WorkItem","worker":"a","trace":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"}}`: "trace",
		`{"type":"WorkItem","worker":"a","progress":5}`:                                                                   "progress",
		`{"type":"WorkItem","worker":"a","progress":{"done":-1}}`:                                                         "progress",
		`{"type":"WorkItem","worker":"a","progress":{"done":3,"total":2}}`:                                                "progress",
		`{"type":"WorkItem","worker":"a","progress":{"done":1,"note":7}}`:                                                 "progress",
		`{"type":"WorkItem","worker":"a","progress":{"done":1,"at":"now"}}`:                                               "progress",
		`[1,2]`: "document",
	}
	for in, field := range cases {
		var it WorkItem
		err := json.Unmarshal([]byte(in), &it)
		var m *MalformedError
		if !errors.As(err, &m) {
			t.Errorf("%s: want MalformedError, got %v", in, err)
			continue
		}
		if m.Field != field {
			t.Errorf("%s: field %q, want %q (%v)", in, m.Field, field, err)
		}
	}
	// A priority is told its own range, whatever is wrong with it; a job
	// that reads running is claimed.
	for in, want := range map[string]string{
		`{"type":"WorkItem","worker":"a","priority":"1"}`:     `priority must be a whole number from 1 (runs first) to 5, got a string`,
		`{"type":"WorkItem","worker":"a","priority":9}`:       `priority must be a whole number from 1 (runs first) to 5, got a number 9`,
		`{"type":"WorkItem","worker":"a","priority":1.5}`:     `priority must be a whole number from 1 (runs first) to 5`,
		`{"type":"WorkItem","worker":"a","status":"running"}`: `status is "running" but the job is not claimed`,
	} {
		var it WorkItem
		if err := json.Unmarshal([]byte(in), &it); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", in, err, want)
		}
	}
}

// The trace field survives every write couchq makes of a job.
func TestWorkItemKeepsTrace(t *testing.T) {
	in := `{"type":"WorkItem","worker":"email","trace":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","tracestate":"a=1"}}`
	var it WorkItem
	if err := json.Unmarshal([]byte(in), &it); err != nil {
		t.Fatal(err)
	}
	if it.Trace["traceparent"] != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" || it.Trace["tracestate"] != "a=1" {
		t.Fatalf("trace %v", it.Trace)
	}
	out, err := json.Marshal(it.Clone())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"trace":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","tracestate":"a=1"}`) {
		t.Fatalf("written back as %s", out)
	}
}

func TestHistoryStaysBoundedAndKeepsEnqueued(t *testing.T) {
	c := &Client{cfg: Config{HistoryLimit: 5}.WithDefaults()}
	it := &WorkItem{}
	c.record(it, "enqueued", "cli", "")
	for range 100 {
		c.record(it, "retry-scheduled", "w", "boom")
	}
	if len(it.History) != 5 {
		t.Fatalf("history has %d entries, want 5", len(it.History))
	}
	if it.History[0].Event != "enqueued" || it.History[4].Event != "retry-scheduled" {
		t.Fatalf("want the first enqueued kept and the newest last: %+v", it.History)
	}
}

func TestTruncateKeepsValidUTF8(t *testing.T) {
	s := truncate(strings.Repeat("é", maxErrorLen))
	if len(s) > maxErrorLen || !strings.HasSuffix(s, "...") || !json.Valid(mustJSON(s)) {
		t.Fatalf("bad truncation: len %d", len(s))
	}
	if strings.ContainsRune(s, '\uFFFD') {
		t.Fatal("truncation split a rune")
	}
}

func TestUnixRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 21, 7, 0, 0, 123456000, time.UTC)
	if got := FromUnix(ToUnix(at)); !got.Equal(at) {
		t.Fatalf("round trip %v -> %v", at, got)
	}
	if ToUnix(time.Time{}) != 0 {
		t.Fatal("zero time must store as 0 (due now)")
	}
}

func TestRedactAndDialKeepPasswordsOut(t *testing.T) {
	if got := Redact("http://admin:s3cret@host:5984/db"); strings.Contains(got, "s3cret") {
		t.Fatalf("Redact leaked: %s", got)
	}
	if _, err := Dial("::not a url s3cret", "", ""); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("Dial error should be clear and redacted: %v", err)
	}
	// Without a scheme, or with a mistyped one, the parser finds no
	// credentials, but the password is still there.
	for in, want := range map[string]string{
		"admin:s3cret@host:5984":        "admin:xxxxx@host:5984",
		"http//admin:s3cret@host:5984":  "http//xxxxx@host:5984",
		"http:/admin:s3cret@host:5984":  "http:/xxxxx@host:5984",
		"http:admin:s3cret@host:5984":   "http:xxxxx@host:5984",
		"http://host:5984/db@x":         "http://host:5984/db@x",
		"https://host:5984/couchq?a=@b": "https://host:5984/couchq?a=@b",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

// Progress round-trips as {done, total, note, at}, and a report is checked
// and its note bounded.
func TestWorkItemProgress(t *testing.T) {
	var it WorkItem
	in := `{"type":"WorkItem","worker":"a","progress":{"done":40,"total":120,"note":"page 40","at":12.5}}`
	if err := json.Unmarshal([]byte(in), &it); err != nil {
		t.Fatal(err)
	}
	if it.Progress == nil || *it.Progress != (Progress{Done: 40, Total: 120, Note: "page 40", At: 12.5}) {
		t.Fatalf("progress %+v", it.Progress)
	}
	if got := it.Progress.String(); got != "40/120 (33%) page 40" {
		t.Errorf("String() = %q", got)
	}
	out, err := json.Marshal(it)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"progress":{"done":40,"total":120,"note":"page 40","at":12.5}`) {
		t.Errorf("encoded %s", out)
	}
	for _, bad := range [][2]int{{-1, 0}, {0, -1}, {3, 2}} {
		if _, err := NewProgress(bad[0], bad[1], "", time.Now()); !errors.Is(err, ErrInvalidJob) {
			t.Errorf("NewProgress(%d, %d): %v, want ErrInvalidJob", bad[0], bad[1], err)
		}
	}
	p, err := NewProgress(7, 0, strings.Repeat("é", 300), time.Unix(5, 0))
	if err != nil || len(p.Note) > MaxProgressNote || p.At != 5 || p.String()[:2] != "7 " {
		t.Errorf("NewProgress: %+v %v", p, err)
	}
}

// A date past what Unix microseconds hold reads as the end of year 9999,
// not as a date in the past.
func TestFromUnixOutOfRange(t *testing.T) {
	end := time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
	for _, s := range []float64{1e300, math.Inf(1), 253402300800} {
		if got := FromUnix(s); !got.Equal(end) {
			t.Errorf("FromUnix(%g) = %s, want %s", s, got, end)
		}
	}
	if got := FromUnix(-1e300); !got.Before(time.Unix(0, 0)) {
		t.Errorf("FromUnix(-1e300) = %s", got)
	}
	if got := FromUnix(1.5); !got.Equal(time.UnixMicro(1500000).UTC()) {
		t.Errorf("FromUnix(1.5) = %s", got)
	}
}

// A document nested deeper than MaxNesting is malformed, as
// validate_doc_update has it; brackets inside strings do not count.
func TestWorkItemNestedTooDeep(t *testing.T) {
	doc := func(levels int, s string) string {
		return `{"_id":"deep","type":"WorkItem","worker":"a","note":"` + s + `","payload":` +
			strings.Repeat("[", levels-1) + strings.Repeat("]", levels-1) + `}`
	}
	var it WorkItem
	if err := json.Unmarshal([]byte(doc(MaxNesting, `[[[{{\"[`)), &it); err != nil {
		t.Errorf("%d levels, and brackets in a string: %v", MaxNesting, err)
	}
	err := json.Unmarshal([]byte(doc(MaxNesting+1, "")), &it)
	var m *MalformedError
	if !errors.As(err, &m) || m.ID != "deep" || m.Field != "document" || !strings.Contains(m.Reason, "more than 1000 levels deep") {
		t.Errorf("%d levels: %v, want a MalformedError naming the document", MaxNesting+1, err)
	}
}
