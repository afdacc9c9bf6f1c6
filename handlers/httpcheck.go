package handlers

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/couchq/couchq/worker"
)

// HTTPCheck is the http-check handler: it GETs the payload's URL and
// succeeds when the final response (after redirects) is not a 4xx or 5xx.
//
// Payload:
//
//	{"url": "https://example.com/health", "timeout": "5s"}
//
// "timeout" is optional: a Go duration string or a number of seconds.
//
// Result: {"url", "final_url", "status", "latency_ms"}, where latency_ms is
// the time until the response headers arrived.
//
// A 4xx/5xx status (a *StatusError) or a network error fails the attempt,
// so the job is retried with backoff. A missing or non-http(s) URL or a bad
// timeout fails the job at once (worker.JobFail).
type HTTPCheck struct {
	// Client sends the request; nil means a client from NewHTTPClient.
	// Redirects are followed as the client's CheckRedirect says.
	Client *http.Client
	// Timeout bounds the request when the payload has no "timeout"; 0
	// means DefaultHTTPTimeout.
	Timeout time.Duration
}

type httpCheckPayload struct {
	URL     string          `json:"url"`
	Timeout payloadDuration `json:"timeout"`
}

// HTTPCheckResult is the result an http-check job records.
type HTTPCheckResult struct {
	URL       string  `json:"url"`
	FinalURL  string  `json:"final_url"`
	Status    int     `json:"status"`
	LatencyMS float64 `json:"latency_ms"`
}

// Handle runs one http-check attempt.
func (h *HTTPCheck) Handle(ctx context.Context, job *worker.Job) error {
	p, err := worker.DecodePayload[httpCheckPayload](job.Payload)
	if err != nil {
		return worker.JobFail(fmt.Errorf("http-check: %w", err))
	}
	target, err := parseTargetURL(p.URL)
	if err != nil {
		return worker.JobFail(fmt.Errorf("http-check: %w", err))
	}
	timeout := timeoutOr(p.Timeout, h.Timeout)
	reqCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(reqCtx, http.MethodGet, target.String(), nil)
	if err != nil {
		return worker.JobFail(fmt.Errorf("http-check: building request for %s: %w", target.Redacted(), err))
	}
	client, done := clientOrNew(h.Client)
	defer done()
	resp, err := roundTrip(ctx, client, req, timeout, func(code int) bool { return code >= 400 })
	if err != nil {
		return fmt.Errorf("http-check: %w", err)
	}
	return job.SetResult(HTTPCheckResult{
		URL:       target.Redacted(),
		FinalURL:  resp.finalURL,
		Status:    resp.status,
		LatencyMS: milliseconds(resp.latency),
	})
}
