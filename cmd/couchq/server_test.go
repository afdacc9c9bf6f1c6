package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/localserver"
	"github.com/couchq/couchq/internal/protocol"
)

// Tests against the real server of couchtest (see TestMain).

func TestInitIsIdempotent(t *testing.T) {
	t.Parallel()
	c := online(t)
	r := c.run(t, "init")
	expect(t, r, exitOK)
	if !strings.Contains(r.stdout, "created database "+c.env["COUCHQ_DB"]) || !strings.Contains(r.stdout, "installed design document") {
		t.Errorf("first init: %q", r.stdout)
	}
	r = c.run(t, "init")
	expect(t, r, exitOK)
	if !strings.Contains(r.stdout, "using database") || !strings.Contains(r.stdout, "up to date") {
		t.Errorf("second init: %q", r.stdout)
	}
	r = c.run(t, "init", "--json")
	expect(t, r, exitOK)
	var res cli.InitResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("init --json: %v: %q", err, r.stdout)
	}
	if res.DBCreated || res.DesignDoc != "unchanged" || res.Database != c.env["COUCHQ_DB"] {
		t.Errorf("third init: %+v", res)
	}
}

// A design document deleted by hand (from Fauxton, say) is named by the
// commands that would read its views, and couchq init puts it back and
// says so rather than calling the documents up to date.
func TestInitRestoresDeletedDesignDocument(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := online(t).mustInit(t)
	db := srv.Client(t).DB(c.env["COUCHQ_DB"])
	var stored struct {
		Rev string `json:"_rev"`
	}
	if err := db.Get(ctx, designdocs.OpsID).ScanDoc(&stored); err != nil {
		t.Fatal(err)
	}
	rev := stored.Rev
	// A PUT of a deletion, as Fauxton makes it: PouchDB Server answers
	// DELETE of a design document "missing".
	if _, err := db.Put(ctx, designdocs.OpsID, map[string]any{"_rev": rev, "_deleted": true}); err != nil {
		t.Fatal(err)
	}
	expect(t, c.run(t, "stats"), exitFailure, "lacks couchq's design document "+designdocs.OpsID, "couchq init")
	for _, want := range []string{"installed missing design documents " + designdocs.OpsID + " again", "up to date"} {
		r := c.run(t, "init")
		expect(t, r, exitOK)
		if !strings.Contains(r.stdout, want) {
			t.Errorf("init says %q, want %q", r.stdout, want)
		}
	}
	expect(t, c.run(t, "stats"), exitOK)
}

// couchq init --shards creates the database with that many shards and
// says so where the server has shards; a bad number changes nothing.
func TestInitShards(t *testing.T) {
	t.Parallel()
	c := online(t)
	r := c.run(t, "init", "--shards", "-2")
	expect(t, r, exitUsage)
	if !strings.Contains(r.stderr, "invalid --shards -2") {
		t.Errorf("init --shards -2: %q", r.stderr)
	}
	expect(t, c.run(t, "init", "--shards", "100000"), exitUsage, "invalid --shards 100000: at most 64")
	r = c.run(t, "init", "--shards", "3", "--json")
	expect(t, r, exitOK)
	var res cli.InitResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || !res.DBCreated {
		t.Fatalf("init --shards 3 --json: %v: %q", err, r.stdout)
	}
	if res.Shards == 0 {
		t.Skipf("%s reports no shards", srv.Caps().Vendor)
	}
	if res.Shards != 3 || res.Copies != 1 {
		t.Errorf("init --shards 3 on one node: %d shards, %d copies, want 3 and 1", res.Shards, res.Copies)
	}
	// Printed when init created the database.
	var out strings.Builder
	if err := cli.PrintInit(&out, &res, false); err != nil || !strings.Contains(out.String(), "created database "+res.Database+" (3 shards, 1 copy) on ") {
		t.Errorf("init's line for the database it created: %q %v", out.String(), err)
	}
	// CouchDB fixes the shards when it creates the database: asking for
	// others later is refused, not ignored; asking for the same is fine.
	expect(t, c.run(t, "init", "--shards", "2"), exitFailure, "exists with 3 shards", "fixes a database's shards when it is created")
	expect(t, c.run(t, "init", "--shards", "3"), exitOK)
}

// couchq init --validation off installs the design document without
// validate_doc_update and says what that means; init without the flag
// keeps the choice; roles refuse to go with it.
func TestInitValidationSwitch(t *testing.T) {
	t.Parallel()
	c := online(t)
	r := c.run(t, "init", "--validation", "off")
	expect(t, r, exitOK)
	if !strings.Contains(r.stdout, "validation off") || !strings.Contains(r.stdout, "workers mark them failed") {
		t.Errorf("init --validation off: %q", r.stdout)
	}
	r = c.run(t, "init", "--json")
	expect(t, r, exitOK)
	var res cli.InitResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.Validation != "off" || res.DesignDoc != "unchanged" {
		t.Errorf("init after --validation off: %v %+v", err, res)
	}
	// Roles need validation: refused before anything is written.
	expect(t, c.run(t, "init", "--validation", "off", "--workers", "someone"), exitUsage, "only validation on enforces the roles")
	expect(t, c.run(t, "init", "--validation", "mango", "--producers", "someone"), exitUsage, "only validation on enforces the roles")
	expect(t, c.run(t, "init", "--workers", "someone"), exitFailure, "its validation is off", "--validation on")
	expect(t, c.run(t, "init", "--validation", "maybe"), exitUsage, `validation must be on, off, mango or auto, not "maybe"`)
	r = c.run(t, "init", "--validation", "on", "--json")
	expect(t, r, exitOK)
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.Validation != "on" || res.DesignDoc != "upgraded" {
		t.Errorf("init --validation on: %v %+v", err, res)
	}
	// A switch within one schema is no upgrade.
	for _, v := range []string{"off", "on"} {
		r = c.run(t, "init", "--validation", v)
		expect(t, r, exitOK)
		if !strings.Contains(r.stdout, "rewrote design documents") || !strings.Contains(r.stdout, "validation "+v) {
			t.Errorf("init --validation %s after the other: %q", v, r.stdout)
		}
	}
	// Mango validation where the server runs it; elsewhere a clear refusal
	// that leaves the database as it was.
	r = c.run(t, "init", "--validation", "mango")
	if r.code == exitOK {
		if !strings.Contains(r.stdout, "validation is mango") {
			t.Errorf("init --validation mango: %q", r.stdout)
		}
		return
	}
	expect(t, r, exitFailure, "does not run validate_doc_update written as a Mango selector", "--validation on")
	r = c.run(t, "init", "--json")
	expect(t, r, exitOK)
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.Validation != "on" || res.DesignDoc != "unchanged" {
		t.Errorf("init after a refused --validation mango: %v %+v", err, res)
	}
}

// Roles stored by an earlier init refuse validation off or mango too,
// though the flags are not given again: the roles would silently stop
// being enforced.
func TestInitValidationOffRefusedOverStoredRoles(t *testing.T) {
	t.Parallel()
	c := online(t)
	expect(t, c.run(t, "init", "--workers", "someone"), exitOK)
	for _, v := range []string{"off", "mango"} {
		expect(t, c.run(t, "init", "--validation", v), exitUsage, "would leave those roles unenforced", `remove the "couchq" section`)
	}
	r := c.run(t, "init", "--json")
	expect(t, r, exitOK)
	var res cli.InitResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.Validation != "on" {
		t.Errorf("init after the refusals: %v %+v", err, res)
	}
}

// couchq init --language sets the design documents' language, init
// without it keeps it, and a language CouchDB does not know is refused
// before anything is written.
func TestInitLanguage(t *testing.T) {
	t.Parallel()
	c := online(t)
	expect(t, c.run(t, "init", "--language", "quickjs"), exitUsage, `language must be javascript or javascript_quickjs, not "quickjs"`)
	r := c.run(t, "init", "--language", "javascript", "--json")
	expect(t, r, exitOK)
	var res cli.InitResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.Language != "javascript" || res.DesignDoc != "created" {
		t.Errorf("init --language javascript: %v %+v", err, res)
	}
	r = c.run(t, "init")
	expect(t, r, exitOK)
	if !strings.Contains(r.stdout, "up to date") || !strings.Contains(r.stdout, "language javascript") {
		t.Errorf("init after --language javascript: %q", r.stdout)
	}
}

func TestCommandsNeedInit(t *testing.T) {
	t.Parallel()
	c := online(t)
	for _, args := range [][]string{{"ls"}, {"show", "job:x"}, {"enqueue", "--type", "x"}} {
		expect(t, c.run(t, args...), exitFailure, "run 'couchq init' first", "HTTP 404")
	}
}

func TestEnqueueListShow(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)

	r := c.run(t, "enqueue", "--type", "email", "--payload", `{"to":"ada@example.com","tags":["a","b"]}`)
	expect(t, r, exitOK)
	emailID := strings.TrimSpace(r.stdout)
	if !strings.HasPrefix(emailID, "job:") {
		t.Fatalf("enqueue printed %q, want a job id", r.stdout)
	}

	r = c.run(t, "enqueue", "--type", "report", "--in", "1h", "--max-attempts", "3", "--id", "report-1", "--json")
	expect(t, r, exitOK)
	var e cli.Enqueued
	if err := json.Unmarshal([]byte(r.stdout), &e); err != nil {
		t.Fatalf("enqueue --json: %v: %q", err, r.stdout)
	}
	if e.ID != "report-1" || e.Type != "report" || e.Rev == "" || e.DueAt == nil || time.Until(*e.DueAt) < 59*time.Minute {
		t.Errorf("enqueue --json: %+v", e)
	}
	expect(t, c.run(t, "enqueue", "--type", "report", "--id", "report-1"), exitFailure, "job report-1: a document with this id already exists", "HTTP 409")

	r = c.run(t, "ls")
	expect(t, r, exitOK)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[0], "LAST ERROR") {
		t.Fatalf("ls: want a header and 2 rows:\n%s", r.stdout)
	}
	if f := strings.Fields(lines[1]); f[0] != emailID || f[1] != "email" || f[2] != "queued" || f[3] != "0/25" || f[4] != "now" {
		t.Errorf("ls row for the email job: %q", lines[1])
	}
	if f := strings.Fields(lines[2]); f[0] != "report-1" || f[3] != "0/3" || f[4] != "in" {
		t.Errorf("ls row for the report job: %q", lines[2])
	}

	r = c.run(t, "ls", "--type", "email", "--status", "queued", "--json")
	expect(t, r, exitOK)
	var docs []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &docs); err != nil {
		t.Fatalf("ls --json: %v", err)
	}
	if len(docs) != 1 || docs[0]["_id"] != emailID || docs[0]["type"] != "WorkItem" {
		t.Errorf("ls --type email --json: %v", docs)
	}
	r = c.run(t, "ls", "--status", "done")
	expect(t, r, exitOK)
	if strings.TrimSpace(r.stdout) != "no jobs" {
		t.Errorf("ls --status done: %q", r.stdout)
	}

	r = c.run(t, "show", emailID)
	expect(t, r, exitOK)
	for _, want := range []string{emailID, "type      email", "status    queued", "attempts  0 of 25",
		"payload\n  {\n    \"to\": \"ada@example.com\",", "history\n", "enqueued  by cli"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("show does not contain %q:\n%s", want, r.stdout)
		}
	}
	// Flags after the id, and the bare uuid without "job:".
	r = c.run(t, "show", strings.TrimPrefix(emailID, "job:"), "--json")
	expect(t, r, exitOK)
	var raw map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil {
		t.Fatalf("show --json: %v", err)
	}
	if raw["_id"] != emailID || raw["_rev"] == nil || raw["worker"] != "email" {
		t.Errorf("show --json: %v", raw)
	}

	r = c.run(t, "show", "job:nope")
	expect(t, r, exitFailure, "job job:nope not found")
	if strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		t.Errorf("want one line, got:\n%s", r.stderr)
	}
}

// ls --status without --type must find jobs however many jobs of other
// statuses sort before them in the status view.
func TestListByStatusAcrossTypes(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	for range 5 {
		expect(t, c.run(t, "enqueue", "--type", "a"), exitOK)
	}
	expect(t, c.run(t, "enqueue", "--type", "z", "--id", "z-1"), exitOK)

	// Run the z job to completion with the library, as a worker would.
	ctx := context.Background()
	q, err := protocol.New(ctx, srv.Client(t).DB(c.env["COUCHQ_DB"]), protocol.Config{})
	if err != nil {
		t.Fatal(err)
	}
	due, err := q.Due(ctx, "z", 10)
	if err != nil || len(due.Items) != 1 {
		t.Fatalf("due z jobs: %v, %v", due, err)
	}
	it, err := q.Claim(ctx, due.Items[0], "test", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Complete(ctx, it, json.RawMessage(`{"ok":true}`)); err != nil {
		t.Fatal(err)
	}

	r := c.run(t, "ls", "--status", "done", "--limit", "1")
	expect(t, r, exitOK)
	if !strings.Contains(r.stdout, "z-1") || !strings.Contains(r.stdout, "done") {
		t.Errorf("ls --status done --limit 1 missed the done job:\n%s", r.stdout)
	}
	// It is the only one: nothing more to show.
	if strings.Contains(r.stdout, "--limit shows more") {
		t.Errorf("ls --limit 1 of the one done job says there are more:\n%s", r.stdout)
	}
	r = c.run(t, "ls", "--status", "queued", "--limit", "1")
	if !strings.Contains(r.stdout, "(first 1 jobs; --limit shows more)") {
		t.Errorf("ls --limit 1 of several queued jobs does not say there are more:\n%s", r.stdout)
	}
	r = c.run(t, "ls", "--status", "queued", "--limit", "3", "--json")
	var docs []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &docs); err != nil || len(docs) != 3 {
		t.Errorf("ls --status queued --limit 3: %d docs, %v", len(docs), err)
	}
	r = c.run(t, "show", "z-1")
	expect(t, r, exitOK)
	for _, want := range []string{"status    done", "attempts  1 of 25", "finished", "result\n  {\n    \"ok\": true", "claimed   by test, attempt 1"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("show of a done job lacks %q:\n%s", want, r.stdout)
		}
	}
}

func writeJobs(t *testing.T, n int, line func(i int) string) string {
	t.Helper()
	var b strings.Builder
	for i := 1; i <= n; i++ {
		b.WriteString(line(i))
		b.WriteByte('\n')
	}
	path := filepath.Join(t.TempDir(), "jobs.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// jobCount counts the documents other than design documents.
func jobCount(t *testing.T, db string) int {
	t.Helper()
	rows := srv.Client(t).DB(db).AllDocs(context.Background())
	defer rows.Close()
	n := 0
	for rows.Next() {
		if id, _ := rows.ID(); !strings.HasPrefix(id, "_design/") {
			n++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestEnqueueFileBulk(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	c.terminal = true // draws the progress bar on stderr
	path := writeJobs(t, 1000, func(i int) string {
		switch i % 4 {
		case 0:
			return fmt.Sprintf(`{"type":"email","payload":{"n":%d}}`, i)
		case 1:
			return fmt.Sprintf(`{"worker":"resize","payload":[%d],"in":"10s","max_attempts":2}`, i)
		case 2:
			return fmt.Sprintf(`{"payload":"%d","at":"2030-01-01T00:00:00Z"}`, i) // --type default
		default:
			return fmt.Sprintf(`{"type":"ping","id":"ping-%d"}`, i)
		}
	})
	r := c.run(t, "enqueue", "--file", path, "--type", "default")
	expect(t, r, exitOK, "1000/1000")
	if strings.TrimSpace(r.stdout) != "1000 enqueued" {
		t.Errorf("summary: %q", r.stdout)
	}
	if strings.Contains(r.stdout, "[=") {
		t.Errorf("the progress bar went to stdout")
	}
	if n := jobCount(t, c.env["COUCHQ_DB"]); n != 1000 {
		t.Errorf("%d jobs stored, want 1000", n)
	}
	r = c.run(t, "show", "ping-3", "--json")
	expect(t, r, exitOK)
	r = c.run(t, "ls", "--type", "default", "--limit", "1000", "--json")
	var docs []protocol.WorkItem
	if err := json.Unmarshal([]byte(r.stdout), &docs); err != nil || len(docs) != 250 {
		t.Fatalf("ls --type default: %d jobs, %v", len(docs), err)
	}
	if want, _ := time.Parse(time.RFC3339, "2030-01-01T00:00:00Z"); !docs[0].DueAt().Equal(want) {
		t.Errorf("due %v, want %v", docs[0].DueAt(), want)
	}

	// The same ids again: each taken id is reported by line, and the file
	// is refused whole.
	r = c.withStdin(`{"type":"ping","id":"ping-3"}`+"\n"+`{"type":"ping","id":"new"}`+"\n").
		run(t, "enqueue", "--file", "-", "--json")
	expect(t, r, exitUsage, "stdin:1: invalid job: a document with id ping-3 already exists", "1 bad line in stdin; nothing was enqueued")
	if r := c.run(t, "show", "new"); r.code != exitFailure {
		t.Errorf("a line of a refused file was enqueued: %+v", r)
	}
}

func TestEnqueueFileBadLineWritesNothing(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	path := writeJobs(t, 1000, func(i int) string {
		switch i {
		case 700:
			return `{"type":"email","payload":{"n":700}` // unterminated
		case 900:
			return `{"type":"email","in":"ten seconds"}`
		}
		return fmt.Sprintf(`{"type":"email","payload":{"n":%d}}`, i)
	})
	r := c.run(t, "enqueue", "--file", path)
	expect(t, r, exitUsage, path+":700: invalid JSON", path+`:900: invalid "in" "ten seconds"`,
		"2 bad lines in "+path+"; nothing was enqueued")
	if n := jobCount(t, c.env["COUCHQ_DB"]); n != 0 {
		t.Errorf("%d jobs stored after a rejected file, want 0", n)
	}
	// So are lines only the server can refuse: a job waited for that does
	// not exist, one waiting for itself, a site the database does not
	// have, and too many attempts.
	r = c.withStdin(`{"type":"b","id":"good1"}`+"\n"+`{"type":"b","after":["job:nosuch"]}`+"\n"+
		`{"type":"b","id":"self","after":["self"]}`+"\n"+`{"type":"b","max_attempts":3000000000}`+"\n"+
		`{"type":"b","id":"later","after":["good2"]}`+"\n"+`{"type":"b","id":"good2"}`+"\n").run(t, "enqueue", "--file", "-")
	expect(t, r, exitUsage, "stdin:2: invalid job: job ", "job:nosuch", "stdin:3:", "stdin:4:", "max attempts", "stdin:5:", "good2",
		"4 bad lines in stdin; nothing was enqueued")
	if n := jobCount(t, c.env["COUCHQ_DB"]); n != 0 {
		t.Errorf("%d jobs stored after a rejected file, want 0", n)
	}
	// A line that is JSON but not an object says what is wanted.
	r = c.withStdin(`[{"type":"fl"}]`+"\n"+`"fl"`+"\n").run(t, "enqueue", "--file", "-")
	expect(t, r, exitUsage, `stdin:1: want a JSON object such as {"type": "email", "payload": {...}}, got a JSON array`,
		`stdin:2: want a JSON object such as {"type": "email", "payload": {...}}, got a JSON string`)
	// Duplicate ids within the file are caught up front too.
	r = c.withStdin(`{"type":"a","id":"x"}`+"\n"+`{"type":"a","id":"x"}`+"\n").run(t, "enqueue", "--file", "-")
	expect(t, r, exitUsage, `stdin:2: id "x" is already used on line 1`)
	if n := jobCount(t, c.env["COUCHQ_DB"]); n != 0 {
		t.Errorf("%d jobs stored after a rejected file, want 0", n)
	}
}

// Wrong credentials make the server answer 401; neither the password in
// the URL nor the one in the environment may appear in any output.
func TestCredentialsNeverPrinted(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	host := strings.TrimPrefix(strings.TrimPrefix(srv.URL(), "http://"), "https://")
	bad := c.withEnv("COUCHDB_URL", "http://intruder:hunter2-in-url@"+host).withEnv("COUCHDB_PASSWORD", "")
	for _, args := range [][]string{{"ls"}, {"init", "--log-level", "debug"}, {"show", "x"}, {"enqueue", "--type", "x", "--json"}} {
		r := bad.run(t, args...)
		expect(t, r, exitFailure, "HTTP 401")
		if strings.Contains(r.stdout+r.stderr, "hunter2") {
			t.Errorf("couchq %v printed the password:\n%s%s", args, r.stdout, r.stderr)
		}
	}
	bad = c.withEnv("COUCHDB_USER", "intruder").withEnv("COUCHDB_PASSWORD", "hunter2-in-env")
	r := bad.run(t, "ls", "--url", "http://"+host)
	expect(t, r, exitFailure, "HTTP 401")
	if strings.Contains(r.stdout+r.stderr, "hunter2") {
		t.Errorf("printed the password:\n%s", r.stderr)
	}
}

// The demo against the test server: the reset only ever touches couchq_demo*.
func TestDemoWithServer(t *testing.T) {
	t.Parallel()
	db := "couchq_demo_" + strings.TrimPrefix(srv.UniqueDBName(t), "couchq_test_")
	if len(db) > 100 {
		db = db[:100]
	}
	t.Cleanup(func() { _ = srv.Client(t).DestroyDB(context.Background(), db) })
	c := online(t)
	// A link to Fauxton where the server serves it, and where it does not
	// (a release built without it), a line that says so.
	fauxton := "/_utils/#/database/" + db
	if !servesFauxton(t) {
		fauxton = "Fauxton, CouchDB's web UI: not served at "
	}
	for run := range 2 { // the second run starts from a fresh database again
		r := c.run(t, "demo", "--db", db)
		expect(t, r, exitOK)
		for _, want := range []string{"==> couchq init", "==> couchq enqueue --type email", "==> couchq ls", "==> couchq show job:",
			"in 2s", "6 enqueued", fauxton,
			"==> Starting 2 workers", "attempt 1 failed: image store busy", "all 10 of 10 jobs done",
			"failed once and was retried", "retry-scheduled  by ", "done             by "} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("run %d: demo output lacks %q", run, want)
			}
		}
		if n := jobCount(t, db); n != 10 {
			t.Errorf("run %d: %d jobs in the demo database, want 10", run, n)
		}
	}
}

// servesFauxton asks the test server for Fauxton's page.
func servesFauxton(t *testing.T) bool {
	t.Helper()
	u, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.User, u.Path = nil, "/_utils/"
	resp, err := http.Get(u.String())
	if err != nil {
		t.Fatalf("asking for Fauxton: %v", err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// The README's first command: no COUCHDB_URL, so the demo starts its own
// server, a single Apache CouchDB node where there is a local release,
// else PouchDB Server, says which, and stops it again.
func TestDemoLocalServer(t *testing.T) {
	t.Parallel()
	t.Run("pouchdb", func(t *testing.T) {
		t.Parallel()
		if _, err := exec.LookPath("node"); err != nil {
			t.Skip("node is not installed: the demo cannot start PouchDB Server")
		}
		env := map[string]string{localserver.CouchDBHomeEnv: filepath.Join(t.TempDir(), "no-release")}
		r := cmdline{env: env}.run(t, "demo")
		expectDemo(t, r, "==> Starting PouchDB Server", "(no Apache CouchDB release at", "Stopped PouchDB Server")
	})
	t.Run("couchdb", func(t *testing.T) {
		t.Parallel()
		home, err := localserver.FindCouchDB(os.Getenv)
		if err != nil {
			t.Skip(err)
		}
		r := cmdline{env: map[string]string{localserver.CouchDBHomeEnv: home}}.run(t, "demo")
		// A release serves Fauxton from share/www, when it was built with it.
		fauxton := "/_utils/#/database/"
		if _, err := os.Stat(filepath.Join(home, "share", "www", "index.html")); err != nil {
			fauxton = "Fauxton, CouchDB's web UI: not served at "
		}
		expectDemo(t, r, "==> Starting Apache CouchDB from "+home, "Stopped Apache CouchDB", fauxton)
	})
}

// expectDemo checks that a run of the demo with a server of its own
// succeeded, printed what it should, and left no data behind.
func expectDemo(t *testing.T, r result, wants ...string) {
	t.Helper()
	expect(t, r, exitOK)
	for _, want := range append(wants, "listening on http://127.0.0.1:", "==> couchq ls") {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	var dir string
	for _, line := range strings.Split(r.stdout, "\n") {
		if _, after, ok := strings.Cut(line, "data in "); ok {
			dir = strings.TrimSpace(after)
		}
	}
	if dir == "" {
		t.Fatal("demo did not say where its data is")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("demo left its data directory %s behind (%v)", dir, err)
	}
}

// The real binary's exit codes, not just Run's return values.
func TestBinaryExitCodes(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "couchq")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"enqueue", "--type", "x", "--bogus"}, exitUsage, "flag provided but not defined: -bogus"},
		{[]string{"enqueue", "--payload", "{bad"}, exitUsage, "invalid --payload"},
		{[]string{"show", "job:x", "--url", unreachable}, exitFailure, "cannot reach CouchDB"},
		{[]string{"help"}, exitOK, ""},
	} {
		cmd := exec.Command(bin, tc.args...)
		cmd.Env = append(os.Environ(), "COUCHDB_URL="+unreachable)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("couchq %v: exit %d, want %d; stderr:\n%s", tc.args, code, tc.code, stderr.String())
		}
	}
}

// A unique key: the second enqueue says which job holds it, and exits 0;
// a --file counts the duplicates apart.
func TestEnqueueUniqueKey(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	r := c.run(t, "enqueue", "--type", "digest", "--unique-key", "user-42")
	expect(t, r, exitOK)
	if got := strings.TrimSpace(r.stdout); got != "job:unique:digest:user-42" {
		t.Fatalf("unique enqueue printed %q", got)
	}
	r = c.run(t, "enqueue", "--type", "digest", "--unique-key", "user-42", "--payload", `{"other":true}`)
	expect(t, r, exitOK)
	if got := strings.TrimSpace(r.stdout); got != "already queued: job:unique:digest:user-42 (queued)" {
		t.Fatalf("second unique enqueue printed %q", got)
	}
	r = c.run(t, "enqueue", "--type", "digest", "--unique-key", "user-42", "--json")
	expect(t, r, exitOK)
	var e cli.Enqueued
	if err := json.Unmarshal([]byte(r.stdout), &e); err != nil || !e.Duplicate || e.UniqueKey != "user-42" || e.ID != "job:unique:digest:user-42" {
		t.Fatalf("unique enqueue --json: %+v %v: %q", e, err, r.stdout)
	}
	r = c.withStdin(`{"type":"digest","unique_key":"user-42"}`+"\n"+`{"type":"digest","unique_key":"user-7","unique_for":"24h"}`+"\n").
		run(t, "enqueue", "--file", "-")
	expect(t, r, exitOK)
	if got := strings.TrimSpace(r.stdout); got != "1 enqueued, 1 already queued (unique keys)" {
		t.Fatalf("unique enqueue --file printed %q", got)
	}
	r = c.run(t, "show", "job:unique:digest:user-42")
	expect(t, r, exitOK)
	if !strings.Contains(r.stdout, "unique key  user-42") {
		t.Errorf("show does not name the unique key:\n%s", r.stdout)
	}
}

// pause and resume: what they print, and what ls and stats then show.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	expect(t, c.run(t, "enqueue", "--type", "mail"), exitOK)
	r := c.run(t, "pause", "mail", "--reason", "smtp down")
	expect(t, r, exitOK)
	if got := strings.TrimSpace(r.stdout); got != "paused mail: its workers stop claiming it; the jobs they hold finish" {
		t.Fatalf("pause printed %q", got)
	}
	if strings.Contains(r.stderr, "note:") {
		t.Errorf("pause of a type with jobs noted: %s", r.stderr)
	}
	// A type nothing here knows is paused too, with a note (a typo?).
	expect(t, c.run(t, "pause", "emial"), exitOK, "note: no job and no worker of type emial is known here (a typo?)")
	expect(t, c.run(t, "resume", "emial"), exitOK)
	r = c.run(t, "ls")
	expect(t, r, exitOK)
	if !strings.Contains(r.stdout, "paused: mail (their workers claim nothing; 'couchq resume TYPE')") {
		t.Fatalf("ls does not show the paused type:\n%s", r.stdout)
	}
	r = c.run(t, "stats")
	expect(t, r, exitOK)
	if !strings.Contains(r.stdout, "OLDEST DUE  PAUSED") || !regexp.MustCompile(`(?m)^mail +1 +0 +0 +0 +0 +- +paused: smtp down$`).MatchString(r.stdout) {
		t.Fatalf("stats does not show the paused type and why:\n%s", r.stdout)
	}
	r = c.run(t, "stats", "--json")
	var st protocol.Stats
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || len(st.Types) != 1 || st.Types[0].Queue.PausedReason != "smtp down" {
		t.Fatalf("stats --json of the paused type: %v\n%s", err, r.stdout)
	}
	// The control document is shown, and said to be no job.
	r = c.run(t, "show", "control:mail")
	expect(t, r, exitFailure, `control:mail is not a job: its type is "`)
	if !strings.Contains(r.stdout, `"paused": true`) {
		t.Errorf("show of the control document does not show it:\n%s", r.stdout)
	}
	expect(t, c.run(t, "show", "_design/couchq"), exitFailure, "_design/couchq is not a job: its type is missing")
	// Nor do the commands that act on a job take one that is none, or a
	// CouchDB endpoint: the answer says so, as for a job that is missing.
	for _, cmd := range []string{"cancel", "retry", "requeue"} {
		expect(t, c.run(t, cmd, "control:mail"), exitFailure, `control:mail is not a job: its type is "TypeControl"`)
		expect(t, c.run(t, cmd, "_all_docs"), exitFailure, `"_all_docs": not a job's id`)
	}
	r = c.run(t, "resume", "mail", "--json")
	expect(t, r, exitOK)
	var pr pauseResult
	if err := json.Unmarshal([]byte(r.stdout), &pr); err != nil || pr != (pauseResult{Type: "mail", Paused: false}) {
		t.Fatalf("resume --json printed %q (%v)", r.stdout, err)
	}
	r = c.run(t, "ls")
	expect(t, r, exitOK)
	if strings.Contains(r.stdout, "paused") {
		t.Fatalf("ls still shows a paused type:\n%s", r.stdout)
	}
	expect(t, c.run(t, "resume", "never-paused"), exitOK)
}

// --priority on the command line and "priority" on a --file line; show
// prints it.
func TestEnqueuePriority(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	r := c.run(t, "enqueue", "--type", "render", "--priority", "1", "--id", "urgent")
	expect(t, r, exitOK)
	r = c.withStdin(`{"type":"render","id":"later","priority":5}`+"\n"+`{"type":"render","id":"default"}`+"\n").
		run(t, "enqueue", "--file", "-", "--priority", "2")
	expect(t, r, exitOK)
	for id, want := range map[string]string{"urgent": "priority  1", "later": "priority  5", "default": "priority  2"} {
		r = c.run(t, "show", id)
		expect(t, r, exitOK)
		if !strings.Contains(r.stdout, want) {
			t.Errorf("show %s does not contain %q:\n%s", id, want, r.stdout)
		}
	}
	r = c.withStdin(`{"type":"render","priority":"high"}`+"\n").run(t, "enqueue", "--file", "-")
	expect(t, r, exitUsage, `"priority" must be a whole number`)
}

// A worker with --periodic enqueues its ticks; periodic ls shows the
// schedule.
func TestWorkerPeriodicAndPeriodicLs(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	r := c.run(t, "periodic", "ls")
	expect(t, r, exitOK)
	if strings.TrimSpace(r.stdout) != "no periodic schedules" {
		t.Fatalf("periodic ls on a fresh database: %q", r.stdout)
	}
	// Runs of a few seconds until one ran a tick's job: on a loaded machine
	// starting the worker can take most of one run.
	for range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
		r = c.runContext(t, ctx, "worker", "--type", "beat", "--handler", "noop", "--periodic", "beat=@every 1s",
			"--feed-timeout", "1s", "--shutdown-timeout", "1s")
		cancel()
		expect(t, r, exitOK)
		if r = c.run(t, "ls", "--type", "beat", "--status", "done"); strings.Contains(r.stdout, "job:periodic:beat@") {
			break
		}
	}
	r = c.run(t, "periodic", "ls")
	expect(t, r, exitOK)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "NAME") || !strings.Contains(lines[1], "beat") ||
		!strings.Contains(lines[1], "@every 1s") || !strings.Contains(lines[1], "job:periodic:beat@") {
		t.Fatalf("periodic ls:\n%s", r.stdout)
	}
	r = c.run(t, "stats")
	expect(t, r, exitOK)
	if !regexp.MustCompile(`(?m)^PERIODIC +TYPE +SCHEDULE +LAST TICK +NEXT TICK\n+beat +beat +@every 1s `).MatchString(r.stdout) {
		t.Fatalf("stats does not show the schedule:\n%s", r.stdout)
	}
	r = c.run(t, "ls", "--type", "beat", "--status", "done")
	expect(t, r, exitOK)
	if !strings.Contains(r.stdout, "job:periodic:beat@") {
		t.Fatalf("no periodic job ran:\n%s", r.stdout)
	}
	// A schedule no process runs any more is removed from the list.
	r = c.run(t, "periodic", "rm", "beat")
	expect(t, r, exitOK)
	if strings.TrimSpace(r.stdout) != "removed periodic schedule beat" {
		t.Fatalf("periodic rm: %q", r.stdout)
	}
	r = c.run(t, "periodic", "ls")
	expect(t, r, exitOK)
	if strings.TrimSpace(r.stdout) != "no periodic schedules" {
		t.Fatalf("periodic ls after rm: %q", r.stdout)
	}
	expect(t, c.run(t, "periodic", "rm", "beat"), exitFailure, `no periodic schedule "beat"`, "couchq periodic ls")
	expect(t, c.run(t, "periodic", "rm"), exitUsage, "couchq periodic rm NAME")
}

// couchq init on a new database validates with the Mango selector where
// the server runs one, else with the JavaScript function; a database
// validated by the selector takes roles only once validation is on.
func TestInitChoosesValidationForANewDatabase(t *testing.T) {
	t.Parallel()
	c := online(t)
	r := c.run(t, "init", "--json")
	expect(t, r, exitOK)
	var res cli.InitResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatal(err)
	}
	switch res.Validation {
	case "mango":
		expect(t, c.run(t, "init", "--workers", "someone"), exitFailure, "its validation is mango", "--validation on")
		r = c.run(t, "init", "--workers", "someone", "--validation", "on", "--json")
		expect(t, r, exitOK)
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.Validation != "on" {
			t.Errorf("init --workers --validation on: %v %+v", err, res)
		}
	case "on":
		// The server has no Mango validation: asking for it says so, and
		// for a new database leaves none behind.
		expect(t, c.run(t, "init", "--validation", "mango"), exitFailure, "does not run validate_doc_update written as a Mango selector")
		fresh := c.withEnv("COUCHQ_DB", srv.UniqueDBName(t))
		expect(t, fresh.run(t, "init", "--validation", "mango"), exitFailure, "does not run validate_doc_update written as a Mango selector")
		if exists, err := srv.Client(t).DBExists(context.Background(), fresh.env["COUCHQ_DB"]); err != nil || exists {
			t.Errorf("a refused init --validation mango left database %s: %v %v", fresh.env["COUCHQ_DB"], exists, err)
		}
	default:
		t.Errorf("a new database got validation %q, want mango or on", res.Validation)
	}
}
