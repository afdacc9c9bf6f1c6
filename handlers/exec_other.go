//go:build !unix

package handlers

import "os/exec"

// useProcessGroup keeps os/exec's default here: cancellation kills the
// command itself (there are no Unix process groups to signal).
func useProcessGroup(*exec.Cmd) {}

func killProcessGroup(*exec.Cmd) {}
