package integration

import (
	"testing"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/protocol"
)

// languages are the design document languages couchq's functions must
// work in on this server: the server's default engine, and QuickJS where
// the server has it (where init picks it unasked).
func languages() []designdocs.Language {
	caps := server.Caps()
	if designdocs.LanguageFor(caps.Vendor, caps.Version) == designdocs.QuickJS {
		return []designdocs.Language{designdocs.QuickJS, designdocs.JavaScript}
	}
	return []designdocs.Language{designdocs.JavaScript}
}

// inEachLanguage runs f as a subtest per language, with a bundle whose
// design documents run in it.
func inEachLanguage(t *testing.T, f func(t *testing.T, tb *testBundle)) {
	for _, lang := range languages() {
		t.Run(string(lang), func(t *testing.T) {
			tb := setupWithout(t, protocol.Config{})
			tb.installLanguage(t, lang)
			f(t, tb)
		})
	}
}

// installLanguage installs couchq's design documents with their functions
// in lang.
func (tb *testBundle) installLanguage(t *testing.T, lang designdocs.Language) {
	t.Helper()
	if _, err := protocol.InitWith(tb.ctx, tb.kivik, tb.db.Name(), protocol.InitOptions{Language: lang}, tb.log); err != nil {
		t.Fatal(err)
	}
	tb.checkLanguage(t, lang)
}

// checkLanguage fails the test unless all three design documents are in lang.
func (tb *testBundle) checkLanguage(t *testing.T, lang designdocs.Language) {
	t.Helper()
	for _, id := range []string{designdocs.ID, designdocs.SweepID, designdocs.OpsID} {
		var doc designdocs.Doc
		if err := tb.db.Get(tb.ctx, id).ScanDoc(&doc); err != nil {
			t.Fatal(err)
		}
		if doc.Language != string(lang) {
			t.Errorf("%s: language %q, want %q", id, doc.Language, lang)
		}
	}
}

// Init picks the fastest engine the server has for a new database and for
// one an older couchq installed, keeps an admin's choice when a worker
// (which passes none) runs it again, and changes it when asked.
func TestInitChoosesTheDesignDocumentsLanguage(t *testing.T) {
	caps := server.Caps()
	best := designdocs.LanguageFor(caps.Vendor, caps.Version)
	t.Logf("%s %s: %s", caps.Vendor, caps.Version, best)
	if best != designdocs.QuickJS {
		t.Logf("%s %s has no QuickJS: only the default engine is checked", caps.Vendor, caps.Version)
	}

	tb := setup(t, protocol.Config{})
	tb.checkLanguage(t, best)
	// The functions run: validate_doc_update refuses a bad job and the
	// claim view lists a good one.
	if code, body := tb.raw(t, "PUT", "/bad", `{"type":"WorkItem","worker":""}`); code != 403 {
		t.Errorf("a job without a worker: %d %s, want 403 from validate_doc_update", code, body)
	}
	if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "lang", ID: "good"}); err != nil {
		t.Fatal(err)
	}
	if due, _, err := tb.client.DueCandidates(tb.ctx, "lang", 10, false); err != nil || len(due) != 1 {
		t.Fatalf("due jobs of type lang: %d (%v), want the one enqueued", len(due), err)
	}

	if best != designdocs.QuickJS {
		return // the server has no QuickJS to switch to
	}
	other := designdocs.JavaScript
	o, err := protocol.InitWith(tb.ctx, tb.kivik, tb.db.Name(), protocol.InitOptions{Language: other}, tb.log)
	if err != nil || o != designdocs.Upgraded {
		t.Fatalf("init --language %s: %v %v, want upgraded", other, o, err)
	}
	tb.checkLanguage(t, other)
	// A worker's init (no choice) keeps the admin's.
	if o, err := protocol.Init(tb.ctx, tb.kivik, tb.db.Name(), tb.log); err != nil || o != designdocs.Unchanged {
		t.Fatalf("init without a language after init --language %s: %v %v, want unchanged", other, o, err)
	}
	tb.checkLanguage(t, other)

	// A document of schema 3, before the choice existed, takes the best.
	var stored designdocs.Doc
	if err := tb.db.Get(tb.ctx, designdocs.ID).ScanDoc(&stored); err != nil {
		t.Fatal(err)
	}
	stored.Couchq.Schema = designdocs.LanguageSchema - 1
	stored.Language = string(designdocs.JavaScript)
	if _, err := tb.db.Put(tb.ctx, designdocs.ID, &stored); err != nil {
		t.Fatal(err)
	}
	if o, err := protocol.Init(tb.ctx, tb.kivik, tb.db.Name(), tb.log); err != nil || o != designdocs.Upgraded {
		t.Fatalf("init over schema %d: %v %v, want upgraded", designdocs.LanguageSchema-1, o, err)
	}
	tb.checkLanguage(t, best)
	if due, _, err := tb.client.DueCandidates(tb.ctx, "lang", 10, false); err != nil || len(due) != 1 {
		t.Fatalf("due jobs of type lang after the switch back: %d (%v), want 1", len(due), err)
	}
}
