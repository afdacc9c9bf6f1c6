package protocol

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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

// A poll ended while its rows are being read (pollChanges ends the long
// poll once its second look found changes) stops reading cleanly. Under
// the race detector this is the check: the rows must not be read through
// calls that look at the feed's state without the lock kivik's closing
// goroutine takes.
func TestFeedEndedWhileItsRowsAreRead(t *testing.T) {
	sent := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"results":[`)
		for i := 0; r.Context().Err() == nil; i++ {
			if i > 0 {
				_, _ = io.WriteString(w, ",")
			}
			fmt.Fprintf(w, `{"seq":"%d-x","id":"job:%d","changes":[{"rev":"1-a"}],"doc":{"_id":"job:%d","type":"WorkItem","worker":"email"}}`, i+1, i, i)
			if i == 2000 {
				w.(http.Flusher).Flush()
				sent <- struct{}{}
			}
		}
	}))
	defer srv.Close()
	client, err := Dial(srv.URL, "", "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(context.Background(), client.DB("q"), Config{Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 20; round++ {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, _, err := c.waitForChangesFilter(ctx, "0", []string{"email"}, time.Minute, true)
			done <- err
		}()
		<-sent
		cancel()
		if err := <-done; err == nil || !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: a poll ended by its caller returned %v, want context.Canceled", round, err)
		}
	}
}
