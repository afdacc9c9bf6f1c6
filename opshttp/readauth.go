package opshttp

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/internal/protocol"
)

// Reads as the person reading (Config.ReadAuth): every read but /healthz,
// /metrics and the page's static files needs the CouchDB login the
// actions need, and is made with that login, so that the database's
// _security decides what the dashboard shows, as it would in Fauxton.

// pageHeader marks the dashboard page's own requests. Their 401 carries a
// challenge that is not Basic: a browser answers a Basic challenge to
// fetch() with its own login dialog, over the page's form.
const (
	pageHeader    = "X-Couchq-Page"
	pageChallenge = `couchq-form realm="couchq"`
)

// challenge sets the WWW-Authenticate header of a 401.
func challenge(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(pageHeader) != "" {
		w.Header().Set("WWW-Authenticate", pageChallenge)
		return
	}
	w.Header().Set("WWW-Authenticate", authRealm)
}

// credentials are the CouchDB credentials a request carries: its basic
// Authorization header, else its AuthSession cookie; both empty when none.
func credentials(r *http.Request) (authorization, cookie string) {
	if _, _, ok := r.BasicAuth(); ok {
		return r.Header.Get("Authorization"), ""
	}
	if c, err := r.Cookie(sessionCookie); err == nil && c.Value != "" {
		return "", c.Value
	}
	return "", ""
}

// askCouch makes a GET of path on CouchDB with the request's credentials,
// and only those: not the rest of the browser's request.
func (s *server) askCouch(ctx context.Context, r *http.Request, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.cfg.CouchURL+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	authorization, cookie := credentials(r)
	setCredentials(req, authorization, cookie)
	return s.cfg.HTTPClient.Do(req)
}

func setCredentials(req *http.Request, authorization, cookie string) {
	req.Header.Del("Authorization")
	req.Header.Del("Cookie")
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	} else if cookie != "" {
		req.AddCookie(&http.Cookie{Name: sessionCookie, Value: cookie})
	}
}

// login asks CouchDB who the request's credentials belong to (GET
// /_session with them) and whether that user may read the database (GET
// /{db} with them): 401 without credentials or with ones CouchDB does not
// know, 403 for a user the database's _security leaves out.
func (s *server) login(ctx context.Context, r *http.Request) (sessionUser, int, error) {
	if authorization, cookie := credentials(r); authorization == "" && cookie == "" {
		return sessionUser{}, http.StatusUnauthorized, errNoCredentials
	}
	name, _, _ := r.BasicAuth()
	if name != "" {
		next, full, blocked := s.failedLogins.blocked(name, s.cfg.Now())
		switch {
		case blocked && full:
			return sessionUser{}, http.StatusTooManyRequests, fmt.Errorf("logins as %d other names failed here within %s, more than this server remembers: "+
				"logins of names that have not failed are refused until %s, so that failures sent through this server cannot make CouchDB lock accounts out", failedLoginNames, failedLoginWindow, next.UTC().Format(time.RFC3339))
		case blocked:
			return sessionUser{}, http.StatusTooManyRequests, fmt.Errorf("%d logins as %s failed here within %s: CouchDB is asked again from %s, "+
				"so that failures sent through this server do not make CouchDB lock the account out", failedLoginsMax, name, failedLoginWindow, next.UTC().Format(time.RFC3339))
		}
	}
	resp, err := s.askCouch(ctx, r, "/_session")
	if err != nil {
		return sessionUser{}, http.StatusBadGateway, fmt.Errorf("checking credentials with CouchDB: %w", err)
	}
	var session struct {
		UserCtx struct {
			Name  *string  `json:"name"`
			Roles []string `json:"roles"`
		} `json:"userCtx"`
		Reason string `json:"reason"`
	}
	err = json.NewDecoder(resp.Body).Decode(&session)
	_ = resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusBadRequest:
		// 400: CouchDB's answer to a malformed AuthSession cookie.
		if name != "" && resp.StatusCode == http.StatusUnauthorized {
			s.failedLogins.add(name, s.cfg.Now())
		}
		return sessionUser{}, http.StatusUnauthorized, errNoCredentials
	case resp.StatusCode == http.StatusForbidden:
		// CouchDB's lockout after failed logins ("Account is temporarily
		// locked due to multiple authentication failures").
		return sessionUser{}, http.StatusForbidden, fmt.Errorf("CouchDB refused the login: %s", cmp.Or(session.Reason, resp.Status))
	case resp.StatusCode != http.StatusOK || err != nil:
		return sessionUser{}, http.StatusBadGateway, fmt.Errorf("checking credentials with CouchDB: GET /_session answered %s", resp.Status)
	case session.UserCtx.Name == nil || *session.UserCtx.Name == "":
		// CouchDB answers 200 to unknown cookies, as anonymous.
		return sessionUser{}, http.StatusUnauthorized, errNoCredentials
	}
	user := sessionUser{name: *session.UserCtx.Name, roles: session.UserCtx.Roles}
	resp, err = s.askCouch(ctx, r, "/"+url.PathEscape(s.db))
	if err != nil {
		return sessionUser{}, http.StatusBadGateway, fmt.Errorf("checking access to database %s: %w", s.db, err)
	}
	_ = resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return user, http.StatusOK, nil
	case http.StatusUnauthorized, http.StatusForbidden:
		return sessionUser{}, http.StatusForbidden, fmt.Errorf("CouchDB user %s may not read database %s", user.name, s.db)
	default:
		return sessionUser{}, http.StatusBadGateway, fmt.Errorf("checking access to database %s: CouchDB answered %s", s.db, resp.Status)
	}
}

// Failed logins a handler lets through to CouchDB, per user name: fewer
// than CouchDB's lockout threshold (3.4 and later lock a user out for five
// minutes after five failed logins from one address, and every login this
// handler checks comes from its own address). Without the bound anyone who
// can reach the handler could lock any account out of CouchDB, the
// workers' included, by sending five wrong passwords for it.
const (
	failedLoginsMax   = 3
	failedLoginWindow = 5 * time.Minute
	// failedLoginNames bounds the names remembered (about 100 bytes
	// each): past it, names not yet failing are refused until the oldest
	// failures expire, since a failure that could not be remembered
	// could be repeated without bound. So many names failing within the
	// window takes over 200 wrong logins a second for five minutes.
	failedLoginNames = 65536
)

// failedLoginLog remembers the failed logins of the last failedLoginWindow
// by user name.
type failedLoginLog struct {
	mu     sync.Mutex
	byName map[string][]time.Time
}

// blocked reports whether name has failed failedLoginsMax times within the
// window before now (full false), or the log is full of other names (full
// true), and when a login may be tried again.
func (f *failedLoginLog) blocked(name string, now time.Time) (next time.Time, full, blocked bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	recent := f.recentLocked(name, now)
	if len(recent) >= failedLoginsMax {
		return recent[0].Add(failedLoginWindow), false, true
	}
	if recent == nil && len(f.byName) >= failedLoginNames {
		f.pruneLocked(now)
		if len(f.byName) >= failedLoginNames {
			return now.Add(failedLoginWindow), true, true
		}
	}
	return time.Time{}, false, false
}

func (f *failedLoginLog) add(name string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byName == nil {
		f.byName = map[string][]time.Time{}
	}
	f.byName[name] = append(f.recentLocked(name, now), now)
}

// recentLocked is name's failures within the window, oldest first; older
// ones are forgotten.
func (f *failedLoginLog) recentLocked(name string, now time.Time) []time.Time {
	times := f.byName[name]
	for len(times) > 0 && now.Sub(times[0]) >= failedLoginWindow {
		times = times[1:]
	}
	if len(times) == 0 {
		delete(f.byName, name)
		return nil
	}
	f.byName[name] = times
	return times
}

func (f *failedLoginLog) pruneLocked(now time.Time) {
	for name := range f.byName {
		f.recentLocked(name, now)
	}
}

// reader is who a read is made as: the handler's own client, or with
// ReadAuth the client of the user the request logged in as.
type reader struct {
	q *protocol.Client
	// user is "" for the handler's own client.
	user string
}

// cacheKey keys a read's answer in the response cache: by user, so that
// an answer read as one user is never served to another, who may not be
// allowed to read it.
func (rd reader) cacheKey(r *http.Request) string {
	if rd.user == "" {
		return r.URL.RequestURI()
	}
	return "user " + rd.user + "\x00" + r.URL.RequestURI()
}

// readerFor is the reader of a request, or the status and error to answer
// with: 401 without a login, 403 for a user who may not read the database.
func (s *server) readerFor(ctx context.Context, r *http.Request) (reader, int, error) {
	if !s.cfg.ReadAuth {
		return reader{q: s.q}, http.StatusOK, nil
	}
	if s.cfg.CouchURL == "" {
		return reader{}, http.StatusForbidden, errors.New("reads need a CouchDB login but the handler was not given CouchDB's URL to check it against (opshttp.Config.CouchURL)")
	}
	authorization, cookie := credentials(r)
	if authorization == "" && cookie == "" {
		return reader{}, http.StatusUnauthorized, errNoCredentials
	}
	key := sha256.Sum256([]byte(authorization + "\x00" + cookie))
	if rd, ok := s.logins.get(key, s.cfg.Now()); ok {
		return rd, http.StatusOK, nil
	}
	user, code, err := s.login(ctx, r)
	if err != nil {
		return reader{}, code, err
	}
	base := s.cfg.HTTPClient.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	hc := &http.Client{Transport: asUser{base: base, authorization: authorization, cookie: cookie}, Timeout: s.cfg.HTTPClient.Timeout}
	q, err := s.q.As(hc, s.cfg.CouchURL)
	if err != nil {
		return reader{}, http.StatusInternalServerError, fmt.Errorf("reading as %s: %w", user.name, err)
	}
	rd := reader{q: q, user: user.name}
	s.logins.put(key, rd, s.cfg.Now())
	return rd, http.StatusOK, nil
}

// asUser sends every request with one user's credentials, and no others.
type asUser struct {
	base                  http.RoundTripper
	authorization, cookie string
}

func (t asUser) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	setCredentials(req, t.authorization, t.cookie)
	return t.base.RoundTrip(req)
}

// loginsMax bounds the logins remembered; past it they start over.
const loginsMax = 256

// loginCache remembers, for CacheTTL, the readers of credentials CouchDB
// accepted, by a hash of the credentials: a dashboard polls five
// endpoints every few seconds, and each would otherwise cost two requests
// to CouchDB before its read. A password changed or a user removed from
// _security takes effect within CacheTTL, as cached figures do.
type loginCache struct {
	ttl time.Duration

	mu      sync.Mutex
	entries map[[sha256.Size]byte]loginEntry
}

type loginEntry struct {
	rd reader
	at time.Time
}

func (c *loginCache) get(key [sha256.Size]byte, now time.Time) (reader, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		return reader{}, false
	}
	if age := now.Sub(e.at); age < 0 || age >= c.ttl {
		delete(c.entries, key)
		return reader{}, false
	}
	return e.rd, true
}

func (c *loginCache) put(key [sha256.Size]byte, rd reader, now time.Time) {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil || len(c.entries) >= loginsMax {
		c.entries = map[[sha256.Size]byte]loginEntry{}
	}
	c.entries[key] = loginEntry{rd: rd, at: now}
}

// refused answers a read that could not be made as the user: 401 with a
// challenge, or the code given.
func refused(w http.ResponseWriter, r *http.Request, code int, err error) {
	if code == http.StatusUnauthorized {
		challenge(w, r)
	}
	writeAPIError(w, code, err.Error())
}

// readFailed answers a read that failed: CouchDB refusing the user (the
// database's _security changed since the login was checked, or the
// session ended) is theirs, 401 or 403; anything else is 502.
func (s *server) readFailed(w http.ResponseWriter, r *http.Request, rd reader, err error) {
	if rd.user != "" {
		switch kivik.HTTPStatus(err) {
		case http.StatusUnauthorized:
			refused(w, r, http.StatusUnauthorized, errNoCredentials)
			return
		case http.StatusForbidden:
			refused(w, r, http.StatusForbidden, fmt.Errorf("CouchDB user %s may not read database %s: %w", rd.user, s.db, err))
			return
		}
	}
	s.serverFailed(w, err)
}

// Payloads hidden by type (Config.HidePayload): a job of such a type is
// answered without its payload and with "payload_hidden": true, so that
// the dashboard says "hidden" rather than showing none.

// hidePayloads returns the jobs as JSON values, the payloads of the
// hidden types taken out. jobs are *protocol.WorkItem or raw documents
// (forms.Jobs' malformed ones).
func (s *server) hidePayloads(jobs []any) ([]any, error) {
	if len(s.hidden) == 0 {
		return jobs, nil
	}
	out := make([]any, len(jobs))
	for i, j := range jobs {
		var err error
		if out[i], err = s.hidePayload(j); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// hidePayload is hidePayloads for one job.
func (s *server) hidePayload(job any) (any, error) {
	if len(s.hidden) == 0 {
		return job, nil
	}
	if it, ok := job.(*protocol.WorkItem); ok && !s.hidden[it.Worker] {
		return job, nil
	}
	b, err := json.Marshal(job)
	if err != nil {
		return nil, fmt.Errorf("encoding a job: %w", err)
	}
	var doc map[string]json.RawMessage
	var typ string
	if json.Unmarshal(b, &doc) != nil || json.Unmarshal(doc["worker"], &typ) != nil || !s.hidden[typ] {
		// Not an object, or of no type hidden: a malformed document is
		// shown as it is.
		return json.RawMessage(b), nil
	}
	delete(doc, "payload")
	doc["payload_hidden"] = json.RawMessage("true")
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("encoding a job: %w", err)
	}
	return json.RawMessage(bytes.TrimSpace(buf.Bytes())), nil
}
