package forms

import (
	"context"
	"time"

	"github.com/couchq/couchq/internal/protocol"
)

// Site is one site of the sites document as couchq sites --json and
// /api/sites give it, and as couchq_site_heartbeat_age_seconds counts it.
type Site struct {
	Site    string `json:"site"`
	Default bool   `json:"default"`
	// HeartbeatAge is how long before now the site last beat, as this
	// database has its heartbeat: how far behind this copy of the site
	// is, plus up to a heartbeat interval (0 when the site's clock is
	// ahead and its beat reads as one from the future). null when no
	// beat of it is here: none of its workers has run yet, or the links
	// have not brought one.
	HeartbeatAge *float64 `json:"heartbeat_age_seconds"`
	// CatchingUp says the site's workers have started again after it was
	// down and wait to hear from the other sites before they claim.
	CatchingUp bool `json:"catching_up,omitempty"`
	// TakenOverBy names the site that took this one's jobs; "" while it
	// runs its own.
	TakenOverBy string `json:"taken_over_by"`
	// Returned says a site taken over has beaten since: it came back, and
	// its workers run the jobs enqueued for it since.
	Returned bool `json:"returned,omitempty"`
}

// SitesSource is what Sites reads; *protocol.Client is one.
type SitesSource interface {
	ReadSites(ctx context.Context) (*protocol.SitesDoc, error)
	SiteHeartbeats(ctx context.Context) (map[string]protocol.SiteHeartbeat, error)
}

// Sites lists the sites of the sites document in name order, each with its
// heartbeat's age at now; empty, not nil (the JSON has [] where scripts
// iterate), for a database without sites.
func Sites(ctx context.Context, src SitesSource, now time.Time) ([]Site, error) {
	d, err := src.ReadSites(ctx)
	if err != nil || d == nil {
		return []Site{}, err
	}
	beats, err := src.SiteHeartbeats(ctx)
	if err != nil {
		return nil, err
	}
	rows := make([]Site, 0, len(d.Sites))
	for _, name := range d.Names() {
		r := Site{Site: name, Default: name == d.Default, TakenOverBy: d.Sites[name].TakenOverBy}
		if hb, ok := beats[name]; ok {
			// The site's clock wrote At: one a little ahead of this one's
			// reads as a beat from the future, which is a beat just now.
			age := max(now.Sub(protocol.FromUnix(hb.At)).Seconds(), 0)
			r.HeartbeatAge = &age
			r.CatchingUp = hb.CatchingUp
			r.Returned = r.TakenOverBy != "" && protocol.RunsItsOwn(d.Sites[name], hb)
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// Link is one link as couchq sites --json and /api/sites give it.
type Link struct {
	DocID string `json:"doc_id"`
	// From and To are the sites the link copies between.
	From string `json:"from"`
	To   string `json:"to"`
	// State is the replicator's: running, pending, crashing, error,
	// failed, completed.
	State string `json:"state"`
	// ChangesPending is how many changes of the source the link has yet to
	// copy; null when the replicator does not say.
	ChangesPending   *int64 `json:"changes_pending"`
	DocsWritten      int64  `json:"docs_written"`
	DocWriteFailures int64  `json:"doc_write_failures"`
	Error            string `json:"error,omitempty"`
	// LastUpdated is when the replicator last reported on the link.
	LastUpdated time.Time `json:"last_updated,omitzero"`
}

// Links is links in their JSON form; empty, not nil, for none.
func Links(links []protocol.LinkState) []Link {
	out := make([]Link, 0, len(links))
	for _, l := range links {
		f := Link{DocID: l.DocID, From: l.From, To: l.To, State: l.State, DocsWritten: l.DocsWritten,
			DocWriteFailures: l.DocWriteFailures, Error: l.Error, LastUpdated: l.LastUpdated}
		if l.ChangesPending >= 0 {
			f.ChangesPending = &l.ChangesPending
		}
		out = append(out, f)
	}
	return out
}

// SitesReport is /api/sites and couchq sites --json: the sites, and the
// links the server holds for the database.
type SitesReport struct {
	Sites []Site `json:"sites"`
	// Links is absent (nil) when the links could not be read: the
	// replicator's state is a server admin's to read, and a server
	// without a replicator has none. [] means none.
	Links []Link `json:"links,omitzero"`
}
