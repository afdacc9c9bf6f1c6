package couchtest

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/couchq/couchq/internal/localserver"
)

// Plan says, in one line, which server a test run will use and why the ones before it in the
// order of choice will not be used, and whether the cluster tier runs. It checks what Start
// checks (the environment, the local release, the Docker engine) without starting anything,
// so that `make test` can print it first: go test shows a passing package's own output only
// with -v.
func Plan(ctx context.Context) string {
	var tier string
	home, relErr := localserver.FindCouchDB(os.Getenv)
	switch {
	case os.Getenv("COUCHQ_SKIP_CLUSTER") != "":
		tier = "the cluster tier does not run: COUCHQ_SKIP_CLUSTER is set"
	case relErr != nil:
		tier = "the CouchDB and cluster tiers do not run: no local Apache CouchDB release"
	default:
		tier = "the cluster tier runs on a 3-node cluster started from " + home
	}
	if os.Getenv(EnvURL) != "" {
		return fmt.Sprintf("test server: %s (%s is set); %s", EnvURL, EnvURL, tier)
	}
	force := os.Getenv(EnvServer)
	why := []string{EnvURL + " is unset"}
	if force == "" || force == ServerCouchDB {
		if relErr == nil {
			return fmt.Sprintf("test server: a single Apache CouchDB node started from %s (%s); %s",
				home, strings.Join(why, "; "), tier)
		}
		why = append(why, relErr.Error())
	} else {
		why = append(why, EnvServer+"="+force)
	}
	if force == "" || force == ServerDocker {
		_, err := dockerPool(ctx)
		if err == nil {
			return fmt.Sprintf("test server: CouchDB %s:%s in Docker (%s); %s", couchImage, couchTag, strings.Join(why, "; "), tier)
		}
		why = append(why, "no Docker engine answers ("+err.Error()+")")
	}
	return fmt.Sprintf("test server: PouchDB Server from tools/pouchdb-server (%s); %s", strings.Join(why, "; "), tier)
}
