package main

import (
	"strings"
	"testing"
)

// enqueue --after makes a waiting job that show and ls present as such;
// a missing dependency, a bad policy and unknown batches are refused.
func TestWorkflowCommands(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	expect(t, c.run(t, "enqueue", "--type", "a", "--id", "job:first", "--in", "1h"), exitOK)
	expect(t, c.run(t, "enqueue", "--type", "b", "--id", "job:second", "--after", "job:first, job:first", "--on-dependency-failure", "run"), exitOK)
	res := c.run(t, "show", "job:second")
	expect(t, res, exitOK)
	for _, want := range []string{"waiting", "job:first (if one fails: run)"} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("show lacks %q:\n%s", want, res.stdout)
		}
	}
	res = c.run(t, "ls", "--status", "waiting")
	expect(t, res, exitOK)
	if !strings.Contains(res.stdout, "job:second") || strings.Contains(res.stdout, "job:first") {
		t.Errorf("ls --status waiting:\n%s", res.stdout)
	}
	expect(t, c.run(t, "enqueue", "--type", "b", "--after", "job:nope"), exitUsage, "job:nope", "no such job")
	expect(t, c.run(t, "enqueue", "--type", "b", "--after", "job:first", "--on-dependency-failure", "maybe"), exitUsage, "--on-dependency-failure")
	expect(t, c.run(t, "enqueue", "--type", "b", "--on-dependency-failure", "run"), exitUsage, "--on-dependency-failure needs --after")
	// --after and --on-dependency-failure are defaults for the lines of a
	// --file that do not set them; a line's own "after" (even an empty
	// one) wins, and its own policy needs an "after".
	expect(t, c.withStdin(`{"type":"c","on_dependency_failure":"run","after":[]}`+"\n").run(t, "enqueue", "--file", "-"), exitUsage, `stdin:1: "on_dependency_failure" needs "after"`)
	lines := `{"type":"c","id":"job:c1"}` + "\n" + `{"type":"c","id":"job:c2","after":[]}` + "\n" + `{"type":"c","id":"job:c3","after":["job:second"],"on_dependency_failure":"cancel"}` + "\n"
	expect(t, c.withStdin(lines).run(t, "enqueue", "--file", "-", "--after", "job:first", "--on-dependency-failure", "run"), exitOK)
	for id, want := range map[string]string{"job:c1": "job:first (if one fails: run)", "job:c2": "queued", "job:c3": "job:second (if one fails: cancel)"} {
		if res := c.run(t, "show", id); !strings.Contains(res.stdout, want) {
			t.Errorf("show %s lacks %q:\n%s", id, want, res.stdout)
		}
	}
	expect(t, c.run(t, "batch", "show", "nope"), exitFailure, "no such batch")
	expect(t, c.run(t, "batch", "cancel", "nope"), exitFailure, "batch nope: no such batch")
	// A batch's jobs are counted from the jobs themselves: here two written
	// by hand, one done, with no callback.
	bulkWrite(t, c.env["COUCHQ_DB"], []any{
		map[string]any{"_id": "hb-1", "type": "WorkItem", "worker": "c", "batch": "hb"},
		map[string]any{"_id": "hb-2", "type": "WorkItem", "worker": "c", "batch": "hb", "status": "done", "finished_at": 1.7e9},
	})
	res = c.run(t, "batch", "show", "hb")
	expect(t, res, exitOK)
	if !strings.Contains(res.stdout, "jobs      2\n") || !strings.Contains(res.stdout, "pending   1\n") {
		t.Errorf("batch show of a batch without a callback:\n%s", res.stdout)
	}
	expect(t, c.run(t, "batch", "frob", "nope"), exitUsage, "want show or cancel")
	// Cancelling the dependency cancels nothing here: the policy is run,
	// so the dependent is released.
	expect(t, c.run(t, "cancel", "job:first"), exitOK)
	res = c.run(t, "show", "job:second")
	if !strings.Contains(res.stdout, "queued") || !strings.Contains(res.stdout, "dependencies-done") {
		t.Errorf("show after the dependency was cancelled:\n%s", res.stdout)
	}
}
