//go:build !linux

package handlers

import "os/exec"

// dieWithWorker does nothing here: only Linux has the kernel kill a child
// when its parent dies (Pdeathsig).
func dieWithWorker(*exec.Cmd) (unlock func()) { return func() {} }
