package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/couchq/couchq/worker"
)

// DefaultKillGrace is how long a cancelled exec command gets to exit after
// SIGTERM before it is killed.
const DefaultKillGrace = 5 * time.Second

const (
	// maxStdout bounds the stdout kept as an exec job's result; the rest
	// is read and thrown away so that the command never blocks on a full
	// pipe.
	maxStdout = 64 << 10
	// maxStderr bounds the stderr kept (its end) for a failure message.
	maxStderr = 2 << 10
)

// Exec is the exec handler: it runs one fixed command per job.
//
// The command is configured when the worker starts and never comes from
// the payload: anyone who can write a job document could otherwise run any
// program on the worker's host (remote code execution). The payload is
// only data, handed to the command on stdin.
//
// The command gets the job as a JSON object on stdin:
//
//	{"id": "...", "type": "...", "attempt": 1, "max_attempts": 5, "payload": ...}
//
// and Env (else the worker's environment) plus COUCHQ_JOB_ID,
// COUCHQ_JOB_TYPE, COUCHQ_ATTEMPT and COUCHQ_MAX_ATTEMPTS.
//
// Exit status 0 completes the job. Its stdout (the first 64 KiB) becomes
// the result: as JSON when it is valid JSON, else as a string without its
// trailing newlines; empty stdout records no result, and stdout cut at the
// limit is always kept as a string. Any other exit fails the attempt with
// an *ExitError carrying the exit status and the last 2 KiB of stderr.
//
// The command runs in its own process group. When ctx is done the group
// gets SIGTERM, and after KillGrace the command is killed (SIGKILL) and its
// pipes closed. Whatever is left of the group when the command ends is
// killed too, so no process outlives its job.
type Exec struct {
	// Argv is the program and its arguments. Required.
	Argv []string
	// Dir is the working directory; empty means the worker's.
	Dir string
	// Env is the environment the command starts from, as os/exec's
	// Cmd.Env; nil means the worker's own. couchq worker passes its own
	// without the CouchDB password it was given, which a command's
	// stderr would otherwise carry into the job's last_error.
	Env []string
	// KillGrace is the time between SIGTERM and SIGKILL on cancellation,
	// and how long output pipes still held open by leftover processes are
	// waited for once the command has exited; 0 means DefaultKillGrace.
	KillGrace time.Duration
}

// ExitError is the error an exec attempt fails with when the command exits
// unsuccessfully. It fails the attempt (the job is retried).
type ExitError struct {
	// Command is the program that ran (Argv[0]).
	Command string
	// ExitCode is the exit status, or -1 if a signal ended the command.
	ExitCode int
	// State describes how the command ended ("exit status 3",
	// "signal: killed").
	State string
	// Stderr is the end of the command's stderr, at most 2 KiB.
	Stderr string
}

func (e *ExitError) Error() string {
	msg := fmt.Sprintf("exec %s: %s", e.Command, e.State)
	if e.Stderr != "" {
		msg += "; stderr: " + e.Stderr
	}
	return msg
}

type execInput struct {
	ID          string          `json:"id"`
	Type        string          `json:"type"`
	Attempt     int             `json:"attempt"`
	MaxAttempts int             `json:"max_attempts"`
	Payload     json.RawMessage `json:"payload"`
}

// Handle runs the command once for job.
func (e *Exec) Handle(ctx context.Context, job *worker.Job) error {
	if len(e.Argv) == 0 || e.Argv[0] == "" {
		return worker.JobFail(errors.New("exec: no command configured"))
	}
	name := e.Argv[0]
	input, err := json.Marshal(execInput{
		ID:          job.ID,
		Type:        job.Type,
		Attempt:     job.Attempt,
		MaxAttempts: job.MaxAttempts,
		Payload:     job.Payload,
	})
	if err != nil {
		return worker.JobFail(fmt.Errorf("exec %s: encoding the job for stdin: %w", name, err))
	}
	grace := e.KillGrace
	if grace <= 0 {
		grace = DefaultKillGrace
	}

	stdout := &headBuffer{limit: maxStdout}
	stderr := &tailBuffer{limit: maxStderr}
	cmd := exec.CommandContext(ctx, name, e.Argv[1:]...)
	cmd.Dir = e.Dir
	// Later entries win in os/exec, so ours override inherited ones.
	env := e.Env
	if env == nil {
		env = os.Environ()
	}
	cmd.Env = append(slices.Clip(env),
		"COUCHQ_JOB_ID="+job.ID,
		"COUCHQ_JOB_TYPE="+job.Type,
		"COUCHQ_ATTEMPT="+strconv.Itoa(job.Attempt),
		"COUCHQ_MAX_ATTEMPTS="+strconv.Itoa(job.MaxAttempts),
	)
	cmd.Stdin = bytes.NewReader(input)
	cmd.Stdout = stdout
	cmd.Stderr = stderr
	cmd.WaitDelay = grace
	useProcessGroup(cmd)
	unlock := dieWithWorker(cmd)

	if err := cmd.Start(); err != nil {
		unlock()
		return fmt.Errorf("exec %s: starting: %w", name, err)
	}
	waitErr := cmd.Wait()
	killProcessGroup(cmd)
	unlock()

	// ErrWaitDelay alone means the command exited 0 but left processes
	// holding its output open; the command itself succeeded.
	if waitErr != nil && !errors.Is(waitErr, exec.ErrWaitDelay) {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return fmt.Errorf("exec %s: stopped (%v) because the job's context ended: %w%s",
				name, waitErr, ctxErr, stderrSuffix(stderr))
		}
		var exitErr *exec.ExitError
		if errors.As(waitErr, &exitErr) {
			return &ExitError{
				Command:  name,
				ExitCode: exitErr.ExitCode(),
				State:    exitErr.ProcessState.String(),
				Stderr:   stderr.String(),
			}
		}
		return fmt.Errorf("exec %s: waiting for the command: %w%s", name, waitErr, stderrSuffix(stderr))
	}
	if err := setExecResult(job, stdout); err != nil {
		return fmt.Errorf("exec %s: recording stdout as the result: %w", name, err)
	}
	return nil
}

func stderrSuffix(stderr *tailBuffer) string {
	if s := stderr.String(); s != "" {
		return "; stderr: " + s
	}
	return ""
}

func setExecResult(job *worker.Job, stdout *headBuffer) error {
	out := stdout.buf
	if stdout.truncated() {
		// A cut-off JSON document is not the document; keep the bytes.
		return job.SetResult(string(out))
	}
	if trimmed := bytes.TrimSpace(out); len(trimmed) == 0 {
		return nil
	} else if json.Valid(trimmed) {
		return job.SetResult(json.RawMessage(trimmed))
	}
	// Like shell command substitution, drop trailing newlines: "echo hi"
	// should record "hi".
	return job.SetResult(strings.TrimRight(string(out), "\r\n"))
}

// headBuffer keeps the first limit bytes written to it and counts the rest.
// It never fails a write, so the command's output is always drained.
type headBuffer struct {
	buf   []byte
	limit int
	total int64
}

func (b *headBuffer) Write(p []byte) (int, error) {
	b.total += int64(len(p))
	if room := b.limit - len(b.buf); room > 0 {
		b.buf = append(b.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (b *headBuffer) truncated() bool { return b.total > int64(len(b.buf)) }

// tailBuffer keeps the last limit bytes written to it.
type tailBuffer struct {
	buf   []byte
	limit int
	total int64
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.total += int64(len(p))
	if len(p) >= b.limit {
		b.buf = append(b.buf[:0], p[len(p)-b.limit:]...)
		return len(p), nil
	}
	if drop := len(b.buf) + len(p) - b.limit; drop > 0 {
		b.buf = append(b.buf[:0], b.buf[drop:]...)
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// String returns the kept bytes, trimmed, marked when earlier output was
// dropped; a multi-byte character cut at the start is dropped too.
func (b *tailBuffer) String() string {
	s := strings.TrimSpace(strings.ToValidUTF8(string(b.buf), ""))
	if s != "" && b.total > int64(len(b.buf)) {
		s = "..." + s
	}
	return s
}
