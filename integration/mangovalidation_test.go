package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// mangoLaxer are the documents the JavaScript validation refuses and the
// Mango selector stores, each with why: a selector cannot compare one
// field with another, nor bound an array's length. Workers quarantine the
// job that waits for itself and run the others as they are.
var mangoLaxer = map[string]string{
	"control-id-mismatch":      "the id must be control:<worker>: compares _id with worker",
	"slot-id-mismatch":         "the id must be slot:<sequence>:<slot>: compares _id with two fields",
	"unique-key-wrong-id":      "the id must start job:unique:<worker>:<key>: compares _id with two fields",
	"after-names-itself":       "after must not name the job's own id: compares after with _id",
	"progress-done-over-total": "progress.done at most progress.total: compares two fields",
	"after-1001":               "after names at most 1000 jobs: a selector cannot bound an array's length",
	"child-of-other-id":        "the id must start <child_of>: compares _id with child_of",
	"child-of-another-id":      "the id must start <child_of>: compares _id with child_of",
}

// mangoStricter are the documents the Mango selector refuses and the
// JavaScript validation stores: Mango's $mod takes only numbers written
// without a fraction as whole.
var mangoStricter = map[string]string{
	"attempts-one-point-zero": "1.0 is a whole number to JavaScript, not to Mango's $mod",
}

// mangoCases are documents beyond the malformed test's shapes: couchq's
// other validated types, the rules that compare fields, and good jobs.
func mangoCases() map[string]string {
	return map[string]string{
		"control-ok":               `{"_id":"control:mail","type":"TypeControl","worker":"mail","paused":true}`,
		"control-paused-string":    `{"_id":"control:mail2","type":"TypeControl","worker":"mail2","paused":"yes"}`,
		"control-id-mismatch":      `{"_id":"control:other","type":"TypeControl","worker":"mail3","paused":false}`,
		"slot-ok":                  `{"_id":"slot:seq:1","type":"SlotReservation","sequence":"seq","slot":"1","state":"free","expires_at":1,"ordinal":1}`,
		"slot-bad-state":           `{"_id":"slot:seq:2","type":"SlotReservation","sequence":"seq","slot":"2","state":"gone","expires_at":1,"ordinal":2}`,
		"slot-id-mismatch":         `{"_id":"slot:seq:9","type":"SlotReservation","sequence":"seq","slot":"3","state":"free","expires_at":1,"ordinal":3}`,
		"unique-key-ok":            `{"_id":"job:unique:mail:k1","type":"WorkItem","worker":"mail","unique_key":"k1"}`,
		"unique-key-wrong-id":      `{"_id":"job:other","type":"WorkItem","worker":"mail","unique_key":"k2"}`,
		"after-ok":                 `{"_id":"flow-b","type":"WorkItem","worker":"mail","after":["flow-a"]}`,
		"after-empty-id":           `{"_id":"flow-c","type":"WorkItem","worker":"mail","after":[""]}`,
		"after-names-itself":       `{"_id":"flow-d","type":"WorkItem","worker":"mail","after":["flow-d"]}`,
		"after-1001":               `{"_id":"flow-e","type":"WorkItem","worker":"mail","after":[` + strings.TrimSuffix(strings.Repeat(`"x",`, 1001), ",") + `]}`,
		"progress-ok":              `{"_id":"p1","type":"WorkItem","worker":"mail","progress":{"done":1,"total":2,"note":"half","at":1}}`,
		"progress-done-over-total": `{"_id":"p2","type":"WorkItem","worker":"mail","progress":{"done":3,"total":2}}`,
		"progress-negative":        `{"_id":"p3","type":"WorkItem","worker":"mail","progress":{"done":-1}}`,
		"trace-ok":                 `{"_id":"t1","type":"WorkItem","worker":"mail","trace":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}`,
		"trace-zero-id":            `{"_id":"t2","type":"WorkItem","worker":"mail","trace":{"traceparent":"00-00000000000000000000000000000000-00f067aa0ba902b7-01"}}`,
		"trace-extra-key":          `{"_id":"t3","type":"WorkItem","worker":"mail","trace":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","baggage":"x"}}`,
		"trace-no-parent":          `{"_id":"t4","type":"WorkItem","worker":"mail","trace":{"tracestate":"a=b"}}`,
		"site-bad":                 `{"_id":"s1","type":"WorkItem","worker":"mail","site":"-bad"}`,
		"site-ok":                  `{"_id":"s2","type":"WorkItem","worker":"mail","site":"eu-1"}`,
		"priority-six":             `{"_id":"pr1","type":"WorkItem","worker":"mail","priority":6}`,
		"priority-fraction":        `{"_id":"pr2","type":"WorkItem","worker":"mail","priority":2.5}`,
		"dependency-failure-bad":   `{"_id":"d1","type":"WorkItem","worker":"mail","on_dependency_failure":"retry"}`,
		"batch-empty":              `{"_id":"b1","type":"WorkItem","worker":"mail","batch":""}`,
		"attempts-one-point-zero":  `{"_id":"a1","type":"WorkItem","worker":"mail","attempts":1.0}`,
		"child-of-ok":              `{"_id":"job:p:k","type":"WorkItem","worker":"mail","child_of":"job:p"}`,
		"child-of-number":          `{"_id":"job:p:l","type":"WorkItem","worker":"mail","child_of":5}`,
		"child-of-other-id":        `{"_id":"job:q:k","type":"WorkItem","worker":"mail","child_of":"job:p"}`,
		"minimal":                  `{"_id":"m1","type":"WorkItem","worker":"mail"}`,
		"not-couchq":               `{"_id":"o1","type":"Invoice","worker":5}`,
	}
}

// With validation mango, where the server runs it, CouchDB refuses what
// the JavaScript validation refuses (but for the listed rules that compare
// fields), couchq's own writes pass, and init moves between mango, on and
// off. Where the server does not run it, init says so and changes nothing,
// and auto falls back to on.
func TestMangoValidation(t *testing.T) {
	onValidationTargets(t, testMangoValidation)
}

func testMangoValidation(t *testing.T, vt validationTarget) {
	initWith := func(opts protocol.InitOptions) (designdocs.Outcome, error) {
		t.Helper()
		return protocol.InitWith(vt.ctx, vt.admin, vt.db, opts, vt.log)
	}
	stored := func() (claim designdocs.Validation, validator bool) {
		t.Helper()
		d, err := designdocs.Stored(vt.ctx, vt.admin.DB(vt.db))
		if err != nil || d == nil {
			t.Fatalf("stored design document: %v %v", d, err)
		}
		if d.ValidationOf() == designdocs.ValidationMango && d.ValidateDocUpdate != "" {
			t.Errorf("validation mango, yet the claim document has its function")
		}
		_, err = vt.admin.DB(vt.db).GetRev(vt.ctx, designdocs.ValidateID)
		if err != nil && kivik.HTTPStatus(err) != http.StatusNotFound {
			t.Fatal(err)
		}
		return d.ValidationOf(), err == nil
	}
	if _, err := initWith(protocol.InitOptions{Validation: designdocs.ValidationOn}); err != nil {
		t.Fatal(err)
	}
	_, err := initWith(protocol.InitOptions{Validation: designdocs.ValidationMango})
	if errors.Is(err, protocol.ErrNoMangoValidation) {
		t.Logf("the server does not run Mango validation: %v", err)
		if v, validator := stored(); v != designdocs.ValidationOn || validator {
			t.Errorf("after the refusal: validation %s, %s there: %v; want on, alone", v, designdocs.ValidateID, validator)
		}
		if _, err := initWith(protocol.InitOptions{Validation: designdocs.ValidationAuto}); err != nil {
			t.Fatal(err)
		}
		if v, validator := stored(); v != designdocs.ValidationOn || validator {
			t.Errorf("auto: validation %s, %s there: %v; want on", v, designdocs.ValidateID, validator)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if v, validator := stored(); v != designdocs.ValidationMango || !validator {
		t.Fatalf("init --validation mango: validation %s, %s there: %v", v, designdocs.ValidateID, validator)
	}

	// The same documents into this database and into one validated by the
	// JavaScript function.
	jsDB := vt.db + "_js"
	if _, err := protocol.InitWith(vt.ctx, vt.admin, jsDB, protocol.InitOptions{Validation: designdocs.ValidationOn}, vt.log); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = vt.admin.DestroyDB(context.Background(), jsDB) })
	put := func(db, id, body string) int {
		code, _ := rawRequest(vt.ctx, t, vt.byHand, db, http.MethodPut, "/"+id, body)
		return code
	}
	// On a cluster the design documents reach every copy a moment after
	// they were written.
	awaitRefusal(t, func(i int) int {
		id := fmt.Sprintf("probe-%d", i)
		return min(put(vt.db, id, `{"type":"WorkItem","worker":"mail","date":"x"}`), put(jsDB, id, `{"type":"WorkItem","worker":"mail","date":"x"}`))
	})
	docs := map[string]string{}
	for _, shape := range append(malShapes(), malOddShapes()...) {
		if shape.alone {
			continue // large, deep or not UTF-8: the server's parser decides, not validation
		}
		head := shape.head
		if head == "" {
			head = `"type":"WorkItem","worker":%s`
		}
		if strings.Contains(head, "%s") {
			head = fmt.Sprintf(head, `"mail"`)
		}
		body := `{"_id":` + malQuote("mal-"+shape.name) + `,` + head
		if shape.fields != "" {
			body += `,` + shape.fields
		}
		docs[shape.name] = body + `}`
	}
	for name, body := range mangoCases() {
		docs[name] = body
	}
	class := func(code int) string {
		switch {
		case code == http.StatusCreated || code == http.StatusAccepted:
			return "stored"
		case code == http.StatusForbidden:
			return "refused"
		}
		return fmt.Sprintf("HTTP %d", code)
	}
	for name, body := range docs {
		id := body[strings.Index(body, `"_id":"`)+len(`"_id":"`):]
		id = id[:strings.Index(id, `"`)]
		js, mango := class(put(jsDB, id, body)), class(put(vt.db, id, body))
		switch {
		case mangoLaxer[name] != "":
			if js != "refused" || mango != "stored" {
				t.Errorf("%s: JavaScript %s, Mango %s; want refused and stored (%s)", name, js, mango, mangoLaxer[name])
			}
		case mangoStricter[name] != "":
			if js != "stored" || mango != "refused" {
				t.Errorf("%s: JavaScript %s, Mango %s; want stored and refused (%s)", name, js, mango, mangoStricter[name])
			}
		case js != mango:
			t.Errorf("%s: JavaScript %s, Mango %s: %s", name, js, mango, body)
		}
	}

	// couchq's own writes pass: enqueue, claim, lease, finish, history.
	ran := make(chan string, 16)
	w, err := worker.New((*couchq.Client)(vt.worker), worker.Config{
		Handlers: map[string]worker.Handler{"mango": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			ran <- job.ID
			if job.Attempt == 1 && job.ID == "mango-retried" {
				return errors.New("once more")
			}
			return nil
		})},
		LeaseDuration: vt.lease, SweepInterval: 200 * time.Millisecond, FeedTimeout: 2 * time.Second,
		Retry: func(int) time.Duration { return 20 * time.Millisecond }, FallbackPoll: time.Minute,
		ShutdownTimeout: 5 * time.Second, Logger: vt.log,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(vt.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	ids := []string{"mango-retried"}
	for _, id := range []string{"mango-retried", "mango-1", "mango-2"} {
		if _, err := vt.producer.Enqueue(vt.ctx, protocol.NewJob{ID: id, Worker: "mango", Priority: 2}); err != nil {
			t.Fatal(err)
		}
		if id != "mango-retried" {
			ids = append(ids, id)
		}
	}
	if code := put(vt.db, "mango-hand", `{"type":"WorkItem","worker":"mango"}`); code != http.StatusCreated && code != http.StatusAccepted {
		t.Fatalf("minimal job by hand: HTTP %d", code)
	}
	for _, id := range append(ids, "mango-hand") {
		it := waitStored(t, vt.producer, id, func(it *protocol.WorkItem) bool { return it.Status == protocol.StatusDone })
		if id == "mango-retried" && it.Attempts != 2 {
			t.Errorf("%s: done after %d attempts, want 2", id, it.Attempts)
		}
	}

	// Switching: on puts the function back and removes the selector, a
	// worker's install keeps it, off removes both, mango comes back.
	if _, err := initWith(protocol.InitOptions{Validation: designdocs.ValidationOn}); err != nil {
		t.Fatal(err)
	}
	if v, validator := stored(); v != designdocs.ValidationOn || validator {
		t.Errorf("on: validation %s, %s there: %v", v, designdocs.ValidateID, validator)
	}
	if _, err := initWith(protocol.InitOptions{Validation: designdocs.ValidationMango}); err != nil {
		t.Fatal(err)
	}
	if o, err := initWith(protocol.InitOptions{}); err != nil || o != designdocs.Unchanged {
		t.Errorf("a worker's install after mango: %s %v, want unchanged", o, err)
	}
	if v, validator := stored(); v != designdocs.ValidationMango || !validator {
		t.Errorf("kept: validation %s, %s there: %v", v, designdocs.ValidateID, validator)
	}
	if _, err := initWith(protocol.InitOptions{Validation: designdocs.ValidationAuto, Roles: true}); err != nil {
		t.Fatal(err)
	}
	if v, validator := stored(); v != designdocs.ValidationOn || validator {
		t.Errorf("auto with roles: validation %s, %s there: %v; want on", v, designdocs.ValidateID, validator)
	}
	if _, err := initWith(protocol.InitOptions{Validation: designdocs.ValidationAuto}); err != nil {
		t.Fatal(err)
	}
	if v, validator := stored(); v != designdocs.ValidationMango || !validator {
		t.Errorf("auto: validation %s, %s there: %v; want mango", v, designdocs.ValidateID, validator)
	}
	if _, err := initWith(protocol.InitOptions{Validation: designdocs.ValidationOff}); err != nil {
		t.Fatal(err)
	}
	if v, validator := stored(); v != designdocs.ValidationOff || validator {
		t.Errorf("off: validation %s, %s there: %v", v, designdocs.ValidateID, validator)
	}
	awaitStored(t, func(i int) int {
		return put(vt.db, fmt.Sprintf("off-%d", i), `{"type":"WorkItem","worker":"none","date":"x"}`)
	})
}

// awaitRefusal calls write with 0, 1, … until it answers 403, for up to
// 20 s: a design document reaches a cluster's copies a moment after it was
// written.
func awaitRefusal(t *testing.T, write func(i int) int) {
	t.Helper()
	awaitCode(t, write, "refused", func(code int) bool { return code == http.StatusForbidden })
}

// awaitStored is awaitRefusal waiting for the write to be stored.
func awaitStored(t *testing.T, write func(i int) int) {
	t.Helper()
	awaitCode(t, write, "stored", func(code int) bool { return code == http.StatusCreated || code == http.StatusAccepted })
}

func awaitCode(t *testing.T, write func(i int) int, want string, ok func(int) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		code := write(i)
		if ok(code) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a write still answers HTTP %d after 20 s, want it %s", code, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
