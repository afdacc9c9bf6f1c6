//go:build unix

package localserver

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestLockFileSerializes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	unlock, err := lockFile(t.Context(), path, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}

	// flock locks belong to the open file description, so a second open in the same process
	// contends exactly like another test binary would.
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := lockFile(ctx, path, zerolog.Nop()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lock while held: err = %v, want deadline exceeded", err)
	}

	unlock()
	unlock2, err := lockFile(t.Context(), path, zerolog.Nop())
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	unlock2()
}
