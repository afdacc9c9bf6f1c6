package protocol

import "testing"

// A link between two replicating sites pulls continuously through the
// link selector with one replicator worker, so that its batches grow with
// the load instead of carrying one revision each.
func TestLinkDoc(t *testing.T) {
	from := SiteEndpoint{Site: "A", URL: "http://a:5984/", DB: "jobs", User: "admin", Password: "secret", Replicator: true}
	to := SiteEndpoint{Site: "B", URL: "http://b:5984", DB: "jobs", Replicator: true}
	doc := linkDoc(from, to)
	if doc["continuous"] != true {
		t.Errorf("continuous: %v", doc["continuous"])
	}
	if doc["worker_processes"] != 1 {
		t.Errorf("worker_processes: %v, want 1", doc["worker_processes"])
	}
	if _, ok := doc["selector"]; !ok {
		t.Error("no selector on a link out of a server with a replicator")
	}
	src, _ := doc["source"].(map[string]any)
	if src["url"] != "http://a:5984/jobs" || src["auth"] == nil {
		t.Errorf("source: %v", src)
	}
	if tgt, _ := doc["target"].(map[string]any); tgt["url"] != "http://b:5984/jobs" || tgt["auth"] != nil {
		t.Errorf("target: %v", tgt)
	}
	// Out of a server without a replicator (PouchDB Server) there is no
	// _selector filter to use.
	from.Replicator = false
	if _, ok := linkDoc(from, to)["selector"]; ok {
		t.Error("a selector on a link out of a server without a replicator")
	}
}

// A revision is in a history when its generation's entry is its hash.
func TestRevisionsHas(t *testing.T) {
	h := revisions{Start: 3, IDs: []string{"c", "b", "a"}}
	for rev, want := range map[string]bool{
		"3-c": true, "2-b": true, "1-a": true,
		"3-b": false, "4-d": false, "0-x": false, "2": false, "x-b": false, "": false,
	} {
		if got := h.has(rev); got != want {
			t.Errorf("has(%q) = %v, want %v", rev, got, want)
		}
	}
}
