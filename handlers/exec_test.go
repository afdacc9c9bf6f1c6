//go:build unix

package handlers_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/couchq/couchq/handlers"
	"github.com/couchq/couchq/worker"
)

func shell(script string) *handlers.Exec {
	return &handlers.Exec{Argv: []string{"sh", "-c", script}}
}

func TestExecJSONStdoutIsResult(t *testing.T) {
	job := newJob(t, `{"n":1}`)
	if err := shell(`echo '{"ok": true, "n": 41}'`).Handle(context.Background(), job); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if got := string(job.Result()); got != `{"ok": true, "n": 41}` {
		t.Fatalf("result = %s", got)
	}
}

func TestExecTextStdoutIsStringResult(t *testing.T) {
	job := newJob(t, ``)
	if err := shell(`echo hello world; echo`).Handle(context.Background(), job); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if got := string(job.Result()); got != `"hello world"` {
		t.Fatalf("result = %s, want \"hello world\"", got)
	}
}

func TestExecEmptyStdoutRecordsNoResult(t *testing.T) {
	job := newJob(t, ``)
	if err := shell(`true`).Handle(context.Background(), job); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if job.Result() != nil {
		t.Fatalf("result = %s, want none", job.Result())
	}
}

func TestExecJobOnStdin(t *testing.T) {
	job := newJob(t, `{"to":"a@example.com"}`)
	if err := (&handlers.Exec{Argv: []string{"cat"}}).Handle(context.Background(), job); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	var got struct {
		ID          string          `json:"id"`
		Type        string          `json:"type"`
		Attempt     int             `json:"attempt"`
		MaxAttempts int             `json:"max_attempts"`
		Payload     json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(job.Result(), &got); err != nil {
		t.Fatalf("decoding result %s: %v", job.Result(), err)
	}
	if got.ID != job.ID || got.Type != "test" || got.Attempt != 2 || got.MaxAttempts != 5 || string(got.Payload) != `{"to":"a@example.com"}` {
		t.Fatalf("stdin = %s", job.Result())
	}
}

func TestExecEnvironment(t *testing.T) {
	t.Setenv("COUCHQ_TEST_INHERITED", "kept")
	t.Setenv("COUCHQ_JOB_ID", "stale")
	job := newJob(t, ``)
	script := `printf '{"id":"%s","type":"%s","attempt":"%s","max":"%s","inherited":"%s"}' ` +
		`"$COUCHQ_JOB_ID" "$COUCHQ_JOB_TYPE" "$COUCHQ_ATTEMPT" "$COUCHQ_MAX_ATTEMPTS" "$COUCHQ_TEST_INHERITED"`
	if err := shell(script).Handle(context.Background(), job); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	got := decodeResult[map[string]string](t, job)
	want := map[string]string{"id": job.ID, "type": "test", "attempt": "2", "max": "5", "inherited": "kept"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

func TestExecNonZeroExitFailsWithStderrTail(t *testing.T) {
	// About 9 KiB of stderr: only the end may be kept.
	script := `i=0; while [ $i -lt 1000 ]; do echo "noise line $i" >&2; i=$((i+1)); done; echo "fatal: disk full" >&2; exit 3`
	err := shell(script).Handle(context.Background(), newJob(t, ``))
	var ee *handlers.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("err = %v, want an ExitError", err)
	}
	if isPermanent(err) {
		t.Fatalf("err %v is permanent, want a retryable failure", err)
	}
	if ee.ExitCode != 3 || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("exit code %d, error %q: want 3", ee.ExitCode, err)
	}
	if !strings.Contains(err.Error(), "fatal: disk full") {
		t.Fatalf("error lacks the end of stderr: %q", err)
	}
	if strings.Contains(err.Error(), "noise line 0\n") || len(ee.Stderr) > 2048+3 {
		t.Fatalf("stderr not bounded to its tail: %d bytes", len(ee.Stderr))
	}
}

func TestExecMissingProgramFailsAttempt(t *testing.T) {
	err := (&handlers.Exec{Argv: []string{"/nonexistent/couchq-program"}}).Handle(context.Background(), newJob(t, ``))
	if err == nil || isPermanent(err) {
		t.Fatalf("err = %v, want a retryable failure", err)
	}
}

func TestExecWithoutCommandIsPermanent(t *testing.T) {
	err := (&handlers.Exec{}).Handle(context.Background(), newJob(t, ``))
	if !isPermanent(err) {
		t.Fatalf("err = %v, want a permanent failure", err)
	}
}

func TestExecHugeStdoutIsBounded(t *testing.T) {
	job := newJob(t, ``)
	// 20 MB of output: far beyond both the limit and any pipe buffer, so
	// the command only finishes if its output keeps being drained.
	if err := shell(`yes couchq | head -c 20000000`).Handle(context.Background(), job); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	var out string
	if err := json.Unmarshal(job.Result(), &out); err != nil {
		t.Fatalf("result is not a string: %v", err)
	}
	if len(out) != 64<<10 || !strings.HasPrefix(out, "couchq\ncouchq\n") {
		t.Fatalf("result is %d bytes starting %.20q, want the first 64 KiB", len(out), out)
	}
}

func TestExecCancelKillsCommand(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)

	start := time.Now()
	err := shell(`sleep 30`).Handle(ctx, newJob(t, ``))
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Handle returned after %s, want soon after cancellation", d)
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestExecCancelKillsProcessGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Both the shell and its child ignore SIGTERM, so only the SIGKILL
	// after the grace period, sent to the whole group, can stop them.
	script := `trap '' TERM; sleep 30 & echo $! > ` + pidFile + `; wait`
	h := &handlers.Exec{Argv: []string{"sh", "-c", script}, KillGrace: 300 * time.Millisecond}

	done := make(chan error, 1)
	go func() { done <- h.Handle(ctx, newJob(t, ``)) }()
	childPID := waitForPID(t, pidFile)
	cancel()

	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Handle did not return after cancellation")
	}
	waitDead(t, childPID)
}

func TestExecKillsLeftoversAfterSuccess(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	// The background sleep keeps stdout open after the shell exits.
	script := `sleep 30 & echo $! > ` + pidFile + `; echo done`
	h := &handlers.Exec{Argv: []string{"sh", "-c", script}, KillGrace: 200 * time.Millisecond}
	job := newJob(t, ``)

	start := time.Now()
	if err := h.Handle(context.Background(), job); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Handle took %s", d)
	}
	if got := string(job.Result()); got != `"done"` {
		t.Fatalf("result = %s", got)
	}
	waitDead(t, waitForPID(t, pidFile))
}

func waitForPID(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				return pid
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no pid in %s", path)
	return 0
}

// waitDead waits for pid to be gone or a zombie (an orphan's reaper may be
// slow, or absent in a container).
func waitDead(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		if stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
			// The state follows the parenthesised command name.
			if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && strings.HasPrefix(string(stat[i+1:]), " Z") {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL) // do not leave it behind
	t.Fatalf("process %d is still running", pid)
}

var _ worker.Handler = (*handlers.Exec)(nil)
