package protocol

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/go-kivik/kivik/v4/couchdb/chttp"
	"github.com/rs/zerolog"
)

// Capabilities are what the server can do that couchq cares about.
type Capabilities struct {
	// Vendor is "couchdb" for Apache CouchDB, "pouchdb" for PouchDB Server,
	// else what the server's welcome said.
	Vendor  string
	Version string
	// SelectorFilter: the _changes feed takes filter=_selector, which
	// CouchDB evaluates natively instead of in a JavaScript process.
	SelectorFilter bool
}

// Server is a connection to a CouchDB server: the kivik client every call
// goes through, plus what the server can do.
type Server struct {
	Client *kivik.Client
	Caps   Capabilities
	// raw speaks to the same server with the same credentials, for the
	// requests kivik's API cannot make: a _changes long-poll whose _selector
	// filter travels in the request body, and _security with fields kivik
	// does not know (security.go).
	raw *chttp.Client
}

// Connect dials the server at rawURL (credentials in the URL or given as
// user and password, see Dial) and detects its capabilities.
func Connect(ctx context.Context, rawURL, user, password string) (*Server, error) {
	return ConnectHTTP(ctx, rawURL, user, password, NewHTTPClient())
}

// ConnectHTTP is Connect over the given HTTP client (see DialHTTP).
func ConnectHTTP(ctx context.Context, rawURL, user, password string, hc *http.Client) (*Server, error) {
	rawURL, hc, err := couchHTTPClient(rawURL, hc, zerolog.Nop())
	if err != nil {
		return nil, err
	}
	client, err := DialHTTP(rawURL, user, password, hc)
	if err != nil {
		return nil, err
	}
	ver, err := client.Version(ctx)
	if err != nil {
		return nil, fmt.Errorf("asking %s what it is: %w", Redact(rawURL), err)
	}
	s := &Server{Client: client, Caps: detectCaps(ver)}
	base, user, password, _ := splitCredentials(rawURL, user, password) // Dial checked it
	if s.raw, err = chttp.New(hc, base, allOptions(clientOptions(user, password, hc))); err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", base, err)
	}
	return s, nil
}

// detectCaps reads the server's welcome document.
func detectCaps(ver *kivik.ServerVersion) Capabilities {
	var welcome map[string]json.RawMessage
	_ = json.Unmarshal(ver.RawResponse, &welcome)
	caps := Capabilities{Vendor: strings.ToLower(ver.Vendor), Version: ver.Version}
	switch {
	case welcome["couchdb"] != nil:
		caps.Vendor = "couchdb"
		major, _ := strconv.Atoi(strings.SplitN(ver.Version, ".", 2)[0])
		caps.SelectorFilter = major >= 2
	case welcome["express-pouchdb"] != nil:
		// PouchDB Server has no _selector filter; asking it for one crashes
		// the whole server process, so never probe it.
		caps.Vendor = "pouchdb"
	}
	return caps
}

// Open returns a Client for the named database on this server, following
// the changes feed with a _selector filter where the server has one.
func (s *Server) Open(ctx context.Context, dbName string, cfg Config) (*Client, error) {
	c, err := New(ctx, s.Client.DB(dbName), cfg)
	if err != nil {
		return nil, err
	}
	if s.Caps.SelectorFilter {
		c.couch = s.raw
	}
	return c, nil
}

// waitForChangesSelector is WaitForChanges with a native _selector filter.
func (c *Client) waitForChangesSelector(ctx context.Context, since string, types []string, timeout time.Duration, docs bool) ([]change, string, error) {
	reqCtx, cancel := context.WithTimeout(ctx, timeout+grace(timeout))
	defer cancel()
	control := map[string]any{"type": ControlDocType}
	if len(types) > 0 {
		control["worker"] = map[string]any{"$in": types}
	}
	joined := map[string]any{"type": WorkerDocType, "joined": true}
	if len(types) > 0 {
		joined["types"] = map[string]any{"$elemMatch": map[string]any{"$in": types}}
	}
	claimable := claimableSelector(types)
	if mine := c.siteSelector(); mine != nil {
		claimable["$and"] = append(claimable["$and"].([]any), mine)
	}
	selector := map[string]any{"$or": []any{claimable, control, joined}}
	q := url.Values{
		"feed":    {"longpoll"},
		"since":   {since},
		"timeout": {strconv.FormatInt(timeout.Milliseconds(), 10)},
		"filter":  {"_selector"},
	}
	if timeout <= 0 { // a look that does not wait
		q.Set("feed", "normal")
		q.Del("timeout")
	}
	if docs {
		q.Set("include_docs", "true")
	}
	var resp struct {
		Results []change        `json:"results"`
		LastSeq json.RawMessage `json:"last_seq"`
	}
	body, err := json.Marshal(map[string]any{"selector": selector})
	if err != nil {
		return nil, since, fmt.Errorf("encoding the changes selector: %w", err)
	}
	// The body goes through GetBody: chttp's DoJSON sends Options.JSON
	// nowhere, and CouchDB answers an empty body with 400 "invalid UTF-8
	// JSON", which left every worker on the slow poll.
	err = c.couch.DoJSON(reqCtx, http.MethodPost, "/"+url.PathEscape(c.db.Name())+"/_changes",
		&chttp.Options{Query: q, NoGzip: true, GetBody: func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(body)), nil
		}}, &resp)
	if err != nil {
		if ctx.Err() == nil && reqCtx.Err() != nil {
			return nil, since, nil
		}
		return nil, since, fmt.Errorf("following changes since %s: %w", since, err)
	}
	last := since
	var s string
	switch {
	case json.Unmarshal(resp.LastSeq, &s) == nil && s != "":
		last = s
	case len(resp.LastSeq) > 0 && string(resp.LastSeq) != "null":
		last = string(resp.LastSeq) // CouchDB 1.x numbers
	}
	return resp.Results, last, nil
}

// claimableSelector matches what the work filter (designdocs/couchq/
// filters/work.js) passes: WorkItems of the given types that are unclaimed
// and not running or finished. Missing fields are spelled out because Mango
// operators other than $exists do not match a missing field.
func claimableSelector(types []string) map[string]any {
	selector := map[string]any{
		"type": DocType,
		"$and": []any{
			map[string]any{"$or": []any{
				map[string]any{"claimed": map[string]any{"$exists": false}},
				map[string]any{"claimed": map[string]any{"$ne": true}},
			}},
			map[string]any{"$or": []any{
				map[string]any{"status": map[string]any{"$exists": false}},
				map[string]any{"status": map[string]any{"$nin": []string{"running", "done", "failed", "cancelled", "waiting"}}},
			}},
		},
	}
	if len(types) > 0 {
		selector["worker"] = map[string]any{"$in": types}
	}
	return selector
}

// allOptions applies several kivik options as one.
type allOptions []kivik.Option

func (o allOptions) Apply(target any) {
	for _, opt := range o {
		opt.Apply(target)
	}
}
