package couchtest

import (
	"slices"
	"testing"

	"github.com/couchq/couchq/internal/localserver"
)

// The CouchDB container runs with the local nodes' scheduler flags, where
// its Erlang VM reads them, and with the admin it is given.
func TestDockerContainerRunsWithoutBusyWaiting(t *testing.T) {
	opts := dockerRunOptions("admin", "secret")
	for _, want := range []string{"ERL_FLAGS=" + localserver.SchedulerFlags, "COUCHDB_USER=admin", "COUCHDB_PASSWORD=secret"} {
		if !slices.Contains(opts.Env, want) {
			t.Errorf("container environment %q lacks %q", opts.Env, want)
		}
	}
}
