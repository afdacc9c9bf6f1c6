package designdocs

import (
	"io/fs"
	"testing"
	"testing/fstest"
)

// The functions themselves are run through a real server in integration/;
// this checks how the tree becomes a design document.
func TestBuildReadsTheTree(t *testing.T) {
	doc, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"due", "leases", "status", "by_status", "failed", "workers", "events", "timings", "attempt_times", "conflicts", "due_priority", "activity", "depth"} {
		if doc.Views[v].Map == "" {
			t.Errorf("view %s has no map", v)
		}
	}
	if doc.Views["status"].Reduce != "_count" || doc.Views["timings"].Reduce != "_stats" || doc.Views["depth"].Reduce != "_sum" {
		t.Errorf("built-in reduces: status %q timings %q", doc.Views["status"].Reduce, doc.Views["timings"].Reduce)
	}
	if doc.ValidateDocUpdate == "" || doc.Filters["work"] == "" {
		t.Error("validate_doc_update or the work filter is missing")
	}
	if doc.Couchq.Schema != SchemaVersion || doc.Couchq.Hash != doc.contentHash() {
		t.Errorf("meta %+v", doc.Couchq)
	}
}

func TestHashFollowsEveryFunction(t *testing.T) {
	base := fstest.MapFS{}
	src := Source()
	if err := fs.WalkDir(src, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(src, p)
		base[p] = &fstest.MapFile{Data: b}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	want, err := Build(base, 1)
	if err != nil {
		t.Fatal(err)
	}
	for p, f := range base {
		edited := fstest.MapFS{}
		for q, g := range base {
			edited[q] = g
		}
		edited[p] = &fstest.MapFile{Data: append(append([]byte{}, f.Data...), ' ', '1')}
		got, err := Build(edited, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got.Couchq.Hash == want.Couchq.Hash {
			t.Errorf("editing %s does not change the hash", p)
		}
	}
}

func TestBuildRejectsStrayFiles(t *testing.T) {
	for _, tree := range []fstest.MapFS{
		{"views/due/map.js": {Data: []byte("function (doc) {}")}, "views/due/notes.txt": {Data: []byte("x")}},
		{"views/due/reduce": {Data: []byte("_count")}},
		{"README.md": {Data: []byte("x")}},
	} {
		if _, err := Build(tree, 1); err == nil {
			t.Errorf("tree %v accepted", tree)
		}
	}
}
