//go:build linux

package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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

// A server's CPU is its process tree's: a child named couchjs counts (and
// is shown) while it runs, and still counts once it ended and was waited
// for, through its parent's children's times.
func TestTreeCPUCountsDescendants(t *testing.T) {
	dir := t.TempDir()
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skipf("no sh: %v", err)
	}
	couchjs := filepath.Join(dir, "couchjs") // the kernel names a process after the file it runs
	if err := os.Symlink(sh, couchjs); err != nil {
		t.Fatal(err)
	}
	burn := `i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 1`
	cmd := exec.Command(sh, "-c", `"$0" -c "$1"; sleep 30`, couchjs, burn)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	}()
	var live treeUse
	deadline := time.Now().Add(time.Minute)
	for {
		u, err := treeCPU(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if len(u.js) > 0 {
			live = u
		} else if live.total > 0 {
			// The couchjs child ended: its time moved to its parent.
			own, err := processCPU(cmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			if u.total < live.total || u.total <= own {
				t.Fatalf("after couchjs ended: tree %v (while it ran %v), parent alone %v", u.total, live.total, own)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no couchjs seen to burn CPU and end within a minute (last %+v)", u)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var js time.Duration
	for _, d := range live.js {
		js += d
	}
	if len(live.js) != 1 || js <= 0 || js > live.total {
		t.Fatalf("while couchjs ran: js %v of %v (%d processes)", js, live.total, len(live.js))
	}
	if _, err := treeCPU(1 << 30); err == nil {
		t.Fatal("treeCPU of no process: no error")
	}
}
