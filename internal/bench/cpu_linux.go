//go:build linux

package bench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is USER_HZ, the unit of /proc/PID/stat times: 100 on every
// Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// findServerPID finds the local server's process by the data directory on
// its command line (the bench made the directory, so it is unique).
func findServerPID(dataDir string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("listing processes: %w", err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for _, arg := range bytes.Split(cmdline, []byte{0}) {
			if string(arg) == dataDir {
				return pid, nil
			}
		}
	}
	return 0, errors.New("no process runs on " + dataDir)
}

// procStat is what the bench reads from /proc/PID/stat.
type procStat struct {
	comm string
	ppid int
	// cpu is the process's own user plus system time; children is that of
	// its children that ended and were waited for (cutime, cstime).
	cpu, children time.Duration
}

// readStat reads /proc/PID/stat.
func readStat(pid int) (procStat, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	// The command name (field 2) may hold blanks and parentheses: it runs
	// from the first '(' to the last ')'.
	text := string(data)
	open, end := strings.IndexByte(text, '('), strings.LastIndexByte(text, ')')
	if open < 0 || end < open {
		return procStat{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(text[end+1:])
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	// f[0] is field 3 (state): field k is f[k-3].
	var n [4]int64
	var errs []error
	for i, k := range []int{14, 15, 16, 17} { // utime, stime, cutime, cstime
		var err error
		n[i], err = strconv.ParseInt(f[k-3], 10, 64)
		errs = append(errs, err)
	}
	ppid, err := strconv.Atoi(f[4-3])
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return procStat{
		comm: text[open+1 : end], ppid: ppid,
		cpu: time.Duration(n[0]+n[1]) * clockTick, children: time.Duration(n[2]+n[3]) * clockTick,
	}, nil
}

// processCPU is the user plus system CPU time process pid has used.
func processCPU(pid int) (time.Duration, error) {
	st, err := readStat(pid)
	return st.cpu, err
}

// treeCPU reads the CPU time of process root and all its descendants: a
// local server's node with the processes it started. CouchDB runs
// validate_doc_update and map functions in couchjs processes, which the
// node's own time leaves out; they are not in its process group either
// (erl_child_setup starts each in a session of its own), hence the tree.
func treeCPU(root int) (treeUse, error) {
	g := treeUse{js: map[int]time.Duration{}}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return g, fmt.Errorf("listing processes: %w", err)
	}
	stats := map[int]procStat{}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err != nil {
			continue // gone since the listing
		}
		stats[pid] = st
		children[st.ppid] = append(children[st.ppid], pid)
	}
	if _, ok := stats[root]; !ok {
		return g, fmt.Errorf("no process %d", root)
	}
	for todo := []int{root}; len(todo) > 0; {
		pid := todo[len(todo)-1]
		todo = append(todo[:len(todo)-1], children[pid]...)
		st := stats[pid]
		g.total += st.cpu + st.children
		if strings.HasPrefix(st.comm, "couchjs") { // SpiderMonkey's couchjs, QuickJS's couchjs_mainjs
			g.js[pid] = st.cpu
		}
	}
	return g, nil
}

// peakRSSOf is VmHWM of process pid: its peak resident set size.
func peakRSSOf(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status: VmHWM %q: %w", pid, v, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no VmHWM", pid)
}

// loadAverage is the 1, 5 and 15 minute load averages, as /proc/loadavg
// has them: other work on the machine skews every figure.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// hostMemory is the machine's memory in bytes (MemTotal), 0 where unknown:
// the docs say what machine their figures come from.
func hostMemory() uint64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0
			}
			return kb * 1024
		}
	}
	return 0
}

// cpuModel is the processor's name as /proc/cpuinfo gives it, "" where
// it gives none (some ARM kernels).
func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return ""
}
