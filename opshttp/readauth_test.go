package opshttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/opstest"
	"github.com/couchq/couchq/internal/protocol"
)

// getAs fetches url with basic credentials unless user is empty, and the
// given headers, and returns the status, the WWW-Authenticate header and
// the body.
func getAs(t *testing.T, url, user, password string, header ...string) (code int, challenge, body string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate"), string(b)
}

// recorder is a transport that notes the user of every basic-auth request
// to a path containing a substring.
type recorder struct {
	base http.RoundTripper
	sub  string

	mu    sync.Mutex
	users map[string]int
}

func (rec *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	if strings.Contains(req.URL.Path, rec.sub) {
		user, _, _ := req.BasicAuth()
		rec.mu.Lock()
		rec.users[user]++
		rec.mu.Unlock()
	}
	return rec.base.RoundTrip(req)
}

func (rec *recorder) count(user string) int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.users[user]
}

// readers adds two users of the test's own, a member of q's database
// (named in its _security) and an outsider, skipping the test where the
// server authenticates no users.
func readers(ctx context.Context, t *testing.T, q *protocol.Client) (member, outsider string) {
	t.Helper()
	stamp := time.Now().UnixNano()
	member, outsider = fmt.Sprintf("dash-member-%d", stamp), fmt.Sprintf("dash-reader-outsider-%d", stamp)
	for _, u := range []string{member, outsider} {
		if err := srv.AddUser(ctx, u, "secret"); err != nil {
			if errors.Is(err, couchtest.ErrNoUsers) {
				couchtest.Skip(t, fmt.Sprintf("%s does not authenticate CouchDB users, so reads cannot need a login (%v)", srv.Caps().Vendor, err))
			}
			t.Fatal(err)
		}
	}
	if err := q.DB().SetSecurity(ctx, &kivik.Security{Members: kivik.Members{Names: []string{member}}}); err != nil {
		t.Fatal(err)
	}
	return member, outsider
}

// readPaths are the dashboard's reads.
var readPaths = []string{
	"/api/jobs?status=queued", "/api/queues", "/api/workers", "/api/failed",
	"/api/series?window=1h", "/api/stats", "/api/sites",
}

// With ReadAuth every read needs a CouchDB login and is made as that user:
// no credentials or wrong ones 401 with a challenge (not Basic for the
// page's own requests, so the browser leaves the page's form to ask), a
// user the database's _security leaves out 403 even right after a member
// read the same path (the cache is per user), a member reads, with their
// own credentials on the requests to CouchDB, and with a session cookie
// as well; so does a server admin, where the server has one. /healthz,
// /metrics and the page stay open. Payloads of hidden
// types come without the payload and marked.
func TestDashboardReadsAsTheUser(t *testing.T) {
	t.Parallel()
	ctx, q := newQueue(t)
	member, outsider := readers(ctx, t, q)
	for _, j := range []protocol.NewJob{
		{Worker: "mail", Payload: json.RawMessage(`{"secret":"s3cr3t"}`)},
		{Worker: "billing", Payload: json.RawMessage(`{"card":"4111"}`)},
	} {
		if _, err := q.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	failJob(t, q, "billing", "card declined")

	rec := &recorder{base: http.DefaultTransport, sub: "/_design/", users: map[string]int{}}
	hs := serveHandler(ctx, t, q, Config{
		CouchURL: srv.URL(), HTTPClient: &http.Client{Transport: rec},
		ReadAuth: true, HidePayload: []string{"billing"},
	})

	for _, path := range []string{"/healthz", "/metrics", "/", "/assets/dashboard.js"} {
		if code, _, body := getAs(t, hs.URL+path, "", ""); code != http.StatusOK {
			t.Errorf("%s without credentials: %d %.200s", path, code, body)
		}
	}
	// A user CouchDB does not know, not a wrong password for one it does:
	// CouchDB 3.4+ locks an account out after a few failed logins.
	if code, challenge, body := getAs(t, hs.URL+"/api/jobs", "dash-nobody", "wrong"); code != http.StatusUnauthorized || challenge == "" {
		t.Errorf("/api/jobs with unknown credentials: %d %q %s", code, challenge, body)
	}
	for _, path := range readPaths {
		if code, challenge, body := getAs(t, hs.URL+path, "", ""); code != http.StatusUnauthorized || challenge != `Basic realm="couchq"` {
			t.Errorf("%s without credentials: %d %q %s", path, code, challenge, body)
		}
		if code, challenge, _ := getAs(t, hs.URL+path, "", "", "X-Couchq-Page", "1"); code != http.StatusUnauthorized || challenge != pageChallenge {
			t.Errorf("%s from the page without credentials: %d %q", path, code, challenge)
		}
		if code, _, body := getAs(t, hs.URL+path, member, "secret"); code != http.StatusOK {
			t.Errorf("%s as a member: %d %s", path, code, body)
		}
		// Within CacheTTL of the member's read: not served from the cache.
		if code, _, body := getAs(t, hs.URL+path, outsider, "secret"); code != http.StatusForbidden || !strings.Contains(body, "may not read database") {
			t.Errorf("%s as a user outside _security: %d %s", path, code, body)
		}
		if admin, adminPW := srv.Credentials(); admin != "" {
			if code, _, body := getAs(t, hs.URL+path, admin, adminPW); code != http.StatusOK {
				t.Errorf("%s as a server admin: %d %s", path, code, body)
			}
		}
	}
	if rec.count(member) == 0 || rec.count(outsider) != 0 {
		t.Errorf("view requests to CouchDB by user: %v; want the member's, none of the outsider's", rec.users)
	}

	code, _, body := getAs(t, hs.URL+"/api/jobs?status=queued", member, "secret")
	var jobs []map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &jobs); code != http.StatusOK || err != nil || len(jobs) != 2 {
		t.Fatalf("/api/jobs as a member: %d %v\n%s", code, err, body)
	}
	for _, j := range jobs {
		switch string(j["worker"]) {
		case `"mail"`:
			var payload struct{ Secret string }
			if json.Unmarshal(j["payload"], &payload) != nil || payload.Secret != "s3cr3t" || j["payload_hidden"] != nil {
				t.Errorf("a mail job: %s", body)
			}
		case `"billing"`:
			if j["payload"] != nil || string(j["payload_hidden"]) != "true" {
				t.Errorf("a billing job, whose payloads are hidden: %s", body)
			}
		}
	}
	if _, _, body := getAs(t, hs.URL+"/api/failed", member, "secret"); strings.Contains(body, "4111") || !strings.Contains(body, `"payload_hidden": true`) {
		t.Errorf("/api/failed shows a hidden payload or no marker: %s", body)
	}

	// CouchDB's session cookie works for reads as for the actions.
	req, err := http.NewRequest(http.MethodGet, hs.URL+"/api/queues", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.AddCookie(&http.Cookie{Name: "AuthSession", Value: sessionCookieFor(t, member, "secret")})
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/api/queues with the member's session cookie: %d", resp.StatusCode)
	}
}

// Without ReadAuth reads stay open, and HidePayload still applies; with
// ReadAuth but no CouchURL reads are refused, saying why.
func TestDashboardReadsOpenByDefault(t *testing.T) {
	t.Parallel()
	ctx, q := newQueue(t)
	if _, err := q.Enqueue(ctx, protocol.NewJob{Worker: "billing", Payload: json.RawMessage(`{"card":"4111"}`)}); err != nil {
		t.Fatal(err)
	}
	hs := serveHandler(ctx, t, q, Config{HidePayload: []string{"billing"}})
	if code, body := get(t, hs, "/api/jobs?status=queued"); code != http.StatusOK || strings.Contains(body, "4111") || !strings.Contains(body, `"payload_hidden": true`) {
		t.Errorf("/api/jobs: %d %s", code, body)
	}
	noURL := serveHandler(ctx, t, q, Config{ReadAuth: true})
	if code, body := get(t, noURL, "/api/queues"); code != http.StatusForbidden || !strings.Contains(body, "CouchURL") {
		t.Errorf("/api/queues with ReadAuth and no CouchURL: %d %s", code, body)
	}
}

// The page with ReadAuth: it shows nothing and asks for a login in its
// own form (no browser dialog), then reads as the member who logged in; a
// hidden payload says "hidden".
func TestDashboardInABrowserReadsNeedALogin(t *testing.T) {
	t.Parallel()
	browser := needBrowser(t)
	ctx, q := newQueue(t)
	member, _ := readers(ctx, t, q)
	for _, j := range []protocol.NewJob{
		{Worker: "mail", Payload: json.RawMessage(`{"to":"ann@example.com"}`)},
		{Worker: "billing", Payload: json.RawMessage(`{"card":"4111"}`)},
	} {
		if _, err := q.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	hs := serveHandler(ctx, t, q, Config{CouchURL: srv.URL(), ReadAuth: true, HidePayload: []string{"billing"}})

	// Generous: on a loaded machine a browser starts slowly.
	bctx, cancel := context.WithTimeout(openBrowser(ctx, t, browser), 4*time.Minute)
	defer cancel()
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	text := func(sel string) string {
		v, err := chromedp.Run(bctx, chromedp.Text(css(sel)))
		if err != nil {
			t.Fatalf("reading %s: %v", sel, err)
		}
		return v
	}
	err := chromedp.Do(bctx,
		chromedp.Navigate(hs.URL+"/"),
		chromedp.Poll[chromedp.Void](`document.getElementById('who').textContent === 'reading needs a CouchDB user'`, chromedp.WithPollingTimeout(2*time.Minute)),
	)
	if err != nil {
		status, _ := chromedp.Run(bctx, chromedp.Text(css(`#status`)))
		t.Fatalf("loading the dashboard without a login: %v (status: %q)", err, status)
	}
	if queues := text(`#queues tbody`); strings.Contains(queues, "mail") {
		t.Errorf("the queues show without a login:\n%s", queues)
	}
	if status := text(`#status`); !strings.Contains(status, "log in") {
		t.Errorf("status without a login: %q", status)
	}
	// A refresh answered 401 while the user types the password leaves the
	// cursor where it is: moving it to the user field sent the rest of the
	// password there.
	err = chromedp.Do(bctx,
		chromedp.Focus(css(`#password`)),
		chromedp.Evaluate[chromedp.Void](`document.getElementById('status').textContent = ''; document.getElementById('jobs-status').dispatchEvent(new Event('change'))`),
		chromedp.Poll[chromedp.Void](`document.getElementById('status').textContent !== ''`, chromedp.WithPollingTimeout(time.Minute)),
	)
	focused := ""
	if err == nil {
		focused, err = chromedp.Run(bctx, chromedp.Evaluate[string](`document.activeElement.id`))
	}
	if err != nil || focused != "password" {
		t.Fatalf("after a refresh answered 401, the cursor is in %q, want the password field (%v)", focused, err)
	}
	err = chromedp.Do(bctx,
		chromedp.SetValue(css(`#jobs-status`), "queued"),
		chromedp.SendKeys(css(`#user`), member),
		chromedp.SendKeys(css(`#password`), "secret"),
		chromedp.Click(css(`#login-button`)),
		// Polled, not waited for as visible: the page replaces its rows on
		// every refresh, and a row found before one is never shown.
		chromedp.Poll[chromedp.Void](`document.querySelector('#queues tr[data-type="billing"]') !== null && document.querySelectorAll('#jobs tr[data-job]').length === 2`,
			chromedp.WithPollingTimeout(time.Minute)),
	)
	if err != nil {
		status, _ := chromedp.Run(bctx, chromedp.Text(css(`#status`)))
		who, _ := chromedp.Run(bctx, chromedp.Text(css(`#who`)))
		t.Fatalf("logging in to read: %v (status: %q, who: %q)", err, status, who)
	}
	jobs, err := chromedp.Run(bctx, chromedp.Evaluate[string](`Array.prototype.map.call(document.querySelectorAll('#jobs pre.payload'), function (p) { return p.textContent; }).sort().join('\n')`))
	if err != nil || jobs != "payload: hidden\npayload: {\"to\":\"ann@example.com\"}" {
		t.Errorf("payloads on the page: %q %v", jobs, err)
	}
}

// A read sent before the user logged in and answered 401 after it says
// nothing of the new login: the page keeps it. (It dropped it, and every
// read after failed, when a refresh was under way as the user logged in.)
// The server here answers the page's first read of its charts late
// (one: a browser sends only a few requests to a server at once), so
// that the login comes between its sending and its answer.
func TestDashboardLoginSurvivesAnswersToEarlierReads(t *testing.T) {
	t.Parallel()
	browser := needBrowser(t)
	ctx, q := newQueue(t)
	member, _ := readers(ctx, t, q)
	if _, err := q.Enqueue(ctx, protocol.NewJob{Worker: "mail"}); err != nil {
		t.Fatal(err)
	}
	const late = 4 * time.Second
	var mu sync.Mutex
	var lateSent, lateAnswered int
	var firstLateAnswer, firstLoggedIn time.Time
	dashboard := NewHandler(ctx, (*couchq.Client)(q), Config{CouchURL: srv.URL(), ReadAuth: true, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get("Authorization") != "":
			mu.Lock()
			if firstLoggedIn.IsZero() && strings.HasPrefix(r.URL.Path, "/api/") {
				firstLoggedIn = time.Now()
			}
			mu.Unlock()
		case r.URL.Path == "/api/series":
			mu.Lock()
			lateSent++
			mu.Unlock()
			select {
			case <-time.After(late):
			case <-r.Context().Done():
			}
			mu.Lock()
			if firstLateAnswer.IsZero() {
				firstLateAnswer = time.Now()
			}
			mu.Unlock()
			defer func() {
				mu.Lock()
				lateAnswered++
				mu.Unlock()
			}()
		}
		dashboard.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)

	bctx := openBrowser(ctx, t, browser)
	who := func() string {
		v, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`#who`)))
		if err != nil {
			t.Fatalf("reading #who: %v", err)
		}
		return v
	}
	// The page's script has run (it says who is signed in), and the read
	// of its charts has not been answered yet: log in now.
	err := chromedp.Do(bctx,
		chromedp.Navigate(hs.URL+"/"),
		chromedp.Poll[chromedp.Void](`document.getElementById('who').textContent !== ''`, chromedp.WithPollingTimeout(time.Minute)),
		chromedp.SendKeys(chromedp.CSS(`#user`), member),
		chromedp.SendKeys(chromedp.CSS(`#password`), "secret"),
		chromedp.Click(chromedp.CSS(`#login-button`)),
		// Polled, not waited for as visible: the page replaces its rows on
		// every refresh, and a row found before one is never shown.
		chromedp.Poll[chromedp.Void](`document.querySelector('#queues tr[data-type="mail"]') !== null`, chromedp.WithPollingTimeout(time.Minute)),
	)
	if err != nil {
		t.Fatalf("logging in while the first read of the charts waits for its answer: %v", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		mu.Lock()
		done := lateSent > 0 && lateAnswered == lateSent
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the read sent before the login was not answered within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	loggedInFirst := !firstLoggedIn.IsZero() && firstLoggedIn.Before(firstLateAnswer)
	mu.Unlock()
	if !loggedInFirst {
		t.Fatalf("the login came after the earlier read was answered (in %v): the test proves nothing", late)
	}
	// The page handles the answers as they come: give it a moment.
	time.Sleep(500 * time.Millisecond)
	if got, want := who(), "signed in as "+member; got != want {
		t.Fatalf("after the answer to the read sent before the login, the page says %q, want %q", got, want)
	}
}

// Wrong passwords sent through the handler reach CouchDB at most three
// times per user in five minutes, fewer than CouchDB's lockout threshold:
// then the handler answers 429 itself, and the account (a worker's, say)
// stays usable at CouchDB. A login it checked before still reads, and the
// user's logins reach CouchDB again once the failures are old.
func TestDashboardFailedLoginsDoNotLockAccountsOut(t *testing.T) {
	t.Parallel()
	ctx, q := newQueue(t)
	member, _ := readers(ctx, t, q)
	clk := opstest.NewClock(time.Now())
	rec := &recorder{base: http.DefaultTransport, sub: "/_session", users: map[string]int{}}
	hs := serveHandler(ctx, t, q, Config{CouchURL: srv.URL(), HTTPClient: &http.Client{Transport: rec}, ReadAuth: true, Now: clk.Now, CacheTTL: time.Hour})
	if code, _, body := getAs(t, hs.URL+"/api/queues", member, "secret"); code != http.StatusOK {
		t.Fatalf("the member's first read: %d %s", code, body)
	}
	for i := range 5 {
		code, _, body := getAs(t, hs.URL+"/api/queues", member, "wrong")
		want := http.StatusUnauthorized
		if i >= failedLoginsMax {
			want = http.StatusTooManyRequests
		}
		if code != want {
			t.Errorf("wrong password #%d: %d %s, want %d", i+1, code, body, want)
		}
	}
	if n := rec.count(member); n != 1+failedLoginsMax {
		t.Errorf("CouchDB was asked about %s %d times, want %d (one login, %d failures)", member, n, 1+failedLoginsMax, failedLoginsMax)
	}
	// CouchDB itself still takes the account.
	if code, _, body := getAs(t, srv.URL()+"/_session", member, "secret"); code != http.StatusOK {
		t.Errorf("the member at CouchDB after the wrong passwords: %d %s", code, body)
	}
	// The login checked before still reads; a new one waits.
	if code, _, body := getAs(t, hs.URL+"/api/workers", member, "secret"); code != http.StatusOK {
		t.Errorf("the member's login checked before: %d %s", code, body)
	}
	clk.Add(failedLoginWindow)
	if code, _, body := getAs(t, hs.URL+"/api/queues", member, "wrong"); code != http.StatusUnauthorized {
		t.Errorf("a wrong password after the failures expired: %d %s, want 401", code, body)
	}
}

// The failed-login log is bounded: once it holds failedLoginNames failing
// names, a name that has not failed is refused too, and the answer says
// why rather than blame that name's own logins.
func TestFailedLoginLogFullSaysSo(t *testing.T) {
	t.Parallel()
	var f failedLoginLog
	now := time.Now()
	for i := range failedLoginNames {
		f.add(fmt.Sprintf("flood-%d", i), now)
	}
	if _, full, blocked := f.blocked("admin", now); !blocked || !full {
		t.Fatalf("a name that never failed, the log full: blocked %v, full %v; want both", blocked, full)
	}
	if _, full, blocked := f.blocked("flood-1", now); blocked || full {
		t.Fatalf("a name with one failure: blocked %v, full %v; want neither", blocked, full)
	}
	if _, _, blocked := f.blocked("admin", now.Add(failedLoginWindow)); blocked {
		t.Fatal("once the failures are old the name is still refused")
	}
}
