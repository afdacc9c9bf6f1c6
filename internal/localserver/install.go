package localserver

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"

	pouchdbserver "github.com/couchq/couchq/tools/pouchdb-server"
)

const (
	// ModulePath identifies the couchq repository root when walking up from the working directory.
	ModulePath = "github.com/couchq/couchq"
	// DirEnv overrides where the pouchdb-server npm project lives (the directory holding package.json).
	DirEnv = "COUCHQ_POUCHDB_DIR"

	// stampName records the sha256 of the package-lock.json that node_modules was installed from.
	// It lives inside node_modules so that deleting node_modules also invalidates it; the Makefile's
	// setup target reads and writes the same file in the same format.
	stampName = ".couchq-lock.sha256"
	// lockName is flocked while npm ci runs: `go test ./...` starts several test binaries at once
	// and each of them may decide that an install is needed.
	lockName = ".npm-ci.lock"
)

// FindRepoRoot walks up from the working directory to the directory whose go.mod declares ModulePath.
func FindRepoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding couchq repo root: %w", err)
	}
	for dir := wd; ; {
		mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && modulePath(mod) == ModulePath {
			return dir, nil
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("finding couchq repo root: %w", err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("finding couchq repo root: no go.mod for module %s above %s (set %s to the tools/pouchdb-server directory)", ModulePath, wd, DirEnv)
		}
		dir = parent
	}
}

func modulePath(gomod []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if rest, ok := strings.CutPrefix(line, "module"); ok && (rest == "" || rest[0] == ' ' || rest[0] == '\t') {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

// ToolsDir returns the pouchdb-server npm project directory: $COUCHQ_POUCHDB_DIR if set, else
// <repo root>/tools/pouchdb-server, else (a couchq binary run outside its repository) a directory
// under the user's cache that holds the same pinned project, written there the first time.
func ToolsDir() (string, error) {
	if dir := os.Getenv(DirEnv); dir != "" {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return "", fmt.Errorf("resolving %s=%q: %w", DirEnv, dir, err)
		}
		return abs, nil
	}
	root, err := FindRepoRoot()
	if err != nil {
		dir, cacheErr := cachedToolsDir()
		if cacheErr != nil {
			return "", fmt.Errorf("%w; and %w", err, cacheErr)
		}
		return dir, nil
	}
	return filepath.Join(root, "tools", "pouchdb-server"), nil
}

// cachedToolsDir writes the pinned pouchdb-server project this binary
// carries to a directory of the user's cache named after its lock file, so
// that another couchq's pins install beside it, and returns it.
func cachedToolsDir() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("finding a directory to install PouchDB Server in (set %s): %w", DirEnv, err)
	}
	lock, err := pouchdbserver.Files.ReadFile("package-lock.json")
	if err != nil {
		return "", fmt.Errorf("reading the pinned PouchDB Server project: %w", err)
	}
	sum := sha256.Sum256(lock)
	dir := filepath.Join(cache, "couchq", "pouchdb-server-"+hex.EncodeToString(sum[:6]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating %s for PouchDB Server: %w", dir, err)
	}
	for _, name := range []string{"package.json", "package-lock.json"} {
		want, err := pouchdbserver.Files.ReadFile(name)
		if err != nil {
			return "", fmt.Errorf("reading the pinned PouchDB Server project: %w", err)
		}
		path := filepath.Join(dir, name)
		if have, err := os.ReadFile(path); err == nil && bytes.Equal(have, want) {
			continue
		}
		if err := writeFileAtomic(path, want); err != nil {
			return "", fmt.Errorf("writing %s: %w", path, err)
		}
	}
	return dir, nil
}

func binPath(dir string) string { return filepath.Join(dir, "node_modules", ".bin", "pouchdb-server") }

// EnsureInstalled runs `npm ci` in ToolsDir when node_modules/.bin/pouchdb-server is missing or
// package-lock.json changed since the last install. Concurrent callers (in this or other processes)
// are serialized with a file lock, and the check is repeated once the lock is held.
func EnsureInstalled(ctx context.Context, logger zerolog.Logger) error {
	dir, err := ToolsDir()
	if err != nil {
		return err
	}
	want, err := lockHash(dir)
	if err != nil {
		return err
	}
	if installed(dir, want) {
		return nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return fmt.Errorf("installing PouchDB Server in %s: npm not found on PATH (install Node.js >= 18, or set COUCHDB_URL to use an existing CouchDB): %w", dir, err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		return fmt.Errorf("installing PouchDB Server in %s: node not found on PATH (install Node.js >= 18): %w", dir, err)
	}

	unlock, err := lockFile(ctx, filepath.Join(dir, lockName), logger)
	if err != nil {
		return fmt.Errorf("installing PouchDB Server in %s: %w", dir, err)
	}
	defer unlock()
	if installed(dir, want) { // another process installed it while we waited for the lock
		return nil
	}

	logger.Info().Str("dir", dir).Msg("installing PouchDB Server with npm ci (once per package-lock.json change)")
	start := time.Now()
	out := NewTail(16 << 10)
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("installing PouchDB Server: npm ci in %s: %w\n%s", dir, err, out.String())
	}
	if _, err := os.Stat(binPath(dir)); err != nil {
		return fmt.Errorf("installing PouchDB Server: npm ci in %s succeeded but %w", dir, err)
	}
	if err := writeFileAtomic(filepath.Join(dir, "node_modules", stampName), []byte(want+"\n")); err != nil {
		return fmt.Errorf("installing PouchDB Server: writing install stamp: %w", err)
	}
	logger.Info().Str("dir", dir).Dur("took", time.Since(start)).Msg("PouchDB Server installed")
	return nil
}

func lockHash(dir string) (string, error) {
	lock, err := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		return "", fmt.Errorf("reading PouchDB Server lock file: %w", err)
	}
	sum := sha256.Sum256(lock)
	return hex.EncodeToString(sum[:]), nil
}

// installed compares hashes rather than mtimes because git does not preserve mtimes.
func installed(dir, wantHash string) bool {
	if _, err := os.Stat(binPath(dir)); err != nil {
		return false
	}
	stamp, err := os.ReadFile(filepath.Join(dir, "node_modules", stampName))
	return err == nil && strings.TrimSpace(string(stamp)) == wantHash
}

func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
