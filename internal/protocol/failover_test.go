package protocol

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// refusedURL is the URL of a port nothing listens on.
func refusedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return "http://" + addr
}

// A request to a node that refuses the connection goes, body and all, to
// the next node, which is used from then on; the dead node is reported
// once however many requests find it down; an answer (even an error
// status) from a live node is returned as it is.
func TestFailoverSkipsUnreachableNodes(t *testing.T) {
	var bodies []string
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies = append(bodies, string(b))
		if r.URL.Path == "/missing" {
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer live.Close()
	dead := refusedURL(t)
	var logged bytes.Buffer
	f, err := NewFailover(nil, []string{dead, live.URL}, zerolog.New(&logged))
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: f}
	for i := range 5 {
		resp, err := hc.Post(dead+"/db/_bulk_docs", "application/json", strings.NewReader(`{"n":1}`))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_ = resp.Body.Close()
	}
	if len(bodies) != 5 || bodies[0] != `{"n":1}` {
		t.Fatalf("bodies at the live node: %q", bodies)
	}
	if f.Node() != live.URL {
		t.Fatalf("node in use %s, want %s", f.Node(), live.URL)
	}
	if n := strings.Count(logged.String(), "CouchDB node unreachable"); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, logged.String())
	}
	resp, err := hc.Get(dead + "/missing")
	if err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a 404 from a live node: %v %v", resp, err)
	}
	_ = resp.Body.Close()

	// Every node down: the last connection error.
	f2, _ := NewFailover(nil, []string{dead, refusedURL(t)}, zerolog.Nop())
	if _, err := (&http.Client{Transport: f2}).Get(dead); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("all nodes down: %v", err)
	}
	if _, err := NewFailover(nil, []string{"ftp://x"}, zerolog.Nop()); err == nil {
		t.Fatal("a bad node URL was accepted")
	}
	if got := SplitNodeURLs(" http://a:1 , http://b:2,"); len(got) != 2 || got[1] != "http://b:2" {
		t.Fatalf("SplitNodeURLs: %q", got)
	}
}

// A node that takes the connection and never answers (a hung process):
// the request that timed out is not sent again, since it may have been
// applied, but the requests after it go to the next node.
func TestFailoverLeavesAHungNode(t *testing.T) {
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer hung.Close()
	defer close(release)
	var served atomic.Int32
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1) }))
	defer live.Close()
	var logged bytes.Buffer
	f, err := NewFailover(nil, []string{hung.URL, live.URL}, zerolog.New(&logged))
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: f}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hung.URL+"/db/_bulk_docs", strings.NewReader(`{"n":1}`))
	if _, err := hc.Do(req); err == nil {
		t.Fatal("a request to the hung node answered")
	}
	if served.Load() != 0 {
		t.Fatal("the request that timed out was sent again to the next node")
	}
	if f.Node() != live.URL {
		t.Fatalf("node in use %s, want %s", f.Node(), live.URL)
	}
	resp, err := hc.Get(hung.URL + "/db")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if served.Load() != 1 || !strings.Contains(logged.String(), "gave no answer in time") {
		t.Fatalf("the next request: served %d; log:\n%s", served.Load(), logged.String())
	}
}

// A node that stores writes on fewer copies than asked (202), as one cut
// off from the rest of its cluster does, is left after a few in a row; a
// lone 202 among 201s is not enough, and reads do not count.
func TestFailoverLeavesANodeInTheMinority(t *testing.T) {
	var minorityStatus atomic.Int32
	minorityStatus.Store(http.StatusAccepted)
	minority := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			return // a read: 200
		}
		w.WriteHeader(int(minorityStatus.Load()))
	}))
	defer minority.Close()
	var served, majorityStatus atomic.Int32
	majorityStatus.Store(http.StatusCreated)
	majority := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		w.WriteHeader(int(majorityStatus.Load()))
	}))
	defer majority.Close()
	var logged bytes.Buffer
	f, err := NewFailover(nil, []string{minority.URL, majority.URL}, zerolog.New(&logged))
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: f}
	do := func(method string) int {
		t.Helper()
		req, _ := http.NewRequest(method, minority.URL+"/db/job", strings.NewReader(`{}`))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	// 202, 201, 202, GET, 202: never three writes in a row.
	for _, step := range []int32{http.StatusAccepted, http.StatusCreated, http.StatusAccepted, 0, http.StatusAccepted} {
		if step == 0 {
			do(http.MethodGet)
			continue
		}
		minorityStatus.Store(step)
		do(http.MethodPut)
	}
	if f.Node() != minority.URL {
		t.Fatalf("left the node after writes of 202 that were not in a row")
	}
	do(http.MethodPut) // the third 202 in a row (the GET did not count)
	if f.Node() != majority.URL || !strings.Contains(logged.String(), "may be cut off from the rest of its cluster") {
		t.Fatalf("node in use %s after three 202s in a row; log:\n%s", f.Node(), logged.String())
	}
	if code := do(http.MethodPut); code != http.StatusCreated || served.Load() != 1 {
		t.Errorf("the next write: %d, served by the majority node %d times", code, served.Load())
	}
	// With no majority anywhere (two nodes of three down) every node
	// answers 202: a node left within the minute is kept, not left again
	// at every third write.
	majorityStatus.Store(http.StatusAccepted)
	minorityStatus.Store(http.StatusAccepted)
	for range 3 {
		do(http.MethodPut)
	}
	if f.Node() != minority.URL {
		t.Fatalf("node in use %s after three 202s from the other node", f.Node())
	}
	for range 6 {
		do(http.MethodPut)
	}
	if f.Node() != minority.URL {
		t.Errorf("left again within the minute the node it had left for its 202s: now %s", f.Node())
	}
}

// One URL with a trailing comma is one node; a URL is shown as given
// unless it carries a password to hide.
func TestOneNodeURLsAndRedact(t *testing.T) {
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer live.Close()
	base, _, err := failoverClient(live.URL+",", NewHTTPClient(), zerolog.Nop())
	if err != nil || base != live.URL {
		t.Fatalf("failoverClient of %q: %q, %v", live.URL+",", base, err)
	}
	for raw, want := range map[string]string{
		"not a url":                  "not a url",
		"http://admin:s3cret@h:5984": "http://admin:xxxxx@h:5984",
		"http://h:5984/a b":          "http://h:5984/a b",
	} {
		if got := Redact(raw); got != want {
			t.Errorf("Redact(%q) = %q, want %q", raw, got, want)
		}
	}
}
