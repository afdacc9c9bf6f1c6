package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
)

// couchq slots reserve from 8 commands at once hands out distinct slots
// with no gaps; release moves the last used slot; ls shows them all.
func TestSlotsCommand(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t).withEnv("USER", "ops")
	var (
		mu    sync.Mutex
		slots = map[string]int{}
		wg    sync.WaitGroup
	)
	for p := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			as := fmt.Sprintf("script-%d", p)
			for range 5 {
				r := c.run(t, "slots", "reserve", "tickets", "--format", "AAAA-%04d", "--as", as)
				if r.code != exitOK {
					t.Errorf("reserve: exit %d: %s", r.code, r.stderr)
					return
				}
				slot := strings.TrimSpace(r.stdout)
				mu.Lock()
				slots[slot]++
				mu.Unlock()
				if r := c.run(t, "slots", "release", "tickets", slot, "--as", as); r.code != exitOK || strings.TrimSpace(r.stdout) != "used "+slot {
					t.Errorf("release %s: exit %d: %s %s", slot, r.code, r.stdout, r.stderr)
				}
			}
		}()
	}
	wg.Wait()
	for i := 1; i <= 40; i++ {
		if s := fmt.Sprintf("AAAA-%04d", i); slots[s] != 1 {
			t.Errorf("slot %s handed out %d times", s, slots[s])
		}
	}
	// A slot held by someone else is refused; the holder may abandon it.
	r := c.run(t, "slots", "reserve", "tickets", "--format", "AAAA-%04d", "--ttl", "5m")
	expect(t, r, exitOK)
	slot := strings.TrimSpace(r.stdout)
	if slot != "AAAA-0041" {
		t.Errorf("next slot %s", slot)
	}
	expect(t, c.run(t, "slots", "release", "tickets", slot, "--as", "someone"), exitFailure, "held by cli:ops, not someone")
	expect(t, c.run(t, "slots", "release", "tickets", slot, "--abandon"), exitOK)
	expect(t, c.run(t, "slots", "release", "tickets", slot), exitFailure, "is free, not reserved")
	r = c.run(t, "slots", "ls", "tickets")
	expect(t, r, exitOK)
	if !strings.HasPrefix(r.stdout, "sequence tickets: last used AAAA-0040, 41 slots\n") ||
		!strings.Contains(r.stdout, "AAAA-0041  free") || strings.Count(r.stdout, "  used  ") != 40 {
		t.Errorf("slots ls:\n%s", r.stdout)
	}
	// Another format than the sequence's: the free slot is reused, then
	// nothing, rather than the sequence starting again at 1.
	r = c.run(t, "slots", "reserve", "tickets", "--format", "%d", "--as", "nightly")
	if strings.TrimSpace(r.stdout) != "AAAA-0041" {
		t.Errorf("reserve of the free slot with another format: %+v", r)
	}
	expect(t, c.run(t, "slots", "reserve", "tickets", "--format", "%d", "--as", "nightly"), exitFailure,
		`the last slot used of tickets, "AAAA-0040", is not one this sequence makes`)
	// Slots of a format without padding list in the sequence's order.
	for range 11 {
		r := c.run(t, "slots", "reserve", "plain", "--format", "%d")
		expect(t, r, exitOK)
		expect(t, c.run(t, "slots", "release", "plain", strings.TrimSpace(r.stdout)), exitOK)
	}
	r = c.run(t, "slots", "ls", "plain", "--json")
	expect(t, r, exitOK)
	var plain struct{ Slots []struct{ Slot string } }
	if err := json.Unmarshal([]byte(r.stdout), &plain); err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, s := range plain.Slots {
		order = append(order, s.Slot)
	}
	if got := strings.Join(order, " "); got != "1 2 3 4 5 6 7 8 9 10 11" {
		t.Errorf("slots ls of %%d slots: %s", got)
	}
	expect(t, c.run(t, "slots", "release", "tickets", "AAAA-9999"), exitFailure, "never reserved")
	expect(t, c.run(t, "slots", "reserve", "a:b"), exitUsage, "without ':'")
	expect(t, c.run(t, "slots", "reserve", "t", "--format", "%s"), exitUsage, "invalid --format")
	expect(t, c.run(t, "slots", "frob", "t"), exitUsage, "unknown subcommand")
}
