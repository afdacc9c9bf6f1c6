//go:build unix

package bench

import (
	"fmt"
	"runtime"
	"syscall"
)

// maxRSS is this process's peak resident set size in bytes.
func maxRSS() (uint64, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	if runtime.GOOS == "darwin" || runtime.GOOS == "ios" {
		return uint64(ru.Maxrss), nil // bytes there
	}
	return uint64(ru.Maxrss) * 1024, nil // KiB on Linux and the BSDs
}
