//go:build linux

package bench

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestProcFiguresOfThisProcess(t *testing.T) {
	start := time.Now()
	for time.Since(start) < 50*time.Millisecond { // burn some CPU to measure
	}
	cpu, err := processCPU(os.Getpid())
	if err != nil || cpu <= 0 {
		t.Fatalf("processCPU(self) = %v, %v", cpu, err)
	}
	rss, err := peakRSSOf(os.Getpid())
	if err != nil || rss < 1<<20 {
		t.Fatalf("peakRSSOf(self) = %d, %v", rss, err)
	}
	self, err := maxRSS()
	if err != nil || self < 1<<20 {
		t.Fatalf("maxRSS() = %d, %v", self, err)
	}
	if f := strings.Fields(loadAverage()); len(f) != 3 {
		t.Fatalf("loadAverage() = %q", loadAverage())
	}
}

func TestFindServerPIDByDataDir(t *testing.T) {
	dir := t.TempDir()
	if _, err := findServerPID(dir); err == nil {
		t.Fatalf("found a process for %s before starting one", dir)
	}
	cmd := exec.Command("sh", "-c", "sleep 30", "sh", dir) // dir is an argument, as -d DIR is
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start sh: %v", err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	pid, err := findServerPID(dir)
	if err != nil || pid != cmd.Process.Pid {
		t.Fatalf("findServerPID = %d, %v; want %d", pid, err, cmd.Process.Pid)
	}
}
