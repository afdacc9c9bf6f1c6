package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/couchq/couchq/handlers"
	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/protocol"
)

// Process-level tests: the couchq CLI is built once and run as real
// worker processes (not goroutines) against the test server, so that they
// can be killed, frozen, interrupted and cut off from the server the way
// production processes are. Timings are short: a 4 s lease (longer on a
// slow server: procLease) renewed four times a lease and swept every 500 ms.
//
// The tests are subtests of one test so that the binary is built once per
// test binary and removed afterwards. None of them is parallel: the restart
// test stops the package's shared server.

// procLease is the worker processes' lease: the measured test lease (see
// testLease), but at least procLeaseMin, renewed four times a lease. Tests
// call setup, which measures it, before they start processes.
func procLease() time.Duration {
	return max(leaseProbe.lease, procLeaseMin)
}

// procLeaseMin is longer than the in-process tests' 2 s: four processes
// with 8 slots each hold up to 32 jobs that each renew every heartbeat, on
// a server that also serves the rest of the suite. With 2 s leases (64
// renewals/s) a live worker's renewals once queued past its lease in a full
// run, and the sweeper rightly gave its job away.
const procLeaseMin = 4 * time.Second

func procHeartbeat() time.Duration { return procLease() / 4 }

// procWorkerArgs is a couchq worker command line with the tests' timings.
func procWorkerArgs(typ, handler string, extra ...string) []string {
	args := []string{"worker", "--type", typ, "--handler", handler,
		"--lease", procLease().String(), "--heartbeat", procHeartbeat().String(), "--sweep-interval", "500ms",
		"--feed-timeout", "2s", "--fallback-poll", "1s", "--retry-delay", "100ms", "--shutdown-timeout", "5s"}
	return append(args, extra...)
}

func TestProcesses(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the process tests send POSIX signals")
	}
	bin := buildCLI(t)
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, bin string)
	}{
		{"KilledWorkerJobsRunElsewhere", testKilledWorker},
		{"KilledWorkerTakesItsCommand", testKilledWorkerCommand},
		{"FrozenWorkerResultRefused", testFrozenWorker},
		{"ServerRestartMidRun", testServerRestart},
		{"GracefulShutdown", testGracefulShutdown},
		{"DrainExits", testDrainProcesses},
		{"BuiltinHandlers", testBuiltinHandlers},
		{"Chaos", testChaos},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, bin) })
	}
}

// procEnv is the environment of the CLI processes a test runs: the test
// server and the test's database, nothing inherited that could point
// elsewhere.
func procEnv(db string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "COUCHDB_URL", "COUCHDB_USER", "COUCHDB_PASSWORD", "COUCHQ_DB":
			continue
		}
		env = append(env, kv)
	}
	user, password := server.Credentials()
	return append(env, "COUCHDB_URL="+server.URL(), "COUCHDB_USER="+user, "COUCHDB_PASSWORD="+password, "COUCHQ_DB="+db)
}

// withEnv returns env with k set to v.
func withEnv(env []string, k, v string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, k+"=") {
			out = append(out, kv)
		}
	}
	return append(out, k+"="+v)
}

// buildCLI builds the couchq CLI into the test's temp dir.
func buildCLI(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "couchq")
	build := exec.Command("go", "build", "-o", bin, "github.com/couchq/couchq/cmd/couchq")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// cliProc is a running CLI process.
type cliProc struct {
	name   string
	cmd    *exec.Cmd
	stdout couchtest.SyncBuffer
	stderr couchtest.SyncBuffer
	exited chan struct{} // closed once the process has been waited for
	code   int           // exit code (-1: killed by a signal), set before exited closes
}

// startProc starts the CLI with args. When the test ends the process is
// killed if it still runs, and its stderr is logged if the test failed.
func startProc(t *testing.T, bin, db, name string, args ...string) *cliProc {
	t.Helper()
	return startProcEnv(t, bin, procEnv(db), name, args...)
}

// startProcEnv is startProc with the environment given.
func startProcEnv(t *testing.T, bin string, env []string, name string, args ...string) *cliProc {
	t.Helper()
	p := launchProc(t, bin, env, name, args...)
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("%s (pid %d, exit %d) stderr, last 6 KiB:\n%s", name, p.pid(), p.code, tail(p.stderr.String(), 6<<10))
		}
	})
	return p
}

// launchProc starts bin with args and the environment given; the caller
// kills it when the test ends.
func launchProc(t *testing.T, bin string, env []string, name string, args ...string) *cliProc {
	t.Helper()
	p := &cliProc{name: name, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = env
	p.cmd.Stdout = &p.stdout
	p.cmd.Stderr = &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		err := p.cmd.Wait()
		p.code = 0
		if ee, ok := err.(*exec.ExitError); ok {
			p.code = ee.ExitCode()
		} else if err != nil {
			p.code = -2
		}
		close(p.exited)
	}()
	return p
}

// kill kills the process with SIGKILL unless it has exited, and waits
// until it has.
func (p *cliProc) kill() {
	if !p.hasExited() {
		_ = p.cmd.Process.Signal(syscall.SIGCONT) // a frozen process dies too, but say it
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

func (p *cliProc) pid() int { return p.cmd.Process.Pid }

func (p *cliProc) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

func (p *cliProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("sending %v to %s: %v", sig, p.name, err)
	}
}

// wait waits up to d for the process to exit and returns its exit code.
func (p *cliProc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
		return p.code
	case <-time.After(d):
		t.Fatalf("%s did not exit within %s", p.name, d)
		return 0
	}
}

// logLine is one JSON log line of a process's stderr.
type logLine map[string]any

func (l logLine) str(k string) string { s, _ := l[k].(string); return s }

// logs parses the process's JSON log lines (other lines are skipped).
func (p *cliProc) logs() []logLine {
	var out []logLine
	sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) == nil {
			out = append(out, l)
		}
	}
	return out
}

// findLog returns the first log line with the given message (and, when
// job is not empty, that job).
func (p *cliProc) findLog(message, job string) (logLine, bool) {
	for _, l := range p.logs() {
		if l.str("message") == message && (job == "" || l.str("job") == job) {
			return l, true
		}
	}
	return nil, false
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// runCLI runs one CLI command to completion.
func runCLI(t *testing.T, bin, db string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = procEnv(db)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("couchq %v: %v", args, err)
	}
	return code, out.String(), errOut.String()
}

// waitFor polls cond every 50 ms until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// registered waits until every process has its registry document and
// returns each one's claimant id, found by pid.
func registered(t *testing.T, tb *testBundle, procs ...*cliProc) map[*cliProc]string {
	t.Helper()
	claimants := map[*cliProc]string{}
	waitFor(t, 20*time.Second, "worker processes to register", func() bool {
		infos, err := tb.client.Workers(tb.ctx)
		if err != nil {
			return false
		}
		for _, p := range procs {
			for _, info := range infos {
				if info.PID == p.pid() {
					claimants[p] = info.Claimant
				}
			}
		}
		return len(claimants) == len(procs)
	})
	return claimants
}

// statusCount counts jobs of typ in status.
func statusCount(t *testing.T, tb *testBundle, typ string, status protocol.Status) int {
	t.Helper()
	counts, err := tb.client.Counts(tb.ctx)
	if err != nil {
		t.Fatalf("counting jobs: %v", err)
	}
	return int(counts[typ][status])
}

// allJobs reads every job of typ (up to 1000).
func allJobs(t *testing.T, tb *testBundle, typ string) []*protocol.WorkItem {
	t.Helper()
	batch, err := tb.client.List(tb.ctx, protocol.ListOptions{Worker: typ, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return batch.Items
}

// hookServer is a webhook receiver on loopback that counts deliveries per
// job (by X-Couchq-Job-Id) and answers as respond says.
type hookServer struct {
	*httptest.Server
	// respond decides how long to hold a delivery and what status to answer.
	respond func(r *http.Request, jobID string, attempt int) (hold time.Duration, status int)

	total      atomic.Int64
	mu         sync.Mutex
	deliveries map[string]int
	answered   map[string]int       // deliveries answered after their hold
	inflight   map[string]time.Time // job id -> when its current delivery arrived
	bodies     map[string]string
}

func newHookServer(t *testing.T, respond func(r *http.Request, jobID string, attempt int) (time.Duration, int)) *hookServer {
	h := &hookServer{respond: respond, deliveries: map[string]int{}, answered: map[string]int{},
		inflight: map[string]time.Time{}, bodies: map[string]string{}}
	h.Server = httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(h.Close)
	return h
}

func (h *hookServer) serve(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(handlers.HeaderJobID)
	attempt, _ := strconv.Atoi(r.Header.Get(handlers.HeaderAttempt))
	body, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	h.deliveries[id]++
	h.inflight[id] = time.Now()
	h.bodies[id] = string(body)
	h.mu.Unlock()
	h.total.Add(1)
	defer func() {
		h.mu.Lock()
		delete(h.inflight, id)
		h.mu.Unlock()
	}()
	hold, status := h.respond(r, id, attempt)
	if hold > 0 {
		select {
		case <-time.After(hold):
		case <-r.Context().Done():
			return
		}
	}
	w.WriteHeader(status)
	fmt.Fprintf(w, "job %s attempt %d\n", id, attempt)
	h.mu.Lock()
	h.answered[id]++
	h.mu.Unlock()
}

func (h *hookServer) count(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.deliveries[id]
}

func (h *hookServer) answeredCount(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.answered[id]
}

func (h *hookServer) body(id string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.bodies[id]
}

// inflightSince returns the jobs being delivered right now, with when.
func (h *hookServer) inflightSince() map[string]time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]time.Time, len(h.inflight))
	for id, at := range h.inflight {
		out[id] = at
	}
	return out
}

// webhookJobs enqueues n webhook jobs of typ, job i posting to path(i).
func webhookJobs(t *testing.T, tb *testBundle, h *hookServer, typ string, n int, path func(i int) string) []string {
	t.Helper()
	jobs := make([]protocol.NewJob, n)
	for i := range jobs {
		jobs[i] = protocol.NewJob{Worker: typ, Payload: map[string]any{"url": h.URL + path(i), "body": map[string]int{"n": i}}}
	}
	res, err := tb.client.EnqueueMany(tb.ctx, jobs)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	for i, r := range res {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		ids[i] = r.Item.ID
	}
	return ids
}

// retriesOf counts a job's failed attempts that were retried, and is how a
// second delivery to a live worker is explained.
func retriesOf(it *protocol.WorkItem) (n int, why []string) {
	for _, e := range it.History {
		if e.Event == protocol.EventRetryScheduled {
			n++
			why = append(why, e.Error)
		}
	}
	return n, why
}

// claimedThenExpired reports whether the job's history has a claim by
// claimant followed by a lease-expired entry that names it, or, on a
// cluster, a branch claimed by claimant that settling withdrew: settling
// withdraws only leaves whose lease has run out, and may keep a conceded
// claim of the same job over it (see settleRank), so the claimant's run is
// then traced in the claim-withdrawn entry rather than by lease-expired.
func claimedThenExpired(it *protocol.WorkItem, claimant string) bool {
	claimed := false
	for _, e := range it.History {
		switch {
		case e.Event == protocol.EventClaimWithdrawn && e.By == claimant &&
			strings.Contains(e.Error, "(claimed by "+claimant+",") && strings.Contains(e.Error, "when the job was settled"):
			return true
		case e.Event == protocol.EventClaimed && e.By == claimant:
			claimed = true
		case claimed && e.Event == protocol.EventLeaseExpired && strings.Contains(e.Error, "claimant "+claimant+" presumed dead"):
			return true
		}
	}
	return false
}

// a. Four worker processes share 500 webhook jobs; one is killed with
// SIGKILL in the middle of a delivery. Every job ends done, and the only
// jobs delivered twice are ones the killed process had claimed.
func testKilledWorker(t *testing.T, bin string) {
	const jobs = 500
	tb := setup(t, protocol.Config{})
	// Every 10th job is held until the victim is dead, so that the victim
	// is caught with a delivery certainly in flight; the rest take 10 ms.
	gate := make(chan struct{})
	var openGate sync.Once
	h := newHookServer(t, func(r *http.Request, _ string, _ int) (time.Duration, int) {
		if strings.HasSuffix(r.URL.Path, "/held") {
			select {
			case <-gate:
			case <-r.Context().Done():
			case <-time.After(time.Minute):
			}
		}
		return 10 * time.Millisecond, http.StatusOK
	})
	t.Cleanup(func() { openGate.Do(func() { close(gate) }) })
	held := func(i int) bool { return i%10 == 5 }
	ids := webhookJobs(t, tb, h, "hook", jobs, func(i int) string {
		if held(i) {
			return fmt.Sprintf("/%d/held", i)
		}
		return fmt.Sprintf("/%d", i)
	})
	heldIDs := map[string]bool{}
	for i, id := range ids {
		heldIDs[id] = held(i)
	}
	start := time.Now()
	var procs []*cliProc
	for i := range 4 {
		procs = append(procs, startProc(t, bin, tb.db.Name(), fmt.Sprintf("worker-%d", i),
			procWorkerArgs("hook", "webhook", "--concurrency", "8")...))
	}
	claimants := registered(t, tb, procs...)
	victim := procs[0]
	dead := claimants[victim]

	// Once a fifth of the jobs went out, kill the victim while it is
	// delivering a held job. The held deliveries of all processes pile up
	// meanwhile, so the victim soon has one.
	var caught string
	waitFor(t, 60*time.Second, "the victim to be mid-delivery of a held job", func() bool {
		if h.total.Load() < jobs/5 {
			return false
		}
		for id := range h.inflightSince() {
			if !heldIDs[id] {
				continue
			}
			// Only the claimant delivers: a claim by the victim means the
			// delivery in flight is the victim's.
			if it, err := tb.client.Get(tb.ctx, id); err == nil && it.Claimed && it.ClaimedBy == dead {
				caught = id
				victim.signal(t, syscall.SIGKILL)
				return true
			}
		}
		return false
	})
	killedAt := time.Now()
	openGate.Do(func() { close(gate) })
	if code := victim.wait(t, 5*time.Second); code != -1 {
		t.Fatalf("the killed worker exited with %d, want -1 (killed by a signal)", code)
	}
	t.Logf("killed %s (%s) after %d deliveries, %s into the run, mid-delivery of %s",
		victim.name, dead, h.total.Load(), killedAt.Sub(start).Round(time.Millisecond), caught)

	waitFor(t, 60*time.Second, "every job to be done", func() bool {
		return statusCount(t, tb, "hook", protocol.StatusDone) == jobs
	})
	t.Logf("all %d jobs done %s after the kill, %s in all; %d deliveries",
		jobs, time.Since(killedAt).Round(time.Millisecond), time.Since(start).Round(time.Millisecond), h.total.Load())

	items := allJobs(t, tb, "hook")
	if len(items) != jobs {
		t.Fatalf("%d jobs listed, want %d", len(items), jobs)
	}
	twice, swept := 0, 0
	for _, it := range items {
		n := h.count(it.ID)
		if it.Status != protocol.StatusDone || it.Claimed {
			t.Errorf("job %s: status %s, claimed %v", it.ID, it.Status, it.Claimed)
		}
		if n == 0 {
			t.Errorf("job %s is done but was never delivered", it.ID)
		}
		for _, e := range it.History {
			if e.Event == protocol.EventLeaseExpired {
				swept++
				if !strings.Contains(e.Error, "claimant "+dead+" presumed dead") {
					t.Errorf("job %s: a lease expired that was not the killed worker's: %+v", it.ID, e)
				}
			}
		}
		if n > 1 {
			twice++
			// A delivery that failed (the hook answered too late on a
			// loaded machine) is retried: the history says so, and why.
			if retries, why := retriesOf(it); retries > 0 && n == retries+1 {
				t.Logf("job %s delivered %d times: %d failed attempts retried (%q); history %s", it.ID, n, retries, why, events(it))
				continue
			}
			if n > 2 || !claimedThenExpired(it, dead) {
				t.Errorf("job %s delivered %d times but it was not claimed by the killed worker %s and swept: history %s",
					it.ID, n, dead, events(it))
			}
		}
		// The killed worker finished jobs before it died, never after.
		if last := it.History[len(it.History)-1]; last.Event != protocol.EventDone {
			t.Errorf("job %s: last history entry %+v, want done", it.ID, last)
		} else if at, err := time.Parse(time.RFC3339Nano, last.At); last.By == dead && (err != nil || at.After(killedAt)) {
			t.Errorf("job %s: done by the killed worker at %s, after it was killed at %s", it.ID, last.At, killedAt.UTC().Format(protocol.HistoryTimeFormat))
		}
	}
	it, err := tb.client.Get(tb.ctx, caught)
	if err != nil {
		t.Fatal(err)
	}
	if n := h.count(caught); n != 2 || !claimedThenExpired(it, dead) || it.Attempts != 2 {
		t.Errorf("the job killed mid-delivery (%s): delivered %d times, attempts %d, history %s; want 2 deliveries, claimed by %s then lease-expired",
			caught, n, it.Attempts, events(it), dead)
	}
	if slices.ContainsFunc(ids, func(id string) bool { return h.count(id) == 0 }) {
		t.Errorf("some enqueued jobs were never delivered")
	}
	t.Logf("%d jobs delivered twice, %d leases of the killed worker swept", twice, swept)

	// The registry: the killed worker's document stays, dead; the others
	// are alive until they stop cleanly and remove theirs.
	code, out, errOut := runCLI(t, bin, tb.db.Name(), "workers", "--json")
	if code != 0 {
		t.Fatalf("couchq workers: exit %d: %s", code, errOut)
	}
	var rows []struct {
		Claimant string `json:"claimant"`
		PID      int    `json:"pid"`
		Alive    bool   `json:"alive"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 4 {
		t.Fatalf("couchq workers --json: %v: %s", err, out)
	}
	for _, r := range rows {
		if r.Alive != (r.Claimant != dead) {
			t.Errorf("couchq workers: %s (pid %d) alive=%v", r.Claimant, r.PID, r.Alive)
		}
	}
	for _, p := range procs[1:] {
		p.signal(t, syscall.SIGTERM)
	}
	for _, p := range procs[1:] {
		if code := p.wait(t, 15*time.Second); code != 0 {
			t.Errorf("%s exited %d after SIGTERM, want 0", p.name, code)
		}
	}
	infos, err := tb.client.Workers(tb.ctx)
	if err != nil || len(infos) != 1 || infos[0].Claimant != dead {
		var docs []string
		for _, info := range infos {
			b, _ := json.Marshal(info)
			docs = append(docs, string(b))
		}
		t.Errorf("registry after the others stopped: %v, %d documents; want only the killed worker's:\n%s",
			err, len(infos), strings.Join(docs, "\n"))
	}
}

// b. A frozen worker (SIGSTOP mid-job) loses its job to the sweeper of
// another process within two leases; the other process runs it; when the
// frozen one wakes up, its late result is refused and logged, and the
// stored result stays the other's.
func testFrozenWorker(t *testing.T, bin string) {
	tb := setup(t, protocol.Config{})
	// The first delivery is held three leases and answered 202; any later
	// one is answered 200 at once, so the stored status tells whose it is.
	h := newHookServer(t, func(r *http.Request, _ string, attempt int) (time.Duration, int) {
		if attempt == 1 {
			return 3 * procLease(), http.StatusAccepted
		}
		return 0, http.StatusOK
	})
	a := startProc(t, bin, tb.db.Name(), "worker-A", procWorkerArgs("hook", "webhook", "--concurrency", "1")...)
	registered(t, tb, a)
	id := webhookJobs(t, tb, h, "hook", 1, func(int) string { return "/frozen" })[0]
	waitFor(t, 10*time.Second, "A to deliver the job", func() bool { return h.count(id) == 1 })
	b := startProc(t, bin, tb.db.Name(), "worker-B", procWorkerArgs("hook", "webhook", "--concurrency", "1")...)
	claimants := registered(t, tb, a, b)

	a.signal(t, syscall.SIGSTOP)
	frozenAt := time.Now()
	var it *protocol.WorkItem
	waitFor(t, 2*procLease(), "the frozen worker's job to be swept", func() bool {
		var err error
		it, err = tb.client.Get(tb.ctx, id)
		return err == nil && claimedThenExpired(it, claimants[a])
	})
	t.Logf("swept %s after A froze (lease %s)", time.Since(frozenAt).Round(time.Millisecond), procLease())
	it = waitStatus(t, tb, id, protocol.StatusDone, 10*time.Second)
	if got := events(it); got != "enqueued claimed lease-expired claimed done" {
		t.Errorf("history: %s", got)
	}
	if it.History[3].By != claimants[b] || it.History[4].By != claimants[b] {
		t.Errorf("want the second claim and the result by B (%s): %+v", claimants[b], it.History)
	}

	// Let A's slow delivery be answered while A is still frozen, then wake
	// A: it finds its claim gone (a 409 on the renewal or on the result)
	// and discards its result.
	waitFor(t, 4*procLease(), "A's delivery to be answered", func() bool { return h.answeredCount(id) == 2 })
	a.signal(t, syscall.SIGCONT)
	var refused logLine
	waitFor(t, 5*time.Second, "A to log that its result was refused", func() bool {
		for _, msg := range []string{
			"result refused: the claim was lost (swept or cancelled) before it was written",
			"lease renewal refused: cancelling the handler",
		} {
			if l, ok := a.findLog(msg, id); ok {
				refused = l
				return true
			}
		}
		return false
	})
	if refused.str("level") != "warn" || !strings.Contains(refused.str("error"), protocol.ErrClaimLost.Error()) ||
		!strings.Contains(strings.ToLower(refused.str("error")), "conflict") {
		t.Errorf("A's refusal log line: %v; want a warning with the claim-lost error of a 409 conflict", refused)
	}
	t.Logf("A logged: %s: %s", refused.str("message"), refused.str("error"))
	// Which 409 A meets first is a race between its overdue lease renewal
	// and the handler's answer; after a refused renewal the result is
	// discarded without a write.
	if refused.str("message") == "lease renewal refused: cancelling the handler" {
		waitFor(t, 5*time.Second, "A to discard its result", func() bool {
			_, ok := a.findLog("claim was lost while running; result discarded", id)
			return ok
		})
	}

	// A's refusal happened; the stored job is still B's.
	time.Sleep(procHeartbeat())
	final, err := tb.client.Get(tb.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var res handlers.WebhookResult
	if err := json.Unmarshal(final.Result, &res); err != nil || res.Status != http.StatusOK {
		t.Errorf("stored result %s (%v): want B's, status 200 (A's delivery was answered 202)", final.Result, err)
	}
	if final.Rev != it.Rev || final.Status != protocol.StatusDone || final.Attempts != 2 {
		t.Errorf("the job changed after B finished it: %+v", final)
	}
	if n := h.count(id); n != 2 {
		t.Errorf("%d deliveries, want 2 (A's, then B's)", n)
	}
	for _, p := range []*cliProc{a, b} {
		p.signal(t, syscall.SIGTERM)
	}
	for _, p := range []*cliProc{a, b} {
		if code := p.wait(t, 15*time.Second); code != 0 {
			t.Errorf("%s exited %d after SIGTERM, want 0", p.name, code)
		}
	}
}

// c. The server stops and starts again (same data, same port) while
// worker processes run jobs: they reconnect, the changes feed resumes, and
// every job finishes.
func testServerRestart(t *testing.T, bin string) {
	if !server.CanRestart() {
		couchtest.Skip(t, fmt.Sprintf("only a server couchtest started itself can be restarted; this is a %s server (%s)",
			server.Kind(), server.Reason()))
	}
	tb := setup(t, protocol.Config{})
	h := newHookServer(t, func(*http.Request, string, int) (time.Duration, int) {
		return 100 * time.Millisecond, http.StatusOK
	})
	before := webhookJobs(t, tb, h, "hook", 80, func(i int) string { return fmt.Sprintf("/%d", i) })
	// No fallback poll worth the name: the jobs enqueued after the restart
	// are found through the changes feed, so it must have come back.
	var procs []*cliProc
	for i := range 2 {
		procs = append(procs, startProc(t, bin, tb.db.Name(), fmt.Sprintf("worker-%d", i),
			procWorkerArgs("hook", "webhook", "--concurrency", "3", "--fallback-poll", "10m")...))
	}
	registered(t, tb, procs...)
	waitFor(t, 30*time.Second, "20 deliveries before the restart", func() bool { return h.total.Load() >= 20 })

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	restartAt := time.Now()
	if err := server.Restart(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	// Whatever happens next, the server answers for the tests that follow.
	if _, err := tb.kivik.Version(ctx); err != nil {
		t.Fatalf("server after restart: %v", err)
	}
	t.Logf("server restarted in %s, after %d deliveries", time.Since(restartAt).Round(time.Millisecond), h.total.Load())

	waitFor(t, 20*time.Second, "both workers' changes feeds to reconnect", func() bool {
		for _, p := range procs {
			if _, ok := p.findLog("changes feed reconnected", ""); !ok {
				return false
			}
		}
		return true
	})
	after := webhookJobs(t, tb, h, "hook", 20, func(i int) string { return fmt.Sprintf("/after/%d", i) })
	waitFor(t, 45*time.Second, "every job to be done", func() bool {
		return statusCount(t, tb, "hook", protocol.StatusDone) == len(before)+len(after)
	})
	t.Logf("all jobs done %s after the restart; %d deliveries for %d jobs",
		time.Since(restartAt).Round(time.Millisecond), h.total.Load(), len(before)+len(after))
	for _, it := range allJobs(t, tb, "hook") {
		if it.Status != protocol.StatusDone || it.Claimed || h.count(it.ID) == 0 {
			t.Errorf("job %s: status %s, claimed %v, %d deliveries", it.ID, it.Status, it.Claimed, h.count(it.ID))
		}
	}
	for _, p := range procs {
		if p.hasExited() {
			t.Fatalf("%s exited (%d) during the restart", p.name, p.code)
		}
		p.signal(t, syscall.SIGTERM)
	}
	for _, p := range procs {
		if code := p.wait(t, 15*time.Second); code != 0 {
			t.Errorf("%s exited %d after SIGTERM, want 0", p.name, code)
		}
	}
}

// d. SIGTERM with a job in flight: the job finishes within the shutdown
// timeout, or is released when it outlives it; either way the process
// exits 0. A second signal exits at once with status 1, and the job left
// claimed goes back to the queue through couchq sweep once its lease ends.
func testGracefulShutdown(t *testing.T, bin string) {
	tb := setup(t, protocol.Config{})
	h := newHookServer(t, func(r *http.Request, _ string, _ int) (time.Duration, int) {
		if strings.HasSuffix(r.URL.Path, "/second") {
			return time.Second, http.StatusOK
		}
		return time.Minute, http.StatusOK // until the worker gives up the request
	})
	cases := []struct {
		typ, path, timeout string
		signals            int
		code               int
		sig                syscall.Signal
	}{
		{"finish", "/second", "10s", 1, 0, syscall.SIGTERM},
		{"release", "/forever", "500ms", 1, 0, syscall.SIGTERM},
		{"abandon", "/forever", "30s", 2, 1, syscall.SIGTERM},
		// A closed terminal or SSH session: stops as SIGTERM does.
		{"hangup", "/forever", "500ms", 1, 0, syscall.SIGHUP},
	}
	type run struct {
		proc *cliProc
		id   string
		sent time.Time
	}
	runs := make([]run, len(cases))
	for i, c := range cases {
		runs[i].id = webhookJobs(t, tb, h, c.typ, 1, func(int) string { return c.path })[0]
		runs[i].proc = startProc(t, bin, tb.db.Name(), "worker-"+c.typ,
			procWorkerArgs(c.typ, "webhook", "--shutdown-timeout", c.timeout)...)
	}
	for i, c := range cases {
		waitFor(t, 10*time.Second, c.typ+" job to be in flight", func() bool { return h.count(runs[i].id) == 1 })
		runs[i].proc.signal(t, c.sig)
		runs[i].sent = time.Now()
		if c.signals == 2 {
			waitFor(t, 5*time.Second, "the worker to start stopping", func() bool {
				_, ok := runs[i].proc.findLog("stopping: no new claims; running jobs may finish, then are released (signal again to exit at once)", "")
				return ok
			})
			runs[i].proc.signal(t, syscall.SIGTERM)
		}
	}
	for i, c := range cases {
		p := runs[i].proc
		code := p.wait(t, 15*time.Second)
		took := time.Since(runs[i].sent)
		if code != c.code {
			t.Errorf("%s: exit %d, want %d", c.typ, code, c.code)
		}
		it, err := tb.client.Get(tb.ctx, runs[i].id)
		if err != nil {
			t.Fatal(err)
		}
		switch c.typ {
		case "finish":
			if it.Status != protocol.StatusDone || it.Attempts != 1 || events(it) != "enqueued claimed done" {
				t.Errorf("finish: %s, attempts %d, history %s; want done in its first attempt", it.Status, it.Attempts, events(it))
			}
		case "release", "hangup":
			if it.Status != protocol.StatusQueued || it.Claimed || it.Attempts != 0 || events(it) != "enqueued claimed released" {
				t.Errorf("%s: %s, claimed %v, attempts %d, history %s; want released, no attempt charged",
					c.typ, it.Status, it.Claimed, it.Attempts, events(it))
			}
			if took > 5*time.Second {
				t.Errorf("%s: took %s to exit with a 500ms shutdown timeout", c.typ, took)
			}
		case "abandon":
			if !strings.Contains(p.stderr.String(), "couchq: terminated again: exiting now") {
				t.Errorf("abandon: no word about the second signal:\n%s", tail(p.stderr.String(), 2000))
			}
			if took > 3*time.Second {
				t.Errorf("abandon: the second signal took %s to end the process", took)
			}
			if it.Status != protocol.StatusRunning || !it.Claimed {
				t.Errorf("abandon: %s, claimed %v; want still claimed by the process that exited", it.Status, it.Claimed)
			}
		}
		if c.code == 0 {
			if _, ok := p.findLog("worker stopped", ""); !ok {
				t.Errorf("%s: no \"worker stopped\" log line", c.typ)
			}
		}
	}
	// The clean exits removed their registry documents; the abandoned
	// one stays until someone cleans it up.
	infos, err := tb.client.Workers(tb.ctx)
	if err != nil || len(infos) != 1 || infos[0].PID != runs[2].proc.pid() {
		t.Errorf("registry: %v, %d documents; want only the abandoned worker's", err, len(infos))
	}
	// The abandoned claim: swept once its lease has run out.
	abandoned := runs[2].id
	it, _ := tb.client.Get(tb.ctx, abandoned)
	time.Sleep(time.Until(it.Lease()) + 50*time.Millisecond)
	code, out, errOut := runCLI(t, bin, tb.db.Name(), "sweep")
	if code != 0 || strings.TrimSpace(out) != "requeued 1, failed 0, lost 0, settled 0" {
		t.Errorf("couchq sweep: exit %d, stdout %q, stderr %s", code, out, errOut)
	}
	it, err = tb.client.Get(tb.ctx, abandoned)
	if err != nil || it.Status != protocol.StatusQueued || it.Claimed || !strings.HasSuffix(events(it), "lease-expired") {
		t.Errorf("abandoned job after couchq sweep: %+v, %v", it, err)
	}
}

// e. couchq worker --drain: two overlapping runs share the due work and
// exit 0 once none is left, leaving nothing claimed and the scheduled job
// alone.
func testDrainProcesses(t *testing.T, bin string) {
	tb := setup(t, protocol.Config{})
	jobs := make([]protocol.NewJob, 60)
	for i := range jobs {
		jobs[i] = protocol.NewJob{Worker: "cron", Payload: i}
	}
	jobs = append(jobs, protocol.NewJob{Worker: "cron", ID: "tomorrow", At: time.Now().Add(24 * time.Hour)})
	if _, err := tb.client.EnqueueMany(tb.ctx, jobs); err != nil {
		t.Fatal(err)
	}
	var procs []*cliProc
	for i := range 2 {
		procs = append(procs, startProc(t, bin, tb.db.Name(), fmt.Sprintf("drain-%d", i),
			procWorkerArgs("cron", "noop", "--drain", "--concurrency", "8")...))
	}
	for _, p := range procs {
		if code := p.wait(t, 30*time.Second); code != 0 {
			t.Errorf("%s: exit %d, want 0", p.name, code)
		}
		if _, ok := p.findLog("drained: no due work left", ""); !ok {
			t.Errorf("%s did not log that it drained", p.name)
		}
	}
	if n := statusCount(t, tb, "cron", protocol.StatusDone); n != 60 {
		t.Errorf("%d jobs done, want 60", n)
	}
	for _, it := range allJobs(t, tb, "cron") {
		if it.Claimed || it.Status == protocol.StatusRunning {
			t.Errorf("job %s left claimed: %+v", it.ID, it)
		}
	}
	it, err := tb.client.Get(tb.ctx, "tomorrow")
	if err != nil || it.Status != protocol.StatusQueued || it.Attempts != 0 {
		t.Errorf("the scheduled job: %+v, %v; want queued, untouched", it, err)
	}
	if infos, err := tb.client.Workers(tb.ctx); err != nil || len(infos) != 0 {
		t.Errorf("registry after drained exits: %v, %d documents", err, len(infos))
	}
}

// f. Each built-in handler through the CLI worker: a success and a
// failure each, with --max-attempts 1 so that a failure is final.
func testBuiltinHandlers(t *testing.T, bin string) {
	tb := setup(t, protocol.Config{})
	h := newHookServer(t, func(r *http.Request, _ string, _ int) (time.Duration, int) {
		if code, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/status/")); err == nil {
			return 0, code
		}
		return 0, http.StatusOK
	})
	script := filepath.Join(t.TempDir(), "job script.sh")
	if err := os.WriteFile(script, []byte(`#!/bin/sh
input=$(cat)
case "$input" in *'"fail":true'*) echo "disk full" >&2; exit 3;; esac
printf '{"id":"%s","attempt":%s,"arg":"%s"}\n' "$COUCHQ_JOB_ID" "$COUCHQ_ATTEMPT" "$1"
`), 0o755); err != nil {
		t.Fatal(err)
	}
	enqueue := func(id, typ string, payload any) {
		if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{ID: id, Worker: typ, Payload: payload}); err != nil {
			t.Fatal(err)
		}
	}
	enqueue("hook-ok", "hook", map[string]any{"url": h.URL + "/ok", "body": map[string]string{"hello": "world"}})
	enqueue("hook-500", "hook", map[string]any{"url": h.URL + "/status/500"})
	enqueue("check-ok", "check", map[string]any{"url": h.URL + "/ok"})
	enqueue("check-404", "check", map[string]any{"url": h.URL + "/status/404"})
	enqueue("exec-ok", "run", map[string]any{"fail": false})
	enqueue("exec-3", "run", map[string]any{"fail": true})

	procs := []*cliProc{
		startProc(t, bin, tb.db.Name(), "webhook", procWorkerArgs("hook", "webhook", "--drain", "--max-attempts", "1")...),
		startProc(t, bin, tb.db.Name(), "http-check", procWorkerArgs("check", "http-check", "--drain", "--max-attempts", "1")...),
		startProc(t, bin, tb.db.Name(), "exec", procWorkerArgs("run", "exec", "--drain", "--max-attempts", "1",
			"--exec", fmt.Sprintf("'%s' 'hello world'", script))...),
	}
	for _, p := range procs {
		if code := p.wait(t, 30*time.Second); code != 0 {
			t.Errorf("%s worker: exit %d, want 0", p.name, code)
		}
	}
	get := func(id string) *protocol.WorkItem {
		it, err := tb.client.Get(tb.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return it
	}
	for _, tc := range []struct {
		id         string
		status     protocol.Status
		result     func(json.RawMessage) bool
		lastErrHas []string
	}{
		{"hook-ok", protocol.StatusDone, func(r json.RawMessage) bool {
			var res handlers.WebhookResult
			return json.Unmarshal(r, &res) == nil && res.Status == 200 && res.URL == h.URL+"/ok"
		}, nil},
		{"hook-500", protocol.StatusFailed, nil, []string{"POST " + h.URL + "/status/500", "status 500 Internal Server Error"}},
		{"check-ok", protocol.StatusDone, func(r json.RawMessage) bool {
			var res handlers.HTTPCheckResult
			return json.Unmarshal(r, &res) == nil && res.Status == 200 && res.FinalURL == h.URL+"/ok"
		}, nil},
		{"check-404", protocol.StatusFailed, nil, []string{"GET " + h.URL + "/status/404", "status 404 Not Found"}},
		{"exec-ok", protocol.StatusDone, func(r json.RawMessage) bool {
			return string(r) == `{"id":"exec-ok","attempt":1,"arg":"hello world"}`
		}, nil},
		{"exec-3", protocol.StatusFailed, nil, []string{"exit status 3", "disk full"}},
	} {
		it := get(tc.id)
		if it.Status != tc.status || it.Attempts != 1 || it.Claimed {
			t.Errorf("%s: %s after %d attempts (claimed %v), want %s after 1; last error %q",
				tc.id, it.Status, it.Attempts, it.Claimed, tc.status, it.LastError)
		}
		if tc.result != nil && !tc.result(it.Result) {
			t.Errorf("%s: result %s", tc.id, it.Result)
		}
		for _, want := range tc.lastErrHas {
			if !strings.Contains(it.LastError, want) {
				t.Errorf("%s: last error %q lacks %q", tc.id, it.LastError, want)
			}
		}
	}
	if body := h.body("hook-ok"); body != `{"hello":"world"}` {
		t.Errorf("webhook body %q", body)
	}
	if l, ok := procs[0].findLog("attempt failed", "hook-500"); !ok || l.str("level") != "warn" || l.str("status") != "failed" {
		t.Errorf("the webhook worker's log of the final failure: %v", l)
	}
}

// A worker killed outright (kill -9) takes the exec command it ran with it
// (on Linux), rather than leave it running beside the job's next run once
// the lease has run out.
func testKilledWorkerCommand(t *testing.T, bin string) {
	if runtime.GOOS != "linux" {
		t.Skip("only Linux kills a child with its parent (Pdeathsig)")
	}
	tb := setup(t, protocol.Config{})
	dir := t.TempDir()
	script := filepath.Join(dir, "job.sh")
	// exec so that the command is the shell's own process: sleep itself.
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho $$ > \"$PIDDIR/pid\"\nexec sleep 60\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	job, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "long"})
	if err != nil {
		t.Fatal(err)
	}
	w := startProcEnv(t, bin, withEnv(procEnv(tb.db.Name()), "PIDDIR", dir), "worker",
		procWorkerArgs("long", "exec", "--exec", script)...)
	var pid int
	waitFor(t, time.Minute, "the job's command to start", func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "pid"))
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0
	})
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) }) // its group, if it outlived the test
	w.signal(t, syscall.SIGKILL)
	waitFor(t, 10*time.Second, "the command of the killed worker to die with it", func() bool {
		if syscall.Kill(pid, 0) != nil {
			return true
		}
		// Dead but not yet reaped by whoever adopted it: a zombie.
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		_, rest, _ := strings.Cut(string(stat), ") ")
		return err == nil && strings.HasPrefix(rest, "Z")
	})
	t.Logf("job %s: its command %d died with its worker", job.ID, pid)
}
