package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

const (
	// maxErrorBody bounds the response body quoted in a StatusError.
	maxErrorBody = 512
	// maxDrain bounds how much of a response body is read and thrown away
	// so that the connection can be reused; bigger bodies just close it.
	maxDrain = 64 << 10
)

// NewHTTPClient returns a new client for http-check and webhook: its own
// transport (no state shared with http.DefaultClient), bounded dialing and
// TLS handshakes, and no overall Client.Timeout, because every request
// these handlers send carries its own deadline (the payload's "timeout" or
// the handler's default) and a client-wide one would silently cap it.
func NewHTTPClient() *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Client{
		Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           dialer.DialContext,
			ForceAttemptHTTP2:     true,
			MaxIdleConns:          100,
			MaxIdleConnsPerHost:   10,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
		},
	}
}

// clientOrNew returns c, or when c is nil a new client from NewHTTPClient,
// with a func to call when done with it that closes the new client's idle
// connections (nothing else would ever reuse them).
func clientOrNew(c *http.Client) (*http.Client, func()) {
	if c != nil {
		return c, func() {}
	}
	c = NewHTTPClient()
	return c, c.CloseIdleConnections
}

// StatusError is the error http-check and webhook return when the server
// answers with a status they count as failure. It fails the attempt (the
// job is retried), it does not fail the job.
type StatusError struct {
	// Method and URL are those of the request that got the response (after
	// any redirects), with any password in the URL redacted.
	Method, URL string
	// StatusCode is the response's status code, Status its status line.
	StatusCode int
	Status     string
	// Body is the start of the response body, at most 512 bytes.
	Body string
	// retryAfter is the wait a 429 or 503 asked for in Retry-After.
	retryAfter time.Duration
}

// RetryAfter is how long a 429 or 503 response asked the client to wait in
// its Retry-After header (seconds or an HTTP date), 0 when it did not. A
// worker does not retry the job before then (worker.Config.Retry).
func (e *StatusError) RetryAfter() time.Duration { return e.retryAfter }

// parseRetryAfter reads a Retry-After header (RFC 9110 10.2.3): a number
// of seconds or an HTTP date. Anything else, or a date past, is no wait.
func parseRetryAfter(value string, now time.Time) time.Duration {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0
	}
	if secs, err := strconv.ParseUint(value, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		// A wait of more than 30 years is taken as 30 years (a worker
		// waits a day at most), not multiplied past what a Duration holds.
		return time.Duration(min(secs, 30*365*24*3600)) * time.Second
	}
	if at, err := http.ParseTime(value); err == nil && at.After(now) {
		return at.Sub(now)
	}
	return 0
}

func (e *StatusError) Error() string {
	msg := fmt.Sprintf("%s %s: status %s", e.Method, e.URL, e.Status)
	if e.Body != "" {
		msg += fmt.Sprintf(": body %q", e.Body)
	}
	return msg
}

// payloadDuration decodes a payload "timeout": a Go duration string ("5s",
// "1m30s") or a number of seconds (5, 0.5, also "5").
type payloadDuration time.Duration

func (d *payloadDuration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	var dur time.Duration
	switch v := v.(type) {
	case float64:
		dur = secondsToDuration(v)
	case string:
		parsed, err := time.ParseDuration(v)
		if err != nil {
			secs, ferr := strconv.ParseFloat(v, 64)
			if ferr != nil {
				return fmt.Errorf("timeout %q is neither a duration like \"5s\" nor a number of seconds", v)
			}
			parsed = secondsToDuration(secs)
		}
		dur = parsed
	default:
		return fmt.Errorf("timeout %s is neither a duration string nor a number of seconds", b)
	}
	if dur <= 0 {
		return fmt.Errorf("timeout %s is not positive", b)
	}
	*d = payloadDuration(dur)
	return nil
}

func secondsToDuration(s float64) time.Duration {
	// Clamp instead of overflowing into a negative duration.
	if s >= float64(1<<63-1)/float64(time.Second) {
		return 1<<63 - 1
	}
	return time.Duration(s * float64(time.Second))
}

// timeoutOr returns the payload's timeout if it gave one, else def, else
// DefaultHTTPTimeout.
func timeoutOr(p payloadDuration, def time.Duration) time.Duration {
	switch {
	case p > 0:
		return time.Duration(p)
	case def > 0:
		return def
	default:
		return DefaultHTTPTimeout
	}
}

// parseTargetURL checks a payload URL. Its errors are permanent: no retry
// can fix the payload.
func parseTargetURL(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, errors.New(`payload has no "url"`)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("payload url: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("payload url %q: scheme must be http or https", u.Redacted())
	}
	if u.Host == "" {
		return nil, fmt.Errorf("payload url %q has no host", u.Redacted())
	}
	return u, nil
}

// response is what the handlers record of a response.
type response struct {
	status   int
	latency  time.Duration
	finalURL string
}

// roundTrip sends req, whose context carries the request deadline (ctx is
// the caller's, to tell the two apart), and reports the response. A status
// for which failed is true becomes a *StatusError quoting the start of the
// body. The body is always drained (bounded) and closed.
func roundTrip(ctx context.Context, client *http.Client, req *http.Request, timeout time.Duration, failed func(code int) bool) (response, error) {
	start := time.Now()
	resp, err := client.Do(req)
	latency := time.Since(start)
	if err != nil {
		// Say plainly when our own deadline, not the caller's context,
		// ended the request.
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return response{}, fmt.Errorf("timed out after %s: %w", timeout, err)
		}
		return response{}, err
	}
	defer resp.Body.Close()
	out := response{status: resp.StatusCode, latency: latency, finalURL: resp.Request.URL.Redacted()}
	if failed(resp.StatusCode) {
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
		failure := &StatusError{
			Method:     resp.Request.Method,
			URL:        out.finalURL,
			StatusCode: resp.StatusCode,
			Status:     statusLine(resp),
			Body:       strings.ToValidUTF8(string(bytes.TrimSpace(snippet)), "\uFFFD"),
		}
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
			failure.retryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
		}
		return out, failure
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
	return out, nil
}

func statusLine(resp *http.Response) string {
	if resp.Status != "" {
		return resp.Status
	}
	return fmt.Sprintf("%d %s", resp.StatusCode, http.StatusText(resp.StatusCode))
}

// milliseconds renders d as fractional milliseconds (microsecond precision),
// so fast local endpoints do not all read 0.
func milliseconds(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1000
}
