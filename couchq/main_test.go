package couchq_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/couchtest"
)

// exampleDBs are the databases the examples use; TestMain drops them
// before the examples run, so that each starts from nothing, as a reader's
// first run would.
var exampleDBs = []string{"couchq_example", "couchq_example_unique", "couchq_example_periodic", "couchq_example_agent", "couchq_example_slots", "couchq_example_workflow"}

// TestMain starts the test server and hands it to the examples the way a
// deployment hands a server to couchq: COUCHDB_URL, COUCHDB_USER and
// COUCHDB_PASSWORD.
func TestMain(m *testing.M) {
	couchtest.Main(m, func(s *couchtest.Server) {
		user, password := s.Credentials()
		for k, v := range map[string]string{"COUCHDB_URL": s.URL(), "COUCHDB_USER": user, "COUCHDB_PASSWORD": password} {
			if err := os.Setenv(k, v); err != nil {
				panic(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		client, err := s.NewClient()
		if err != nil {
			panic(err)
		}
		for _, db := range exampleDBs {
			if ok, err := client.DBExists(ctx, db); err == nil && ok {
				if err := client.DestroyDB(ctx, db); err != nil {
					panic(fmt.Sprintf("dropping %s: %v", db, err))
				}
			}
		}
	})
}
