package main

import (
	"context"
	"encoding/json"
	"net/url"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/handlers"
	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/protocol"
)

// Flag mistakes of worker, sweep and workers exit 2 before any request:
// every case runs against a URL where nothing listens.
func TestWorkerCommandsUsageErrors(t *testing.T) {
	t.Parallel()
	w := func(args ...string) []string {
		return append([]string{"worker", "--type", "t", "--handler", "noop"}, args...)
	}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no type", []string{"worker", "--handler", "noop"}, "--type is required"},
		{"empty type", []string{"worker", "--type", "a,,b", "--handler", "noop"}, `invalid --type "a,,b": empty job type`},
		{"no handler", []string{"worker", "--type", "t"}, "--handler is required: one of exec, http-check, noop, webhook"},
		{"unknown handler", []string{"worker", "--type", "t", "--handler", "smtp"}, `unknown handler "smtp"`},
		{"exec without command", []string{"worker", "--type", "t", "--handler", "exec"}, "no command given"},
		{"exec of a missing program", []string{"worker", "--type", "t", "--handler", "exec", "--exec", "/nonexistent/prog arg"}, `command "/nonexistent/prog"`},
		{"exec with another handler", w("--exec", "true"), "--exec is only for --handler exec"},
		{"unterminated quote", []string{"worker", "--type", "t", "--handler", "exec", "--exec", `sh -c 'echo`}, "unterminated quote"},
		{"blank exec", []string{"worker", "--type", "t", "--handler", "exec", "--exec", "  "}, "no command"},
		{"zero concurrency", w("--concurrency", "0"), "invalid --concurrency 0"},
		{"zero lease", w("--lease", "0s"), "invalid --lease 0s: must be at least 100ms"},
		{"negative lease", w("--lease", "-1s"), "invalid --lease -1s"},
		{"tiny lease", w("--lease", "2ns"), "invalid --lease 2ns: must be at least 100ms"},
		{"bad duration", w("--lease", "soon"), `invalid --lease "soon": want a duration such as 90s`},
		{"heartbeat not shorter than lease", w("--lease", "2s", "--heartbeat", "2s"), "must be shorter than the lease 2s"},
		{"zero heartbeat", w("--heartbeat", "0s"), "invalid --heartbeat 0s"},
		{"zero sweep interval", w("--sweep-interval", "0s"), "invalid --sweep-interval 0"},
		{"zero max attempts", w("--max-attempts", "0"), "invalid --max-attempts 0"},
		{"negative job timeout", w("--job-timeout", "-1s"), "invalid --job-timeout -1s: must not be negative (0 sets no bound)"},
		{"periodic without spec", w("--periodic", "report"), `invalid --periodic "report": want TYPE=SPEC`},
		{"periodic bad cron", w("--periodic", "report=every day"), `invalid --periodic "report=every day"`},
		{"periodic too often", w("--periodic", "ping=@every 10ms"), "at least 1s"},
		{"periodic twice", w("--periodic", "a=@daily", "--periodic", "a=@hourly"), "a schedule for a is already given"},
		{"periodic bad zone", w("--periodic", "a=@daily", "--periodic-tz", "Mars/Olympus"), `invalid --periodic-tz "Mars/Olympus"`},
		{"bad catch-up", w("--periodic", "a=@daily", "--catch-up", "some"), `invalid --catch-up "some": want once or all`},
		{"zone without periodic", w("--periodic-tz", "Europe/Paris"), "--periodic-tz applies to the schedules of --periodic, and none is given"},
		{"catch-up without periodic", w("--catch-up", "all"), "--catch-up applies to the schedules of --periodic, and none is given"},
		{"rate without limit", w("--rate", "t"), `invalid --rate "t": want TYPE=N/PER`},
		{"rate of another type", w("--rate", "x=10/s"), "x is not one of --type t"},
		{"rate zero", w("--rate", "t=0/s"), "want N/s, N/m, N/h or N/DURATION"},
		{"rate bad period", w("--rate", "t=10/fortnight"), `unknown period "fortnight"`},
		{"rate too short", w("--rate", "t=10/1ms"), "at least 100ms"},
		{"rate twice", w("--rate", "t=10/s", "--rate", "t=5/s"), "a limit for t is already given"},
		{"fleet concurrency bad", w("--fleet-concurrency", "t"), `invalid --fleet-concurrency "t": want TYPE=K`},
		{"fleet concurrency zero", w("--fleet-concurrency", "t=0"), "K must be from 1"},
		{"fleet concurrency other type", w("--fleet-concurrency", "x=2"), "x is not one of --type t"},
		{"zero shutdown timeout", w("--shutdown-timeout", "0s"), "invalid --shutdown-timeout 0s"},
		{"zero http timeout", w("--http-timeout", "0s"), "invalid --http-timeout 0s"},
		{"zero feed timeout", w("--feed-timeout", "0s"), "invalid --feed-timeout 0s"},
		{"zero query timeout", w("--query-timeout", "0s"), "invalid --query-timeout 0s"},
		{"zero fallback poll", w("--fallback-poll", "0s"), "invalid --fallback-poll 0s"},
		{"negative retry delay", w("--retry-delay", "-1s"), "invalid --retry-delay -1s"},
		{"stray argument", w("extra"), `unexpected argument "extra"`},
		{"drain takes no value", w("--drain=maybe"), `invalid boolean value "maybe" for -drain`},
		{"bad log level", w("--log-level", "chatty"), `invalid --log-level "chatty"`},
		{"sweep zero limit", []string{"sweep", "--limit", "0"}, "invalid --limit 0"},
		{"sweep bad limit", []string{"sweep", "--limit", "many"}, `invalid --limit "many": want a whole number`},
		{"sweep stray argument", []string{"sweep", "now"}, `unexpected argument "now"`},
		{"workers stray argument", []string{"workers", "all"}, `unexpected argument "all"`},
		{"workers unknown flag", []string{"workers", "--dead"}, "flag provided but not defined: -dead"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := offline().run(t, tc.args...)
			expect(t, r, exitUsage, tc.want, "run 'couchq help "+tc.args[0]+"' for usage")
			if r.stdout != "" {
				t.Errorf("stdout not empty on a usage error: %q", r.stdout)
			}
		})
	}
}

func TestWorkerCommandsHelp(t *testing.T) {
	t.Parallel()
	r := offline().run(t, "help")
	expect(t, r, exitOK)
	for _, cmd := range []string{"worker", "sweep", "workers"} {
		if !strings.Contains(r.stdout, "\t"+cmd+" ") {
			t.Errorf("couchq help does not list %s:\n%s", cmd, r.stdout)
		}
	}
	r = offline().run(t, "help", "worker")
	expect(t, r, exitOK)
	for _, flag := range []string{"--type", "--handler", "--exec", "--concurrency", "--lease", "--drain", "--delete-done",
		"--max-attempts", "--shutdown-timeout", "--heartbeat", "--sweep-interval", "--feed-timeout", "--query-timeout", "--fallback-poll",
		"--retry-delay", "--http-timeout", "--health-addr", "--url"} {
		if !strings.Contains(r.stdout, flag+" ") {
			t.Errorf("couchq help worker lacks %s", flag)
		}
	}
	for _, name := range handlers.Names() {
		if !strings.Contains(r.stdout, name) {
			t.Errorf("couchq help worker does not name the %s handler", name)
		}
	}
	for _, cmd := range []string{"worker", "sweep", "workers"} {
		expect(t, offline().run(t, cmd, "-h"), exitOK, "Usage: couchq "+cmd, "--log-level")
	}
	expect(t, offline().run(t, "sweep", "-h"), exitOK, "--limit N")
}

func TestWorkerUnreachableServer(t *testing.T) {
	t.Parallel()
	c := offline().withEnv("COUCHDB_URL", "http://admin:s3cr3t-pw@127.0.0.1:1")
	for _, args := range [][]string{{"worker", "--type", "t", "--handler", "noop"}, {"sweep"}, {"workers"}} {
		r := c.run(t, args...)
		expect(t, r, exitFailure, "cannot reach CouchDB at http://admin:xxxxx@127.0.0.1:1")
		if strings.Contains(r.stderr, "s3cr3t") {
			t.Errorf("couchq %v printed the password:\n%s", args, r.stderr)
		}
	}
}

// couchq worker --drain in-process: it creates the database itself, runs
// every due job, leaves the scheduled one alone and exits 0.
func TestWorkerDrainInProcess(t *testing.T) {
	t.Parallel()
	c := online(t)
	// No init: the worker does it.
	r := c.run(t, "worker", "--type", "a,b", "--handler", "noop", "--drain", "--lease", "2s", "--heartbeat", "500ms")
	expect(t, r, exitOK, `"message":"worker started"`, `"message":"drained: no due work left"`)
	c.mustInit(t)
	for _, typ := range []string{"a", "a", "b"} {
		expect(t, c.run(t, "enqueue", "--type", typ), exitOK)
	}
	expect(t, c.run(t, "enqueue", "--type", "a", "--id", "later", "--in", "1h"), exitOK)
	r = c.run(t, "worker", "--type", "a,b", "--handler", "noop", "--drain", "--delete-done", "--log-level", "warn")
	expect(t, r, exitOK)
	if strings.Contains(r.stderr, `"level":"info"`) {
		t.Errorf("--log-level warn still logged at info:\n%s", r.stderr)
	}
	if n := jobCount(t, c.env["COUCHQ_DB"]); n != 1 {
		t.Errorf("%d jobs left after draining with --delete-done, want only the scheduled one", n)
	}
	r = c.run(t, "show", "later", "--json")
	var it protocol.WorkItem
	if err := json.Unmarshal([]byte(r.stdout), &it); err != nil || it.Status != protocol.StatusQueued || it.Claimed {
		t.Errorf("the scheduled job: %+v, %v", it, err)
	}
}

// sweep and workers against the real server: a claim whose claimant died
// is swept once, and the registry shows alive and dead workers.
func TestSweepAndWorkers(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	ctx := context.Background()
	q, err := protocol.New(ctx, srv.Client(t).DB(c.env["COUCHQ_DB"]), protocol.Config{})
	if err != nil {
		t.Fatal(err)
	}

	r := c.run(t, "workers")
	expect(t, r, exitOK)
	if strings.TrimSpace(r.stdout) != "no workers" {
		t.Errorf("workers on an empty registry: %q", r.stdout)
	}
	r = c.run(t, "sweep")
	expect(t, r, exitOK)
	if strings.TrimSpace(r.stdout) != "requeued 0, failed 0, lost 0, settled 0" {
		t.Errorf("sweep with nothing expired: %q", r.stdout)
	}

	for _, id := range []string{"a", "b", "c"} {
		attempts := "3"
		if id == "b" {
			attempts = "1" // its one attempt is spent by the claim
		}
		expect(t, c.run(t, "enqueue", "--type", "x", "--id", id, "--max-attempts", attempts), exitOK)
	}
	// a and b are claimed with a lease that runs out at once; c holds.
	for id, lease := range map[string]time.Duration{"a": time.Millisecond, "b": time.Millisecond, "c": time.Hour} {
		it, err := q.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := q.Claim(ctx, it, "host/99/dead", lease); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond)
	r = c.run(t, "sweep", "--json")
	expect(t, r, exitOK)
	var res sweepResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res != (sweepResult{Requeued: 1, Failed: 1}) {
		t.Errorf("sweep --json: %+v, %v (%q)", res, err, r.stdout)
	}
	for id, status := range map[string]protocol.Status{"a": protocol.StatusQueued, "b": protocol.StatusFailed, "c": protocol.StatusRunning} {
		it, err := q.Get(ctx, id)
		if err != nil || it.Status != status {
			t.Errorf("job %s after the sweep: %+v, %v; want %s", id, it, err, status)
		}
	}
	r = c.run(t, "show", "a")
	for _, want := range []string{"lease-expired  by cli, attempt 1, error: lease expired at", "claimant host/99/dead presumed dead"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("show of the swept job lacks %q:\n%s", want, r.stdout)
		}
	}
	// b had no attempts left: it failed for good, and is counted so.
	r = c.run(t, "show", "b")
	if !regexp.MustCompile(`failed +by cli, attempt 1, error: lease expired at .*; no attempts left`).MatchString(r.stdout) {
		t.Errorf("show of the job the sweep failed lacks its failed entry:\n%s", r.stdout)
	}
	r = c.run(t, "stats", "--type", "x", "--json")
	expect(t, r, exitOK)
	var st protocol.Stats
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || len(st.Types) != 1 || st.Types[0].Failed != 1 {
		t.Errorf("stats after the sweep failed b: %v %s", err, r.stdout)
	}
	r = c.run(t, "sweep", "--limit", "1")
	expect(t, r, exitOK)
	if strings.TrimSpace(r.stdout) != "requeued 0, failed 0, lost 0, settled 0" {
		t.Errorf("second sweep: %q", r.stdout)
	}

	now := time.Now()
	for _, w := range []*protocol.WorkerInfo{
		{ID: "worker:h:1:alive", Claimant: "h/1/alive", PID: 1, Types: []string{"x", "y"}, Concurrency: 4,
			Running: []string{"c"}, LastHeartbeat: protocol.ToUnix(now.Add(-time.Second)), HeartbeatInterval: 10},
		{ID: "worker:h:2:dead", Claimant: "h/2/dead", PID: 2, Types: []string{"x"}, Concurrency: 1,
			LastHeartbeat: protocol.ToUnix(now.Add(-time.Minute)), HeartbeatInterval: 10},
	} {
		if err := q.PutWorker(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	r = c.run(t, "workers")
	expect(t, r, exitOK)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 {
		t.Fatalf("workers: want a header and 2 rows:\n%s", r.stdout)
	}
	if got := strings.Fields(lines[0]); !reflect.DeepEqual(got, []string{"CLAIMANT", "TYPES", "CONCURRENCY", "RUNNING", "HEARTBEAT", "STATE"}) {
		t.Errorf("header: %q", lines[0])
	}
	if f := strings.Fields(lines[1]); len(f) != 7 || f[0] != "h/1/alive" || f[1] != "x,y" || f[2] != "4" || f[3] != "1" || f[5] != "ago" || f[6] != "alive" {
		t.Errorf("alive row: %q", lines[1])
	}
	// A minute, and however long the command took to start on a loaded machine.
	if f := strings.Fields(lines[2]); len(f) != 7 || f[0] != "h/2/dead" || f[3] != "0" || !regexp.MustCompile(`^1m[0-9]+s$`).MatchString(f[4]) || f[6] != "dead" {
		t.Errorf("dead row: %q", lines[2])
	}
	r = c.run(t, "workers", "--json")
	expect(t, r, exitOK)
	var rows []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil || len(rows) != 2 {
		t.Fatalf("workers --json: %v, %q", err, r.stdout)
	}
	if rows[0]["claimant"] != "h/1/alive" || rows[0]["alive"] != true || rows[1]["alive"] != false ||
		rows[1]["heartbeat_age"].(float64) < 59 || rows[1]["running"] == nil || rows[0]["pid"] != 1.0 {
		t.Errorf("workers --json: %v", rows)
	}
	// A dead worker is forgotten once it is older than asked, and only
	// then; an alive one never is.
	r = c.run(t, "workers", "--forget-dead", "1h")
	if r.code != 0 || strings.Count(strings.TrimSpace(r.stdout), "\n") != 2 || strings.Contains(r.stderr, "forgot") {
		t.Errorf("workers --forget-dead 1h forgot a worker dead for a minute: %+v", r)
	}
	r = c.run(t, "workers", "--forget-dead", "0s") // every dead worker
	if r.code != 0 || !strings.Contains(r.stderr, "forgot dead worker h/2/dead") || strings.Contains(r.stdout, "h/2/dead") || !strings.Contains(r.stdout, "h/1/alive") {
		t.Errorf("workers --forget-dead 0s: %+v", r)
	}
	if r = c.run(t, "workers", "--json"); !strings.Contains(r.stdout, "h/1/alive") || strings.Contains(r.stdout, "h/2/dead") {
		t.Errorf("the registry after forgetting the dead worker:\n%s", r.stdout)
	}
	expect(t, c.run(t, "workers", "--forget-dead", "-1h"), exitUsage, "invalid --forget-dead")
}

// An exec command does not get the CouchDB password the worker was given,
// in a variable of its own, in a URL or as a file's name: what it prints to stderr is stored
// in the job, where every reader of the database sees it. Not parallel:
// the command inherits this process's environment.
func TestWorkerExecCommandGetsNoPassword(t *testing.T) {
	c := online(t).mustInit(t)
	user, password := srv.Credentials()
	u, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, password)
	// The worker reads these through its own environment, which the
	// command inherits.
	t.Setenv("COUCHDB_PASSWORD", password)
	// Nor the password file's name: the command could read the file.
	t.Setenv("COUCHDB_PASSWORD_FILE", writePassword(t, password))
	t.Setenv("COUCHQ_TEST_URL_WITH_PASSWORD", u.String())
	t.Setenv("COUCHQ_TEST_PLAIN", "kept")
	c = c.withEnv("COUCHDB_URL", u.String())
	expect(t, c.run(t, "enqueue", "--type", "leak", "--id", "leaky", "--max-attempts", "1"), exitOK)
	r := c.run(t, "worker", "--type", "leak", "--handler", "exec", "--drain",
		"--exec", `sh -c 'echo "pw=$COUCHDB_PASSWORD url=$COUCHQ_TEST_URL_WITH_PASSWORD file=$(cat "$COUCHDB_PASSWORD_FILE" 2>/dev/null) plain=$COUCHQ_TEST_PLAIN" >&2; exit 1'`)
	expect(t, r, exitOK)
	r = c.run(t, "show", "leaky", "--json")
	var it protocol.WorkItem
	if err := json.Unmarshal([]byte(r.stdout), &it); err != nil || it.Status != protocol.StatusFailed {
		t.Fatalf("the job: %+v, %v", it, err)
	}
	if strings.Contains(it.LastError, password) || !strings.Contains(it.LastError, "plain=kept") {
		t.Errorf("the command's stderr, stored in last_error: %q; want the environment without the password", it.LastError)
	}
}

// --job-timeout stops an exec command that runs too long and fails the
// attempt.
func TestWorkerJobTimeoutStopsACommand(t *testing.T) {
	c := online(t).mustInit(t)
	expect(t, c.run(t, "enqueue", "--type", "slow", "--id", "slow", "--max-attempts", "1"), exitOK)
	began := time.Now()
	r := c.run(t, "worker", "--type", "slow", "--handler", "exec", "--drain", "--job-timeout", "1s",
		"--exec", "sleep 30")
	expect(t, r, exitOK, `"message":"job ran past its timeout`)
	if took := time.Since(began); took > 20*time.Second {
		t.Errorf("the worker took %s with a 1s job timeout", took.Round(time.Second))
	}
	r = c.run(t, "show", "slow", "--json")
	var it protocol.WorkItem
	if err := json.Unmarshal([]byte(r.stdout), &it); err != nil || it.Status != protocol.StatusFailed {
		t.Fatalf("the job: %+v, %v", it, err)
	}
	if !strings.Contains(it.LastError, "job timed out after 1s") {
		t.Errorf("last_error %q, want the timeout named", it.LastError)
	}
}

// couchq sweep on a machine whose clock is ahead of the server's (and so,
// likely, of the workers') warns that it may return running jobs.
func TestSweepWarnsOfAClockAhead(t *testing.T) {
	if !srv.Caps().SelectorFilter {
		couchtest.Skip(t, srv.Caps().Vendor+" is not Apache CouchDB: couchq reads no server date there")
	}
	c := online(t).mustInit(t)
	c.now = func() time.Time { return time.Now().Add(time.Minute) }
	expect(t, c.run(t, "sweep"), exitOK, "ahead of the CouchDB server's, and the sweep judges leases on it")
	c.now = nil
	if r := c.run(t, "sweep"); strings.Contains(r.stderr, "the sweep judges leases on it") {
		t.Errorf("a clock in time warned: %s", r.stderr)
	}
}
