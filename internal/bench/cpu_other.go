//go:build !linux

package bench

import (
	"errors"
	"time"
)

var errNoProc = errors.New("per-process figures need Linux's /proc")

func findServerPID(string) (int, error)     { return 0, errNoProc }
func processCPU(int) (time.Duration, error) { return 0, errNoProc }
func treeCPU(int) (treeUse, error)          { return treeUse{}, errNoProc }
func peakRSSOf(int) (uint64, error)         { return 0, errNoProc }

func loadAverage() string { return "" }

func hostMemory() uint64 { return 0 }
func cpuModel() string   { return "" }
