package bench

import (
	"context"
	"fmt"
	"runtime/metrics"
	"sync"
	"time"
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
func (b *run) runMemory(_ context.Context, s *Section) error {
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
	return nil
}
