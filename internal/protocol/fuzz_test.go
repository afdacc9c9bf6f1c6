package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzWorkItemDecode feeds arbitrary bytes to the WorkItem decoder, which
// reads documents applications wrote straight into CouchDB. The seeds are
// in testdata/fuzz/FuzzWorkItemDecode; run it longer with
//
//	go test -run='^$' -fuzz=FuzzWorkItemDecode -fuzztime=60s ./internal/protocol/
//
// Properties:
//   - decoding never panics;
//   - couchq's own decoder (UnmarshalJSON) fails only with a
//     *MalformedError naming a field and a reason; through json.Unmarshal,
//     input that is not JSON at all is refused by encoding/json itself (a
//     *json.SyntaxError) before couchq sees it;
//   - a decoded job is runnable: a worker, a valid status, counts >= 0;
//   - a decoded job re-encodes to valid JSON (valid UTF-8 when the input
//     was) that decodes again to the same known fields and kept unknown
//     fields, and encoding is then a fixed point.
func FuzzWorkItemDecode(f *testing.F) {
	// A few seeds inline so that the target is useful even without the
	// corpus directory; the interesting ones live in testdata.
	for _, s := range []string{
		`{"type":"WorkItem","worker":"email"}`,
		`{"_id":"a","_rev":"1-x","type":"WorkItem","worker":"email","date":12.5,"payload":{"to":"a@b"},"tenant":"acme"}`,
		`{"type":"WorkItem","worker":"a","attempts":-1}`,
		`{"type":"WorkItem","worker":"a","progress":{"done":40,"total":120,"note":"page 40","at":12.5}}`,
		`null`,
		`[1,2]`,
		`{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var direct WorkItem
		derr := direct.UnmarshalJSON(data)
		var it WorkItem
		err := json.Unmarshal(data, &it)

		if !json.Valid(data) {
			var syn *json.SyntaxError
			if err == nil || !errors.As(err, &syn) {
				t.Fatalf("json.Unmarshal of invalid JSON: want a *json.SyntaxError, got %T %v", err, err)
			}
			m := checkMalformed(t, derr, data)
			if m.Field != "document" {
				t.Fatalf("UnmarshalJSON of invalid JSON: field %q, want \"document\" (%v)", m.Field, m)
			}
			return
		}
		// Valid JSON: encoding/json hands the whole input to UnmarshalJSON,
		// so both paths must agree.
		if (err == nil) != (derr == nil) {
			t.Fatalf("json.Unmarshal and UnmarshalJSON disagree: %v vs %v", err, derr)
		}
		if err != nil {
			m := checkMalformed(t, err, data)
			if dm := checkMalformed(t, derr, data); *dm != *m {
				t.Fatalf("json.Unmarshal and UnmarshalJSON report different errors: %+v vs %+v", m, dm)
			}
			return
		}
		checkRunnable(t, &it)

		out, err := json.Marshal(it)
		if err != nil {
			t.Fatalf("re-encoding a decoded job: %v", err)
		}
		if !json.Valid(out) {
			t.Fatalf("re-encoded job is not valid JSON: %q", out)
		}
		if utf8.Valid(data) && !utf8.Valid(out) {
			t.Fatalf("valid UTF-8 in, invalid UTF-8 out: %q", out)
		}
		var back WorkItem
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("re-encoded job does not decode: %v\nin:  %q\nout: %q", err, data, out)
		}
		sameItem(t, &it, &back, out)
		again, err := json.Marshal(back)
		if err != nil {
			t.Fatalf("encoding the round-tripped job: %v", err)
		}
		if !bytes.Equal(out, again) {
			t.Fatalf("encoding is not a fixed point:\nfirst:  %q\nsecond: %q", out, again)
		}
	})
}

// checkMalformed asserts err is a *MalformedError an operator can act on.
func checkMalformed(t *testing.T, err error, data []byte) *MalformedError {
	t.Helper()
	var m *MalformedError
	if !errors.As(err, &m) {
		t.Fatalf("decode error is %T (%v), want *MalformedError; input %q", err, err, data)
	}
	if m.Field == "" || m.Reason == "" {
		t.Fatalf("MalformedError without field or reason: %+v; input %q", m, data)
	}
	if m.Field != "document" && !knownField(m.Field) {
		t.Fatalf("MalformedError names %q, which is not a WorkItem field; input %q", m.Field, data)
	}
	if m.Error() == "" || !strings.Contains(m.Error(), m.Field) {
		t.Fatalf("MalformedError message %q does not name field %q", m.Error(), m.Field)
	}
	// The id lets an operator find the document: it is reported whenever
	// the document has a string _id.
	// (A map, not a struct: encoding/json matches struct fields without
	// regard to case, and "_ID" is not "_id".)
	var members map[string]json.RawMessage
	if json.Unmarshal(data, &members) == nil {
		var id string
		if json.Unmarshal(members["_id"], &id) == nil && m.ID != id {
			t.Fatalf("MalformedError id %q, document _id %q", m.ID, id)
		}
	}
	return m
}

// checkRunnable asserts what a worker relies on in every decoded job.
func checkRunnable(t *testing.T, it *WorkItem) {
	t.Helper()
	if it.Worker == "" {
		t.Fatalf("decoded a job without a worker: %+v", it)
	}
	if !it.Status.Valid() {
		t.Fatalf("decoded a job with status %q", it.Status)
	}
	if it.Attempts < 0 || it.MaxAttempts < 0 {
		t.Fatalf("decoded negative counts: attempts %d, max_attempts %d", it.Attempts, it.MaxAttempts)
	}
	for _, f := range []float64{it.Date, it.ClaimedAt, it.LeaseUntil, it.CreatedAt, it.StartedAt, it.FinishedAt} {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			t.Fatalf("decoded a non-finite time: %+v", it)
		}
	}
	_ = it.DueAt() // must not panic for any finite date
	_ = it.Lease()
}

// sameItem compares the fields a write carries: every known field (raw
// JSON ones by meaning, since encoding compacts and escapes them) and the
// kept unknown fields. Conflicts are informational and never written.
func sameItem(t *testing.T, a, b *WorkItem, out []byte) {
	t.Helper()
	fail := func(field string, x, y any) {
		t.Helper()
		t.Fatalf("round trip changed %s: %#v -> %#v\nencoded: %q", field, x, y, out)
	}
	type scalar struct {
		ID, Rev, Worker, ClaimedBy, LastError string
		Date, ClaimedAt, LeaseUntil           float64
		CreatedAt, StartedAt, FinishedAt      float64
		Claimed                               bool
		Status                                Status
		Attempts, MaxAttempts                 int
	}
	sa := scalar{a.ID, a.Rev, a.Worker, a.ClaimedBy, a.LastError, a.Date, a.ClaimedAt, a.LeaseUntil,
		a.CreatedAt, a.StartedAt, a.FinishedAt, a.Claimed, a.Status, a.Attempts, a.MaxAttempts}
	sb := scalar{b.ID, b.Rev, b.Worker, b.ClaimedBy, b.LastError, b.Date, b.ClaimedAt, b.LeaseUntil,
		b.CreatedAt, b.StartedAt, b.FinishedAt, b.Claimed, b.Status, b.Attempts, b.MaxAttempts}
	if sa != sb { // == on floats: -0 and 0 are the same time
		fail("scalar fields", sa, sb)
	}
	if len(a.History) != len(b.History) || (len(a.History) > 0 && !reflect.DeepEqual(a.History, b.History)) {
		fail("history", a.History, b.History)
	}
	if !reflect.DeepEqual(a.Progress, b.Progress) {
		fail("progress", a.Progress, b.Progress)
	}
	if !sameJSON(a.Payload, b.Payload) {
		fail("payload", string(a.Payload), string(b.Payload))
	}
	if !sameJSON(a.Result, b.Result) {
		fail("result", string(a.Result), string(b.Result))
	}
	if len(a.extra) != len(b.extra) {
		fail("unknown fields", a.extra, b.extra)
	}
	for k, v := range a.extra {
		w, ok := b.extra[k]
		if !ok || !sameJSON(v, w) {
			fail("unknown field "+k, string(v), string(w))
		}
	}
}

// sameJSON compares two raw JSON values by meaning (numbers as written).
func sameJSON(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	va, erra := decodeAny(a)
	vb, errb := decodeAny(b)
	if erra != nil || errb != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

func decodeAny(raw json.RawMessage) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}
