package main

import (
	"context"
	"strings"
	"testing"
)

func noEnv(string) string { return "" }

func TestRunExitCodes(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		code int
		err  string
	}{
		{"help", []string{"-h"}, 0, "usage: couchq-bench"},
		{"unknown flag", []string{"--nope"}, 2, "flag provided but not defined"},
		{"bad section", []string{"--sections", "9"}, 2, "unknown section 9"},
		// Refused before any connection is made.
		{"remote server", []string{"--url", "http://192.0.2.1:5984", "--sections", "1"}, 1, "loopback"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			code := run(context.Background(), c.args, noEnv, &stdout, &stderr)
			if code != c.code {
				t.Fatalf("exit code %d, want %d; stderr:\n%s", code, c.code, stderr.String())
			}
			if !strings.Contains(stderr.String(), c.err) {
				t.Fatalf("stderr lacks %q:\n%s", c.err, stderr.String())
			}
			if stdout.Len() != 0 {
				t.Fatalf("stdout: %s", stdout.String())
			}
		})
	}
}

func TestPasswordStaysOutOfErrors(t *testing.T) {
	var stdout, stderr strings.Builder
	run(context.Background(), []string{"--url", "http://admin:s3cret@192.0.2.1:5984"}, noEnv, &stdout, &stderr)
	if strings.Contains(stderr.String()+stdout.String(), "s3cret") {
		t.Fatalf("the password leaked:\n%s", stderr.String())
	}
}
