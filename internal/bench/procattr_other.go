//go:build !linux

package bench

import "syscall"

func childProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
