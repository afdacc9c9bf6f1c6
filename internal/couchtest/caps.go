package couchtest

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Capabilities describes what the server supports, detected from GET / and GET /{db} and, where
// harmless, by probing.
type Capabilities struct {
	// Vendor is "couchdb", "pouchdb-server", or the vendor name GET / reports for anything else.
	Vendor  string
	Version string
	// Features is GET /'s features list (CouchDB only).
	Features []string
	// SelectorFilter: _changes?filter=_selector works (CouchDB >= 2). Never probed: it crashes
	// the whole PouchDB Server 4.2.0 process.
	SelectorFilter bool
	// Cluster: GET /{db} has a cluster object; ClusterN is its n (1 without one).
	Cluster  bool
	ClusterN int
	// NewEditsWithValidation: _bulk_docs with new_edits=false stores a new revision of an existing
	// doc while a validate_doc_update exists. Probed; false on PouchDB Server 4.2.0, which
	// silently drops such writes.
	NewEditsWithValidation bool
}

func detectCapabilities(ctx context.Context, s *Server) (Capabilities, error) {
	var welcome struct {
		CouchDB        string   `json:"couchdb"`
		ExpressPouchDB string   `json:"express-pouchdb"`
		Version        string   `json:"version"`
		Features       []string `json:"features"`
		Vendor         struct {
			Name string `json:"name"`
		} `json:"vendor"`
	}
	if _, err := s.do(ctx, http.MethodGet, "/", nil, &welcome); err != nil {
		return Capabilities{}, err
	}
	c := Capabilities{Version: welcome.Version, Features: welcome.Features, ClusterN: 1}
	switch {
	case welcome.CouchDB != "":
		c.Vendor = "couchdb"
		major, _ := strconv.Atoi(strings.SplitN(welcome.Version, ".", 2)[0])
		c.SelectorFilter = major >= 2
	case welcome.ExpressPouchDB != "":
		c.Vendor = "pouchdb-server"
	default:
		c.Vendor = welcome.Vendor.Name
	}

	// A scratch database for the per-database facts; never one of the caller's.
	db := "couchq_caps_probe_" + randomHex(6)
	if _, err := s.do(ctx, http.MethodPut, "/"+db, nil, nil); err != nil {
		return c, fmt.Errorf("creating probe database: %w", err)
	}
	defer s.do(context.WithoutCancel(ctx), http.MethodDelete, "/"+db, nil, nil) //nolint:errcheck // best effort cleanup

	var info struct {
		Cluster *struct {
			N int `json:"n"`
		} `json:"cluster"`
	}
	if _, err := s.do(ctx, http.MethodGet, "/"+db, nil, &info); err != nil {
		return c, err
	}
	if info.Cluster != nil {
		c.Cluster = true
		if info.Cluster.N > 0 {
			c.ClusterN = info.Cluster.N
		}
	}

	ddoc := map[string]any{"validate_doc_update": "function (newDoc, oldDoc, userCtx) {}"}
	if _, err := s.do(ctx, http.MethodPut, docPath(db, "_design/probe"), ddoc, nil); err != nil {
		return c, fmt.Errorf("creating probe design doc: %w", err)
	}
	// Graft a second revision onto an existing doc, like a conflicting replicated edit. (PouchDB
	// Server's validation wrapper replaces _revisions with the stored doc's history, so a brand-new
	// doc would get through and hide the problem.)
	var first struct {
		Rev string `json:"rev"`
	}
	if _, err := s.do(ctx, http.MethodPut, docPath(db, "probe"), map[string]any{}, &first); err != nil {
		return c, fmt.Errorf("creating probe doc: %w", err)
	}
	hash := randomHex(16)
	doc := map[string]any{
		"_id":        "probe",
		"_rev":       "2-" + hash,
		"_revisions": map[string]any{"start": 2, "ids": []string{hash, strings.SplitN(first.Rev, "-", 2)[1]}},
	}
	if err := s.bulkNoNewEdits(ctx, db, doc); err != nil {
		return c, err
	}
	landed, err := s.hasRev(ctx, db, "probe", "2-"+hash)
	c.NewEditsWithValidation = landed
	return c, err
}

// bulkNoNewEdits stores doc's revision as given (_rev and _revisions), the way replication does.
func (s *Server) bulkNoNewEdits(ctx context.Context, db string, doc map[string]any) error {
	var results []struct {
		ID     string `json:"id"`
		Error  string `json:"error"`
		Reason string `json:"reason"`
	}
	body := map[string]any{"new_edits": false, "docs": []any{doc}}
	if _, err := s.do(ctx, http.MethodPost, "/"+url.PathEscape(db)+"/_bulk_docs", body, &results); err != nil {
		return err
	}
	for _, r := range results {
		if r.Error != "" {
			return fmt.Errorf("_bulk_docs new_edits=false on %s: %s: %s: %s", db, r.ID, r.Error, r.Reason)
		}
	}
	return nil
}

// hasRev reports whether revision rev of doc id can be read.
func (s *Server) hasRev(ctx context.Context, db, id, rev string) (bool, error) {
	status, err := s.do(ctx, http.MethodGet, docPath(db, id)+"?rev="+url.QueryEscape(rev), nil, nil)
	if status == http.StatusNotFound {
		return false, nil
	}
	return err == nil, err
}
