package designdocs

import (
	"encoding/json"
	"io/fs"
	"strings"
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
	ops, err := DefaultOps()
	if err != nil {
		t.Fatal(err)
	}
	sweep, err := DefaultSweep()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"due_priority"} {
		if doc.Views[v].Map == "" || ops.Views[v].Map != "" || sweep.Views[v].Map != "" {
			t.Errorf("claim view %s is not (only) in %s", v, ID)
		}
	}
	for _, v := range []string{"leases", "conflicts", "free_slots", "held"} {
		if sweep.Views[v].Map == "" || ops.Views[v].Map != "" || doc.Views[v].Map != "" {
			t.Errorf("sweep view %s is not (only) in %s", v, SweepID)
		}
	}
	if len(doc.Views) != 1 {
		t.Errorf("%s has views %v: every view there is brought up to date by each claim's due query", ID, doc.Views)
	}
	for _, v := range []string{"due", "status", "by_status", "failed", "workers", "events", "timings", "attempt_times", "activity", "depth"} {
		if ops.Views[v].Map == "" || doc.Views[v].Map != "" {
			t.Errorf("ops view %s is not (only) in %s", v, OpsID)
		}
	}
	if ops.Views["status"].Reduce != "_count" || ops.Views["timings"].Reduce != "_stats" || ops.Views["depth"].Reduce != "_sum" {
		t.Errorf("built-in reduces: status %q timings %q", ops.Views["status"].Reduce, ops.Views["timings"].Reduce)
	}
	if doc.ValidateDocUpdate == "" || doc.Filters["work"] == "" || doc.Couchq.Validation != ValidationOn {
		t.Error("validate_doc_update or the work filter is missing")
	}
	if doc.Autoupdate != nil || sweep.Autoupdate != nil || ops.Autoupdate == nil || *ops.Autoupdate {
		t.Errorf("autoupdate: claim %v, sweep %v, ops %v; want the ops document's views indexed only when read", doc.Autoupdate, sweep.Autoupdate, ops.Autoupdate)
	}
	for _, d := range []*Doc{ops, sweep} {
		if d.ValidateDocUpdate != "" || len(d.Filters) != 0 || d.Couchq.Validation != ValidationKept {
			t.Errorf("%s has more than views: %+v", d.ID, d.Couchq)
		}
	}
	for _, d := range []*Doc{doc, ops, sweep} {
		if d.Couchq.Schema != SchemaVersion || d.Couchq.Hash != d.contentHash() {
			t.Errorf("%s: meta %+v", d.ID, d.Couchq)
		}
	}
}

// DocFor, which the queries use, names the document each view is in.
func TestDocForFollowsTheTrees(t *testing.T) {
	docs, err := Defaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range docs {
		for v := range doc.Views {
			if got := DocFor(v); got != doc.ID {
				t.Errorf("DocFor(%q) = %s, but the view is in %s", v, got, doc.ID)
			}
		}
	}
}

// Validation off drops the function and changes the hash; kept returns
// the document itself.
func TestWithValidation(t *testing.T) {
	doc, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	off := doc.WithValidation(ValidationOff)
	if off.ValidateDocUpdate != "" || off.ValidationOf() != ValidationOff || off.Couchq.Hash == doc.Couchq.Hash || off.Couchq.Hash != off.contentHash() {
		t.Errorf("validation off: %+v", off.Couchq)
	}
	if doc.ValidateDocUpdate == "" || doc.WithValidation(ValidationKept) != doc || doc.WithValidation(ValidationOn) != doc {
		t.Error("the original changed, or kept/on copied it")
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

// A function includes a file of lib/ indented as its include line, and
// CouchDB stores it whole; only lib/ files can be included.
func TestBuildIncludesLibFiles(t *testing.T) {
	lib, err := fs.ReadFile(embedded, "lib/waiting.js")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := Build(fstest.MapFS{"views/w/map.js": {Data: []byte("function (doc) {\n  // include: lib/waiting.js\n  emit(waiting(doc), null);\n}\n")}}, 1)
	if err != nil {
		t.Fatal(err)
	}
	m := doc.Views["w"].Map
	if strings.Contains(m, includeMarker) || !strings.Contains(m, "\n  function waiting(d) {\n    if (d.status === 'waiting') {") ||
		!strings.HasSuffix(m, "  }\n  emit(waiting(doc), null);\n}") || strings.Count(m, "\n") != strings.Count(string(lib), "\n")+2 {
		t.Errorf("expanded function:\n%s", m)
	}
	for _, inc := range []string{"lib/missing.js", "../couchq/filters/work.js", "lib/../couchq/filters/work.js", "couchq/filters/work.js", "lib/waiting.txt"} {
		tree := fstest.MapFS{"views/w/map.js": {Data: []byte("function (doc) {\n  // include: " + inc + "\n}")}}
		if _, err := Build(tree, 1); err == nil || !strings.Contains(err.Error(), "views/w/map.js") {
			t.Errorf("include of %s: %v, want an error naming the file", inc, err)
		}
	}
	// Every embedded function is whole: no include line is left.
	for _, f := range []func() (*Doc, error){Default, DefaultSweep, DefaultOps} {
		d, err := f()
		if err != nil {
			t.Fatal(err)
		}
		fns := []string{d.ValidateDocUpdate}
		for _, v := range d.Views {
			fns = append(fns, v.Map, v.Reduce)
		}
		for _, f := range d.Filters {
			fns = append(fns, f)
		}
		for _, fn := range fns {
			if strings.Contains(fn, includeMarker) {
				t.Errorf("%s: a function still has an include line:\n%s", d.ID, fn)
			}
		}
	}
}

func TestLanguageFor(t *testing.T) {
	for _, c := range []struct {
		vendor, version string
		want            Language
	}{
		{"couchdb", "3.5.0", QuickJS},
		{"couchdb", "3.4.2", QuickJS},
		{"couchdb", "4.0.0", QuickJS},
		{"couchdb", "3.3.3", JavaScript},
		{"couchdb", "2.3.1", JavaScript},
		{"couchdb", "", JavaScript},
		{"couchdb", "garbage", JavaScript},
		{"pouchdb", "4.2.0", JavaScript},
		{"", "3.5.0", JavaScript},
	} {
		if got := LanguageFor(c.vendor, c.version); got != c.want {
			t.Errorf("LanguageFor(%q, %q) = %q, want %q", c.vendor, c.version, got, c.want)
		}
	}
}

func TestParseLanguage(t *testing.T) {
	for _, s := range []string{"", "js", "quickjs", "javascript_spidermonkey", "JavaScript"} {
		if _, err := ParseLanguage(s); err == nil {
			t.Errorf("ParseLanguage(%q) accepted it", s)
		}
	}
	for _, l := range []Language{JavaScript, QuickJS} {
		if got, err := ParseLanguage(string(l)); err != nil || got != l {
			t.Errorf("ParseLanguage(%q) = %q, %v", l, got, err)
		}
	}
}

func TestWithLanguage(t *testing.T) {
	d, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	if d.Language != string(JavaScript) || d.WithLanguage(LanguageKept) != d || d.WithLanguage(JavaScript) != d {
		t.Fatalf("built %q; kept or the same language must return the document itself", d.Language)
	}
	q := d.WithLanguage(QuickJS)
	if q.Language != string(QuickJS) || d.Language != string(JavaScript) {
		t.Fatalf("WithLanguage: copy %q, original %q", q.Language, d.Language)
	}
	if q.Couchq.Hash == d.Couchq.Hash || q.Couchq.Hash != q.contentHash() {
		t.Errorf("the hash must follow the language: %s vs %s", q.Couchq.Hash, d.Couchq.Hash)
	}
	// Validation off keeps the language.
	if off := q.WithValidation(ValidationOff); off.Language != string(QuickJS) || off.Couchq.Hash != off.contentHash() {
		t.Errorf("validation off: language %q", off.Language)
	}
}

// The Mango validation document holds its selector as validate_doc_update,
// an object, in a document of language query, and reads back the same.
func TestValidateDocRoundTrips(t *testing.T) {
	v, err := DefaultValidate()
	if err != nil {
		t.Fatal(err)
	}
	if v.ID != ValidateID || v.Language != Query || v.Couchq.Validation != ValidationMango || len(v.Selector) == 0 || v.ValidateDocUpdate != "" {
		t.Fatalf("validate document: id %s, language %s, validation %s, selector %d bytes", v.ID, v.Language, v.Couchq.Validation, len(v.Selector))
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var stored map[string]json.RawMessage
	if err := json.Unmarshal(b, &stored); err != nil {
		t.Fatal(err)
	}
	if s := stored["validate_doc_update"]; len(s) == 0 || s[0] != '{' {
		t.Errorf("validate_doc_update stored as %.40s, want the selector object", s)
	}
	if _, ok := stored["views"]; ok {
		t.Error("the validate document carries views")
	}
	var back Doc
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.contentHash() != v.Couchq.Hash || back.ValidationOf() != ValidationMango {
		t.Errorf("read back: hash %s, want %s; validation %s", back.contentHash(), v.Couchq.Hash, back.ValidationOf())
	}
	// The claim document keeps its function as a string.
	doc, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	b, err = json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var claim Doc
	if err := json.Unmarshal(b, &claim); err != nil {
		t.Fatal(err)
	}
	if claim.ValidateDocUpdate != doc.ValidateDocUpdate || claim.Selector != nil || claim.contentHash() != doc.Couchq.Hash {
		t.Error("the claim document did not read back as written")
	}
	mango := doc.WithValidation(ValidationMango)
	off := doc.WithValidation(ValidationOff)
	if mango.ValidateDocUpdate != "" || mango.ValidationOf() != ValidationMango || mango.ValidationOf() == ValidationOff ||
		mango.Couchq.Hash == doc.Couchq.Hash || mango.Couchq.Hash == off.Couchq.Hash || mango.Couchq.Hash != mango.contentHash() {
		t.Errorf("claim document with validation mango: %+v", mango.Couchq)
	}
}

func TestParseValidation(t *testing.T) {
	for _, s := range []string{"on", "off", "mango", "auto"} {
		if v, err := ParseValidation(s); err != nil || string(v) != s {
			t.Errorf("ParseValidation(%q) = %q, %v", s, v, err)
		}
	}
	for _, s := range []string{"", "On", "js", "yes"} {
		if _, err := ParseValidation(s); err == nil {
			t.Errorf("ParseValidation(%q) accepted", s)
		}
	}
}
