package localserver

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The nodes run with the scheduler flags written to their vm.args: the
// Erlang VM gets them on its command line (erlexec expands the args file),
// so a flag the release's start script dropped would show here.
func TestCouchDBNodesRunWithoutBusyWaiting(t *testing.T) {
	home, err := FindCouchDB(os.Getenv)
	if err != nil {
		t.Skipf("no local Apache CouchDB release: %v", err)
	}
	if _, err := os.Stat("/proc/self/cmdline"); err != nil {
		t.Skipf("no /proc to read a process's command line: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c, err := StartCouchDB(ctx, CouchDBOptions{Home: home, Nodes: 1, DataDir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Stop(context.WithoutCancel(ctx)); err != nil {
			t.Error(err)
		}
	}()
	pids := c.NodePIDs()
	if len(pids) != 1 || pids[0] == 0 {
		t.Fatalf("node processes %v, want one", pids)
	}
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pids[0]) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Join(strings.Fields(string(bytes.ReplaceAll(raw, []byte{0}, []byte{' '}))), " ")
	if !strings.Contains(args, "beam") {
		t.Fatalf("process %d is not the Erlang VM: %s", pids[0], args)
	}
	// erlexec passes "+flag value" on to the VM as "-flag value".
	flags := strings.Fields(SchedulerFlags)
	for i := 0; i+1 < len(flags); i += 2 {
		if want := "-" + strings.TrimPrefix(flags[i], "+") + " " + flags[i+1]; !strings.Contains(args, want) {
			t.Errorf("the VM runs without %q: %s", want, args)
		}
	}
}

// The nodes compact at CompactionRatio, as local.ini sets it, not at
// CouchDB's default.
func TestCouchDBNodesCompactAtTheQueueRatio(t *testing.T) {
	home, err := FindCouchDB(os.Getenv)
	if err != nil {
		t.Skipf("no local Apache CouchDB release: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c, err := StartCouchDB(ctx, CouchDBOptions{Home: home, Nodes: 1, DataDir: t.TempDir(), User: "admin", Password: "secret", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Stop(context.WithoutCancel(ctx)); err != nil {
			t.Error(err)
		}
	}()
	for section, keys := range CompactionSettings() {
		for key, want := range keys {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL()+"/_node/_local/_config/"+section+"/"+key, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.SetBasicAuth("admin", "secret")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var got string
			err = json.NewDecoder(resp.Body).Decode(&got)
			resp.Body.Close()
			if err != nil || got != want {
				t.Errorf("[%s] %s = %q (%v), want %q", section, key, got, err, want)
			}
		}
	}
}
