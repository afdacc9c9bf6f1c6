package localserver

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func testLogger(t *testing.T) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Logger()
}

func do(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestStartWriteRestartStop(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute) // includes a possible npm ci
	defer cancel()
	dataDir := t.TempDir()
	srv, err := Start(ctx, Options{DataDir: dataDir, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })

	if !strings.HasPrefix(srv.URL(), "http://127.0.0.1:") || srv.Port() == 0 {
		t.Fatalf("URL() = %q, Port() = %d", srv.URL(), srv.Port())
	}
	if srv.DataDir() != dataDir {
		t.Fatalf("DataDir() = %q, want %q", srv.DataDir(), dataDir)
	}
	if code, body := do(t, http.MethodPut, srv.URL()+"/things", ""); code != http.StatusCreated {
		t.Fatalf("create db: %d %s", code, body)
	}
	if code, body := do(t, http.MethodPut, srv.URL()+"/things/a", `{"v":1}`); code != http.StatusCreated {
		t.Fatalf("put doc: %d %s", code, body)
	}
	// pouchdb-server must run with cwd = data dir: its log and config land there, not in the repo.
	for _, f := range []string{"config.json", "log.txt"} {
		if _, err := os.Stat(filepath.Join(dataDir, f)); err != nil {
			t.Errorf("expected %s in data dir: %v", f, err)
		}
	}

	url := srv.URL()
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if srv.URL() != url {
		t.Fatalf("Restart moved the server from %s to %s", url, srv.URL())
	}
	code, body := do(t, http.MethodGet, srv.URL()+"/things/a", "")
	if code != http.StatusOK || !strings.Contains(body, `"v":1`) {
		t.Fatalf("doc after restart: %d %s", code, body)
	}

	if err := srv.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get(srv.URL() + "/"); err == nil {
		t.Fatal("server still answers after Stop")
	}
	if err := srv.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

func TestStartFailsWhenPortTaken(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	first, err := Start(ctx, Options{DataDir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Stop(context.Background()) })

	// An explicit port is never changed: the second server must fail, and say why.
	_, err = Start(ctx, Options{DataDir: t.TempDir(), Port: first.Port(), Logger: testLogger(t)})
	if err == nil {
		t.Fatal("second server on the same port started")
	}
	if !strings.Contains(err.Error(), "already in use") {
		t.Fatalf("error does not carry the server's output: %v", err)
	}
}

func TestModulePath(t *testing.T) {
	for in, want := range map[string]string{
		"module github.com/couchq/couchq\n\ngo 1.26\n": "github.com/couchq/couchq",
		"// x\nmodule \"github.com/couchq/couchq\"\n":  "github.com/couchq/couchq",
		"modulex foo\n": "",
	} {
		if got := modulePath([]byte(in)); got != want {
			t.Errorf("modulePath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestToolsDirOverride(t *testing.T) {
	t.Setenv(DirEnv, "/some/where")
	if dir, err := ToolsDir(); err != nil || dir != "/some/where" {
		t.Fatalf("ToolsDir() = %q, %v", dir, err)
	}
}

func TestToolsDirFromRepo(t *testing.T) {
	t.Setenv(DirEnv, "")
	dir, err := ToolsDir()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "package.json")); err != nil {
		t.Fatalf("ToolsDir() = %q: %v", dir, err)
	}
}

// A couchq binary run outside its repository installs PouchDB Server from
// the pinned project it carries, in the user's cache.
func TestToolsDirOutsideTheRepo(t *testing.T) {
	repoDir, err := ToolsDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(DirEnv, "")
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	t.Chdir(t.TempDir())
	for range 2 { // the second time, over the files of the first
		dir, err := ToolsDir()
		if err != nil {
			t.Fatalf("ToolsDir outside the repository: %v", err)
		}
		if !strings.HasPrefix(dir, filepath.Join(cache, "couchq", "pouchdb-server-")) {
			t.Errorf("ToolsDir outside the repository = %s, want a directory under %s", dir, cache)
		}
		for _, name := range []string{"package.json", "package-lock.json"} {
			have, err := os.ReadFile(filepath.Join(dir, name))
			want, werr := os.ReadFile(filepath.Join(repoDir, name))
			if err != nil || werr != nil || !bytes.Equal(have, want) {
				t.Errorf("%s in %s: not the repository's (%v, %v)", name, dir, err, werr)
			}
		}
	}
}

func TestTailKeepsTheEnd(t *testing.T) {
	tl := NewTail(8)
	for _, s := range []string{"hello ", "wide ", "world"} {
		if n, err := tl.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if got := tl.String(); got != "de world" {
		t.Fatalf("tail = %q, want the last 8 bytes %q", got, "de world")
	}
}

// A server started with RestartOnCrash that dies on its own answers again
// on the same URL, with its databases.
func TestRestartOnCrash(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	srv, err := Start(ctx, Options{DataDir: t.TempDir(), Logger: testLogger(t), RestartOnCrash: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	if code, body := do(t, http.MethodPut, srv.URL()+"/things", ""); code != http.StatusCreated {
		t.Fatalf("create db: %d %s", code, body)
	}
	time.Sleep(time.Second) // what the server has written out; a crash loses the rest
	srv.mu.Lock()
	crashed := srv.proc
	srv.mu.Unlock()
	if err := syscall.Kill(-crashed.cmd.Process.Pid, syscall.SIGKILL); err != nil { // as a crash, not Stop
		t.Fatal(err)
	}
	<-crashed.done
	deadline := time.Now().Add(time.Minute)
	for {
		srv.mu.Lock()
		restarted := srv.proc != nil && srv.proc != crashed
		srv.mu.Unlock()
		if restarted && srv.answers(ctx) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("PouchDB Server not started again a minute after it crashed")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, body := do(t, http.MethodGet, srv.URL()+"/things", ""); code != http.StatusOK {
		t.Fatalf("the database after the restart: %d %s", code, body)
	}
}
