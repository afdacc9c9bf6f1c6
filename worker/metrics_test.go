package worker

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The recording methods keep the figures docs/workers.md documents: slots free
// and in flight move together, outcomes land in their own counters, and
// several workers sharing one Metrics add up.
func TestMetricsRecording(t *testing.T) {
	m := NewMetrics()
	m.addSlots("mail", 4)
	m.addSlots("mail", 2) // a second worker sharing m
	m.jobStarted("mail")
	m.jobStarted("mail")
	m.handlerRan("mail", 30*time.Millisecond)
	m.succeededJob("mail")
	m.jobEnded("mail")
	m.failedAttempt("mail", false)
	m.failedAttempt("mail", true)
	m.claimsLostBy("mail", LostConflict, 3)
	m.claimsLostBy("mail", LostLease, 1)
	m.claimsLostBy("mail", LostLease, 0)
	m.renewal("mail", RenewalOK, 5*time.Millisecond)
	m.renewal("mail", RenewalError, time.Second)
	m.feedReconnected()

	for _, c := range []struct {
		name string
		got  prometheus.Collector
		want float64
	}{
		{"started", m.started.WithLabelValues("mail"), 2},
		{"claims won", m.claimsWon.WithLabelValues("mail"), 2},
		{"succeeded", m.succeeded.WithLabelValues("mail"), 1},
		{"retried", m.retried.WithLabelValues("mail"), 1},
		{"failed", m.failed.WithLabelValues("mail"), 1},
		{"lost conflict", m.claimsLost.WithLabelValues("mail", LostConflict), 3},
		{"lost lease", m.claimsLost.WithLabelValues("mail", LostLease), 1},
		{"renewals ok", m.renewals.WithLabelValues("mail", RenewalOK), 1},
		{"renewals error", m.renewals.WithLabelValues("mail", RenewalError), 1},
		{"feed reconnects", m.feedReconnects, 1},
		{"in flight", m.inFlight.WithLabelValues("mail"), 1},
		{"free slots", m.freeSlots.WithLabelValues("mail"), 5},
	} {
		if v := testutil.ToFloat64(c.got); v != c.want {
			t.Errorf("%s = %v, want %v", c.name, v, c.want)
		}
	}
	want := `
# HELP couchq_worker_handler_duration_seconds How long handlers ran, whatever their outcome.
# TYPE couchq_worker_handler_duration_seconds histogram
couchq_worker_handler_duration_seconds_bucket{type="mail",le="0.005"} 0
couchq_worker_handler_duration_seconds_bucket{type="mail",le="0.02"} 0
couchq_worker_handler_duration_seconds_bucket{type="mail",le="0.08"} 1
couchq_worker_handler_duration_seconds_bucket{type="mail",le="0.32"} 1
couchq_worker_handler_duration_seconds_bucket{type="mail",le="1.28"} 1
couchq_worker_handler_duration_seconds_bucket{type="mail",le="5.12"} 1
couchq_worker_handler_duration_seconds_bucket{type="mail",le="20.48"} 1
couchq_worker_handler_duration_seconds_bucket{type="mail",le="81.92"} 1
couchq_worker_handler_duration_seconds_bucket{type="mail",le="327.68"} 1
couchq_worker_handler_duration_seconds_bucket{type="mail",le="1310.72"} 1
couchq_worker_handler_duration_seconds_bucket{type="mail",le="+Inf"} 1
couchq_worker_handler_duration_seconds_sum{type="mail"} 0.03
couchq_worker_handler_duration_seconds_count{type="mail"} 1
`
	if err := testutil.CollectAndCompare(m, strings.NewReader(want), "couchq_worker_handler_duration_seconds"); err != nil {
		t.Error(err)
	}
	if err := testutil.CollectAndCompare(m, strings.NewReader(`
# HELP couchq_worker_lease_renewal_duration_seconds Latency of lease renewals; near a third of the lease, leases may lapse while jobs run.
# TYPE couchq_worker_lease_renewal_duration_seconds histogram
couchq_worker_lease_renewal_duration_seconds_bucket{type="mail",le="0.001"} 0
couchq_worker_lease_renewal_duration_seconds_bucket{type="mail",le="0.0025"} 0
couchq_worker_lease_renewal_duration_seconds_bucket{type="mail",le="0.00625"} 1
couchq_worker_lease_renewal_duration_seconds_bucket{type="mail",le="0.015625"} 1
couchq_worker_lease_renewal_duration_seconds_bucket{type="mail",le="0.0390625"} 1
couchq_worker_lease_renewal_duration_seconds_bucket{type="mail",le="0.09765625"} 1
couchq_worker_lease_renewal_duration_seconds_bucket{type="mail",le="0.244140625"} 1
couchq_worker_lease_renewal_duration_seconds_bucket{type="mail",le="0.6103515625"} 1
couchq_worker_lease_renewal_duration_seconds_bucket{type="mail",le="1.52587890625"} 2
couchq_worker_lease_renewal_duration_seconds_bucket{type="mail",le="3.814697265625"} 2
couchq_worker_lease_renewal_duration_seconds_bucket{type="mail",le="9.5367431640625"} 2
couchq_worker_lease_renewal_duration_seconds_bucket{type="mail",le="23.84185791015625"} 2
couchq_worker_lease_renewal_duration_seconds_bucket{type="mail",le="+Inf"} 2
couchq_worker_lease_renewal_duration_seconds_sum{type="mail"} 1.005
couchq_worker_lease_renewal_duration_seconds_count{type="mail"} 2
`), "couchq_worker_lease_renewal_duration_seconds"); err != nil {
		t.Error(err)
	}
}

var errTest = errors.New("test failure")

// A worker without metrics records nothing and does not crash.
func TestNilMetricsRecordNothing(t *testing.T) {
	var m *Metrics
	m.addSlots("t", 1)
	m.jobStarted("t")
	m.jobEnded("t")
	m.handlerRan("t", time.Second)
	m.succeededJob("t")
	m.failedAttempt("t", true)
	m.claimsLostBy("t", LostLease, 1)
	m.renewal("t", RenewalOK, time.Second)
	m.feedReconnected()
}

// Every metric passes the registry's and promlint's checks of names,
// help and units.
func TestMetricsLint(t *testing.T) {
	m := NewMetrics()
	m.addSlots("t", 1)
	m.jobStarted("t")
	m.handlerRan("t", time.Second)
	m.claimsLostBy("t", LostConflict, 1)
	m.renewal("t", RenewalOK, time.Millisecond)
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(m); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

// Ready says why a worker that never started is not ready, and that a
// stopping worker is not.
func TestReadyBeforeStartAndWhenStopping(t *testing.T) {
	noop := HandlerFunc(func(context.Context, *Job) error { return nil })
	w, err := New(nil, Config{Handlers: map[string]Handler{"t": noop}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Ready(); err == nil || !strings.Contains(err.Error(), "not started") {
		t.Errorf("Ready before Start = %v", err)
	}
	// Started, reached CouchDB long ago, feed broken: each reason shows.
	w.health.started = true
	if err := w.Ready(); err == nil || !strings.Contains(err.Error(), "CouchDB not reached") {
		t.Errorf("Ready without contact = %v", err)
	}
	w.noteContact(nil)
	if err := w.Ready(); err != nil {
		t.Errorf("Ready after contact = %v", err)
	}
	w.noteFeed(errTest)
	if err := w.Ready(); err == nil || !strings.Contains(err.Error(), "changes feed disconnected: test failure") {
		t.Errorf("Ready with a broken feed = %v", err)
	}
	w.noteFeed(nil)
	w.noteContact(errTest) // one failed heartbeat is a blip
	if err := w.Ready(); err != nil {
		t.Errorf("Ready after one failed heartbeat = %v", err)
	}
	w.health.lastContact = time.Now().Add(-readyHeartbeats*w.cfg.HeartbeatInterval - time.Second)
	if err := w.Ready(); err == nil || !strings.Contains(err.Error(), "test failure") {
		t.Errorf("Ready after failed heartbeats = %v", err)
	}
	w.stopOnce.Do(func() { close(w.stopClaiming) })
	if err := w.Ready(); err == nil || !strings.Contains(err.Error(), "stopping") {
		t.Errorf("Ready when stopping = %v", err)
	}
}

// The workers guide's table lists every metric, so that operators find each
// one.
func TestWorkersGuideListsEveryMetric(t *testing.T) {
	guide, err := os.ReadFile("../docs/workers.md")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan *prometheus.Desc, 100)
	NewMetrics().Describe(ch)
	close(ch)
	name := regexp.MustCompile(`fqName: "([^"]+)"`)
	n := 0
	for d := range ch {
		m := name.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no name in %s", d)
		}
		n++
		if !strings.Contains(string(guide), "| `"+m[1]+"` |") {
			t.Errorf("docs/workers.md does not list %s", m[1])
		}
	}
	if n != 13 {
		t.Errorf("%d metrics described, want 13", n)
	}
}
