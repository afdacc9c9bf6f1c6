package couchtest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// InjectRevision writes doc as a competing revision, as replication from another node would:
// POST /{db}/_bulk_docs with new_edits=false. doc must carry _id, _rev and _revisions
// ({"start": N, "ids": [newest hash, ..., oldest]}); sharing ancestors with the current winner
// makes the two revisions conflict. The revision is read back; the test fails if it is not there.
//
// PouchDB Server silently drops such writes while any design doc in the database has a
// validate_doc_update. On a server with that flaw (Caps().NewEditsWithValidation false),
// InjectRevision removes validate_doc_update from those design docs, injects, puts them back,
// and logs that it did so.
func InjectRevision(ctx context.Context, t testing.TB, srv *Server, dbName string, doc map[string]any) {
	t.Helper()
	workaround, err := srv.injectRevision(ctx, dbName, doc)
	if workaround != "" {
		t.Log("couchtest: " + workaround)
	}
	if err != nil {
		t.Fatalf("couchtest: InjectRevision: %v", err)
	}
}

// injectRevision returns, besides any error, a note describing the validate_doc_update workaround
// if it had to be used.
func (s *Server) injectRevision(ctx context.Context, db string, doc map[string]any) (workaround string, err error) {
	id, _ := doc["_id"].(string)
	rev, _ := doc["_rev"].(string)
	if id == "" || rev == "" {
		return "", errors.New("doc needs string _id and _rev")
	}
	if _, ok := doc["_revisions"]; !ok {
		return "", fmt.Errorf("doc %q needs _revisions ({start, ids}) to place rev %s in the revision tree", id, rev)
	}
	inject := func() (bool, error) {
		if err := s.bulkNoNewEdits(ctx, db, doc); err != nil {
			return false, err
		}
		return s.hasRev(ctx, db, id, rev)
	}
	landed, err := inject()
	if err != nil || landed {
		return "", err
	}
	if s.caps.NewEditsWithValidation {
		return "", fmt.Errorf("%s accepted doc %q rev %s with new_edits=false, but that revision cannot be read back", s, id, rev)
	}
	ddocs, err := s.validatingDesignDocs(ctx, db)
	if err != nil {
		return "", err
	}
	if len(ddocs) == 0 {
		return "", fmt.Errorf("%s dropped doc %q rev %s (new_edits=false), and no validate_doc_update is there to blame", s, id, rev)
	}
	ids := make([]string, len(ddocs))
	for i, d := range ddocs {
		ids[i], _ = d["_id"].(string)
	}
	workaround = fmt.Sprintf("%s %s silently drops new_edits=false writes while a validate_doc_update exists; "+
		"so validate_doc_update was removed from %s while injecting %q rev %s, then put back",
		s.caps.Vendor, s.caps.Version, strings.Join(ids, ", "), id, rev)
	return workaround, s.withoutValidation(ctx, db, ddocs, func() error {
		landed, err := inject()
		if err == nil && !landed {
			err = fmt.Errorf("%s dropped doc %q rev %s (new_edits=false) even with validate_doc_update removed", s, id, rev)
		}
		return err
	})
}

// validatingDesignDocs returns the design docs of db that have a validate_doc_update.
func (s *Server) validatingDesignDocs(ctx context.Context, db string) ([]map[string]any, error) {
	var all struct {
		Rows []struct {
			Doc map[string]any `json:"doc"`
		} `json:"rows"`
	}
	q := url.Values{"startkey": {`"_design/"`}, "endkey": {`"_design0"`}, "include_docs": {"true"}}
	if _, err := s.do(ctx, http.MethodGet, "/"+url.PathEscape(db)+"/_all_docs?"+q.Encode(), nil, &all); err != nil {
		return nil, fmt.Errorf("listing design docs: %w", err)
	}
	var out []map[string]any
	for _, r := range all.Rows {
		if _, ok := r.Doc["validate_doc_update"]; ok {
			out = append(out, r.Doc)
		}
	}
	return out, nil
}

// withoutValidation runs fn with validate_doc_update removed from ddocs, then writes the original
// design docs back (as new revisions), even if fn fails or ctx is done.
func (s *Server) withoutValidation(ctx context.Context, db string, ddocs []map[string]any, fn func() error) (err error) {
	type stripped struct {
		orig map[string]any
		rev  string // revision without validate_doc_update
	}
	var done []stripped
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		for _, d := range done {
			restored := maps.Clone(d.orig)
			restored["_rev"] = d.rev
			id, _ := d.orig["_id"].(string)
			if _, rerr := s.do(rctx, http.MethodPut, docPath(db, id), restored, nil); rerr != nil {
				err = errors.Join(err, fmt.Errorf("restoring validate_doc_update of %s: %w", id, rerr))
			}
		}
	}()
	for _, d := range ddocs {
		id, _ := d["_id"].(string)
		c := maps.Clone(d)
		delete(c, "validate_doc_update")
		var res struct {
			Rev string `json:"rev"`
		}
		if _, err := s.do(ctx, http.MethodPut, docPath(db, id), c, &res); err != nil {
			return fmt.Errorf("removing validate_doc_update from %s: %w", id, err)
		}
		done = append(done, stripped{orig: d, rev: res.Rev})
	}
	return fn()
}
