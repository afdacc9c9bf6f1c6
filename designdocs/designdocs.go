// Package designdocs holds couchq's CouchDB design documents and installs them.
//
// There are three. _design/couchq (tree couchq/) holds what workers need on
// every claim: the due_priority view, the changes filter and
// validate_doc_update.
// _design/couchq-sweep (tree couchq-sweep/) holds the views the sweeper,
// agents and slot reservations read (leases, conflicts, held, free_slots).
// _design/couchq-ops (tree couchq-ops/) holds the views people and couchq's
// ops commands read (due, status, events, timings…), with autoupdate off. All
// views of one design document share one index, brought up to date before
// any of its views answers: kept together, every claim's due query would
// first run every other view's map over every changed job, and CouchDB
// would index ops views in the background while workers claim. Apart, the
// sweep views are brought up to date by the sweeps (every SweepInterval,
// many revisions at once) and in the background, and ops views only when
// read, once per document however many revisions it went through in
// between (claimed, then done).
//
// Every function the server runs (maps, reduces, the changes filter,
// validate_doc_update) is a real JavaScript file, embedded into the binary.
// They run in CouchDB's QuickJS engine where the server has it, else in its
// default engine (see Language); they must work in both.
// The layout of a tree is the layout of its design document:
//
//	couchq/views/NAME/map.js      a view's map function
//	couchq/views/NAME/reduce.js   a custom reduce function, or
//	couchq/views/NAME/reduce      a built-in reduce such as _count or _stats
//	couchq/filters/NAME.js        a _changes filter function
//	couchq/validate_doc_update.js the validation function
//
// What several functions share (when a job waits, for one) is written once,
// in lib/: a line "// include: lib/NAME.js" in a function stands for that
// file, indented as the line is. The functions CouchDB stores are whole,
// as if written out: CouchDB's require() has no counterpart in PouchDB
// Server's views.
//
// A fourth, _design/couchq-validate (tree couchq-validate/), holds the
// validation written as a Mango selector (validate_doc_update.json, in a
// design document of language "query"), which CouchDB runs without
// JavaScript where it can (see ValidationMango). It is installed only when
// the database's validation is mango, in place of validate_doc_update.js.
package designdocs

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
)

//go:embed couchq couchq-sweep couchq-ops couchq-validate lib
var embedded embed.FS

// includeMarker, alone on a line of a function's source, stands for a file
// of lib/: one copy of what several functions need.
const includeMarker = "// include: "

// ID is the claim design document's id in every couchq database.
const ID = "_design/couchq"

// Name is the claim design document's name as used in view and filter
// paths (couchq/_view/due, filter=couchq/work).
const Name = "couchq"

// OpsID is the ops design document's id.
const OpsID = "_design/couchq-ops"

// SweepID is the id of the design document of the sweeper's, agents' and
// slot reservations' views.
const SweepID = "_design/couchq-sweep"

// ValidateID is the id of the design document that holds the validation
// written as a Mango selector (ValidationMango).
const ValidateID = "_design/couchq-validate"

// Query is the language of a design document CouchDB runs without
// JavaScript: Mango indexes and, on servers that have it, validation
// written as a Mango selector.
const Query = "query"

// DocFor is the id of the design document that holds view.
func DocFor(view string) string {
	switch view {
	case "activity", "attempt_times", "by_status", "depth", "due", "events", "failed", "site_due", "status", "timings", "workers":
		return OpsID
	case "leases", "conflicts", "held", "free_slots", "dependents", "waiting", "batches":
		return SweepID
	}
	return ID
}

// SchemaVersion orders design documents written by different couchq
// releases. Raise it whenever the views change meaning, so that a newer
// couchq upgrades an older document and an older couchq (still running
// during a rolling deploy) leaves the newer one alone.
//
// Schema 2 records whether validation is on (Meta.Validation), so that a
// couchq of schema 1, which would put validation back, leaves it alone.
// Schema 3 moves leases, conflicts, held and free_slots from _design/couchq
// to _design/couchq-sweep and due to _design/couchq-ops, so that a couchq
// of schema 2 does not put them back (its sweeps and its Next queries
// fail, logged, until it is upgraded: a rolling deploy's new workers sweep
// for every worker).
// Schema 4 may run the functions in CouchDB's QuickJS engine (Language), so
// that a couchq of schema 3, which would put plain javascript back and
// rebuild every index, leaves it alone.
//
// Schema 5 adds workflows: the due views, the status views and the
// changes filter read a waiting job (status waiting, or an after field
// never released) as not claimable, and the sweep document gains the
// dependents, waiting and batches views; a couchq of schema 4 would put
// back due views that list waiting jobs. Its validation function also
// checks the trace and progress fields.
//
// Schema 6 may validate with a Mango selector (ValidationMango) in
// _design/couchq-validate, the claim document then carrying no
// validate_doc_update: a couchq of schema 5 would put the JavaScript
// function back beside it.
// Schema 7 adds the site_due view to _design/couchq-ops (each site's
// backlog), which a couchq of schema 6 would remove; only the ops
// document's indexes, which claims do not read, are rebuilt.
const SchemaVersion = 7

// LanguageSchema is the first schema whose Language was chosen: an older
// document's plain javascript is no one's choice.
const LanguageSchema = 4

// Language is the language of a design document's functions, which picks
// the JavaScript engine CouchDB runs them in.
type Language string

const (
	// LanguageKept keeps the stored documents' language (one of schema 4
	// or later), else takes the best the server has (LanguageFor).
	LanguageKept Language = ""
	// JavaScript runs the functions in the server's default engine:
	// SpiderMonkey, unless an admin set [couchdb] js_engine = quickjs.
	JavaScript Language = "javascript"
	// QuickJS runs them in CouchDB's QuickJS engine whatever the server's
	// default (Apache CouchDB 3.4 and later). On this project's 2-core
	// machine it nearly doubled the server's write rate into a database
	// with validation, and couchq ran 67-112 % faster (see the README's
	// Performance section).
	QuickJS Language = "javascript_quickjs"
)

// ParseLanguage reads "javascript" or "javascript_quickjs".
func ParseLanguage(s string) (Language, error) {
	return parseEither("language", s, JavaScript, QuickJS)
}

// LanguageFor is the language couchq's functions run fastest in on a
// server of vendor ("couchdb" for Apache CouchDB) and version: QuickJS on
// Apache CouchDB 3.4 and later, else JavaScript.
func LanguageFor(vendor, version string) Language {
	if vendor != "couchdb" {
		return JavaScript
	}
	var major, minor int
	if _, err := fmt.Sscanf(version, "%d.%d", &major, &minor); err != nil {
		return JavaScript
	}
	if major > 3 || (major == 3 && minor >= 4) {
		return QuickJS
	}
	return JavaScript
}

// Validation says how a database validates writes.
//
// With it on CouchDB refuses, on every write, a WorkItem no worker could
// run, saying which field is wrong and why, and enforces the roles of
// couchq init --workers/--producers. It runs in CouchDB's JavaScript
// server for every document written, which costs most of the server's
// write capacity (see the README's Performance section). With mango the
// same field checks are a Mango selector that CouchDB runs without
// JavaScript, on servers that have such validation (Apache CouchDB after
// 3.5): malformed WorkItems are refused with CouchDB's "document is not
// valid", but roles are not enforced (a selector does not see who writes)
// and the few rules that compare two fields are not checked (workers
// still quarantine a job that waits for itself). With
// it off, malformed WorkItems are stored and workers quarantine them as
// they meet them (marked failed with the reason), and any member of the
// database may write anything.
type Validation string

const (
	// ValidationKept keeps what the database's design document has: on
	// for a database that has none yet. Workers install with it, so they
	// never undo an admin's choice.
	ValidationKept Validation = ""
	// ValidationOn installs validate_doc_update.
	ValidationOn Validation = "on"
	// ValidationOff installs the design document without it.
	ValidationOff Validation = "off"
	// ValidationMango installs the claim design document without
	// validate_doc_update, and _design/couchq-validate with the checks as
	// a Mango selector. Only servers that run such validation take it.
	ValidationMango Validation = "mango"
	// ValidationAuto is mango where the server runs it and the database
	// is not to enforce roles, else on: what a new database gets.
	ValidationAuto Validation = "auto"
)

// ParseValidation reads "on", "off", "mango" or "auto".
func ParseValidation(s string) (Validation, error) {
	switch v := Validation(s); v {
	case ValidationOn, ValidationOff, ValidationMango, ValidationAuto:
		return v, nil
	}
	return "", fmt.Errorf("validation must be on, off, mango or auto, not %q", s)
}

// parseEither reads s as a or b, the two values an init option called
// what takes.
func parseEither[T ~string](what, s string, a, b T) (T, error) {
	if v := T(s); v == a || v == b {
		return v, nil
	}
	return "", fmt.Errorf("%s must be %s or %s, not %q", what, a, b, s)
}

// Source returns the embedded claim design document tree (rooted at couchq/).
func Source() fs.FS { return subtree("couchq") }

// ValidateSource returns the embedded tree of the validation written as a
// Mango selector (couchq-validate/).
func ValidateSource() fs.FS { return subtree("couchq-validate") }

// SweepSource returns the embedded sweep design document tree (couchq-sweep/).
func SweepSource() fs.FS { return subtree("couchq-sweep") }

// OpsSource returns the embedded ops design document tree (couchq-ops/).
func OpsSource() fs.FS { return subtree("couchq-ops") }

func subtree(dir string) fs.FS {
	sub, err := fs.Sub(embedded, dir)
	if err != nil {
		// fs.Sub only fails on an invalid path; dir is a constant.
		panic(err)
	}
	return sub
}

// expandIncludes replaces each include line of src by the lib file it
// names, each of its lines indented as the include line is.
func expandIncludes(src string) (string, error) {
	if !strings.Contains(src, includeMarker) {
		return src, nil
	}
	lines := strings.Split(src, "\n")
	var out []string
	for _, line := range lines {
		body := strings.TrimLeft(line, " ")
		name, ok := strings.CutPrefix(body, includeMarker)
		if !ok {
			out = append(out, line)
			continue
		}
		if !strings.HasPrefix(name, "lib/") || path.Ext(name) != ".js" || path.Clean(name) != name {
			return "", fmt.Errorf("include of %q: only files of lib/ (lib/NAME.js) can be included", name)
		}
		b, err := fs.ReadFile(embedded, name)
		if err != nil {
			return "", fmt.Errorf("include of %s: %w", name, err)
		}
		indent := line[:len(line)-len(body)]
		for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
			if l != "" {
				l = indent + l
			}
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n"), nil
}

// View is one view of the design document.
type View struct {
	Map    string `json:"map"`
	Reduce string `json:"reduce,omitempty"`
}

// Meta is couchq's own bookkeeping inside the design document.
type Meta struct {
	// Schema is the SchemaVersion of the couchq that wrote the document.
	Schema int `json:"schema"`
	// Hash is a digest of the functions, so that unchanged content is
	// recognised without comparing every function.
	Hash string `json:"hash"`
	// Validation is whether validate_doc_update is installed (on or off;
	// empty in documents from before schema 2, which always had it).
	Validation Validation `json:"validation,omitempty"`
}

// Doc is the design document as couchq writes it.
type Doc struct {
	ID                string            `json:"_id"`
	Rev               string            `json:"_rev,omitempty"`
	Language          string            `json:"language"`
	Views             map[string]View   `json:"views"`
	Filters           map[string]string `json:"filters,omitempty"`
	ValidateDocUpdate string            `json:"validate_doc_update,omitempty"`
	// Selector is validate_doc_update written as a Mango selector, in a
	// document of language Query; it takes the place of ValidateDocUpdate
	// in the stored JSON.
	Selector json.RawMessage `json:"-"`
	// Autoupdate false keeps CouchDB from indexing the views in the
	// background (the ops document): they are indexed when read.
	Autoupdate *bool `json:"autoupdate,omitempty"`
	Couchq     Meta  `json:"couchq"`
}

// Build reads the claim design document's tree (see the package comment)
// into a Doc stamped with schema and the content hash.
func Build(fsys fs.FS, schema int) (*Doc, error) { return build(fsys, ID, schema) }

// BuildOps reads the ops design document's tree: its views are indexed
// only when read (autoupdate false).
func BuildOps(fsys fs.FS, schema int) (*Doc, error) { return build(fsys, OpsID, schema) }

// BuildSweep reads the sweep design document's tree.
func BuildSweep(fsys fs.FS, schema int) (*Doc, error) { return build(fsys, SweepID, schema) }

// BuildValidate reads the tree of the validation written as a Mango
// selector.
func BuildValidate(fsys fs.FS, schema int) (*Doc, error) { return build(fsys, ValidateID, schema) }

func build(fsys fs.FS, id string, schema int) (*Doc, error) {
	doc := &Doc{ID: id, Language: string(JavaScript), Views: map[string]View{}, Filters: map[string]string{}}
	if id == ValidateID {
		doc.Language = Query
	}
	if id == OpsID {
		doc.Autoupdate = new(bool)
	}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return fmt.Errorf("reading %s: %w", p, err)
		}
		src, err := expandIncludes(strings.TrimSpace(string(b)))
		if err != nil {
			return fmt.Errorf("design document tree: %s: %w", p, err)
		}
		parts := strings.Split(p, "/")
		switch {
		case p == "validate_doc_update.js":
			doc.ValidateDocUpdate = src
		case p == "validate_doc_update.json" && id == ValidateID:
			var compact bytes.Buffer
			if err := json.Compact(&compact, []byte(src)); err != nil {
				return fmt.Errorf("design document tree: %s: %w", p, err)
			}
			doc.Selector = compact.Bytes()
		case len(parts) == 2 && parts[0] == "filters" && path.Ext(p) == ".js":
			doc.Filters[strings.TrimSuffix(parts[1], ".js")] = src
		case len(parts) == 3 && parts[0] == "views":
			v := doc.Views[parts[1]]
			switch parts[2] {
			case "map.js":
				v.Map = src
			case "reduce.js", "reduce":
				v.Reduce = src
			default:
				return fmt.Errorf("design document tree: unexpected file %s", p)
			}
			doc.Views[parts[1]] = v
		default:
			return fmt.Errorf("design document tree: unexpected file %s", p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for name, v := range doc.Views {
		if v.Map == "" {
			return nil, fmt.Errorf("design document tree: view %q has no map.js", name)
		}
	}
	if id == ValidateID && (len(doc.Selector) == 0 || len(doc.Views)+len(doc.Filters) > 0) {
		return nil, fmt.Errorf("design document tree: %s must hold validate_doc_update.json alone", id)
	}
	doc.Couchq = Meta{Schema: schema, Hash: doc.contentHash()}
	switch {
	case doc.ValidateDocUpdate != "":
		doc.Couchq.Validation = ValidationOn
	case doc.Selector != nil:
		doc.Couchq.Validation = ValidationMango
	}
	return doc, nil
}

// WithValidation returns a copy of the claim document d with
// validate_doc_update on, off or left to the Mango selector of
// _design/couchq-validate (see Validation); ValidationKept (and
// ValidationAuto, which Init resolves first) returns d itself. Turning it
// back on needs the function, so only a document built with it can.
func (d *Doc) WithValidation(v Validation) *Doc {
	if v == ValidationKept || v == ValidationAuto || v == d.Couchq.Validation {
		return d
	}
	c := *d
	if v == ValidationOff || v == ValidationMango {
		c.ValidateDocUpdate = ""
	}
	c.Couchq.Validation = v
	c.Couchq.Hash = c.contentHash()
	return &c
}

// WithLanguage returns a copy of d whose functions run in lang;
// LanguageKept returns d itself.
func (d *Doc) WithLanguage(lang Language) *Doc {
	if lang == LanguageKept || string(lang) == d.Language {
		return d
	}
	c := *d
	c.Language = string(lang)
	c.Couchq.Hash = c.contentHash()
	return &c
}

// ValidationOf is how the database whose stored claim document is d
// validates: on, off or mango.
func (d *Doc) ValidationOf() Validation {
	switch d.Couchq.Validation {
	case ValidationOff, ValidationMango:
		return d.Couchq.Validation
	}
	return ValidationOn
}

// Default is the claim design document embedded in this build of couchq.
func Default() (*Doc, error) {
	return Build(Source(), SchemaVersion)
}

// DefaultOps is the ops design document embedded in this build of couchq.
func DefaultOps() (*Doc, error) {
	return BuildOps(OpsSource(), SchemaVersion)
}

// DefaultValidate is the design document of the validation written as a
// Mango selector, embedded in this build of couchq.
func DefaultValidate() (*Doc, error) {
	return BuildValidate(ValidateSource(), SchemaVersion)
}

// DefaultSweep is the sweep design document embedded in this build of couchq.
func DefaultSweep() (*Doc, error) {
	return BuildSweep(SweepSource(), SchemaVersion)
}

// Defaults are every design document of this build of couchq, the claim
// document first.
func Defaults() ([]*Doc, error) {
	var docs []*Doc
	for _, build := range []func() (*Doc, error){Default, DefaultSweep, DefaultOps} {
		d, err := build()
		if err != nil {
			return nil, fmt.Errorf("building design documents: %w", err)
		}
		docs = append(docs, d)
	}
	return docs, nil
}

// contentHash digests everything the server runs, in a stable order.
func (d *Doc) contentHash() string {
	h := sha256.New()
	write := func(kind, name, src string) {
		fmt.Fprintf(h, "%s\x00%s\x00%d\x00%s\x00", kind, name, len(src), src)
	}
	write("language", "", d.Language)
	write("validate", "", d.ValidateDocUpdate)
	if d.Couchq.Validation == ValidationMango && d.Selector == nil {
		// The claim document of validation mango runs what validation
		// off's does; its hash tells the two apart, so that switching
		// between them is written.
		write("validation", "", string(ValidationMango))
	}
	if d.Selector != nil {
		write("selector", "", string(d.Selector))
	}
	if d.Autoupdate != nil {
		write("autoupdate", "", fmt.Sprint(*d.Autoupdate))
	}
	for _, name := range sortedKeys(d.Views) {
		write("map", name, d.Views[name].Map)
		write("reduce", name, d.Views[name].Reduce)
	}
	for _, name := range sortedKeys(d.Filters) {
		write("filter", name, d.Filters[name])
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// MarshalJSON keeps empty maps out of the stored document, and writes a
// Selector as validate_doc_update.
func (d *Doc) MarshalJSON() ([]byte, error) {
	type plain Doc
	c := plain(*d)
	if len(c.Filters) == 0 {
		c.Filters = nil
	}
	if c.Selector == nil {
		return json.Marshal(c)
	}
	var views map[string]View
	if len(c.Views) > 0 {
		views = c.Views
	}
	c.Views = nil
	return json.Marshal(struct {
		plain
		Views    map[string]View `json:"views,omitempty"`
		Selector json.RawMessage `json:"validate_doc_update"`
	}{c, views, c.Selector})
}

// UnmarshalJSON reads validate_doc_update as a function's source or as a
// Mango selector (Selector).
func (d *Doc) UnmarshalJSON(b []byte) error {
	type plain Doc
	var c struct {
		plain
		Validate json.RawMessage `json:"validate_doc_update"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return err
	}
	*d = Doc(c.plain)
	d.ValidateDocUpdate, d.Selector = "", nil
	switch v := bytes.TrimSpace(c.Validate); {
	case len(v) == 0 || string(v) == "null":
	case v[0] == '"':
		return json.Unmarshal(v, &d.ValidateDocUpdate)
	default:
		var compact bytes.Buffer
		if err := json.Compact(&compact, v); err != nil {
			return err
		}
		d.Selector = compact.Bytes()
	}
	return nil
}
