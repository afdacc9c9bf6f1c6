//go:build unix

package handlers

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
)

// useProcessGroup starts cmd in a process group of its own and makes
// cancellation signal the whole group: killing only the direct child (what
// exec.CommandContext does by default) would leave a shell's children
// running and holding the output pipes.
func useProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return signalGroup(cmd, syscall.SIGTERM) }
}

// killProcessGroup kills whatever is left of cmd's group once cmd has been
// waited for. The group id stays reserved while any member lives, so it
// cannot name someone else's group while there is anything to kill.
func killProcessGroup(cmd *exec.Cmd) {
	_ = signalGroup(cmd, syscall.SIGKILL)
}

func signalGroup(cmd *exec.Cmd, sig syscall.Signal) error {
	if cmd.Process == nil {
		return os.ErrProcessDone
	}
	err := syscall.Kill(-cmd.Process.Pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}
