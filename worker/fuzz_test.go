package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/worker"
)

// Payload shapes a handler might declare: plain fields, nesting and
// recursion, pointers, raw JSON, time.Time (its own UnmarshalJSON), the
// ",string" option, embedding, arrays and interfaces.
type (
	fuzzEmail struct {
		To       string         `json:"to"`
		CC       []string       `json:"cc"`
		Priority int            `json:"priority"`
		Meta     map[string]any `json:"meta"`
	}
	fuzzOrder struct {
		fuzzAudit
		ID     int64           `json:"id"`
		Count  int             `json:"count,string"`
		Small  uint8           `json:"small"`
		Price  float64         `json:"price"`
		Due    time.Time       `json:"due"`
		Flag   *bool           `json:"flag"`
		Raw    json.RawMessage `json:"raw"`
		Pair   [2]int          `json:"pair"`
		Lines  []fuzzLine      `json:"lines"`
		Parent *fuzzOrder      `json:"parent"`
		Any    any             `json:"any"`
	}
	fuzzAudit struct {
		By   string            `json:"by"`
		Tags map[string]string `json:"tags"`
	}
	fuzzLine struct {
		SKU string `json:"sku"`
		Qty uint   `json:"qty"`
	}
)

// FuzzTypedPayload hands arbitrary bytes, as a job's payload, to handlers
// built with worker.Typed for several argument types. Seeds are in
// testdata/fuzz/FuzzTypedPayload; run it longer with
//
//	go test -run='^$' -fuzz=FuzzTypedPayload -fuzztime=60s ./worker/
//
// Properties: no panic; a payload that does not decode into T fails the
// job at once with a *worker.FailError naming the job, without calling the
// function; one that decodes calls it exactly once with exactly what
// DecodePayload (and encoding/json) produce, and its error is returned as
// it is.
func FuzzTypedPayload(f *testing.F) {
	for _, s := range []string{``, `null`, `{}`, `{"to":"a@b","priority":1}`, `{"count":"3"}`, `[`, `"x"`, `{"due":"0000-01-01T0:00:00+24:00"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		checkTyped[fuzzEmail](t, payload)
		checkTyped[fuzzOrder](t, payload)
		checkTyped[map[string]int](t, payload)
		checkTyped[[]string](t, payload)
		checkTyped[int](t, payload)
		checkTyped[*fuzzEmail](t, payload)
	})
}

// errFromHandler is what the typed function returns, to check it comes
// back unchanged (not turned into a FailError).
var errFromHandler = errors.New("handler says no")

func checkTyped[T any](t *testing.T, payload []byte) {
	t.Helper()
	// What the documentation promises: a missing payload decodes as null.
	want := payload
	if len(want) == 0 {
		want = []byte("null")
	}
	var expected T
	decodeErr := json.Unmarshal(want, &expected)

	calls := 0
	var got T
	h := worker.Typed(func(ctx context.Context, job *worker.Job, args T) error {
		calls++
		got = args
		return errFromHandler
	})
	job := &worker.Job{ID: "fuzz-job", Type: "fuzz", Attempt: 1, MaxAttempts: 3, Payload: payload}
	err := h.Handle(context.Background(), job)

	var fail *worker.FailError
	if decodeErr != nil {
		if calls != 0 {
			t.Fatalf("%T: the function ran on a payload that does not decode: %q", expected, payload)
		}
		if !errors.As(err, &fail) {
			t.Fatalf("%T: payload %q does not decode (%v) but the handler returned %T %v, want *worker.FailError",
				expected, payload, decodeErr, err, err)
		}
		if !strings.Contains(err.Error(), job.ID) {
			t.Fatalf("%T: failure does not name the job: %v", expected, err)
		}
		if _, derr := worker.DecodePayload[T](payload); derr == nil {
			t.Fatalf("%T: DecodePayload accepted %q, encoding/json did not", expected, payload)
		}
		return
	}
	if calls != 1 {
		t.Fatalf("%T: payload %q decodes but the function ran %d times (err %v)", expected, payload, calls, err)
	}
	if !errors.Is(err, errFromHandler) || errors.As(err, &fail) {
		t.Fatalf("%T: the function's error came back as %T %v", expected, err, err)
	}
	// Compare by encoding: time.Time values decoded twice carry distinct
	// *time.Location pointers, so reflect.DeepEqual would be too strict.
	if a, b := mustEncode(t, expected), mustEncode(t, got); !bytes.Equal(a, b) {
		t.Fatalf("%T: handler got %s, encoding/json gives %s", expected, b, a)
	}
	direct, derr := worker.DecodePayload[T](payload)
	if derr != nil {
		t.Fatalf("%T: DecodePayload refused %q: %v", expected, payload, derr)
	}
	if a, b := mustEncode(t, expected), mustEncode(t, direct); !bytes.Equal(a, b) {
		t.Fatalf("%T: DecodePayload gives %s, encoding/json gives %s", expected, b, a)
	}
}

func mustEncode(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		// json.Unmarshal accepts RFC 3339 text that time.Time cannot
		// encode again (an offset of +24:00, say): compare such values by
		// the error, which names what will not encode.
		return []byte("not encodable: " + err.Error())
	}
	return b
}
