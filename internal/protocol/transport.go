package protocol

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/rs/zerolog"
)

// expectContinueAbove is the body size from which a request asks the server
// to accept it (Expect: 100-continue) before the body is sent. Below it
// the body goes out with the headers, in one write, and an extra round
// trip per document would cost more than it saves.
const expectContinueAbove = 16 << 10

// wholeBody is the transport under every couchq client. kivik's driver
// streams request bodies in chunks, so the headers can reach CouchDB
// before the body does; CouchDB refuses some requests from the headers
// alone (a user who is no longer a member of the database gets 403) and
// closes the connection without reading the rest, and the client, still
// writing, sees only "broken pipe" instead of the answer. wholeBody sends
// each body with its length, together with the headers; a large body
// waits for the server's 100 Continue, so a refusal arrives before it. A
// request whose writing still fails was not read whole, so the server
// cannot have acted on it: it is sent once more.
type wholeBody struct{ next http.RoundTripper }

// RoundTrip implements http.RoundTripper.
func (w wholeBody) RoundTrip(req *http.Request) (*http.Response, error) {
	body, err := readBody(req)
	if err != nil {
		return nil, err
	}
	send := func() (*http.Response, error) {
		r := req.Clone(req.Context())
		setBody(r, body)
		if len(body) > expectContinueAbove {
			r.Header.Set("Expect", "100-continue")
		}
		return w.next.RoundTrip(r)
	}
	resp, err := send()
	if err != nil && unsent(err) && req.Context().Err() == nil {
		return send()
	}
	return resp, err
}

// readBody reads a request's body once, so the request can be sent whole
// and sent again; nil when it has none.
func readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	b, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("reading request body: %w", err)
	}
	return b, nil
}

// setBody gives r (a clone) body with its length, replayable.
func setBody(r *http.Request, body []byte) {
	if body == nil {
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil
}

// unsent reports whether writing a request failed, so the server did not
// read all of it.
func unsent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "write"
}

// couchHTTPClient returns the HTTP client a couchq client talks through:
// a copy of hc whose transport fails over between the nodes of a list (see
// failoverClient) and sends bodies whole; and the URL to use.
func couchHTTPClient(rawURL string, hc *http.Client, log zerolog.Logger) (string, *http.Client, error) {
	if _, ok := hc.Transport.(wholeBody); ok {
		if nodes := SplitNodeURLs(rawURL); len(nodes) > 1 {
			return nodes[0], hc, nil
		}
		return rawURL, hc, nil
	}
	rawURL, hc, err := failoverClient(rawURL, hc, log)
	if err != nil {
		return "", nil, err
	}
	next := hc.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	copied := *hc
	copied.Transport = wholeBody{next: next}
	return rawURL, &copied, nil
}
