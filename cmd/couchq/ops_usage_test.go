package main

import (
	"strings"
	"testing"
)

// The ops commands' usage errors are caught before any request (the URL
// has nothing listening, so exit 2 rather than 1 proves it).
func TestOpsUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"stats", "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"stats", "--since", "soon"}, `invalid --since "soon"`},
		{[]string{"stats", "--since", "-5h"}, "must not be negative"},
		{[]string{"stats", "--until", "yesterday"}, `invalid --until "yesterday"`},
		{[]string{"stats", "--since", "2030-01-02T00:00:00Z", "--until", "2030-01-01T00:00:00Z"}, "is not before --until"},
		{[]string{"stats", "mail"}, `unexpected argument "mail"`},
		{[]string{"retry"}, "missing job ID"},
		{[]string{"retry", "a", "b"}, "want one job ID"},
		{[]string{"retry", "--failed"}, "--failed needs --type"},
		{[]string{"retry", "--type", "x"}, "--type goes with --failed"},
		{[]string{"retry", "--failed", "--type", "x", "job:1"}, "not both"},
		{[]string{"retry", "--bogus", "x"}, "flag provided but not defined: -bogus"},
		{[]string{"cancel"}, "missing job ID"},
		{[]string{"cancel", "a", "b"}, "want one job ID"},
		{[]string{"cancel", "--reason"}, "flag needs an argument: -reason"},
		{[]string{"requeue"}, "missing job ID"},
		{[]string{"requeue", ""}, "empty job ID"},
		{[]string{"requeue", "--force=maybe", "x"}, "invalid boolean value"},
		{[]string{"purge"}, "--status is required"},
		{[]string{"purge", "--status", "done"}, "--older-than is required"},
		{[]string{"purge", "--status", "running", "--older-than", "7d"}, `invalid --status "running": only finished jobs are purged`},
		{[]string{"purge", "--status", "stuck", "--older-than", "7d"}, `invalid --status "stuck"`},
		{[]string{"purge", "--status", "done", "--older-than", "a week"}, `invalid --older-than "a week"`},
		{[]string{"purge", "--status", "done", "--older-than", "-7d"}, `invalid --older-than "-7d"`},
		{[]string{"purge", "--status", "done", "--older-than", "7d", "extra"}, `unexpected argument "extra"`},
		{[]string{"serve", "--addr", "9090"}, `invalid --addr "9090"`},
		{[]string{"serve", "--addr", "127.0.0.1:99999"}, "not a number from 0 to 65535"},
		{[]string{"serve", "--cache", "-1s"}, "must not be negative"},
		{[]string{"serve", "--settle", "soon"}, `invalid --settle "soon": want a duration such as 90s`},
		{[]string{"serve", "extra"}, `unexpected argument "extra"`},
		{[]string{"stats", "--json", "--db", "Bad"}, `invalid --db "Bad"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			r := offline().run(t, tc.args...)
			expect(t, r, exitUsage, tc.want, "run 'couchq help "+tc.args[0]+"' for usage")
			if r.stdout != "" {
				t.Errorf("stdout not empty on a usage error: %q", r.stdout)
			}
			if n := strings.Count(strings.TrimSpace(r.stderr), "\n"); n != 0 {
				t.Errorf("want one line: the error and a pointer to help, got:\n%s", r.stderr)
			}
		})
	}
}

// With no server, every ops command says it cannot reach CouchDB, where,
// and exits 1.
func TestOpsUnreachableServer(t *testing.T) {
	t.Parallel()
	c := offline().withEnv("COUCHDB_URL", "http://admin:s3cr3t@127.0.0.1:1")
	for _, args := range [][]string{
		{"stats"}, {"stats", "--json"}, {"retry", "job:x"}, {"retry", "--failed", "--type", "x"},
		{"cancel", "job:x"}, {"requeue", "job:x"}, {"purge", "--status", "done", "--older-than", "7d"},
		{"serve", "--addr", "127.0.0.1:0"},
	} {
		r := c.run(t, args...)
		expect(t, r, exitFailure, "couchq "+args[0]+": cannot reach CouchDB at http://admin:xxxxx@127.0.0.1:1", "connection refused")
		if strings.Contains(r.stderr, "s3cr3t") || strings.Contains(r.stderr, "HTTP 502") {
			t.Errorf("couchq %v:\n%s", args, r.stderr)
		}
	}
}

// The ops commands need the database couchq init creates.
func TestOpsNeedInit(t *testing.T) {
	t.Parallel()
	c := online(t)
	for _, args := range [][]string{{"stats"}, {"retry", "x"}, {"cancel", "x"}, {"requeue", "x"},
		{"purge", "--status", "done", "--older-than", "1d"}, {"serve", "--addr", "127.0.0.1:0"}} {
		expect(t, c.run(t, args...), exitFailure, "run 'couchq init' first", "HTTP 404")
	}
}

func TestOpsHelp(t *testing.T) {
	t.Parallel()
	r := offline().run(t, "help")
	expect(t, r, exitOK)
	for _, cmd := range []string{"stats", "retry", "cancel", "requeue", "purge", "serve"} {
		if !strings.Contains(r.stdout, "\t"+cmd+" ") {
			t.Errorf("couchq help does not list %s", cmd)
		}
		r := offline().run(t, cmd, "-h")
		expect(t, r, exitOK, "Usage:", "couchq "+cmd, "--json")
	}
}
