package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/couchtest"
)

// addUser creates a CouchDB user for the test, or skips where the server
// authenticates none (PouchDB Server).
func addUser(t *testing.T, prefix string, roles ...string) (name, password string) {
	t.Helper()
	name = fmt.Sprintf("%s-%08x", prefix, rand.Uint32())
	password = fmt.Sprintf("pw-%016x", rand.Uint64())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := srv.AddUser(ctx, name, password, roles...); err != nil {
		if errors.Is(err, couchtest.ErrNoUsers) {
			couchtest.Skip(t, fmt.Sprintf("%s does not authenticate CouchDB users, so _security and couchq's roles cannot be enforced (%v)", srv.Caps().Vendor, err))
		}
		t.Fatal(err)
	}
	return name, password
}

// writePassword writes a password file for the test.
func writePassword(t *testing.T, password string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(file, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// as is c connecting as another user, the password in a file.
func (c cmdline) as(t *testing.T, name, password string) cmdline {
	t.Helper()
	return c.withEnv("COUCHDB_USER", name).withEnv("COUCHDB_PASSWORD", "").withEnv("COUCHDB_PASSWORD_FILE", writePassword(t, password))
}

// couchq init --workers/--producers sets _security; a producer enqueues but
// cannot cancel, an outsider cannot read, a worker can do both.
func TestInitRolesFromTheCommandLine(t *testing.T) {
	t.Parallel()
	admin := online(t)
	producer, ppw := addUser(t, "producer")
	worker, wpw := addUser(t, "worker", "couchq-test-workers")
	outsider, opw := addUser(t, "outsider")

	r := admin.run(t, "init", "--workers", "role:couchq-test-workers", "--producers", producer)
	expect(t, r, exitOK)
	if !strings.Contains(r.stdout, "workers: role:couchq-test-workers; producers: "+producer) {
		t.Errorf("init output:\n%s", r.stdout)
	}
	r = admin.run(t, "init", "--workers", "role:couchq-test-workers", "--producers", producer, "--json")
	expect(t, r, exitOK)
	if !strings.Contains(r.stdout, `"security"`) || !strings.Contains(r.stdout, `"couchq-test-workers"`) {
		t.Errorf("init --json:\n%s", r.stdout)
	}

	p := admin.as(t, producer, ppw)
	r = p.run(t, "enqueue", "--type", "mail", "--id", "m1")
	expect(t, r, exitOK)
	r = p.run(t, "cancel", "m1")
	expect(t, r, exitFailure, "is a couchq producer")
	w := admin.as(t, worker, wpw)
	r = w.run(t, "cancel", "m1")
	expect(t, r, exitOK)
	r = admin.as(t, outsider, opw).run(t, "ls")
	// CouchDB answers 403, PouchDB Server 401.
	if r.code == exitOK || !(strings.Contains(r.stderr, "403") || strings.Contains(r.stderr, "401")) {
		t.Errorf("outsider ls: exit %d, %s", r.code, r.stderr)
	}
	// Only an admin sets roles.
	r = w.run(t, "init", "--workers", worker)
	expect(t, r, exitFailure, "only an admin may write _security")
	// ...or changes the design documents: a worker's init asking for the
	// other language changes nothing, and says so rather than succeed.
	r = admin.run(t, "init", "--json")
	var stored struct {
		Language string `json:"language"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &stored); err != nil {
		t.Fatalf("init --json: %v\n%s", err, r.stdout)
	}
	other := map[string]string{"javascript": "javascript_quickjs", "javascript_quickjs": "javascript"}[stored.Language]
	r = w.run(t, "init", "--language", other)
	expect(t, r, exitFailure, "were not changed", "only an admin may write design documents")
	r = admin.run(t, "init", "--workers", "_admin")
	expect(t, r, exitUsage, "do not start with _")
	r = admin.run(t, "init", "--producers", " , ")
	expect(t, r, exitUsage, "name nobody")
}

// A member running a worker or ls on a database without couchq's design
// document is told to run couchq init as an admin.
func TestMemberWithoutDesignDocument(t *testing.T) {
	t.Parallel()
	admin := online(t)
	worker, wpw := addUser(t, "worker")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A database with members but no design document: created by hand.
	db := admin.env["COUCHQ_DB"]
	if err := srv.Client(t).CreateDB(ctx, db); err != nil {
		t.Fatal(err)
	}
	admin.put(t, db, "_security", fmt.Sprintf(`{"admins":{"names":[],"roles":[]},"members":{"names":[%q],"roles":[]}}`, worker))
	w := admin.as(t, worker, wpw)
	r := w.run(t, "ls")
	expect(t, r, exitFailure, "has no couchq design document", "run `couchq init` as an admin")
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	r = w.runContext(t, ctx2, "worker", "--type", "mail", "--handler", "noop")
	expect(t, r, exitFailure, "run `couchq init` as an admin")
	// A database that does not exist: only an admin may create it.
	r = w.withEnv("COUCHQ_DB", srv.UniqueDBName(t)).runContext(t, ctx2, "worker", "--type", "mail", "--handler", "noop")
	expect(t, r, exitFailure, "does not exist, and only an admin may create it", "run `couchq init` as an admin")
}

// Commands on a database whose design documents an older couchq wrote say
// to run couchq init, rather than fail on a view those lack with
// CouchDB's bare "missing".
func TestCommandsOnAnOlderSchema(t *testing.T) {
	t.Parallel()
	c := online(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := c.env["COUCHQ_DB"]
	if err := srv.Client(t).CreateDB(ctx, db); err != nil {
		t.Fatal(err)
	}
	// Schema 2: the claim design document alone, before the sweep one.
	old, err := designdocs.Build(designdocs.Source(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := designdocs.Install(ctx, srv.Client(t).DB(db), old, designdocs.ValidationOn, zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"stats"}, {"sweep"}, {"ls"}} {
		expect(t, c.run(t, args...), exitFailure, "the design documents of an older couchq (schema 2; this couchq needs", "run `couchq init` as an admin")
	}
	// init brings them up to date.
	expect(t, c.run(t, "init"), exitOK)
	expect(t, c.run(t, "stats"), exitOK)
}

// put writes a raw document (or _security) as the admin.
func (c cmdline) put(t *testing.T, db, id, body string) {
	t.Helper()
	u := c.env["COUCHDB_URL"] + "/" + url.PathEscape(db) + "/" + id
	req, err := http.NewRequest(http.MethodPut, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if c.env["COUCHDB_USER"] != "" { // PouchDB Server's admin party: no credentials at all
		req.SetBasicAuth(c.env["COUCHDB_USER"], c.env["COUCHDB_PASSWORD"])
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode >= 300 {
		t.Fatalf("PUT %s: %s", id, resp.Status)
	}
}

// The password can come from a file, and never shows in the output.
func TestPasswordFile(t *testing.T) {
	t.Parallel()
	user, password := srv.Credentials()
	if user == "" {
		couchtest.Skip(t, "the test server takes no credentials")
	}
	c := online(t).mustInit(t).as(t, user, password)
	r := c.run(t, "ls", "--log-level", "debug")
	expect(t, r, exitOK)
	if strings.Contains(r.stderr, password) {
		t.Errorf("the password leaked:\n%s", r.stderr)
	}
	// The flag wins over the environment. Tried with a user of the test's
	// own: CouchDB 3.4+ locks an account out after a few failed logins from
	// one address, and the admin's is every other test's.
	name, pw := addUser(t, "pwfile")
	// Logged in, it is refused as no member of the database (CouchDB's new
	// databases are for admins), or served (PouchDB Server's are open).
	if r := c.withEnv("COUCHDB_USER", name).run(t, "ls", "--password-file", writePassword(t, pw)); r.code != exitOK && !strings.Contains(r.stderr, "HTTP 403") {
		t.Errorf("ls as %s with its password file: exit %d %s", name, r.code, r.stderr)
	}
	bad := writePassword(t, "not-the-password")
	r = c.withEnv("COUCHDB_USER", name).run(t, "ls", "--password-file", bad)
	if r.code == exitOK || !strings.Contains(r.stderr, "HTTP 401") || strings.Contains(r.stderr, "not-the-password") {
		t.Errorf("ls with a wrong password file: exit %d\n%s", r.code, r.stderr)
	}
	r = c.run(t, "ls", "--password-file", filepath.Join(t.TempDir(), "missing"))
	expect(t, r, exitUsage, "reading the password file")
	r = c.withEnv("COUCHDB_USER", "").run(t, "ls", "--url", srv.URL())
	expect(t, r, exitUsage, "a password file needs a user")
}

// https:// URLs work, with --ca-file trusting a private CA; without it
// the certificate is refused with a clear message.
func TestHTTPSWithCAFile(t *testing.T) {
	t.Parallel()
	target, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	// A TLS listener in front of the test server, with its own CA.
	proxy := httptest.NewUnstartedServer(httputil.NewSingleHostReverseProxy(target))
	proxy.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	proxy.StartTLS()
	t.Cleanup(proxy.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: proxy.Certificate().Raw})
	if err := os.WriteFile(caFile, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	c := online(t).withEnv("COUCHDB_URL", proxy.URL)
	if !strings.HasPrefix(proxy.URL, "https://") {
		t.Fatalf("proxy URL %s", proxy.URL)
	}
	r := c.run(t, "init", "--ca-file", caFile)
	expect(t, r, exitOK)
	r = c.run(t, "enqueue", "--type", "tls", "--ca-file", caFile)
	expect(t, r, exitOK)
	r = c.run(t, "ls", "--ca-file", caFile)
	expect(t, r, exitOK)
	if !strings.Contains(r.stdout, "tls") {
		t.Errorf("ls over https:\n%s", r.stdout)
	}
	r = c.run(t, "ls")
	expect(t, r, exitFailure, "certificate")
	r = c.run(t, "ls", "--ca-file", filepath.Join(t.TempDir(), "none.pem"))
	expect(t, r, exitUsage, "reading the CA file (--ca-file, ca_file)")
	notPEM := filepath.Join(t.TempDir(), "bad.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = c.run(t, "ls", "--ca-file", notPEM)
	expect(t, r, exitUsage, "holds no PEM certificate")
}

// What a document holds cannot drive the terminal of the operator who
// reads it: show prints its control characters escaped, in the last error
// and the history too.
func TestShowEscapesControlCharacters(t *testing.T) {
	c := online(t).mustInit(t)
	c.put(t, c.env["COUCHQ_DB"], "job:escapes", `{"type":"WorkItem","worker":"esc","status":"failed","attempts":1,"finished_at":1,`+
		`"last_error":"boom \u001b[31mRED\u001b]0;TITLE\u0007\nsecond \u001b[2J line",`+
		`"history":[{"at":"2026-11-29T00:00:00Z","event":"failed","by":"\u001b[2Jclear","error":"x"}]}`)
	r := c.run(t, "show", "job:escapes")
	expect(t, r, exitOK)
	for _, want := range []string{`boom \x1b[31mRED\x1b]0;TITLE\a`, `second \x1b[2J line`, `by \x1b[2Jclear`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("show does not print %q", want)
		}
	}
	if strings.ContainsRune(r.stdout, 0x1b) || strings.ContainsRune(r.stdout, 0x07) {
		t.Errorf("show printed control characters raw:\n%q", r.stdout)
	}
}
