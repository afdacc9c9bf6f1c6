package handlers_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchq/couchq/handlers"
)

// recorded is what a test server saw of one request.
type recorded struct {
	method string
	header http.Header
	host   string
	body   string
}

func recordingServer(t *testing.T, status int, reply string) (*httptest.Server, <-chan recorded) {
	t.Helper()
	seen := make(chan recorded, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("reading request body: %v", err)
		}
		seen <- recorded{method: r.Method, header: r.Header.Clone(), host: r.Host, body: string(body)}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, reply)
	}))
	t.Cleanup(srv.Close)
	return srv, seen
}

func TestWebhookPostsBodyAndHeaders(t *testing.T) {
	srv, seen := recordingServer(t, http.StatusAccepted, "")
	h := &handlers.Webhook{Client: srv.Client()}
	job := newJob(t, `{"url":"`+srv.URL+`/hook","body":{"event":"paid","amount":12},
		"headers":{"Authorization":"Bearer t0k","x-custom":"yes","X-Couchq-Job-Id":"spoofed"}}`)
	if err := h.Handle(context.Background(), job); err != nil {
		t.Fatalf("Handle: %v", err)
	}

	req := <-seen
	if req.method != http.MethodPost {
		t.Errorf("method = %s, want POST", req.method)
	}
	if req.body != `{"event":"paid","amount":12}` {
		t.Errorf("body = %s", req.body)
	}
	for name, want := range map[string]string{
		"Content-Type":     "application/json",
		"Authorization":    "Bearer t0k",
		"X-Custom":         "yes",
		"X-Couchq-Job-Id":  job.ID,
		"X-Couchq-Attempt": "2",
	} {
		if got := req.header.Get(name); got != want {
			t.Errorf("header %s = %q, want %q", name, got, want)
		}
	}
	res := decodeResult[handlers.WebhookResult](t, job)
	if res.Status != http.StatusAccepted || res.URL != srv.URL+"/hook" || res.LatencyMS < 0 {
		t.Fatalf("result = %+v", res)
	}
}

func TestWebhookSendsWholePayloadWithoutBody(t *testing.T) {
	srv, seen := recordingServer(t, http.StatusOK, "")
	payload := `{"url":"` + srv.URL + `","order":7}`
	if err := (&handlers.Webhook{Client: srv.Client()}).Handle(context.Background(), newJob(t, payload)); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if got := (<-seen).body; got != payload {
		t.Fatalf("body = %s, want the whole payload %s", got, payload)
	}
}

func TestWebhookKeepsGivenContentTypeAndHost(t *testing.T) {
	srv, seen := recordingServer(t, http.StatusNoContent, "")
	payload := `{"url":"` + srv.URL + `","body":"a=1","headers":{"content-type":"text/plain","Host":"hooks.example"}}`
	if err := (&handlers.Webhook{Client: srv.Client()}).Handle(context.Background(), newJob(t, payload)); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	req := <-seen
	if got := req.header.Get("Content-Type"); got != "text/plain" {
		t.Errorf("Content-Type = %q, want text/plain", got)
	}
	if req.host != "hooks.example" {
		t.Errorf("Host = %q, want hooks.example", req.host)
	}
	if req.body != `"a=1"` {
		t.Errorf("body = %s", req.body)
	}
}

func TestWebhookServerErrorFailsAttempt(t *testing.T) {
	srv, _ := recordingServer(t, http.StatusInternalServerError, "database on fire\n"+strings.Repeat("x", 10000))
	err := (&handlers.Webhook{Client: srv.Client()}).Handle(context.Background(), newJob(t, `{"url":"`+srv.URL+`"}`))
	var se *handlers.StatusError
	if !errors.As(err, &se) || se.StatusCode != 500 {
		t.Fatalf("err = %v, want a StatusError with code 500", err)
	}
	if isPermanent(err) {
		t.Fatalf("err %v is permanent, want a retryable failure", err)
	}
	if !strings.Contains(err.Error(), "500") || !strings.Contains(err.Error(), "database on fire") {
		t.Fatalf("error %q lacks the status or the body snippet", err)
	}
	if len(se.Body) > 512 || len(err.Error()) > 1024 {
		t.Fatalf("body snippet not bounded: %d bytes, error %d bytes", len(se.Body), len(err.Error()))
	}
}

func TestWebhookNon2xxFailsAttempt(t *testing.T) {
	for _, code := range []int{http.StatusTooManyRequests, http.StatusBadRequest, http.StatusFound} {
		srv, _ := recordingServer(t, code, "")
		err := (&handlers.Webhook{Client: srv.Client()}).Handle(context.Background(), newJob(t, `{"url":"`+srv.URL+`"}`))
		var se *handlers.StatusError
		if !errors.As(err, &se) || se.StatusCode != code {
			t.Fatalf("status %d: err = %v, want a StatusError with that code", code, err)
		}
		if isPermanent(err) {
			t.Fatalf("status %d: err %v is permanent", code, err)
		}
	}
}

// A 429 or 503 that says when to come back (seconds or an HTTP date) is
// not retried sooner; another status, or a header that says nothing
// usable, leaves the worker's backoff alone.
func TestWebhookReportsRetryAfter(t *testing.T) {
	in90s := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	for _, c := range []struct {
		code   int
		header string
		least  time.Duration
		most   time.Duration
	}{
		{http.StatusTooManyRequests, "120", 120 * time.Second, 120 * time.Second},
		{http.StatusServiceUnavailable, " 7 ", 7 * time.Second, 7 * time.Second},
		{http.StatusServiceUnavailable, in90s, 85 * time.Second, 90 * time.Second},
		{http.StatusServiceUnavailable, "Wed, 21 Oct 2015 07:28:00 GMT", 0, 0}, // past
		{http.StatusTooManyRequests, "soon", 0, 0},
		{http.StatusTooManyRequests, "-5", 0, 0},
		{http.StatusTooManyRequests, "99999999999999999999", 30 * 365 * 24 * time.Hour, 30 * 365 * 24 * time.Hour},
		{http.StatusTooManyRequests, "", 0, 0},
		{http.StatusInternalServerError, "120", 0, 0},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if c.header != "" {
				w.Header().Set("Retry-After", c.header)
			}
			w.WriteHeader(c.code)
		}))
		err := (&handlers.Webhook{Client: srv.Client()}).Handle(context.Background(), newJob(t, `{"url":"`+srv.URL+`"}`))
		srv.Close()
		var se *handlers.StatusError
		if !errors.As(err, &se) || se.StatusCode != c.code {
			t.Fatalf("%d %q: err = %v, want a StatusError with that code", c.code, c.header, err)
		}
		if got := se.RetryAfter(); got < c.least || got > c.most {
			t.Errorf("%d with Retry-After %q: RetryAfter() = %s, want %s to %s", c.code, c.header, got, c.least, c.most)
		}
	}
}

func TestWebhookDoesNotFollowRedirects(t *testing.T) {
	var followed atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("/hook", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/elsewhere", http.StatusFound)
	})
	mux.HandleFunc("/elsewhere", func(w http.ResponseWriter, r *http.Request) { followed.Store(true) })
	srv := httptest.NewServer(mux)
	defer srv.Close()

	err := (&handlers.Webhook{Client: srv.Client()}).Handle(context.Background(), newJob(t, `{"url":"`+srv.URL+`/hook"}`))
	var se *handlers.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusFound {
		t.Fatalf("err = %v, want a StatusError with code 302", err)
	}
	if followed.Load() {
		t.Fatal("the redirect was followed")
	}
}

func TestWebhookBadPayloadIsPermanent(t *testing.T) {
	for _, payload := range []string{
		``,
		`[]`,
		`{"body":{}}`,
		`{"url":"mailto:a@example.com"}`,
		`{"url":"http://example.com","headers":{"X-N":1}}`,
		`{"url":"http://example.com","headers":["a"]}`,
		`{"url":"http://example.com","headers":{"Bad Name":"v"}}`,
		`{"url":"http://example.com","headers":{"X-A":"v\r\nX-Injected: 1"}}`,
		`{"url":"http://example.com","timeout":"-5s"}`,
	} {
		err := (&handlers.Webhook{}).Handle(context.Background(), newJob(t, payload))
		if !isPermanent(err) {
			t.Errorf("payload %s: err = %v, want a permanent failure", payload, err)
		}
	}
}

func TestWebhookNullBodyIsSent(t *testing.T) {
	srv, seen := recordingServer(t, http.StatusOK, "")
	if err := (&handlers.Webhook{Client: srv.Client()}).Handle(context.Background(), newJob(t, `{"url":"`+srv.URL+`","body":null}`)); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if got := (<-seen).body; got != "null" {
		t.Fatalf("body = %q, want null", got)
	}
}
