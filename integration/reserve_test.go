package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// reserveAll reserves and releases n slots of seq from each client at once
// and returns every slot handed out, in the order the calls returned.
func reserveAll(t *testing.T, ctx context.Context, clients []*protocol.Client, seq protocol.Sequence, n int) []string {
	t.Helper()
	var (
		mu    sync.Mutex
		slots []string
		wg    sync.WaitGroup
	)
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			holder := fmt.Sprintf("holder-%d", i)
			for range n {
				r, err := c.Reserve(ctx, seq, holder)
				if err != nil {
					t.Errorf("%s: %v", holder, err)
					return
				}
				mu.Lock()
				slots = append(slots, r.Slot)
				mu.Unlock()
				if err := c.ReleaseSlot(ctx, r); err != nil {
					t.Errorf("%s releasing %s: %v", holder, r.Slot, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return slots
}

// checkDistinctNoGaps checks that slots are exactly the sequence's first
// len(slots) values, each once.
func checkDistinctNoGaps(t *testing.T, seq protocol.Sequence, slots []string) {
	t.Helper()
	seen := map[string]int{}
	for _, s := range slots {
		seen[s]++
	}
	for s, n := range seen {
		if n > 1 {
			t.Errorf("slot %s handed out %d times", s, n)
		}
	}
	want := seq.Start()
	for i := range len(slots) {
		if seen[want] == 0 {
			t.Errorf("gap: slot %s (the %dth) was never handed out", want, i+1)
		}
		want = seq.Next(want)
	}
}

// 8 clients reserving at once get distinct slots with no gaps, and the
// marker ends at the last.
func TestReserveDistinctNoGaps(t *testing.T) {
	tb := setup(t, protocol.Config{})
	clients := []*protocol.Client{tb.client}
	for range 7 {
		c, err := protocol.New(tb.ctx, server.Client(t).DB(tb.db.Name()), protocol.Config{Logger: tb.log})
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	seq := protocol.NumberedSequence("tickets", "AAAA-%04d", 1, time.Minute)
	// Not the bundle's two minutes: 1,000 reservations take about 85 s on
	// an idle 2-core machine, and more beside the rest of the suite.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	began := time.Now()
	slots := reserveAll(t, ctx, clients, seq, 125)
	t.Logf("%d reservations from 8 clients in %s", len(slots), time.Since(began).Round(time.Millisecond))
	if len(slots) != 1000 {
		t.Fatalf("%d slots handed out, want 1000", len(slots))
	}
	checkDistinctNoGaps(t, seq, slots)
	if last, err := tb.client.LastUsed(ctx, "tickets"); err != nil || last != "AAAA-1000" {
		t.Errorf("marker %q (%v), want AAAA-1000", last, err)
	}
}

// A holder that dies leaves its slot reserved until the TTL runs out; then
// the next Reserve takes it, and the dead holder's late release is refused.
// Abandoned slots are taken first; releases out of order never move the
// marker back.
func TestReserveTTLAbandonAndMarker(t *testing.T) {
	tb := setup(t, protocol.Config{})
	ctx := tb.ctx
	seq := protocol.NumberedSequence("seats", "S%d", 1, time.Second)
	reserve := func(holder string) *protocol.Reservation {
		t.Helper()
		r, err := tb.client.Reserve(ctx, seq, holder)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	dead := reserve("dead") // S1, never released
	live := reserve("live") // S2
	if dead.Slot != "S1" || live.Slot != "S2" {
		t.Fatalf("first slots %s, %s", dead.Slot, live.Slot)
	}
	time.Sleep(1500 * time.Millisecond) // both TTLs run out
	if err := tb.client.ReleaseSlot(ctx, live); err != nil {
		// Its TTL ran out but nobody took it: the release stands.
		t.Fatalf("late release nobody contested: %v", err)
	}
	again := reserve("next")
	if again.Slot != "S1" {
		t.Errorf("after the TTL, Reserve got %s, want the dead holder's S1", again.Slot)
	}
	if err := tb.client.ReleaseSlot(ctx, dead); !errors.Is(err, protocol.ErrReservationLost) {
		t.Errorf("the dead holder's release: %v, want ErrReservationLost", err)
	}
	if err := tb.client.ReleaseSlot(ctx, again); err != nil {
		t.Fatal(err)
	}

	// Out of order: S3, S4, S5 reserved; S5 released first, then S3.
	r3, r4, r5 := reserve("a"), reserve("b"), reserve("c")
	if got := []string{r3.Slot, r4.Slot, r5.Slot}; fmt.Sprint(got) != "[S3 S4 S5]" {
		t.Fatalf("slots %v", got)
	}
	for _, r := range []*protocol.Reservation{r5, r3} {
		if err := tb.client.ReleaseSlot(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if last, _ := tb.client.LastUsed(ctx, "seats"); last != "S5" {
		t.Errorf("marker %s after releasing S5 then S3, want S5", last)
	}
	// A failed job abandons S4: the next Reserve takes it, and the marker stays.
	if err := tb.client.AbandonSlot(ctx, r4); err != nil {
		t.Fatal(err)
	}
	if r := reserve("d"); r.Slot != "S4" {
		t.Errorf("after abandoning S4, Reserve got %s", r.Slot)
	}
	if last, _ := tb.client.LastUsed(ctx, "seats"); last != "S5" {
		t.Errorf("marker %s after an abandon, want S5", last)
	}
	if r := reserve("e"); r.Slot != "S6" {
		t.Errorf("next slot %s, want S6", r.Slot)
	}

	list, err := tb.client.Reservations(ctx, "seats", 100)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, r := range list {
		states[r.Slot] = r.State
	}
	want := map[string]string{"S1": "used", "S2": "used", "S3": "used", "S4": "reserved", "S5": "used", "S6": "reserved"}
	if fmt.Sprint(states) != fmt.Sprint(want) {
		t.Errorf("slots %v, want %v", states, want)
	}
}

// Reservation documents written by hand are validated like jobs.
func TestReservationValidated(t *testing.T) {
	tb := setup(t, protocol.Config{})
	for _, body := range []string{
		`{"type":"SlotReservation","sequence":"s","slot":"1","state":"reserved","expires_at":1,"ordinal":1}`,
		`{"type":"SlotReservation","sequence":"s","slot":"2","state":"taken","expires_at":1,"ordinal":2}`,
	} {
		status, answer := tb.raw(t, http.MethodPut, "/slot:s:9", body)
		if status != http.StatusForbidden {
			t.Errorf("PUT %s: %d %s, want 403", body, status, answer)
		}
	}
	status, answer := tb.raw(t, http.MethodPut, "/slot:s:1", `{"type":"SlotReservation","sequence":"s","slot":"1","state":"free","expires_at":0,"ordinal":1}`)
	if status != http.StatusCreated {
		t.Errorf("a valid reservation: %d %s", status, answer)
	}
	if _, err := tb.client.Reserve(tb.ctx, protocol.Sequence{Name: "x:y"}, "h"); !errors.Is(err, protocol.ErrInvalidSequence) {
		t.Errorf("bad sequence: %v", err)
	}
}

// On the cluster, clients on all three nodes never hold one slot at once.
func TestClusterReserveDistinct(t *testing.T) {
	cb := setupCluster(t, protocol.Config{})
	var clients []*protocol.Client
	for i := range 8 {
		clients = append(clients, cb.clients[i%3])
	}
	seq := protocol.NumberedSequence("invoices", "INV-%05d", 1, time.Minute)
	began := time.Now()
	slots := reserveAll(t, cb.ctx, clients, seq, 25)
	t.Logf("%d reservations from 8 holders on 3 nodes in %s", len(slots), time.Since(began).Round(time.Millisecond))
	seen := map[string]int{}
	for _, s := range slots {
		seen[s]++
		if seen[s] > 1 {
			t.Errorf("slot %s handed out twice", s)
		}
	}
	sorted := append([]string(nil), slots...)
	sort.Strings(sorted)
	if len(sorted) > 0 {
		t.Logf("slots %s .. %s", sorted[0], sorted[len(sorted)-1])
	}
}

// A job type with a sequence gets a reserved slot per attempt: the jobs
// that succeed use the sequence's first values with no gaps, and a failed
// attempt's slot goes to the next job.
func TestWorkerSequenceSlots(t *testing.T) {
	tb := setup(t, protocol.Config{})
	const jobs = 20
	var (
		mu     sync.Mutex
		used   []string
		failed = map[string]bool{}
	)
	handler := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		if job.Slot == "" {
			return fmt.Errorf("no slot")
		}
		mu.Lock()
		defer mu.Unlock()
		// Every fifth job fails its first attempt: its slot is abandoned.
		if n, _ := strconv.Atoi(strings.TrimPrefix(job.ID, "ticket-")); n%5 == 0 && !failed[job.ID] {
			failed[job.ID] = true
			return fmt.Errorf("printer jammed")
		}
		used = append(used, job.Slot)
		return nil
	})
	var ids []string
	for i := range jobs {
		it, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "ticket", ID: fmt.Sprintf("ticket-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, it.ID)
	}
	seq := protocol.NumberedSequence("tickets", "AAAA-%04d", 1, time.Minute)
	cfg := fastWorker(tb, map[string]worker.Handler{"ticket": handler})
	cfg.Sequences = map[string]protocol.Sequence{"ticket": seq}
	startWorker(t, tb, cfg)
	for _, id := range ids {
		waitStatus(t, tb, id, protocol.StatusDone, time.Minute)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(used) != jobs || len(failed) != 4 {
		t.Fatalf("%d slots used by %d jobs (%d failed attempts)", len(used), jobs, len(failed))
	}
	checkDistinctNoGaps(t, seq, used)
	if last, err := tb.client.LastUsed(tb.ctx, "tickets"); err != nil || last != "AAAA-0020" {
		t.Errorf("marker %q (%v), want AAAA-0020", last, err)
	}
}

// Reservations from 8 processes at once (the CLI, each reservation its own
// process run) get distinct slots with no gaps.
func TestReserveFromProcesses(t *testing.T) {
	tb := setup(t, protocol.Config{})
	bin := buildCLI(t)
	const procs, each = 8, 25
	var (
		mu    sync.Mutex
		slots []string
		wg    sync.WaitGroup
	)
	for p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			as := fmt.Sprintf("proc-%d", p)
			for range each {
				code, out, errOut := runCLI(t, bin, tb.db.Name(), "slots", "reserve", "serials", "--format", "S-%05d", "--as", as)
				if code != 0 {
					t.Errorf("%s reserve: exit %d: %s", as, code, errOut)
					return
				}
				slot := strings.TrimSpace(out)
				mu.Lock()
				slots = append(slots, slot)
				mu.Unlock()
				if code, _, errOut := runCLI(t, bin, tb.db.Name(), "slots", "release", "serials", slot, "--as", as); code != 0 {
					t.Errorf("%s release %s: exit %d: %s", as, slot, code, errOut)
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(slots) != procs*each {
		t.Fatalf("%d slots, want %d", len(slots), procs*each)
	}
	checkDistinctNoGaps(t, protocol.NumberedSequence("serials", "S-%05d", 1, 0), slots)
}

// A job whose handler used its slot records it used even when CouchDB
// does not answer as it tries: it tries again, as it does the job's
// outcome (and before it), so the slot does not fall free when its TTL
// runs out and go to the next job as well.
func TestWorkerRecordsAUsedSlotThroughAnOutage(t *testing.T) {
	tb := setup(t, protocol.Config{})
	var outageUntil atomic.Int64 // Unix nanoseconds: writes of slots fail until then
	client := clientThrough(t, tb, protocol.Config{}, func(next http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/slot:") && time.Now().UnixNano() < outageUntil.Load() {
				return nil, errors.New("connection refused (the test's outage)")
			}
			return next.RoundTrip(r)
		})
	})
	var mu sync.Mutex
	var used []string
	cfg := fastWorker(tb, map[string]worker.Handler{"ticket": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		mu.Lock()
		used = append(used, job.Slot)
		mu.Unlock()
		if job.ID == "first" {
			outageUntil.Store(time.Now().Add(2 * time.Second).UnixNano())
		}
		return nil
	})})
	cfg.Sequences = map[string]protocol.Sequence{"ticket": protocol.NumberedSequence("tickets", "T-%04d", 1, time.Second)}
	runWorker(t, tb.ctx, client, cfg)
	mustEnqueue(t, tb, protocol.NewJob{Worker: "ticket", ID: "first"})
	waitStatus(t, tb, "first", protocol.StatusDone, 30*time.Second)
	mustEnqueue(t, tb, protocol.NewJob{Worker: "ticket", ID: "second"})
	waitStatus(t, tb, "second", protocol.StatusDone, 30*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(used, []string{"T-0001", "T-0002"}) {
		t.Fatalf("slots used: %v, want T-0001 then T-0002", used)
	}
	if last, err := tb.client.LastUsed(tb.ctx, "tickets"); err != nil || last != "T-0002" {
		t.Errorf("marker %q (%v), want T-0002", last, err)
	}
}
