//go:build linux

package handlers

import (
	"os/exec"
	"runtime"
	"syscall"
)

// dieWithWorker has the kernel kill cmd (SIGKILL) when the worker process
// dies without stopping it (kill -9, a crash): otherwise the command runs
// on, and overlaps the job's next run once its lease has run out.
// Pdeathsig fires when the OS thread that started the command exits, and
// the Go runtime retires a thread whose goroutine ends while locked to
// it: so the goroutine stays locked to its thread until the command has
// been waited for, and unlock (called then) returns the thread unharmed.
// useProcessGroup must have run first.
func dieWithWorker(cmd *exec.Cmd) (unlock func()) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	runtime.LockOSThread()
	return runtime.UnlockOSThread
}
