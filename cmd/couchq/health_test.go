package main

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/opstest"
)

// workerRun is a couchq worker running in-process with --health-addr.
type workerRun struct {
	health string // http://HOST:PORT, from the log line
	stderr *couchtest.SyncBuffer
	cancel context.CancelFunc
	done   chan int
}

var healthLine = regexp.MustCompile(`health and metrics on (http://\S+): /healthz`)

// startWorker runs couchq worker with --health-addr 127.0.0.1:0 and args
// (a later --health-addr wins) in-process and waits until it says where its health server listens.
func startWorker(t *testing.T, c cmdline, args ...string) *workerRun {
	t.Helper()
	w := &workerRun{stderr: &couchtest.SyncBuffer{}, done: make(chan int, 1)}
	m := NewMain(strings.NewReader(""), &couchtest.SyncBuffer{}, w.stderr)
	m.Getenv = func(k string) string { return c.env[k] }
	var ctx context.Context
	ctx, w.cancel = context.WithCancel(context.Background())
	go func() {
		w.done <- m.Run(ctx, append([]string{"worker", "--health-addr", "127.0.0.1:0"}, args...))
	}()
	t.Cleanup(func() { w.stop(t) })
	deadline := time.Now().Add(time.Minute)
	for {
		if found := healthLine.FindStringSubmatch(w.stderr.String()); found != nil {
			w.health = found[1]
			return w
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker did not say where its health server listens; stderr:\n%s", w.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop interrupts the worker and returns its exit code (-1 if it hung).
func (w *workerRun) stop(t *testing.T) int {
	t.Helper()
	if w.cancel == nil {
		return 0
	}
	w.cancel()
	w.cancel = nil
	select {
	case code := <-w.done:
		t.Logf("couchq worker -> %d\nstderr:\n%s", code, w.stderr)
		return code
	case <-time.After(30 * time.Second):
		t.Errorf("the worker did not stop within 30s of the interrupt")
		return -1
	}
}

// await GETs path until check accepts the answer, failing after a minute.
func (w *workerRun) await(t *testing.T, path string, check func(code int, body string) bool) (int, string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		code, body := opstest.Get(t, w.health+path)
		if check(code, body) {
			return code, body
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: still %d:\n%s\nstderr:\n%s", path, code, body, w.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// awaitMetrics scrapes /metrics until it has first, then checks that it
// has the rest too, and returns the scrape.
func (w *workerRun) awaitMetrics(t *testing.T, first string, rest ...string) string {
	t.Helper()
	_, body := w.await(t, "/metrics", func(_ int, body string) bool { return strings.Contains(body, first) })
	for _, want := range rest {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, body)
		}
	}
	return body
}

// --health-addr serves liveness, readiness once the worker is connected,
// and the process's metrics of the jobs it ran; it closes with the worker.
func TestWorkerHealthAddr(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	expect(t, c.run(t, "enqueue", "--type", "x"), exitOK)
	w := startWorker(t, c, "--type", "x", "--handler", "noop", "--feed-timeout", "1s", "--shutdown-timeout", "1s")
	if code, body := opstest.Get(t, w.health+"/healthz"); code != http.StatusOK || !strings.Contains(body, `"status":"ok"`) {
		t.Errorf("/healthz: %d %s", code, body)
	}
	w.await(t, "/readyz", func(code int, body string) bool { return code == http.StatusOK })
	w.awaitMetrics(t, `couchq_worker_jobs_succeeded_total{type="x"} 1`,
		`couchq_worker_jobs_started_total{type="x"} 1`,
		`couchq_worker_claims_won_total{type="x"} 1`,
		`couchq_worker_handler_duration_seconds_count{type="x"} 1`,
		`couchq_worker_jobs_in_flight{type="x"} 0`,
		`couchq_worker_free_slots{type="x"} 4`,
		`couchq_worker_feed_reconnects_total 0`,
		"go_goroutines",
	)
	if code := w.stop(t); code != exitOK {
		t.Errorf("worker exit %d", code)
	}
	if _, err := http.Get(w.health + "/healthz"); err == nil {
		t.Errorf("the health server still answers after the worker stopped")
	}
}

// /readyz answers 503 with the reason when CouchDB stops answering (here
// the proxy the worker reaches CouchDB through is closed) and 200 again
// once it is back and the feed has reconnected, which the metrics count.
func TestWorkerHealthNotReadyWhenCouchDBIsGone(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	target, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ErrorLog = log.New(io.Discard, "", 0) // requests cut off on purpose
	proxy := httptest.NewServer(rp)
	defer proxy.Close()
	c = c.withEnv("COUCHDB_URL", proxy.URL)
	w := startWorker(t, c, "--type", "x", "--handler", "noop", "--lease", "1s", "--heartbeat", "200ms",
		"--feed-timeout", "1s", "--shutdown-timeout", "1s")
	w.await(t, "/readyz", func(code int, body string) bool { return code == http.StatusOK })
	proxy.CloseClientConnections()
	proxy.Close()
	_, body := w.await(t, "/readyz", func(code int, body string) bool { return code == http.StatusServiceUnavailable })
	if !strings.Contains(body, `"ready":false`) ||
		!(strings.Contains(body, "changes feed disconnected") || strings.Contains(body, "CouchDB not reached")) {
		t.Errorf("/readyz when CouchDB is gone: %s", body)
	}
	// Liveness does not depend on CouchDB.
	if code, _ := opstest.Get(t, w.health+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz when CouchDB is gone: %d", code)
	}
	w.awaitMetrics(t, `couchq_worker_free_slots{type="x"} 4`, "couchq_worker_feed_reconnects_total 0")

	// The proxy comes back on the same address.
	ln, err := net.Listen("tcp", strings.TrimPrefix(proxy.URL, "http://"))
	if err != nil {
		couchtest.Skip(t, "the proxy's port was taken meanwhile: "+err.Error())
	}
	back := httptest.NewUnstartedServer(rp)
	back.Listener.Close()
	back.Listener = ln
	back.Start()
	defer back.Close()
	w.await(t, "/readyz", func(code int, body string) bool { return code == http.StatusOK })
	w.awaitMetrics(t, "couchq_worker_feed_reconnects_total 1")
}

func TestWorkerHealthAddrUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ addr, want string }{
		{"8081", `invalid --health-addr "8081": want HOST:PORT, e.g. 127.0.0.1:8081`},
		{"127.0.0.1:http", `port "http" is not a number`},
		{"127.0.0.1:70000", `port "70000" is not a number from 0 to 65535`},
	} {
		r := offline().run(t, "worker", "--type", "t", "--handler", "noop", "--health-addr", tc.addr)
		expect(t, r, exitUsage, tc.want)
	}
}

// A --health-addr that is not loopback works with a warning, as serve's.
func TestWorkerHealthWarnsOffLoopback(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	w := startWorker(t, c, "--type", "x", "--handler", "noop", "--health-addr", "0.0.0.0:0", "--shutdown-timeout", "1s")
	if code, _ := opstest.Get(t, w.health+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	w.stop(t)
	if !strings.Contains(w.stderr.String(), "--health-addr is not loopback") {
		t.Errorf("no warning about the address:\n%s", w.stderr)
	}
}

// Failures and lease renewals show in the metrics: a job that fails twice
// out of two attempts is retried once and failed once, and its leases
// were renewed while it ran.
func TestWorkerHealthMetricsOfFailuresAndRenewals(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	expect(t, c.run(t, "enqueue", "--type", "x"), exitOK)
	w := startWorker(t, c, "--type", "x", "--handler", "exec", "--exec", "sh -c 'sleep 0.7; exit 3'",
		"--max-attempts", "2", "--retry-delay", "0", "--lease", "1s", "--heartbeat", "200ms",
		"--feed-timeout", "1s", "--shutdown-timeout", "1s")
	body := w.awaitMetrics(t, `couchq_worker_jobs_failed_total{type="x"} 1`,
		`couchq_worker_jobs_started_total{type="x"} 2`,
		`couchq_worker_jobs_retried_total{type="x"} 1`,
		`couchq_worker_handler_duration_seconds_count{type="x"} 2`,
	)
	if !regexp.MustCompile(`couchq_worker_lease_renewals_total\{result="ok",type="x"\} [1-9]`).MatchString(body) ||
		!regexp.MustCompile(`couchq_worker_lease_renewal_duration_seconds_count\{type="x"\} [1-9]`).MatchString(body) {
		t.Errorf("/metrics shows no lease renewal:\n%s", body)
	}
	if strings.Contains(body, "couchq_worker_jobs_succeeded_total{") {
		t.Errorf("a success was counted:\n%s", body)
	}
}

// A process running several types from a config file serves one health
// endpoint: ready when all are, metrics of every type on one page.
func TestWorkerConfigHealth(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	path := writeConfig(t, "[types.a]\nhandler = \"noop\"\n\n[types.b]\nhandler = \"noop\"\nconcurrency = 2\n")
	for _, typ := range []string{"a", "b"} {
		expect(t, c.run(t, "enqueue", "--type", typ), exitOK)
	}
	w := startWorker(t, c, "--config", path, "--feed-timeout", "1s", "--shutdown-timeout", "1s")
	_, body := w.await(t, "/readyz", func(code int, body string) bool { return code == http.StatusOK })
	if !strings.Contains(body, `"ready":true`) {
		t.Errorf("/readyz: %s", body)
	}
	if _, body := opstest.Get(t, w.health+"/healthz"); strings.Count(body, "/") < 4 {
		t.Errorf("/healthz lists the claimants of both types: %s", body)
	}
	w.awaitMetrics(t, `couchq_worker_jobs_succeeded_total{type="a"} 1`)
	w.awaitMetrics(t, `couchq_worker_jobs_succeeded_total{type="b"} 1`, `couchq_worker_free_slots{type="b"} 2`)
	if code := w.stop(t); code != exitOK {
		t.Errorf("worker exit %d", code)
	}
}
