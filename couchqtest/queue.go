package couchqtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-kivik/kivik/v4"

	"github.com/couchq/couchq/couchq"
)

// NewQueue creates a database of the test's own on srv, installs couchq's
// design documents in it and opens a client on it with cfg; the database
// is deleted when the test ends. Its name is couchqtest_, the test's name
// and a random suffix, so tests run in parallel apart. srv's user must be
// allowed to create databases (a server admin). A failure fails the test.
func NewQueue(ctx context.Context, t testing.TB, srv *couchq.Server, cfg couchq.Config) *couchq.Client {
	t.Helper()
	if srv == nil {
		t.Fatalf("couchqtest.NewQueue: srv is nil (connect with couchq.Connect)")
		return nil
	}
	name := testDBName(t)
	if err := srv.Init(ctx, name, couchq.InitOptions{}); err != nil {
		t.Fatalf("couchqtest.NewQueue: creating the test database %s: %v", name, err)
		return nil
	}
	q, err := srv.Open(ctx, name, cfg)
	if err != nil {
		t.Fatalf("couchqtest.NewQueue: opening the test database %s: %v", name, err)
		return nil
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := q.DB().Client().DestroyDB(cctx, name); err != nil && kivik.HTTPStatus(err) != http.StatusNotFound {
			t.Logf("couchqtest: deleting the test database %s: %v", name, err)
		}
	})
	return q
}

// testDBName is a database name for t: CouchDB's rules (lower-case
// letters, digits, _ and -, starting with a letter), the test's name and
// a random suffix.
func testDBName(t testing.TB) string {
	var b strings.Builder
	b.WriteString("couchqtest_")
	for _, r := range strings.ToLower(t.Name()) {
		if b.Len() >= 100 {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix) // never fails: crypto/rand panics instead
	return b.String() + "_" + hex.EncodeToString(suffix)
}
