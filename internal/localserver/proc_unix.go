//go:build unix && !linux

package localserver

import "syscall"

// sysProcAttr puts the server in its own process group so Stop can signal everything it spawned.
// There is no parent-death signal outside Linux: a crashed Go process leaves the server running.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
