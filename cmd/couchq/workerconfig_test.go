package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// writeConfig writes a worker configuration file for the test.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "workers.toml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const goodConfig = `[couchdb]
url = ["http://127.0.0.1:1", "http://127.0.0.2:1"]
user = "couchq-worker"
password_env = "WORKER_PW"
db = "couchq_jobs"

[worker]
shutdown_timeout = "45s"

[defaults]
concurrency = 2
max_attempts = 7

[types.email]
handler = "exec"
exec = "/bin/cat"
lease = "1m"
rate = "10/s"
fleet_concurrency = 5
job_timeout = "10m"

[types.ping]
handler = "noop"
concurrency = 8
retry_delay = "2s"
delete_done = true

[[periodic]]
type = "report"
schedule = "@every 5m"
timezone = "Europe/Berlin"
priority = 1
payload = { format = "pdf" }
`

// --check prints every type's effective settings, the file's defaults and
// the command line's overrides applied, and never the password.
func TestWorkerConfigCheck(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, goodConfig)
	c := cmdline{env: map[string]string{"WORKER_PW": "s3cret-pw"}}
	r := c.run(t, "worker", "--config", path, "--check")
	expect(t, r, exitOK)
	for _, want := range []string{
		"couchdb: http://127.0.0.1:1,http://127.0.0.2:1 database couchq_jobs user couchq-worker password from the environment",
		`type email: handler exec exec "/bin/cat", concurrency 2, lease 1m0s, heartbeat 20s, max_attempts 7, retry backoff attempt^4 s, delete_done false, http_timeout 10s, rate 10/1s, fleet_concurrency 5, job_timeout 10m0s`,
		"type ping: handler noop, concurrency 8, lease 30s, heartbeat 10s, max_attempts 7, retry fixed 2s, delete_done true",
		`periodic report: "@every 5m" in Europe/Berlin, catch up once, priority 1, payload {"format":"pdf"}`,
		"shutdown_timeout 45s",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("--check output lacks %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout+r.stderr, "s3cret-pw") {
		t.Errorf("the password was printed")
	}
	// Flags override the file for every type; --type picks types.
	r = c.run(t, "worker", "--config", path, "--check", "--concurrency", "3", "--type", "ping", "--db", "other")
	expect(t, r, exitOK)
	if !strings.Contains(r.stdout, "type ping: handler noop, concurrency 3,") || strings.Contains(r.stdout, "type email") ||
		strings.Contains(r.stdout, "job_timeout") ||
		!strings.Contains(r.stdout, "database other") {
		t.Errorf("overrides:\n%s", r.stdout)
	}
	r = c.run(t, "worker", "--config", path, "--check", "--job-timeout", "90s")
	expect(t, r, exitOK)
	if strings.Count(r.stdout, ", job_timeout 1m30s") != 2 {
		t.Errorf("--job-timeout over the file, for every type:\n%s", r.stdout)
	}
	// --handler overrides a type's exec handler, its command with it.
	r = c.run(t, "worker", "--config", path, "--check", "--type", "email", "--handler", "noop")
	expect(t, r, exitOK)
	if !strings.Contains(r.stdout, "type email: handler noop,") {
		t.Errorf("--handler over the file's exec:\n%s", r.stdout)
	}
	// The environment overrides the file (a deployment's secret or URL).
	r = c.withEnv("COUCHDB_URL", "http://couch.example:5984").withEnv("COUCHDB_PASSWORD", "x").run(t, "worker", "--config", path, "--check")
	expect(t, r, exitOK)
	if !strings.Contains(r.stdout, "couchdb: http://couch.example:5984 database couchq_jobs user couchq-worker password from $COUCHDB_PASSWORD") {
		t.Errorf("environment over the file:\n%s", r.stdout)
	}
	r = c.run(t, "worker", "--config", path, "--check", "--type", "sms")
	expect(t, r, exitUsage, "has no [types.sms] table")
	r = cmdline{}.run(t, "worker", "--config", path, "--check")
	expect(t, r, exitUsage, "$WORKER_PW is empty or unset")
}

// Mistakes in the file are usage errors naming the file, the line and the
// key (fleet's tests go through every one); the command requires every
// type's handler, having no Go ones.
func TestWorkerConfigErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, body, want string }{
		{"unknown key", "[types.a]\nhandler = \"noop\"\nconcurency = 3\n", ":3: types.a.concurency: unknown key"},
		{"no handler", "[types.a]\nconcurrency = 2\n", ":1: types.a.handler: required"},
		{"heartbeat", "[types.a]\nhandler = \"noop\"\nheartbeat = \"1m\"\n", ":1: types.a: invalid heartbeat 1m0s: must be shorter than the lease"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.body)
			r := offline().run(t, "worker", "--config", path, "--check")
			expect(t, r, exitUsage, path+tc.want)
		})
	}
	r := offline().run(t, "worker", "--check")
	expect(t, r, exitUsage, "--check needs --config FILE")
	r = offline().run(t, "worker", "--config", filepath.Join(t.TempDir(), "none.toml"))
	expect(t, r, exitUsage, "reading --config")
	r = offline().run(t, "worker", "--config", writeConfig(t, goodConfig), "--periodic", "x=@daily")
	expect(t, r, exitUsage, "[[periodic]] tables")
	r = offline().run(t, "worker", "--config", writeConfig(t, "[worker]\nlog_level = \"chatty\"\n[types.a]\nhandler = \"noop\"\n"), "--check")
	expect(t, r, exitUsage, `workers.toml:2: worker.log_level: invalid "chatty"`)
	// --check finds what running would: a handler exec with no command.
	r = offline().run(t, "worker", "--config", writeConfig(t, "[types.e]\nhandler = \"exec\"\n"), "--check")
	expect(t, r, exitUsage, "types.e: no command given")
	// ... a program that is not there, and a CA file that is not one.
	r = offline().run(t, "worker", "--config", writeConfig(t, "[types.e]\nhandler = \"exec\"\nexec = \"/nonexistent/send-email\"\n"), "--check")
	expect(t, r, exitUsage, `command "/nonexistent/send-email"`)
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = offline().run(t, "worker", "--config", writeConfig(t, fmt.Sprintf("[couchdb]\nca_file = %q\n[types.a]\nhandler = \"noop\"\n", notPEM)), "--check")
	expect(t, r, exitUsage, "the CA file "+notPEM+" (--ca-file, ca_file) holds no PEM certificate")
	// The password's source is the one used: $COUCHDB_PASSWORD_FILE.
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = offline().withEnv("COUCHDB_PASSWORD_FILE", pwFile).run(t, "worker", "--config", writeConfig(t, goodConfig), "--check")
	expect(t, r, exitOK)
	if !strings.Contains(r.stdout, "password from file "+pwFile) {
		t.Errorf("--check with $COUCHDB_PASSWORD_FILE:\n%s", r.stdout)
	}
}

// One process runs every type of the file, each with its own settings.
func TestWorkerConfigRunsEveryType(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	path := writeConfig(t, `[types.alpha]
handler = "noop"
concurrency = 1

[types.beta]
handler = "noop"
delete_done = true
`)
	for _, typ := range []string{"alpha", "beta"} {
		expect(t, c.run(t, "enqueue", "--type", typ, "--id", typ+"-1"), exitOK)
	}
	r := c.run(t, "worker", "--config", path, "--drain", "--fallback-poll", "1s")
	expect(t, r, exitOK)
	r = c.run(t, "show", "alpha-1")
	expect(t, r, exitOK)
	if !strings.Contains(r.stdout, "done") {
		t.Errorf("alpha-1 not done:\n%s", r.stdout)
	}
	// beta deletes its finished jobs; alpha keeps them.
	r = c.run(t, "show", "beta-1")
	expect(t, r, exitFailure)
}

// With a configuration file each type drains on its own: a job of one
// type that releases work of another, whose worker drained already, does
// not end the process with that work due.
func TestWorkerConfigDrainsWorkOneTypeReleasesForAnother(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	path := writeConfig(t, `[types.first]
handler = "exec"
exec = "sleep 2"

[types.then]
handler = "noop"
`)
	expect(t, c.run(t, "enqueue", "--type", "first", "--id", "first-1"), exitOK)
	expect(t, c.run(t, "enqueue", "--type", "then", "--id", "then-1", "--after", "first-1"), exitOK)
	r := c.run(t, "worker", "--config", path, "--drain", "--fallback-poll", "1s")
	expect(t, r, exitOK)
	for _, id := range []string{"first-1", "then-1"} {
		r := c.run(t, "show", id)
		expect(t, r, exitOK)
		if !regexp.MustCompile(`(?m)^\s*status\s+done$`).MatchString(r.stdout) {
			t.Errorf("%s not done when the drain ended:\n%s", id, r.stdout)
		}
	}
}
