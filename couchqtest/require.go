package couchqtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/protocol"
)

// RequireOpts narrow what RequireEnqueued and RequireNotEnqueued look for
// among the jobs of a type; every field set must match. The zero value (or
// nil) matches any job of the type.
type RequireOpts struct {
	// Payload is what the job's payload must hold: encoded to JSON, an
	// object matches a payload object that has each of its members, matching
	// (so a few fields of a large payload will do), any other value one
	// equal to it.
	Payload any
	// Priority is the job's priority (1 runs first, 5 last; a job without
	// one has couchq.PriorityDefault); 0 matches any.
	Priority int
	// DueAfter and DueBefore bound when the job is due (a job due at once
	// is due when it was enqueued); zero means unbounded.
	DueAfter, DueBefore time.Time
	// Status is the job's status; "" matches any.
	Status couchq.Status
	// Count, when above 0, is how many jobs must match (RequireEnqueued);
	// 0 means at least one.
	Count int
}

// maxListed bounds the jobs of a type the requirements read.
const maxListed = 1000

// RequireEnqueued checks that the database holds a job of type worker
// matching opts, and returns the jobs that match (in the order of
// couchq.Client.List). When none
// (or not opts.Count) match, it fails the test with what it looked for and
// the jobs of the type it found.
func RequireEnqueued(ctx context.Context, t testing.TB, client *couchq.Client, worker string, opts *RequireOpts) []*couchq.WorkItem {
	t.Helper()
	matched, all, want, ok := find(ctx, t, client, worker, opts)
	if !ok {
		return nil
	}
	switch {
	case opts != nil && opts.Count > 0 && len(matched) != opts.Count:
		t.Fatalf("couchqtest: want %d %s jobs%s, found %d\n%s", opts.Count, worker, want, len(matched), listing(worker, all, matched))
		return nil
	case len(matched) == 0:
		t.Fatalf("couchqtest: no %s job%s was enqueued\n%s", worker, want, listing(worker, all, nil))
		return nil
	}
	return matched
}

// RequireNotEnqueued checks that the database holds no job of type worker
// matching opts (opts.Count is ignored); otherwise it fails the test,
// listing the jobs that match.
func RequireNotEnqueued(ctx context.Context, t testing.TB, client *couchq.Client, worker string, opts *RequireOpts) {
	t.Helper()
	matched, all, want, ok := find(ctx, t, client, worker, opts)
	if ok && len(matched) > 0 {
		t.Fatalf("couchqtest: want no %s job%s, found %d\n%s", worker, want, len(matched), listing(worker, all, matched))
	}
}

// find lists the jobs of type worker and those of them matching opts, with
// what opts asks for in words; ok is false when it failed the test.
func find(ctx context.Context, t testing.TB, client *couchq.Client, worker string, opts *RequireOpts) (matched, all []*couchq.WorkItem, want string, ok bool) {
	t.Helper()
	switch {
	case client == nil:
		t.Fatalf("couchqtest: a nil client: open one with couchq.Open")
		return nil, nil, "", false
	case worker == "":
		t.Fatalf("couchqtest: the job type to look for is required")
		return nil, nil, "", false
	}
	if opts == nil {
		opts = &RequireOpts{}
	}
	var payload json.RawMessage
	if opts.Payload != nil {
		b, err := json.Marshal(opts.Payload)
		if err != nil {
			t.Fatalf("couchqtest: encoding the payload wanted: %v", err)
			return nil, nil, "", false
		}
		payload = b
	}
	all, err := client.List(ctx, couchq.ListOptions{Worker: worker, Limit: maxListed})
	if err != nil {
		t.Fatalf("couchqtest: listing the %s jobs: %v", worker, err)
		return nil, nil, "", false
	}
	for _, it := range all {
		if matches(it, opts, payload) {
			matched = append(matched, it)
		}
	}
	return matched, all, describe(opts, payload), true
}

// matches reports whether it is what opts (its payload encoded) ask for.
func matches(it *couchq.WorkItem, opts *RequireOpts, payload json.RawMessage) bool {
	due := dueAt(it)
	switch {
	case opts.Status != "" && it.Status != opts.Status,
		opts.Priority != 0 && it.EffectivePriority() != opts.Priority,
		!opts.DueAfter.IsZero() && !due.After(opts.DueAfter),
		!opts.DueBefore.IsZero() && !due.Before(opts.DueBefore):
		return false
	}
	if payload == nil {
		return true
	}
	var want, got any
	if json.Unmarshal(payload, &want) != nil {
		return false
	}
	if len(it.Payload) > 0 && json.Unmarshal(it.Payload, &got) != nil {
		return false
	}
	return contains(got, want)
}

// dueAt is when it is due: a job due at once is due when it was enqueued.
func dueAt(it *couchq.WorkItem) time.Time {
	if it.Date == 0 && it.CreatedAt != 0 {
		return protocol.FromUnix(it.CreatedAt)
	}
	return it.DueAt()
}

// contains reports whether got holds want: every member of a wanted object
// (recursively), any other value equal.
func contains(got, want any) bool {
	if w, ok := want.(map[string]any); ok {
		g, ok := got.(map[string]any)
		if !ok {
			return false
		}
		for k, wv := range w {
			gv, ok := g[k]
			if !ok || !contains(gv, wv) {
				return false
			}
		}
		return true
	}
	a, _ := json.Marshal(got)
	b, _ := json.Marshal(want)
	return bytes.Equal(a, b)
}

// describe says what opts ask for: " with payload containing {...}, priority 1".
func describe(opts *RequireOpts, payload json.RawMessage) string {
	var parts []string
	if payload != nil {
		parts = append(parts, "payload containing "+string(payload))
	}
	if opts.Priority != 0 {
		parts = append(parts, fmt.Sprintf("priority %d", opts.Priority))
	}
	if !opts.DueAfter.IsZero() {
		parts = append(parts, "due after "+opts.DueAfter.UTC().Format(time.RFC3339Nano))
	}
	if !opts.DueBefore.IsZero() {
		parts = append(parts, "due before "+opts.DueBefore.UTC().Format(time.RFC3339Nano))
	}
	if opts.Status != "" {
		parts = append(parts, "status "+string(opts.Status))
	}
	if len(parts) == 0 {
		return ""
	}
	return " with " + strings.Join(parts, ", ")
}

// maxShown bounds the jobs a failure lists.
const maxShown = 20

// listing lists the jobs of type worker found, for a failure, marking
// those that matched.
func listing(worker string, all, matched []*couchq.WorkItem) string {
	if len(all) == 0 {
		return "  (the database holds no " + worker + " job)"
	}
	hit := map[string]bool{}
	for _, it := range matched {
		hit[it.ID] = true
	}
	var b strings.Builder
	noun := "jobs"
	if len(all) == 1 {
		noun = "job"
	}
	fmt.Fprintf(&b, "  %d %s %s found", len(all), worker, noun)
	if len(all) >= maxListed {
		fmt.Fprintf(&b, " (the first %d)", maxListed)
	}
	b.WriteString(":")
	for i, it := range all {
		if i == maxShown {
			fmt.Fprintf(&b, "\n  ... and %d more", len(all)-maxShown)
			break
		}
		mark := " "
		if hit[it.ID] {
			mark = "*"
		}
		payload := string(it.Payload)
		if payload == "" {
			payload = "null"
		}
		fmt.Fprintf(&b, "\n  %s %s %s priority %d due %s payload %s", mark, it.ID, it.Status, it.EffectivePriority(),
			dueAt(it).Format(time.RFC3339Nano), payload)
	}
	if len(matched) > 0 {
		b.WriteString("\n  (* matches)")
	}
	return b.String()
}
