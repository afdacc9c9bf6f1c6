package forms

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/protocol"
)

// fakeSites is a sites document and heartbeats as a database has them.
type fakeSites struct {
	doc   *protocol.SitesDoc
	beats map[string]protocol.SiteHeartbeat
}

func (f fakeSites) ReadSites(context.Context) (*protocol.SitesDoc, error) { return f.doc, nil }

func (f fakeSites) SiteHeartbeats(context.Context) (map[string]protocol.SiteHeartbeat, error) {
	return f.beats, nil
}

func TestSitesAndLinks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Date(2030, 1, 2, 0, 0, 30, 0, time.UTC)
	rows, err := Sites(ctx, fakeSites{}, now)
	if err != nil || rows == nil || len(rows) != 0 {
		t.Errorf("a single database: %#v, %v; want an empty list", rows, err)
	}

	src := fakeSites{
		doc: &protocol.SitesDoc{Default: "B", Sites: map[string]protocol.SiteInfo{
			"C": {}, "A": {TakenOverBy: "B"}, "B": {}, "D": {},
		}},
		beats: map[string]protocol.SiteHeartbeat{
			"B": {Site: "B", At: protocol.ToUnix(now.Add(-12 * time.Second))},
			"C": {Site: "C", At: protocol.ToUnix(now.Add(-time.Second)), CatchingUp: true},
			// A's clock runs 3 s ahead of this one.
			"A": {Site: "A", At: protocol.ToUnix(now.Add(3 * time.Second))},
		},
	}
	rows, err = Sites(ctx, src, now)
	if err != nil || len(rows) != 4 {
		t.Fatalf("Sites: %+v, %v", rows, err)
	}
	if r := rows[0]; r.Site != "A" || r.Default || r.HeartbeatAge == nil || *r.HeartbeatAge != 0 || r.TakenOverBy != "B" {
		t.Errorf("A, whose beat is from a clock ahead of this one's (age 0, not negative): %+v", r)
	}
	if r := rows[1]; r.Site != "B" || !r.Default || r.HeartbeatAge == nil || *r.HeartbeatAge != 12 {
		t.Errorf("B: %+v", r)
	}
	if r := rows[2]; r.Site != "C" || !r.CatchingUp || rows[1].CatchingUp {
		t.Errorf("C, catching up, or not in name order: %+v", rows)
	}
	if r := rows[3]; r.Site != "D" || r.HeartbeatAge != nil {
		t.Errorf("D, which has not beaten: %+v", r)
	}

	links := Links([]protocol.LinkState{
		{DocID: "d1", From: "B", To: "A", State: "running", ChangesPending: 3, DocsWritten: 9},
		{DocID: "d2", From: "C", To: "A", State: "crashing", ChangesPending: -1, Error: "unauthorized"},
	})
	if len(links) != 2 || *links[0].ChangesPending != 3 || links[1].ChangesPending != nil {
		t.Errorf("Links: %+v", links)
	}
	var b strings.Builder
	if err := WriteJSON(&b, SitesReport{Sites: []Site{rows[0], rows[3]}, Links: links[1:]}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"heartbeat_age_seconds": null`, `"heartbeat_age_seconds": 0`, `"taken_over_by": "B"`, `"changes_pending": null`, `"error": "unauthorized"`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("JSON lacks %s:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "last_updated") {
		t.Errorf("JSON has a zero last_updated:\n%s", b.String())
	}
	// Links unread are absent; none read are [].
	for _, c := range []struct {
		links []Link
		want  string
	}{{nil, `{"sites":[]}`}, {[]Link{}, `{"sites":[],"links":[]}`}} {
		got, _ := json.Marshal(SitesReport{Sites: []Site{}, Links: c.links})
		if string(got) != c.want {
			t.Errorf("got %s, want %s", got, c.want)
		}
	}
}
