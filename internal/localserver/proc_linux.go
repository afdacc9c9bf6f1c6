package localserver

import "syscall"

// sysProcAttr puts the server in its own process group (so Stop can signal everything it spawned)
// and asks the kernel to SIGKILL it if the Go process dies without calling Stop.
// Pdeathsig fires when the creating OS thread exits; the Go runtime only retires threads whose
// goroutine exited while locked with runtime.LockOSThread, which this package never does.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
