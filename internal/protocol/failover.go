package protocol

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// FailoverWarnEveryDefault is how often Failover reports a node it cannot
// reach: once a minute per node, however many requests find it down.
const FailoverWarnEveryDefault = time.Minute

// Failover is an http.RoundTripper for a CouchDB cluster reached through
// several nodes: every request goes to the node in use, and when that node
// cannot be reached (the connection is refused or times out, so the
// request never arrived) the same request goes to the next node, which is
// used from then on. Any node of a cluster serves every database, so the
// queue goes on while a node is down.
//
// Dial and Connect use one when given a comma-separated list of node URLs.
type Failover struct {
	next      http.RoundTripper
	nodes     []*url.URL
	log       zerolog.Logger
	warnEvery time.Duration

	mu     sync.Mutex
	cur    int
	warned map[int]time.Time
	// accepted counts the writes in a row the node in use answered 202:
	// stored on fewer copies than asked (minorityWrites).
	accepted int
	// leftMinority is when requests last left each node for its 202s: a
	// node left again within warnEvery is kept (the others are no better,
	// as with two nodes of three down), not left at every third write.
	leftMinority map[int]time.Time
}

// minorityWrites is how many writes in a row answered 202 Accepted make
// Failover move to the next node. A node cut off from the rest of its
// cluster still answers, and stores every write on its own copies only:
// requests that stayed there would run nothing for as long as the cut
// lasts, while the majority side could. One 202 alone is no sign of that:
// a write can find a copy that has not yet taken the document it changes.
const minorityWrites = 3

// NewFailover returns a Failover over next (nil: http.DefaultTransport) for
// the given node URLs (credentials in them are ignored: the client sends
// its own). log receives at most one warning a minute per unreachable node.
func NewFailover(next http.RoundTripper, nodeURLs []string, log zerolog.Logger) (*Failover, error) {
	if next == nil {
		next = http.DefaultTransport
	}
	if len(nodeURLs) == 0 {
		return nil, errors.New("failover: no node URLs")
	}
	f := &Failover{next: next, log: log, warnEvery: FailoverWarnEveryDefault, warned: map[int]time.Time{}, leftMinority: map[int]time.Time{}}
	for _, raw := range nodeURLs {
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("invalid CouchDB node URL %q: want http(s)://host:port", Redact(raw))
		}
		f.nodes = append(f.nodes, &url.URL{Scheme: u.Scheme, Host: u.Host})
	}
	return f, nil
}

// SplitNodeURLs splits a comma-separated list of node URLs; a single URL
// is a list of one.
func SplitNodeURLs(raw string) []string {
	var out []string
	for _, s := range strings.Split(raw, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Node returns the URL of the node requests go to now.
func (f *Failover) Node() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nodes[f.cur].String()
}

// RoundTrip implements http.RoundTripper.
func (f *Failover) RoundTrip(req *http.Request) (*http.Response, error) {
	body, err := readBody(req)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	start := f.cur
	f.mu.Unlock()
	var lastErr error
	for k := range f.nodes {
		i := (start + k) % len(f.nodes)
		r := req.Clone(req.Context())
		r.URL.Scheme, r.URL.Host, r.Host = f.nodes[i].Scheme, f.nodes[i].Host, ""
		setBody(r, body)
		resp, err := f.next.RoundTrip(r)
		if err == nil {
			if k > 0 {
				f.use(i)
			}
			f.noteWrite(i, resp.StatusCode)
			return resp, nil
		}
		if errors.Is(req.Context().Err(), context.DeadlineExceeded) && len(f.nodes) > 1 {
			// The node took the connection but gave no answer in time: a
			// hung node (a stopped process still accepts connections).
			// The request may have been applied there, so it is not sent
			// again; the requests after it go to the next node.
			f.warnHung(i, err)
			f.use((i + 1) % len(f.nodes))
			return nil, err
		}
		if !unreached(err) || req.Context().Err() != nil {
			return nil, err
		}
		f.warn(i, err)
		lastErr = err
	}
	return nil, lastErr
}

// unreached reports whether a request failed before reaching the server
// (so resending it elsewhere cannot apply it twice).
func unreached(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// noteWrite counts node i's 202 answers in a row, and moves to the next
// node after minorityWrites of them (see minorityWrites). Other answers of
// a write (201) end the run; reads (200) leave it as it is.
func (f *Failover) noteWrite(i, status int) {
	if len(f.nodes) < 2 || (status != http.StatusAccepted && status != http.StatusCreated) {
		return
	}
	f.mu.Lock()
	if f.cur != i {
		f.mu.Unlock()
		return // an answer from a node already left
	}
	if status == http.StatusCreated {
		f.accepted = 0
		f.mu.Unlock()
		return
	}
	f.accepted++
	move := f.accepted >= minorityWrites
	if move {
		f.accepted = 0
		if last, ok := f.leftMinority[i]; ok && time.Since(last) < f.warnEvery {
			move = false // back here within the minute: the others are no better
		} else {
			f.leftMinority[i] = time.Now()
		}
	}
	f.mu.Unlock()
	if move {
		f.warnOnce(i, fmt.Errorf("%d writes in a row stored on fewer copies than asked (202 Accepted)", minorityWrites),
			"CouchDB node may be cut off from the rest of its cluster; the next requests go to the next node (reported at most once a minute per node)")
		f.use((i + 1) % len(f.nodes))
	}
}

func (f *Failover) use(i int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cur != i {
		f.log.Info().Str("node", f.nodes[i].String()).Msg("CouchDB requests now go to this node")
		f.cur = i
		f.accepted = 0
	}
}

func (f *Failover) warn(i int, err error) {
	f.warnOnce(i, err, "CouchDB node unreachable; trying the next (reported at most once a minute per node)")
}

func (f *Failover) warnHung(i int, err error) {
	f.warnOnce(i, err, "CouchDB node gave no answer in time (it hangs, or waits for a node of its cluster that hangs); the next requests go to the next node (reported at most once a minute per node)")
}

// warnOnce logs msg about node i at most once per warnEvery.
func (f *Failover) warnOnce(i int, err error, msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if last, ok := f.warned[i]; ok && now.Sub(last) < f.warnEvery {
		return
	}
	f.warned[i] = now
	f.log.Warn().Err(err).Str("node", f.nodes[i].String()).Int("nodes", len(f.nodes)).Msg(msg)
}

// failoverClient returns hc unchanged for one URL; for a list it returns a
// copy of hc whose transport fails over between the nodes (unless hc's
// already does), and the first URL, which carries any credentials.
func failoverClient(rawURL string, hc *http.Client, log zerolog.Logger) (string, *http.Client, error) {
	nodes := SplitNodeURLs(rawURL)
	switch len(nodes) {
	case 0:
		return rawURL, hc, nil
	case 1:
		return nodes[0], hc, nil // "URL," is one node
	}
	if _, ok := hc.Transport.(*Failover); ok {
		return nodes[0], hc, nil
	}
	f, err := NewFailover(hc.Transport, nodes, log)
	if err != nil {
		return "", nil, err
	}
	copied := *hc
	copied.Transport = f
	return nodes[0], &copied, nil
}
