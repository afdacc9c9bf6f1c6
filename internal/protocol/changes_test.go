package protocol

import (
	"testing"
	"time"
)

// The feed's documents become candidates as the due view would key them:
// the priority as its map function reads it, none for a document that names
// no type or is scheduled for later.
func TestFedCandidate(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, c := range []struct {
		doc      string
		typ      string
		priority int
		ok       bool
	}{
		{`{"type":"WorkItem","worker":"email"}`, "email", PriorityDefault, true},
		{`{"type":"WorkItem","worker":"email","priority":2,"date":1799999999}`, "email", 2, true},
		{`{"type":"WorkItem","worker":"email","priority":null}`, "email", PriorityDefault, true},
		{`{"type":"WorkItem","worker":"email","priority":"high"}`, "email", PriorityHighest, true},
		{`{"type":"WorkItem","worker":"email","priority":9}`, "email", PriorityHighest, true},
		{`{"type":"WorkItem","worker":"email","priority":2.5}`, "email", PriorityHighest, true},
		{`{"type":"WorkItem","worker":"email","date":"soon"}`, "email", PriorityDefault, true},
		{`{"type":"WorkItem","worker":"email","date":1800000001}`, "", 0, false},
		{`{"type":"WorkItem"}`, "", 0, false},
		{`{"type":"WorkItem","worker":7}`, "", 0, false},
		{`null`, "", 0, false},
		{``, "", 0, false},
	} {
		typ, cand, ok := fedCandidate(change{ID: "job:1", Doc: []byte(c.doc)}, now)
		if ok != c.ok || typ != c.typ || (ok && (cand.Priority != c.priority || cand.ID != "job:1" || cand.doc != c.doc)) {
			t.Errorf("%s: got %q %+v %v, want %q priority %d %v", c.doc, typ, cand, ok, c.typ, c.priority, c.ok)
		}
	}
}
