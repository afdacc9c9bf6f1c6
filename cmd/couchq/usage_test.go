package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// Usage errors are caught before any request: every case runs against a
// URL where nothing listens, so exit 2 (not 1) proves no request was made.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		stdin string
		args  []string
		want  string
	}{
		{"no command", "", nil, "Usage:"},
		{"unknown command", "", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"unknown flag", "", []string{"enqueue", "--type", "x", "--bogus"}, "flag provided but not defined: -bogus"},
		{"flag without value", "", []string{"enqueue", "--type"}, "flag needs an argument: -type"},
		{"bad payload", "", []string{"enqueue", "--type", "x", "--payload", "{bad"}, "invalid --payload"},
		{"payload not JSON", "", []string{"enqueue", "--type", "x", "--payload", "hello"}, "invalid --payload"},
		{"two payload values", "", []string{"enqueue", "--type", "x", "--payload", "1 2"}, "more than one JSON value"},
		{"payload without type", "", []string{"enqueue", "--payload", "{bad"}, "invalid --payload"},
		{"missing type", "", []string{"enqueue"}, "--type is required"},
		{"bad at", "", []string{"enqueue", "--type", "x", "--at", "tomorrow"}, `invalid --at "tomorrow"`},
		{"bad in", "", []string{"enqueue", "--type", "x", "--in", "soon"}, `invalid --in "soon"`},
		{"negative in", "", []string{"enqueue", "--type", "x", "--in", "-5s"}, "must not be negative"},
		{"at and in", "", []string{"enqueue", "--type", "x", "--in", "5s", "--at", "2030-01-01T00:00:00Z"}, "not both"},
		{"negative max attempts", "", []string{"enqueue", "--type", "x", "--max-attempts", "-2"}, "invalid --max-attempts -2"},
		{"max attempts -1", "", []string{"enqueue", "--type", "x", "--max-attempts", "-1"}, "invalid --max-attempts -1"},
		{"after nothing", "", []string{"enqueue", "--type", "x", "--after", ""}, `--after "" names no job`},
		{"empty unique key", "", []string{"enqueue", "--type", "x", "--unique-key", ""}, "--unique-key is empty"},
		{"empty unique key in a file", `{"type":"x","unique_key":""}`, []string{"enqueue", "--file", "-"}, `stdin:1: "unique_key" is empty`},
		{"after commas", "", []string{"enqueue", "--type", "x", "--after", " , "}, `--after " , " names no job`},
		{"reserved id", "", []string{"enqueue", "--type", "x", "--id", "_design/x"}, "reserved by CouchDB"},
		{"stray argument", "", []string{"enqueue", "--type", "x", "payload"}, `unexpected argument "payload"`},
		{"unique id and key", "", []string{"enqueue", "--type", "x", "--id", "a", "--unique-key", "k"}, `give --id or --unique-key, not both`},
		{"unique for without key", "", []string{"enqueue", "--type", "x", "--unique-for", "1h"}, `--unique-for needs a --unique-key`},
		{"unique for too short", "", []string{"enqueue", "--type", "x", "--unique-key", "k", "--unique-for", "10ms"}, `invalid --unique-for "10ms"`},
		{"unique type with colon", "", []string{"enqueue", "--type", "a:b", "--unique-key", "k"}, `cannot contain ':'`},
		{"file and unique key", "", []string{"enqueue", "--file", "-", "--unique-key", "k"}, "with --file"},
		{"priority 0", "", []string{"enqueue", "--type", "x", "--priority", "0"}, `invalid --priority 0: want 1 (runs first) to 5`},
		{"priority 6", "", []string{"enqueue", "--type", "x", "--priority", "6"}, `invalid --priority 6`},
		{"type with a comma", "", []string{"enqueue", "--type", "a,b"}, `invalid "type": job type "a,b" has a comma`},
		{"type with spaces", "", []string{"enqueue", "--type", " sp "}, `job type " sp " has surrounding spaces`},
		{"type with a newline", "", []string{"enqueue", "--type", "nl\nx"}, `job type "nl\nx" contains control characters`},
		{"file line type with a comma", `{"type":"a,b"}`, []string{"enqueue", "--file", "-"}, `stdin:1: invalid "type": job type "a,b" has a comma`},
		{"pause type with a comma", "", []string{"pause", "a,b"}, `job type "a,b" has a comma`},
		{"lease not a duration", "", []string{"worker", "--type", "a", "--handler", "noop", "--lease", "5x"}, `invalid --lease "5x": want a duration such as 90s`},
		{"priority not whole", "", []string{"enqueue", "--type", "x", "--priority", "1.5"}, `invalid --priority "1.5": want a whole number`},
		{"pause without type", "", []string{"pause"}, "missing job TYPE"},
		{"periodic without subcommand", "", []string{"periodic"}, "missing subcommand"},
		{"periodic unknown subcommand", "", []string{"periodic", "delete"}, `unknown subcommand "delete"`},
		{"periodic rm without a name", "", []string{"periodic", "rm"}, "want 'couchq periodic rm NAME'"},
		{"pause two types", "", []string{"pause", "a", "b"}, "want one job TYPE, got 2"},
		{"resume without type", "", []string{"resume"}, "missing job TYPE"},
		{"resume with reason", "", []string{"resume", "a", "--reason", "x"}, "flag provided but not defined: -reason"},
		{"file and payload", "", []string{"enqueue", "--file", "-", "--payload", "1"}, "with --file"},
		{"missing file", "", []string{"enqueue", "--file", "/nonexistent/jobs.jsonl"}, "no such file"},
		{"bad default in", "", []string{"enqueue", "--file", "-", "--in", "soon"}, `invalid --in "soon"`},
		{"bad status", "", []string{"ls", "--status", "stuck"}, "want one of waiting, queued, running, done, failed, cancelled"},
		{"bad limit", "", []string{"ls", "--limit", "0"}, "invalid --limit 0"},
		{"slots ls limit 0", "", []string{"slots", "ls", "tickets", "--limit", "0"}, "invalid --limit 0: must be at least 1"},
		{"slots negative ttl", "", []string{"slots", "reserve", "tickets", "--ttl", "-1m"}, "invalid --ttl -1m0s: must be positive"},
		{"show without id", "", []string{"show"}, "missing job ID"},
		{"show two ids", "", []string{"show", "a", "b"}, "want one job ID"},
		{"bad db name", "", []string{"ls", "--db", "Jobs"}, `invalid --db "Jobs"`},
		{"bad url", "", []string{"ls", "--url", "localhost:5984"}, "invalid --url"},
		{"bad node in url list", "", []string{"ls", "--url", "http://a:1,localhost:5984"}, `invalid --url "localhost:5984"`},
		{"empty url list", "", []string{"ls", "--url", ","}, "invalid --url"},
		{"bad log level", "", []string{"init", "--log-level", "loud"}, `invalid --log-level "loud"`},
		{"demo resets only demo dbs", "", []string{"demo", "--db", "couchq"}, "must start with couchq_demo"},
		{"help for unknown", "", []string{"help", "nope"}, `unknown command "nope"`},
		{"bad file line", `{"type":"a"}` + "\n" + `{"typ":"b"}` + "\n", []string{"enqueue", "--file", "-"}, `stdin:2: unknown field "typ"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := offline().withStdin(tc.stdin).run(t, tc.args...)
			expect(t, r, exitUsage, tc.want)
			if r.code == exitUsage && len(tc.args) > 0 && !strings.Contains(r.stderr, "run 'couchq help") {
				t.Errorf("stderr does not point to help:\n%s", r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("stdout not empty on a usage error: %q", r.stdout)
			}
		})
	}
}

func TestUsageErrorIsOneLine(t *testing.T) {
	t.Parallel()
	r := offline().run(t, "enqueue", "--payload", "{bad")
	expect(t, r, exitUsage)
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "couchq enqueue: ") || !strings.HasSuffix(lines[0], "(run 'couchq help enqueue' for usage)") {
		t.Errorf("want one line: the error and a pointer to help, got:\n%s", r.stderr)
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	r := offline().run(t, "help")
	expect(t, r, exitOK)
	for _, cmd := range []string{"init", "enqueue", "ls", "show", "demo", "--url", "COUCHDB_URL"} {
		if !strings.Contains(r.stdout, cmd) {
			t.Errorf("couchq help does not mention %s", cmd)
		}
	}
	r = offline().run(t, "help", "enqueue")
	expect(t, r, exitOK)
	if !strings.Contains(r.stdout, "--max-attempts") || !strings.Contains(r.stdout, "--file") {
		t.Errorf("couchq help enqueue lacks its flags:\n%s", r.stdout)
	}
	for _, cmd := range []string{"init", "enqueue", "ls", "show", "demo"} {
		r := offline().run(t, cmd, "-h")
		expect(t, r, exitOK, "Usage:", "couchq "+cmd, "--log-level")
	}
}

// The usage text must not show defaults taken from the environment: the
// URL there may carry a password.
func TestHelpHidesEnvironment(t *testing.T) {
	t.Parallel()
	c := offline().withEnv("COUCHDB_URL", "http://admin:pa55word@db.example:5984")
	for _, args := range [][]string{{"ls", "-h"}, {"help", "ls"}, {"help"}} {
		r := c.run(t, args...)
		if strings.Contains(r.stdout+r.stderr, "pa55word") {
			t.Errorf("couchq %v printed the password", args)
		}
	}
}

func TestUnreachableServer(t *testing.T) {
	t.Parallel()
	c := offline().
		withEnv("COUCHDB_URL", "http://admin:s3cr3t-pw@127.0.0.1:1").
		withEnv("COUCHDB_PASSWORD", "other-s3cr3t")
	for _, args := range [][]string{{"init"}, {"ls"}, {"show", "job:x"}, {"enqueue", "--type", "x"}, {"ls", "--log-level", "debug"}} {
		r := c.run(t, args...)
		expect(t, r, exitFailure, "cannot reach CouchDB at http://admin:xxxxx@127.0.0.1:1", "connection refused")
		if strings.Contains(r.stderr, "s3cr3t") {
			t.Errorf("couchq %v printed a password:\n%s", args, r.stderr)
		}
		if strings.Contains(r.stderr, "HTTP 502") {
			t.Errorf("couchq %v reported kivik's made-up 502 for a connection failure:\n%s", args, r.stderr)
		}
	}
}

func TestScrubbing(t *testing.T) {
	t.Parallel()
	secrets := secretsIn(
		[]string{"ls", "--url=http://u:in-arg@h:1", "--url", "http://u:p%40ss@h:1", "http://u:[bad@h",
			"--url", "http://u:node-a@a:1,http://u:node-b@b:1"},
		func(k string) string {
			return map[string]string{"COUCHDB_PASSWORD": "env-pw", "COUCHDB_URL": "https://x:env-url-pw@h"}[k]
		})
	var buf bytes.Buffer
	w := &scrubWriter{w: &buf, secrets: secrets}
	_, _ = w.Write([]byte("in-arg env-pw env-url-pw p@ss p%40ss u:[bad node-a node-b"))
	for _, leak := range []string{"in-arg", "env-pw", "env-url-pw", "p@ss", "p%40ss", "[bad", "node-a", "node-b"} {
		if strings.Contains(buf.String(), leak) {
			t.Errorf("scrubbed output %q still contains %q", buf.String(), leak)
		}
	}
}

// --url may list several nodes: with the first one down, every command
// goes through the next (and the worker command as well, see the cluster
// tier in integration/).
func TestURLListFailsOver(t *testing.T) {
	t.Parallel()
	c := online(t)
	c = c.withEnv("COUCHDB_URL", unreachable+","+c.env["COUCHDB_URL"]).mustInit(t)
	r := c.run(t, "enqueue", "--type", "fo", "--json")
	expect(t, r, exitOK)
	var out struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.ID == "" {
		t.Fatalf("enqueue --json: %q (%v)", r.stdout, err)
	}
	expect(t, c.run(t, "show", out.ID), exitOK)
	// --url repeated is the same list.
	live := c.env["COUCHDB_URL"][len(unreachable)+1:]
	expect(t, c.withEnv("COUCHDB_URL", "").run(t, "show", out.ID, "--url", unreachable, "--url", live), exitOK)
}
