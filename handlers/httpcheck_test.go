package handlers_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/handlers"
)

func TestHTTPCheckOK(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			t.Errorf("method = %s, want GET", r.Method)
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()

	h := &handlers.HTTPCheck{Client: srv.Client()}
	job := newJob(t, `{"url":"`+srv.URL+`/health"}`)
	if err := h.Handle(context.Background(), job); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	res := decodeResult[handlers.HTTPCheckResult](t, job)
	if res.Status != 200 || res.URL != srv.URL+"/health" || res.FinalURL != srv.URL+"/health" || res.LatencyMS < 0 {
		t.Fatalf("result = %+v", res)
	}
}

func TestHTTPCheckRecordsFinalURL(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("/old", http.RedirectHandler("/new", http.StatusFound))
	mux.HandleFunc("/new", func(w http.ResponseWriter, r *http.Request) {})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	h := &handlers.HTTPCheck{Client: srv.Client()}
	job := newJob(t, `{"url":"`+srv.URL+`/old"}`)
	if err := h.Handle(context.Background(), job); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	res := decodeResult[handlers.HTTPCheckResult](t, job)
	if res.Status != 200 || res.URL != srv.URL+"/old" || res.FinalURL != srv.URL+"/new" {
		t.Fatalf("result = %+v", res)
	}
}

func TestHTTPCheckErrorStatusFailsAttempt(t *testing.T) {
	for _, code := range []int{404, 503} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "nope", code)
		}))
		h := &handlers.HTTPCheck{Client: srv.Client()}
		err := h.Handle(context.Background(), newJob(t, `{"url":"`+srv.URL+`"}`))
		srv.Close()

		var se *handlers.StatusError
		if !errors.As(err, &se) || se.StatusCode != code {
			t.Fatalf("status %d: err = %v, want a StatusError with that code", code, err)
		}
		if isPermanent(err) {
			t.Fatalf("status %d: err %v is permanent, want a retryable failure", code, err)
		}
		if !strings.Contains(err.Error(), http.StatusText(code)) {
			t.Fatalf("status %d: error %q does not say the status", code, err)
		}
	}
}

func TestHTTPCheckConnectionRefusedFailsAttempt(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there any more

	err := (&handlers.HTTPCheck{}).Handle(context.Background(), newJob(t, `{"url":"`+url+`"}`))
	if err == nil {
		t.Fatal("Handle succeeded against a closed port")
	}
	if isPermanent(err) {
		t.Fatalf("err %v is permanent, want a retryable failure", err)
	}
	if !strings.Contains(err.Error(), "refused") {
		t.Fatalf("error %q does not give the cause", err)
	}
}

func TestHTTPCheckTimeoutFromPayload(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	defer srv.Close()

	for _, timeout := range []string{`"50ms"`, `0.05`, `"0.05"`} {
		h := &handlers.HTTPCheck{Client: srv.Client(), Timeout: time.Minute}
		start := time.Now()
		err := h.Handle(context.Background(), newJob(t, `{"url":"`+srv.URL+`","timeout":`+timeout+`}`))
		if err == nil || !strings.Contains(err.Error(), "timed out after 50ms") {
			t.Fatalf("timeout %s: err = %v, want a 'timed out after 50ms' error", timeout, err)
		}
		if isPermanent(err) {
			t.Fatalf("timeout %s: a timeout is permanent: %v", timeout, err)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("timeout %s: took %s", timeout, d)
		}
	}
}

func TestHTTPCheckDefaultTimeout(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	defer srv.Close()

	h, err := handlers.New("http-check", handlers.Options{HTTPTimeout: 50 * time.Millisecond, Client: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	err = h.Handle(context.Background(), newJob(t, `{"url":"`+srv.URL+`"}`))
	if err == nil || !strings.Contains(err.Error(), "timed out after 50ms") {
		t.Fatalf("err = %v, want a 'timed out after 50ms' error", err)
	}
}

func TestHTTPCheckBadPayloadIsPermanent(t *testing.T) {
	for _, payload := range []string{
		``,
		`{}`,
		`"http://example.com"`,
		`{"url":"ftp://example.com/file"}`,
		`{"url":"example.com"}`,
		`{"url":"http://"}`,
		`{"url":"http://exa mple.com/"}`,
		`{"url":"http://example.com","timeout":"soon"}`,
		`{"url":"http://example.com","timeout":-1}`,
		`{"url":"http://example.com","timeout":true}`,
	} {
		err := (&handlers.HTTPCheck{}).Handle(context.Background(), newJob(t, payload))
		if !isPermanent(err) {
			t.Errorf("payload %s: err = %v, want a permanent failure", payload, err)
		}
	}
}

func TestHTTPCheckRedactsPassword(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "denied", http.StatusForbidden)
	}))
	defer srv.Close()

	url := strings.Replace(srv.URL, "http://", "http://user:s3cret@", 1)
	err := (&handlers.HTTPCheck{Client: srv.Client()}).Handle(context.Background(), newJob(t, `{"url":"`+url+`"}`))
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("err = %v, want an error without the password", err)
	}
}
