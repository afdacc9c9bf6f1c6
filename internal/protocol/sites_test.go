package protocol

import (
	"encoding/json"
	"testing"
)

// Branches of the sites document merge into every site any lists, the
// earliest added time, the latest takeover, and the default followed
// through the takeovers; the same branches in any order give the same
// document, byte for byte, so that two sites settling them write the
// same revision.
func TestMergeSites(t *testing.T) {
	// berlin added paris while cut off from tokyo, which took berlin over.
	atBerlin := &SitesDoc{Default: "berlin", Sites: map[string]SiteInfo{
		"berlin": {AddedAt: 10}, "tokyo": {AddedAt: 11}, "paris": {AddedAt: 50},
	}}
	atTokyo := &SitesDoc{Default: "tokyo", Sites: map[string]SiteInfo{
		"berlin": {AddedAt: 10, TakenOverBy: "tokyo", TakenOverAt: 40}, "tokyo": {AddedAt: 11},
	}}
	m := mergeSites([]*SitesDoc{atBerlin, atTokyo})
	if m.Default != "tokyo" || len(m.Sites) != 3 || m.Sites["paris"].AddedAt != 50 ||
		m.Sites["berlin"].TakenOverBy != "tokyo" || m.Sites["berlin"].TakenOverAt != 40 {
		t.Fatalf("merged: %+v", m)
	}
	a, _ := json.Marshal(m)
	b, _ := json.Marshal(mergeSites([]*SitesDoc{atTokyo, atBerlin}))
	if string(a) != string(b) {
		t.Errorf("the order of the branches changed the document:\n%s\n%s", a, b)
	}

	// Two takeovers of one site: the latest stands. Each side took the
	// other over: the default is the least name, whichever branch says.
	x := &SitesDoc{Default: "a", Sites: map[string]SiteInfo{"a": {AddedAt: 1, TakenOverBy: "b", TakenOverAt: 5}, "b": {AddedAt: 2}, "c": {AddedAt: 3}}}
	y := &SitesDoc{Default: "c", Sites: map[string]SiteInfo{"a": {AddedAt: 1, TakenOverBy: "c", TakenOverAt: 7}, "b": {AddedAt: 2, TakenOverBy: "a", TakenOverAt: 6}, "c": {AddedAt: 3}}}
	m = mergeSites([]*SitesDoc{x, y})
	if m.Sites["a"].TakenOverBy != "c" || m.Sites["b"].TakenOverBy != "a" || m.Default != "c" {
		t.Errorf("merged takeovers: %+v", m)
	}
	mutual := mergeSites([]*SitesDoc{
		{Default: "b", Sites: map[string]SiteInfo{"a": {TakenOverBy: "b", TakenOverAt: 5}, "b": {}}},
		{Default: "a", Sites: map[string]SiteInfo{"a": {}, "b": {TakenOverBy: "a", TakenOverAt: 6}}},
	})
	if mutual.Default != "a" {
		t.Errorf("two sites that took each other over: default %q, want a", mutual.Default)
	}
}
