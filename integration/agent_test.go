package integration

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/protocol"
)

// Agents claim by name: what they hold comes back first, and they may only
// act on what they hold.
func TestAgentClaims(t *testing.T) {
	tb := setup(t, protocol.Config{})
	ctx := tb.ctx
	for i := range 6 {
		if _, err := tb.client.Enqueue(ctx, protocol.NewJob{Worker: "review", ID: fmt.Sprintf("r%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := tb.client.ClaimForAgent(ctx, "review", 2, "alice", time.Hour)
	if err != nil || len(got.Claimed) != 2 || len(got.Held) != 0 {
		t.Fatalf("first claim: %+v, %v", got, err)
	}
	first := ids(got.Claimed)
	// Asking again returns alice's own jobs before new ones.
	again, err := tb.client.ClaimForAgent(ctx, "review", 3, "alice", time.Hour)
	if err != nil || fmt.Sprint(ids(again.Held)) != fmt.Sprint(first) || len(again.Claimed) != 1 {
		t.Fatalf("second claim: held %v claimed %v (%v), want held %v and one new", ids(again.Held), ids(again.Claimed), err, first)
	}
	bob, err := tb.client.ClaimForAgent(ctx, "review", 10, "bob", time.Hour)
	if err != nil || len(bob.Claimed) != 3 {
		t.Fatalf("bob: %+v, %v", bob, err)
	}
	if err := tb.client.Extend(ctx, bob.Claimed[0], 0); !errors.Is(err, protocol.ErrInvalidJob) {
		t.Errorf("extending a lease by 0: %v", err)
	}
	// Bob cannot touch alice's job; a job nobody holds is refused too.
	if _, err := tb.client.HeldJob(ctx, first[0], "bob"); !errors.Is(err, protocol.ErrNotHeld) || !strings.Contains(err.Error(), "alice holds it") {
		t.Errorf("bob acting on alice's job: %v", err)
	}
	it, err := tb.client.HeldJob(ctx, first[0], "alice")
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.client.Complete(ctx, it, []byte(`{"verdict":"ok"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.client.HeldJob(ctx, first[0], "alice"); !errors.Is(err, protocol.ErrNotHeld) {
		t.Errorf("acting on a finished job: %v", err)
	}
	// The item a Complete finished is held no more: finishing it again,
	// or failing it (which would queue it again), writes nothing.
	if err := tb.client.Complete(ctx, it, nil); !errors.Is(err, protocol.ErrNotHeld) {
		t.Errorf("completing a job twice: %v", err)
	}
	if err := tb.client.Fail(ctx, it, "late", protocol.FailOptions{}); !errors.Is(err, protocol.ErrNotHeld) {
		t.Errorf("failing a completed job: %v", err)
	}
	if done, err := tb.client.Get(ctx, first[0]); err != nil || done.Status != protocol.StatusDone || string(done.Result) != `{"verdict":"ok"}` {
		t.Errorf("the completed job after a second Complete and a Fail: %+v, %v", done, err)
	}
	// A job read without a claim cannot be finished: nobody ran it.
	if _, err := tb.client.Enqueue(ctx, protocol.NewJob{Worker: "review", ID: "unclaimed"}); err != nil {
		t.Fatal(err)
	}
	loose, err := tb.client.Get(ctx, "unclaimed")
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.client.Complete(ctx, loose, nil); !errors.Is(err, protocol.ErrNotHeld) {
		t.Errorf("completing a job nobody claimed: %v", err)
	}
	if loose, err = tb.client.Get(ctx, "unclaimed"); err != nil || loose.Status != protocol.StatusQueued || loose.Attempts != 0 {
		t.Errorf("the unclaimed job after Complete: %+v, %v", loose, err)
	}
	// An agent's claim whose lease runs out goes back through the sweeper.
	if _, err := tb.client.Enqueue(ctx, protocol.NewJob{Worker: "proofread", ID: "p1"}); err != nil {
		t.Fatal(err)
	}
	if short, err := tb.client.ClaimForAgent(ctx, "proofread", 1, "dave", time.Second); err != nil || len(short.Claimed) != 1 {
		t.Fatalf("dave's claim: %+v %v", short, err)
	}
	time.Sleep(1500 * time.Millisecond)
	if res, err := tb.client.Sweep(ctx, "sweeper", 100); err != nil || res.Requeued != 1 {
		t.Errorf("sweep: %+v %v, want dave's job requeued", res, err)
	}
	if _, err := tb.client.HeldJob(ctx, "p1", "dave"); !errors.Is(err, protocol.ErrNotHeld) {
		t.Errorf("dave acting after his lease was swept: %v", err)
	}
	// A paused type gives no new jobs, only held ones.
	if err := tb.client.Pause(ctx, "review", "ops", ""); err != nil {
		t.Fatal(err)
	}
	if p, err := tb.client.ClaimForAgent(ctx, "review", 5, "carol", time.Hour); err != nil || !p.Paused || len(p.Claimed) != 0 {
		t.Errorf("claim of a paused type: %+v, %v", p, err)
	}
}

// An agent written in shell (examples/review-agent.sh) works the queue
// through the CLI: every review job ends done or failed, claimed by it.
func TestShellAgentExample(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	tb := setup(t, protocol.Config{})
	bin := buildCLI(t)
	want := map[string]protocol.Status{}
	for i := range 12 {
		text := fmt.Sprintf("article %d", i)
		status := protocol.StatusDone
		if i%4 == 0 {
			text += " TODO: sources"
			status = protocol.StatusFailed
		}
		it, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "review", Payload: map[string]string{"text": text}})
		if err != nil {
			t.Fatal(err)
		}
		want[it.ID] = status
	}
	ctx, cancel := context.WithTimeout(tb.ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "../examples/review-agent.sh")
	cmd.Env = withEnv(withEnv(procEnv(tb.db.Name()), "AGENT", "alice"), "COUCHQ", bin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("review-agent.sh: %v\n%s", err, out)
	}
	for id, status := range want {
		it, err := tb.client.Get(tb.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		claimedBy := ""
		for _, e := range it.History {
			if e.Event == protocol.EventClaimed {
				claimedBy = e.By
			}
		}
		if it.Status != status || claimedBy != "alice" {
			t.Errorf("%s: %s, claimed by %q; want %s by alice (history %s)", id, it.Status, claimedBy, status, events(it))
		}
	}
}

// Requeue through the Go API refuses a job its claimant may still be
// running (an agent whose lease runs), unless forced, as couchq requeue
// does.
func TestGoRequeueRefusesALiveClaimant(t *testing.T) {
	tb := setup(t, protocol.Config{})
	q := (*couchq.Client)(tb.client)
	job, err := q.Enqueue(tb.ctx, couchq.NewJob{Worker: "review"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Requeue(tb.ctx, job.ID, false); !errors.Is(err, couchq.ErrWrongState) {
		t.Errorf("requeueing a queued job: %v, want ErrWrongState", err)
	}
	if claim, err := q.ClaimForAgent(tb.ctx, "review", 1, "agent-7", time.Hour); err != nil || len(claim.Claimed) != 1 {
		t.Fatalf("the agent's claim: %+v %v", claim, err)
	}
	if _, err := q.Requeue(tb.ctx, job.ID, false); !errors.Is(err, couchq.ErrWrongState) || !strings.Contains(err.Error(), "its lease runs") {
		t.Errorf("requeueing the job an agent holds: %v, want ErrWrongState naming its lease", err)
	}
	it, err := q.Requeue(tb.ctx, job.ID, true)
	if err != nil || it.Status != couchq.StatusQueued || it.Claimed {
		t.Errorf("requeueing it with force: %+v %v", it, err)
	}
}
