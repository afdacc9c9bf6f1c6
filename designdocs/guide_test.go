package designdocs

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// The operating guide documents the design documents: its views table lists
// exactly the views that exist, and its Fauxton section names every one, so
// that neither drifts when a view is added or removed.
func TestOperatingGuideListsTheViews(t *testing.T) {
	var views []string
	docs, err := Defaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range docs {
		for v := range doc.Views {
			views = append(views, v)
		}
	}
	sort.Strings(views)
	b, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	guide := string(b)
	section := func(heading string) string {
		_, rest, ok := strings.Cut(guide, "\n"+heading+"\n")
		if !ok {
			t.Fatalf("docs/operating.md has no %q", heading)
		}
		if i := strings.Index(rest, "\n## "); i >= 0 {
			rest = rest[:i]
		}
		return rest
	}

	var table []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|").FindAllStringSubmatch(section("## Design document and views"), -1) {
		table = append(table, m[1])
	}
	sort.Strings(table)
	if strings.Join(table, " ") != strings.Join(views, " ") {
		t.Errorf("docs/operating.md's views table lists %v; the design documents have %v", table, views)
	}
	fauxton := section("## Inspect jobs in Fauxton")
	for _, v := range views {
		if !strings.Contains(fauxton, "`"+v+"`") {
			t.Errorf("docs/operating.md's Fauxton section does not name view %s", v)
		}
	}
}
