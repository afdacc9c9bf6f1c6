package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/couchq/couchq/worker"
)

// Headers the webhook handler adds to every request so that receivers can
// recognise deliveries of the same job (and retries of it).
const (
	HeaderJobID   = "X-Couchq-Job-Id"
	HeaderAttempt = "X-Couchq-Attempt"
)

// Webhook is the webhook handler: it POSTs JSON to the payload's URL and
// succeeds on a 2xx response.
//
// Payload:
//
//	{"url": "https://example.com/hook", "body": {...},
//	 "headers": {"Authorization": "Bearer ..."}, "timeout": "5s"}
//
// "body" is sent as it is (any JSON value); without it the whole payload is
// sent. "headers" (string to string) and "timeout" (a Go duration string or
// a number of seconds) are optional. Content-Type is application/json
// unless "headers" sets it. X-Couchq-Job-Id and X-Couchq-Attempt are always
// set (they override the payload's) so that receivers can deduplicate.
//
// Redirects are not followed: a webhook POST turned into a GET by a 302 is
// not a delivery, so a 3xx fails the attempt like any other non-2xx status.
//
// Result: {"url", "status", "latency_ms"}.
//
// Any non-2xx status (a *StatusError quoting the start of the response
// body) or network error fails the attempt, so the job is retried with
// backoff. A bad payload (no URL, non-http(s) URL, headers that are not
// strings or not valid in HTTP, bad timeout) fails the job at once
// (worker.JobFail).
type Webhook struct {
	// Client sends the request; nil means a client from NewHTTPClient.
	// Its CheckRedirect is ignored (see above).
	Client *http.Client
	// Timeout bounds the request when the payload has no "timeout"; 0
	// means DefaultHTTPTimeout.
	Timeout time.Duration
}

type webhookPayload struct {
	URL     string            `json:"url"`
	Body    json.RawMessage   `json:"body"`
	Headers map[string]string `json:"headers"`
	Timeout payloadDuration   `json:"timeout"`
}

// WebhookResult is the result a webhook job records.
type WebhookResult struct {
	URL       string  `json:"url"`
	Status    int     `json:"status"`
	LatencyMS float64 `json:"latency_ms"`
}

// Handle runs one webhook delivery attempt.
func (h *Webhook) Handle(ctx context.Context, job *worker.Job) error {
	p, err := worker.DecodePayload[webhookPayload](job.Payload)
	if err != nil {
		return worker.JobFail(fmt.Errorf("webhook: %w", err))
	}
	target, err := parseTargetURL(p.URL)
	if err != nil {
		return worker.JobFail(fmt.Errorf("webhook: %w", err))
	}
	// A present "body" (even null) is sent as given; the decoder leaves
	// Body nil only when the key is absent.
	body := p.Body
	if body == nil {
		body = job.Payload
	}
	timeout := timeoutOr(p.Timeout, h.Timeout)
	reqCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, target.String(), bytes.NewReader(body))
	if err != nil {
		return worker.JobFail(fmt.Errorf("webhook: building request for %s: %w", target.Redacted(), err))
	}
	for name, value := range p.Headers {
		if err := checkHeader(name, value); err != nil {
			return worker.JobFail(fmt.Errorf("webhook: payload headers: %w", err))
		}
		if strings.EqualFold(name, "Host") {
			// net/http sends req.Host, never a Host entry in req.Header.
			req.Host = value
			continue
		}
		req.Header.Set(name, value)
	}
	if req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set(HeaderJobID, job.ID)
	req.Header.Set(HeaderAttempt, strconv.Itoa(job.Attempt))

	base, done := clientOrNew(h.Client)
	defer done()
	client := *base
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := roundTrip(ctx, &client, req, timeout, func(code int) bool { return code < 200 || code > 299 })
	if err != nil {
		return fmt.Errorf("webhook: %w", err)
	}
	return job.SetResult(WebhookResult{
		URL:       target.Redacted(),
		Status:    resp.status,
		LatencyMS: milliseconds(resp.latency),
	})
}

// checkHeader rejects what net/http would refuse to send, so that a bad
// payload fails the job once instead of failing every retry.
func checkHeader(name, value string) error {
	if name == "" {
		return errors.New("empty header name")
	}
	for i := 0; i < len(name); i++ {
		if !isTokenByte(name[i]) {
			return fmt.Errorf("header name %q is not a valid HTTP token", name)
		}
	}
	for i := 0; i < len(value); i++ {
		if c := value[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return fmt.Errorf("header %s: value contains a control character", name)
		}
	}
	return nil
}

// isTokenByte reports whether c may appear in an HTTP token (RFC 9110 5.6.2).
func isTokenByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
