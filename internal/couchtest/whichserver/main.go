// Command whichserver prints which server `make test` will run the tests against, and why
// (see couchtest.Plan). It starts nothing.
package main

import (
	"context"
	"fmt"
	"time"

	"github.com/couchq/couchq/internal/couchtest"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fmt.Println(couchtest.Plan(ctx))
}
