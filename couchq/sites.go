package couchq

import (
	"context"
	"fmt"

	"github.com/couchq/couchq/internal/protocol"
)

// Sites is the sites document of a queue whose databases, at several
// sites, are linked by replication: the sites (Names lists them), each
// with when it was added and who took it over, and the Default site, which
// owns the jobs that name none. See the sites guide.
type Sites = protocol.SitesDoc

// SiteInfo is one site's entry in Sites.
type SiteInfo = protocol.SiteInfo

// Sites reads the sites document; nil for a single database.
func (c *Client) Sites(ctx context.Context) (*Sites, error) {
	return c.p().ReadSites(ctx)
}

// AddSite adds a site to the queue's sites document, creating it (with the
// site as the default) in a database that has none. Adding a site that is
// there changes nothing.
func (c *Client) AddSite(ctx context.Context, name string) error {
	_, err := c.p().AddSite(ctx, name)
	return err
}

// TakeOver moves every unfinished job that site from owns to site to, for
// when from is gone (down, or cut off for longer than its jobs can wait),
// and makes to the default if from was. It returns how many jobs it moved.
// If from was only cut off, a job it runs meanwhile runs at both sites;
// the job's history shows both runs and the takeover.
func (c *Client) TakeOver(ctx context.Context, from, to string) (int, error) {
	return c.p().TakeOver(ctx, from, to)
}

// SiteLink is one side of LinkSites: a site's queue database and how the
// replicator reaches it.
type SiteLink struct {
	// Site names the site.
	Site string
	// Server is a connection to the site's server.
	Server *Server
	// URL is the server's base URL as the other server reaches it,
	// without credentials; DB is the queue database.
	URL, DB string
	// User and Password are what the replicator signs in with; the links
	// keep them, readable by the servers' admins only.
	User, Password string
}

// LinkSites links two sites' queue databases both ways with continuous
// replication: between two Apache CouchDB servers each pulls from the
// other through its _replicator database; a server without a replicator
// (PouchDB Server) drives both links itself, until it restarts.
func LinkSites(ctx context.Context, a, b SiteLink) error {
	ends := map[string]*protocol.Server{}
	var eps [2]protocol.SiteEndpoint
	for i, l := range []SiteLink{a, b} {
		if l.Server == nil {
			return fmt.Errorf("linking sites: site %s has no Server", l.Site)
		}
		ends[l.Site] = l.Server.s
		eps[i] = protocol.SiteEndpoint{Site: l.Site, URL: l.URL, DB: l.DB, User: l.User, Password: l.Password,
			Replicator: l.Server.s.Caps.Vendor == "couchdb"}
	}
	return protocol.LinkSites(ctx, eps[0], eps[1], ends)
}

// SiteLinkState is one link between two sites' databases as the
// replicator of the server holding it reports it: its state, the changes
// it has yet to copy, what it copied and what the target refused.
type SiteLinkState = protocol.LinkState

// SiteLinks lists the links this server holds for database db (an Apache
// CouchDB server's replicator holds the links that pull into it; PouchDB
// Server holds none it can report). Only a server admin may read them.
func (s *Server) SiteLinks(ctx context.Context, db string) ([]SiteLinkState, error) {
	return s.s.Links(ctx, db)
}

// UnlinkSites removes the links this server holds for database db, so
// that nothing replicates into it until the sites are linked again (which
// resumes from where the links were), and returns how many it removed.
// It waits, up to a few seconds, for the replicator to stop them. PouchDB
// Server runs a producer's links in its process and cannot cancel them:
// there it returns an error and changes nothing.
func (s *Server) UnlinkSites(ctx context.Context, db string) (int, error) {
	if err := s.s.CanUnlink(db); err != nil {
		return 0, err
	}
	return s.s.Unlink(ctx, db)
}

// SiteHeartbeat is a site's heartbeat as this database has it: when one of
// the site's workers last wrote it (At, Unix seconds by the site's clock),
// so how far behind this copy of the site is, plus up to a heartbeat
// interval; and whether the site's workers, started again after it was
// down, wait to hear from the other sites before they claim.
type SiteHeartbeat = protocol.SiteHeartbeat

// SiteHeartbeats reads the sites' heartbeats, by site name: a site none of
// whose workers has run yet, or whose beat the links have not brought, has
// none.
func (c *Client) SiteHeartbeats(ctx context.Context) (map[string]SiteHeartbeat, error) {
	return c.p().SiteHeartbeats(ctx)
}

// SiteRequest is a cancel or retry of a job asked at a site that does not
// own it, or a pause or resume asked of another site (PauseAt): the
// request the calls that return ErrForwarded write, which the owner's
// workers apply once when the links bring it, recording whether they
// applied or refused it, and why.
type SiteRequest = protocol.SiteRequest

// SiteRequests lists the requests this database has, oldest first: all of
// them, or those for one job.
func (c *Client) SiteRequests(ctx context.Context, job string) ([]SiteRequest, error) {
	return c.p().Requests(ctx, job)
}
