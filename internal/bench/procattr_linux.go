//go:build linux

package bench

import "syscall"

// childProcAttr has the kernel kill a worker process if the bench dies
// without stopping it, so no worker outlives a run.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
