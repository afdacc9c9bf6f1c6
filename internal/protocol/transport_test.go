package protocol

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	kivik "github.com/go-kivik/kivik/v4"
)

// refuseFromHeaders serves like CouchDB 3.5 answering a user who is not a
// member of the database: 403 with "Connection: close" as soon as the
// headers are read, then the connection closed without reading the body.
// (A server that closes without "Connection: close" would make any client
// race to reuse the connection.)
func refuseFromHeaders(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = conn.Close() }()
				r := bufio.NewReader(conn)
				for {
					line, err := r.ReadString('\n')
					if err != nil || line == "\r\n" {
						break
					}
				}
				const body = `{"error":"forbidden","reason":"You are not allowed to access this db."}`
				_, _ = io.WriteString(conn, "HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: "+
					itoa(len(body))+"\r\n\r\n"+body)
				// Close a moment later, as CouchDB does: by then a body the
				// client sent regardless sits unread, the close resets the
				// connection and the client loses the 403 it had not read.
				time.Sleep(50 * time.Millisecond)
			}()
		}
	}()
	return "http://" + l.Addr().String()
}

func itoa(n int) string {
	var b []byte
	for {
		b = append([]byte{byte('0' + n%10)}, b...)
		if n /= 10; n == 0 {
			return string(b)
		}
	}
}

// A document refused from the headers alone comes back as the server's
// 403, not as a broken pipe, however large: the body waits for the
// server's consent.
func TestRefusalBeforeBodyIsReported(t *testing.T) {
	url := refuseFromHeaders(t)
	client, err := Dial(url, "", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{100, expectContinueAbove + 1, 4 << 20} {
		doc := map[string]any{"type": "WorkItem", "worker": "mail", "args": strings.Repeat("x", size)}
		_, err := client.DB("q").Put(context.Background(), "job:1", doc)
		if kivik.HTTPStatus(err) != http.StatusForbidden {
			t.Errorf("%d-byte document: %v (HTTP %d), want 403", size, err, kivik.HTTPStatus(err))
		}
	}
}

// Bodies go with their length, not chunked, and arrive whole.
func TestBodiesSentWhole(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.Store([]any{r.ContentLength, r.TransferEncoding, len(b)})
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true,"id":"job:1","rev":"1-a"}`)
	}))
	defer srv.Close()
	client, err := Dial(srv.URL, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.DB("q").Put(context.Background(), "job:1", map[string]any{"args": strings.Repeat("y", 1000)}); err != nil {
		t.Fatal(err)
	}
	g := got.Load().([]any)
	if n := g[0].(int64); n <= 1000 || int(n) != g[2].(int) || len(g[1].([]string)) != 0 {
		t.Errorf("content length %v, transfer encoding %v, %v bytes read", g[0], g[1], g[2])
	}
}

// stubTransport answers with errs in turn, then 200.
type stubTransport struct {
	errs  []error
	calls int
	seen  []string
}

func (s *stubTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	b, _ := io.ReadAll(req.Body)
	s.seen = append(s.seen, string(b))
	s.calls++
	if len(s.errs) > 0 {
		err := s.errs[0]
		s.errs = s.errs[1:]
		return nil, err
	}
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
}

// A request whose writing failed is sent once more, body and all; one
// that failed otherwise (the server may have acted on it) is not.
func TestUnsentRequestSentAgain(t *testing.T) {
	writeErr := &net.OpError{Op: "write", Net: "tcp", Err: errors.New("broken pipe")}
	readErr := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}
	for _, tc := range []struct {
		name  string
		errs  []error
		calls int
		ok    bool
	}{
		{"write fails once", []error{writeErr}, 2, true},
		{"write fails twice", []error{writeErr, writeErr}, 2, false},
		{"read fails", []error{readErr}, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stub := &stubTransport{errs: tc.errs}
			req, _ := http.NewRequest(http.MethodPut, "http://couch/q/job:1", strings.NewReader(`{"n":1}`))
			resp, err := wholeBody{next: stub}.RoundTrip(req)
			if (err == nil) != tc.ok || stub.calls != tc.calls {
				t.Fatalf("err %v after %d calls, want ok=%v after %d", err, stub.calls, tc.ok, tc.calls)
			}
			if resp != nil {
				_ = resp.Body.Close()
			}
			for _, b := range stub.seen {
				if b != `{"n":1}` {
					t.Errorf("body sent %q", b)
				}
			}
		})
	}
}
