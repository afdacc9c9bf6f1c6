package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime/metrics"
	"sync"
	"time"

	"github.com/couchq/couchq/handlers"
	"github.com/couchq/couchq/internal/protocol"
)

// heapSampler records the peak of the Go heap while workers run.
type heapSampler struct {
	mu   sync.Mutex
	peak uint64
	quit chan struct{}
	done chan struct{}
}

func newHeapSampler() *heapSampler { return &heapSampler{} }

const (
	metricHeapObjects = "/memory/classes/heap/objects:bytes"
	metricHeapAllocs  = "/gc/heap/allocs:bytes"
	sampleEvery       = 50 * time.Millisecond
)

func readMetric(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// heapAllocated is the bytes allocated on the heap since the process
// started (a cumulative counter).
func heapAllocated() uint64 { return readMetric(metricHeapAllocs) }

// start samples until stop; runtime/metrics reads do not stop the world.
func (h *heapSampler) start() {
	h.quit, h.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(h.done)
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for {
			h.sample()
			select {
			case <-h.quit:
				h.sample()
				return
			case <-t.C:
			}
		}
	}()
}

func (h *heapSampler) sample() {
	v := readMetric(metricHeapObjects)
	h.mu.Lock()
	h.peak = max(h.peak, v)
	h.mu.Unlock()
}

func (h *heapSampler) stop() {
	if h.quit == nil {
		return
	}
	close(h.quit)
	<-h.done
	h.quit = nil
}

func (h *heapSampler) max() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.peak
}

// runMemory reports the peak memory of the processes the workers ran in:
// with --procs, each worker process's VmHWM (read before it was stopped);
// always this process's own peak, which includes the bench's buffers.
// Then it runs one `couchq worker` process at WorkerRSSConcurrency jobs at
// once and judges its peak RSS (runWorkerRSS100); that comes last so that
// its HTTP server and jobs count in none of the figures before it.
func (b *run) runMemory(ctx context.Context, s *Section) error {
	if len(b.procRSS) > 0 {
		var peak uint64
		for _, v := range b.procRSS {
			peak = max(peak, v)
		}
		s.add(numRow(fmt.Sprintf("peak RSS of a worker process (VmHWM, max of %d)", len(b.procRSS)), float64(peak)/(1<<20), "MiB", 1)).Key = keyWorkerRSS
	}
	rss, err := maxRSS()
	if err != nil {
		return err
	}
	row := s.add(numRow("peak RSS of this process (bench + in-process workers, getrusage maxrss)", float64(rss)/(1<<20), "MiB", 1))
	if b.cfg.Procs == 0 {
		// The workers ran here: this is the process that ran them.
		row.Key = keyWorkerRSS
	}
	if pids := b.t.serverPIDs; len(pids) > 0 {
		var sum uint64
		var err error
		for _, pid := range pids {
			var rss uint64
			if rss, err = peakRSSOf(pid); err != nil {
				break
			}
			sum += rss
		}
		what := "peak RSS of the local server (VmHWM)"
		if len(pids) > 1 {
			what = fmt.Sprintf("peak RSS of the local server (VmHWM, the %d nodes' summed)", len(pids))
		}
		if err == nil {
			s.add(numRow(what, float64(sum)/(1<<20), "MiB", 1))
		}
	}
	if peak := b.memory.max(); peak > 0 {
		s.add(numRow("peak Go heap (live objects) while in-process workers ran", float64(peak)/(1<<20), "MiB", 1))
	} else {
		s.add(textRow("peak Go heap (live objects) while in-process workers ran", "n/a (none ran)"))
	}
	return b.runWorkerRSS100(ctx, s)
}

const (
	// rss100Jobs is three rounds of the worker's slots: its peak is then
	// that of slots reused, not of the first round alone.
	rss100Jobs = 3 * WorkerRSSConcurrency
	// rss100Hold is how long the receiver holds each webhook request: long
	// enough for the worker to claim and start all its slots' jobs before
	// the first ends, short enough for the three rounds to take seconds.
	rss100Hold = 2 * time.Second
	// rss100HTTPTimeout bounds each webhook request, set on the command
	// line so that no default of the CLI's can cut the hold short.
	rss100HTTPTimeout = 5 * rss100Hold
)

// runWorkerRSS100 measures the target TargetWorkerRSS100: one `couchq
// worker --handler webhook --concurrency WorkerRSSConcurrency` process
// works rss100Jobs jobs that POST to a local receiver holding each request
// for rss100Hold, so that every slot holds a job, a request and its
// connection at once; the process's VmHWM is read before it is stopped.
func (b *run) runWorkerRSS100(ctx context.Context, s *Section) error {
	if _, err := b.cliPath(ctx); err != nil {
		return err
	}
	recv := newHoldServer(rss100Hold)
	defer recv.close()
	db, err := b.newDB(ctx, s, "rss")
	if err != nil {
		return err
	}
	c, err := b.t.open(ctx, db)
	if err != nil {
		return err
	}
	jobs := make([]protocol.NewJob, rss100Jobs)
	for i := range jobs {
		jobs[i] = protocol.NewJob{Worker: jobType, Payload: map[string]string{"url": recv.URL}}
	}
	res, err := c.EnqueueMany(ctx, jobs)
	if err != nil {
		return fmt.Errorf("enqueueing %d webhook jobs: %w", len(jobs), err)
	}
	for _, r := range res {
		if r.Err != nil {
			return fmt.Errorf("enqueueing %d webhook jobs: %w", len(jobs), r.Err)
		}
	}
	p, err := b.startProcsWith(ctx, db, []int{WorkerRSSConcurrency}, handlers.NameWebhook,
		"--http-timeout", rss100HTTPTimeout.String())
	if err != nil {
		return err
	}
	// Stopped before the receiver closes (deferred calls run last first):
	// a job cut short by the receiver would fail and be retried.
	defer p.stop(b)
	if err := p.waitCompleted(ctx, c, rss100Jobs, stallTimeout); err != nil {
		peak, served := recv.counts()
		return fmt.Errorf("running %d webhook jobs (the receiver answered %d requests, at most %d at once): %w", rss100Jobs, served, peak, err)
	}
	rss, err := p.peakRSS()
	if err != nil {
		return fmt.Errorf("reading the webhook worker's peak RSS: %w", err)
	}
	peak, _ := recv.counts()
	workerRSS100Rows(s, rss[0], peak)
	return nil
}

// workerRSS100Rows adds the worker's peak RSS, judged against
// TargetWorkerRSS100, and the peak of requests the receiver held at once.
// The target is about WorkerRSSConcurrency jobs at once: a worker that ran
// fewer at once did not show what it needs at that load, so its figure,
// however small, does not meet it.
func workerRSS100Rows(s *Section, rss uint64, inFlight int) {
	row := s.add(numRow(fmt.Sprintf("peak RSS of a `couchq worker` process running %d jobs at once (webhook handler, VmHWM)", WorkerRSSConcurrency),
		float64(rss)/(1<<20), "MiB", 1))
	row.Key = keyWorkerRSS100
	what := fmt.Sprintf("< %d MiB", TargetWorkerRSS100>>20)
	if inFlight < WorkerRSSConcurrency {
		what += fmt.Sprintf(", at %d jobs at once: not met, only %d ran at once", WorkerRSSConcurrency, inFlight)
	}
	row.target(what, rss < TargetWorkerRSS100 && inFlight >= WorkerRSSConcurrency)
	s.add(numRow(fmt.Sprintf("  peak webhook requests in flight at the receiver (each held %s)", rss100Hold), float64(inFlight), "", 0))
}

// holdServer is the webhook jobs' receiver, an HTTP server in this
// process: it holds each request for hold before answering 200, so that
// the jobs overlap, and counts the requests it holds at once.
type holdServer struct {
	*httptest.Server
	hold time.Duration
	// quit, closed by close, answers the requests still held at once:
	// httptest.Server.Close waits for them.
	quit chan struct{}

	mu                     sync.Mutex
	inFlight, peak, served int
}

func newHoldServer(hold time.Duration) *holdServer {
	h := &holdServer{hold: hold, quit: make(chan struct{})}
	h.Server = httptest.NewServer(http.HandlerFunc(h.serve))
	return h
}

func (h *holdServer) serve(w http.ResponseWriter, r *http.Request) {
	// Read the body first, as a receiver does before it works.
	_, _ = io.Copy(io.Discard, r.Body)
	h.mu.Lock()
	h.inFlight++
	h.peak = max(h.peak, h.inFlight)
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.inFlight--
		h.mu.Unlock()
	}()
	t := time.NewTimer(h.hold)
	defer t.Stop()
	select {
	case <-t.C:
	case <-h.quit:
	case <-r.Context().Done(): // the worker gave up on it: no one to answer
		return
	}
	w.WriteHeader(http.StatusOK)
	h.mu.Lock()
	h.served++
	h.mu.Unlock()
}

// counts returns the peak of requests held at once and how many were
// answered.
func (h *holdServer) counts() (peak, served int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.peak, h.served
}

func (h *holdServer) close() {
	close(h.quit)
	h.Server.Close()
}
