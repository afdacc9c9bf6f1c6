package bench

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const regionsDoc = `# Guide

Prose before.

<!-- bench:begin -->
old table
old notes
<!-- bench:end -->

Prose between, kept byte for byte:  trailing blanks  
	and tabs.

  <!-- bench:targets:begin -->
<!-- bench:targets:end -->

` + "```markdown\n<!-- bench:begin -->\nan example in a code block, not a region\n<!-- bench:end -->\n```\n" + `
Prose after, no final newline.`

func TestReplaceRegions(t *testing.T) {
	contents := map[string]string{"bench": "new table\n", "bench:targets": "targets"}
	got, err := ReplaceRegions(regionsDoc, contents)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(regionsDoc, "old table\nold notes\n", "new table\n", 1)
	want = strings.Replace(want, "  <!-- bench:targets:begin -->\n", "  <!-- bench:targets:begin -->\ntargets\n", 1)
	if got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	again, err := ReplaceRegions(got, contents)
	if err != nil || again != got {
		t.Fatalf("not idempotent (err %v):\n%s", err, again)
	}
	// An empty content empties the region, markers kept.
	emptied, err := ReplaceRegions(got, map[string]string{"bench": ""})
	if err != nil || !strings.Contains(emptied, "<!-- bench:begin -->\n<!-- bench:end -->\n") {
		t.Fatalf("emptying (err %v):\n%s", err, emptied)
	}
}

func TestReplaceRegionsRefusesBadMarkers(t *testing.T) {
	b, e := regionMarkers("bench")
	tb, te := regionMarkers("bench:targets")
	for _, c := range []struct {
		name, text string
		want       string // in the error
		noMarkers  bool
	}{
		{"none", "just prose\n", "region bench: no markers <!-- bench:begin --> and <!-- bench:end -->", true},
		{"only in a code block", "```\n" + b + "\n" + e + "\n```\n", "no markers", true},
		{"no begin", "x\n" + e + "\n", "region bench: no <!-- bench:begin --> (<!-- bench:end --> is on line 2)", false},
		{"no end", b + "\nx\n", "region bench: no <!-- bench:end --> (<!-- bench:begin --> is on line 1)", false},
		{"begin twice", b + "\n" + e + "\n" + b + "\n", "<!-- bench:begin --> is on 2 lines (1, 3), want one", false},
		{"end twice", b + "\n" + e + "\n" + e + "\n", "<!-- bench:end --> is on 2 lines (2, 3), want one", false},
		{"end first", e + "\nx\n" + b + "\n", "<!-- bench:end --> (line 1) comes before <!-- bench:begin --> (line 3)", false},
		{"nested", b + "\n" + tb + "\n" + te + "\n" + e + "\n", "region bench:targets begins (line 2) inside region bench (line 1)", false},
		{"overlapping", tb + "\n" + b + "\n" + te + "\n" + e + "\n", "region bench begins (line 2) inside region bench:targets (line 1)", false},
		{"marker with more on its line", "see " + b + "\n" + e + "\n", "region bench: no <!-- bench:begin -->", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			text := c.text
			if !strings.Contains(text, tb) {
				text += tb + "\n" + te + "\n"
			}
			got, err := ReplaceRegions(text, map[string]string{"bench": "new\n", "bench:targets": "new\n"})
			if err == nil {
				t.Fatalf("no error; got:\n%s", got)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q lacks %q", err, c.want)
			}
			if errors.Is(err, ErrNoMarkers) != c.noMarkers {
				t.Errorf("errors.Is(%q, ErrNoMarkers) = %v, want %v", err, !c.noMarkers, c.noMarkers)
			}
		})
	}
}

func TestRewriteRegions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "guide.md")
	if err := os.WriteFile(path, []byte(regionsDoc), 0o640); err != nil {
		t.Fatal(err)
	}
	contents := map[string]string{"bench": "new table", "bench:targets": "targets\n"}
	if err := CheckRegions(path, "bench", "bench:targets"); err != nil {
		t.Fatal(err)
	}
	if err := RewriteRegions(path, contents); err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(first), "<!-- bench:begin -->\nnew table\n<!-- bench:end -->") || strings.Contains(string(first), "old table") {
		t.Fatalf("not rewritten:\n%s", first)
	}
	info, err := os.Stat(path)
	if err != nil || info.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v (err %v), want 0640 kept", info.Mode(), err)
	}
	// A second write with the same contents leaves the file as it is:
	// not even written (its modification time stays).
	past := info.ModTime().Add(-time.Hour)
	if err := os.Chtimes(path, past, past); err != nil {
		t.Fatal(err)
	}
	if err := RewriteRegions(path, contents); err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(path); err != nil || !info.ModTime().Equal(past) {
		t.Errorf("rewritten although unchanged (err %v)", err)
	}
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil || len(entries) != 1 {
		t.Errorf("temporary files left: %v (err %v)", entries, err)
	}
	// A file without a region's markers is left alone; the error names
	// the file and the marker.
	if err := RewriteRegions(path, map[string]string{"bench:summary": "x"}); err == nil ||
		!strings.Contains(err.Error(), path+": region bench:summary: no markers <!-- bench:summary:begin -->") || !errors.Is(err, ErrNoMarkers) {
		t.Errorf("missing markers: %v", err)
	}
	if err := CheckRegions(path, "bench:summary"); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("CheckRegions with missing markers: %v", err)
	}
	after, err := os.ReadFile(path)
	if err != nil || string(after) != string(first) {
		t.Errorf("changed by a failed rewrite (err %v)", err)
	}
	if err := RewriteRegions(filepath.Join(t.TempDir(), "missing.md"), contents); err == nil || !strings.Contains(err.Error(), "missing.md") {
		t.Errorf("missing file: %v", err)
	}
}
