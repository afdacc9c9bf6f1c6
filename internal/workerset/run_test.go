package workerset

import (
	"slices"
	"testing"
)

// The command's environment holds no copy of a password: not the
// variable the worker read it from, nor another that holds it with a
// newline or inside a connection string, nor a URL with it escaped.
func TestCommandEnvLeavesOutEveryCopyOfAPassword(t *testing.T) {
	environ := []string{
		"COUCHDB_PASSWORD=p@ss word",
		"PWNL=p@ss word\n",
		"DSN=host=db user=w password=p@ss word",
		"COUCHDB_URL=http://w:p%40ss%20word@couch:5984",
		"COUCHDB_PASSWORD_FILE=/run/secrets/pw",
		"HOME=/home/w",
		"EMPTY=",
	}
	got := commandEnv(environ, []string{"p@ss word", ""})
	if want := []string{"HOME=/home/w", "EMPTY="}; !slices.Equal(got, want) {
		t.Fatalf("command environment %q, want %q", got, want)
	}
}
