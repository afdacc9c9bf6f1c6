package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// The agent commands: claim by name, act only on what the agent holds
// (exit 3 otherwise, saying who holds it).
func TestAgentCommands(t *testing.T) {
	t.Parallel()
	c := online(t).mustInit(t)
	for _, id := range []string{"a1", "a2", "a3"} {
		expect(t, c.run(t, "enqueue", "--type", "review", "--id", id, "--payload", `{"text":"x"}`), exitOK)
	}
	r := c.run(t, "claim", "--type", "review", "--as", "alice", "--count", "2", "--json")
	expect(t, r, exitOK)
	var jobs []struct {
		ID        string `json:"_id"`
		ClaimedBy string `json:"claimed_by"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &jobs); err != nil || len(jobs) != 2 || jobs[0].ClaimedBy != "alice" {
		t.Fatalf("claim --json: %v %s", err, r.stdout)
	}
	mine, other := jobs[0].ID, jobs[1].ID
	// Plain output: one tab-separated line per job, held ones again first.
	r = c.run(t, "claim", "--type", "review", "--as", "alice", "--count", "3")
	expect(t, r, exitOK)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], mine+"\treview\tuntil ") || !strings.HasSuffix(lines[0], `{"text":"x"}`) {
		t.Fatalf("claim:\n%s", r.stdout)
	}
	expect(t, c.run(t, "complete", mine, "--as", "bob"), exitNotHeld, "alice holds it")
	expect(t, c.run(t, "extend", mine, "--as", "alice", "--lease", "2h"), exitOK)
	r = c.run(t, "progress", mine, "--as", "alice", "--done", "40", "--total", "120", "--note", "page 40")
	expect(t, r, exitOK)
	if strings.TrimSpace(r.stdout) != "progress 40/120 (33%) page 40 of "+mine {
		t.Errorf("progress: %q", r.stdout)
	}
	r = c.run(t, "show", mine)
	if !regexp.MustCompile(`\n  progress +40/120 \(33%\) page 40, reported `).MatchString(r.stdout) {
		t.Errorf("show after progress:\n%s", r.stdout)
	}
	r = c.run(t, "ls", "--type", "review")
	if !strings.Contains(r.stdout, "running 40/120") {
		t.Errorf("ls after progress:\n%s", r.stdout)
	}
	expect(t, c.run(t, "progress", mine, "--as", "bob", "--done", "1"), exitNotHeld, "alice holds it")
	expect(t, c.run(t, "progress", mine, "--as", "alice"), exitUsage, "--done N is required")
	expect(t, c.run(t, "progress", mine, "--as", "alice", "--done", "5", "--total", "4"), exitUsage, "more than --total")
	expect(t, c.run(t, "progress", mine, "--as", "alice", "--done", "-1"), exitUsage, "invalid --done -1")
	expect(t, c.run(t, "progress", mine, "--as", "alice"), exitUsage, "--done N is required")
	expect(t, c.run(t, "complete", mine, "--as", "alice", "--result", `{"ok":true}`), exitOK)
	expect(t, c.run(t, "complete", mine, "--as", "alice"), exitNotHeld, "nobody holds it")
	r = c.run(t, "fail", other, "--as", "alice", "--error", "bad", "--no-retry")
	expect(t, r, exitOK)
	if strings.TrimSpace(r.stdout) != "failed "+other {
		t.Errorf("fail: %q", r.stdout)
	}
	expect(t, c.run(t, "release", "a3", "--as", "alice"), exitOK)
	r = c.run(t, "show", "a3")
	if !strings.Contains(r.stdout, "queued") {
		t.Errorf("released job:\n%s", r.stdout)
	}
	expect(t, c.run(t, "claim", "--type", "review"), exitUsage, "--as NAME is required")
	expect(t, c.run(t, "complete", "a3", "--as", "x", "--result", "{"), exitUsage, "not JSON")
	expect(t, c.run(t, "fail", "a3", "--as", "x"), exitUsage, "--error MSG is required")
	expect(t, c.run(t, "extend", "nope", "--as", "x"), exitFailure, "not found")
}
