package protocol

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/go-kivik/kivik/v4/couchdb/chttp"

	"github.com/couchq/couchq/designdocs"
)

// Links between sites are CouchDB continuous replications, held in the
// _replicator database of a site's server. Each Apache CouchDB site pulls
// the other's changes into its own database, so a site that is up keeps
// its inbound link whatever the other does; a site whose server has no
// replicator (PouchDB Server, a producer) is pushed to and pulled from by
// its peer.
//
// What replicates: jobs (with their history and results), the sites
// document, the site heartbeats and the operators' requests (requests.go),
// deletions, and design documents. What stays at each site: the worker registry, rate and run
// slots, slot reservations and sequences, periodic schedules' state and the
// pause controls of job types. Those documents coordinate the workers of
// one site; replicated, two sites' workers would share (and conflict over)
// limits that are meant per site.

// replicatedTypes are the document types links carry.
var replicatedTypes = []string{DocType, SitesDocType, SiteHeartbeatDocType, SiteRequestDocType}

// linkSelector is the replication selector of every link.
func linkSelector() map[string]any {
	return map[string]any{"$or": []any{
		map[string]any{"type": map[string]any{"$in": replicatedTypes}},
		// Design documents but couchq's own. Each site installs those for
		// its server (couchq init): their language and validation follow
		// what the server runs (QuickJS or not, Mango validation or not),
		// and two sites' documents of different content would conflict
		// over the links, CouchDB's arbitrary pick among them becoming
		// every site's (a PouchDB producer's JavaScript ones rebuilding
		// every index in SpiderMonkey, a Mango validation failing every
		// write at a server without it).
		map[string]any{"_id": map[string]any{"$regex": "^_design/(?!couchq$|couchq-)"}},
		// Tombstones carry no type: purged jobs and withdrawn branches
		// must reach the other sites too.
		map[string]any{"_deleted": true},
	}}
}

// SiteEndpoint is one site's queue database as a replicator reaches it.
type SiteEndpoint struct {
	// Site names the site.
	Site string
	// URL is the server's base URL, without credentials.
	URL string
	// DB is the queue database's name.
	DB string
	// User and Password are the credentials the replicator uses; the
	// _replicator document keeps them, readable by the server's admins
	// only.
	User, Password string
	// Replicator is set when the server runs CouchDB's replicator (Apache
	// CouchDB), so that it can hold links.
	Replicator bool
}

func (e SiteEndpoint) replicationEnd() map[string]any {
	end := map[string]any{"url": strings.TrimRight(e.URL, "/") + "/" + url.PathEscape(e.DB)}
	if e.User != "" {
		end["auth"] = map[string]any{"basic": map[string]any{"username": e.User, "password": e.Password}}
	}
	return end
}

// linkDocID is the _replicator document of the link from one site's
// database into another's.
func linkDocID(from, to SiteEndpoint) string {
	return "couchq-" + to.DB + "-from-" + from.Site + "-to-" + to.Site
}

// linkDoc is the _replicator document of the link from into to.
func linkDoc(from, to SiteEndpoint) map[string]any {
	doc := map[string]any{
		"source":     from.replicationEnd(),
		"target":     to.replicationEnd(),
		"continuous": true,
		// One worker per link, not CouchDB's four. A live link's changes
		// arrive one at a time; four workers each take a batch of one
		// (a revs_diff, a _bulk_get and a _bulk_docs per revision), where
		// one worker takes everything that arrived while it wrote the last
		// batch. Batches then grow with the load, and each revision of a
		// job that was replaced before its batch left is not sent at all:
		// with two sites this cut a site's server CPU per job by a
		// quarter, with three by more than a third (docs/design/sites.md).
		"worker_processes": 1,
		"couchq":           map[string]any{"from": from.Site, "to": to.Site, "db": to.DB},
	}
	if from.Replicator {
		doc["selector"] = linkSelector()
	}
	// A server without a replicator (PouchDB Server) has no _selector
	// filter either, and CouchDB's replicator pulling from it through a
	// filter stalled: its links are driven by the producer (linkProducer),
	// and out of it they carry everything. Such a site is a producer, with
	// no workers, so it holds none of the documents that stay at a site.
	return doc
}

// LinkSites sets up continuous replication both ways between two sites'
// queue databases. Between two Apache CouchDB sites each pulls from the
// other through its _replicator database, so the links outlive restarts.
// A site without a replicator (PouchDB Server, a producer) drives both
// directions itself, in its own process: those links end when it stops,
// and linking again after a restart resumes them where they were (PouchDB
// in an application syncs so itself). holders maps a site to a
// connection to its server. Linking again replaces the links (new
// credentials, say).
func LinkSites(ctx context.Context, a, b SiteEndpoint, holders map[string]*Server) error {
	if a.Site == b.Site {
		return fmt.Errorf("linking site %s to itself", a.Site)
	}
	if !a.Replicator && !b.Replicator {
		return fmt.Errorf("linking sites %s and %s: neither server runs CouchDB's replicator (Apache CouchDB does; PouchDB Server does not)", a.Site, b.Site)
	}
	if err := checkLinkEnds(ctx, a, b, holders); err != nil {
		return err
	}
	if !a.Replicator || !b.Replicator {
		producer, peer := a, b
		if a.Replicator {
			producer, peer = b, a
		}
		return linkProducer(ctx, producer, peer, holders[producer.Site])
	}
	type link struct {
		from, to SiteEndpoint
		holder   string
	}
	var links []link
	for _, pair := range [][2]SiteEndpoint{{a, b}, {b, a}} {
		from, to := pair[0], pair[1]
		holder := to.Site // the target pulls
		if !to.Replicator {
			holder = from.Site // the source pushes
		}
		links = append(links, link{from, to, holder})
	}
	for _, l := range links {
		srv := holders[l.holder]
		if srv == nil {
			return fmt.Errorf("linking %s into %s: no connection to site %s, which holds the link", l.from.Site, l.to.Site, l.holder)
		}
		if err := srv.putReplication(ctx, linkDocID(l.from, l.to), linkDoc(l.from, l.to)); err != nil {
			return fmt.Errorf("linking %s into %s: %w", l.from.Site, l.to.Site, err)
		}
	}
	return nil
}

// checkLinkEnds refuses a link that could only fail, or that would
// replace a working link with one that fails: a database that does not
// exist (the replicator would retry it for ever, and the link of the
// same sites it replaced stops), or a site that no sites document of the
// two lists (a misspelt name makes a second link between the same
// databases, which the replicator refuses as a duplicate of the first).
// A database without a sites document is a site still to receive it
// through the link, but one of the two must have it.
func checkLinkEnds(ctx context.Context, a, b SiteEndpoint, holders map[string]*Server) error {
	type listed struct {
		at    string // the site whose database holds it
		sites *SitesDoc
		revs  revisions
	}
	for _, e := range []SiteEndpoint{a, b} {
		if holders[e.Site] == nil {
			return fmt.Errorf("linking sites %s and %s: no connection to site %s", a.Site, b.Site, e.Site)
		}
	}
	if err := checkTwoDatabases(ctx, a, b, holders[a.Site], holders[b.Site]); err != nil {
		return err
	}
	var listing []listed
	for _, e := range []SiteEndpoint{a, b} {
		srv := holders[e.Site]
		var d struct {
			SitesDoc
			Revisions revisions `json:"_revisions"`
		}
		err := srv.Client.DB(e.DB).Get(ctx, SitesDocID, kivik.Param("revs", true)).ScanDoc(&d)
		switch {
		case isStatus(err, http.StatusNotFound):
			// No sites document, or no database: tell them apart.
			exists, xerr := srv.Client.DBExists(ctx, e.DB)
			if xerr != nil {
				return fmt.Errorf("linking sites %s and %s: looking for site %s's database %s: %w", a.Site, b.Site, e.Site, e.DB, xerr)
			}
			if !exists {
				return fmt.Errorf("linking sites %s and %s: site %s's database %s does not exist at %s (run couchq init there first)", a.Site, b.Site, e.Site, e.DB, e.URL)
			}
		case err != nil:
			return fmt.Errorf("linking sites %s and %s: reading site %s's sites document: %w", a.Site, b.Site, e.Site, err)
		default:
			listing = append(listing, listed{e.Site, &d.SitesDoc, d.Revisions})
		}
	}
	if len(listing) == 0 {
		return fmt.Errorf("linking sites %s and %s: neither database has a sites document yet: add the sites at one of them (couchq sites add %s, then %s), or, when they were added at a third site, link them once its links have brought it (couchq sites lists them)", a.Site, b.Site, a.Site, b.Site)
	}
	if len(listing) == 2 {
		// Sites added at each database before they were linked: the link
		// would make the two documents conflict, and CouchDB would keep
		// one of them, the other's sites and default lost.
		x, y := listing[0], listing[1]
		same := x.sites.Default == y.sites.Default && slices.Equal(x.sites.Names(), y.sites.Names())
		// Two documents that share a revision are one document changed at
		// both ends while cut off: the link makes a conflict the workers'
		// sweeps merge (every site added at either, every takeover).
		if !same && !x.revs.shares(y.revs) {
			return fmt.Errorf("linking sites %s and %s: each database has a sites document of its own (site %s's: %s, default %s; site %s's: %s, default %s), and linking would keep only one: add the sites at one database only, delete the other's %s, then link",
				a.Site, b.Site, x.at, strings.Join(x.sites.Names(), ", "), x.sites.Default, y.at, strings.Join(y.sites.Names(), ", "), y.sites.Default, SitesDocID)
		}
	}
	for _, l := range listing {
		for _, name := range []string{a.Site, b.Site} {
			if _, ok := l.sites.Sites[name]; !ok {
				return fmt.Errorf("linking sites %s and %s: site %s is not one of the sites (%s) as site %s's database has them: add it first (couchq sites add %s), or check the name",
					a.Site, b.Site, name, strings.Join(l.sites.Names(), ", "), l.at, name)
			}
		}
	}
	return nil
}

// checkTwoDatabases refuses two ends that are one database (a peer URL
// that names this server again, through another name or the same): the
// link would replace the working links of the two sites with copies of the
// database into itself. A local document, which no link carries, written
// through one end and found through the other tells; the two URLs do not.
func checkTwoDatabases(ctx context.Context, a, b SiteEndpoint, srvA, srvB *Server) error {
	id := "_local/couchq-link-probe-" + strings.TrimPrefix(NewID(), "job:")
	dbA := srvA.Client.DB(a.DB)
	rev, err := dbA.Put(ctx, id, map[string]any{"site": a.Site})
	if isStatus(err, http.StatusNotFound) {
		return fmt.Errorf("linking sites %s and %s: site %s's database %s does not exist at %s (run couchq init there first)", a.Site, b.Site, a.Site, a.DB, a.URL)
	}
	if err != nil {
		return fmt.Errorf("linking sites %s and %s: writing a probe to site %s's database %s: %w", a.Site, b.Site, a.Site, a.DB, err)
	}
	defer func() { _, _ = dbA.Delete(context.WithoutCancel(ctx), id, rev) }()
	err = srvB.Client.DB(b.DB).Get(ctx, id).Err()
	switch {
	case err == nil:
		return fmt.Errorf("linking sites %s and %s: %s at %s and %s at %s are one database: give the other site's server and database (--peer-url, --peer-db)",
			a.Site, b.Site, a.DB, a.URL, b.DB, b.URL)
	case isStatus(err, http.StatusNotFound):
		return nil
	default:
		return fmt.Errorf("linking sites %s and %s: reading site %s's database %s: %w", a.Site, b.Site, b.Site, b.DB, err)
	}
}

// revisions is a document's _revisions: its revision history, newest
// first.
type revisions struct {
	Start int      `json:"start"`
	IDs   []string `json:"ids"`
}

// has reports whether rev is in the history.
func (r revisions) has(rev string) bool {
	gen, hash, ok := strings.Cut(rev, "-")
	if !ok {
		return false
	}
	n, err := strconv.Atoi(gen)
	if err != nil {
		return false
	}
	i := r.Start - n
	return i >= 0 && i < len(r.IDs) && r.IDs[i] == hash
}

// shares reports whether two revision histories have a revision in
// common: they are of one document.
func (r revisions) shares(o revisions) bool {
	for i, hash := range r.IDs {
		if o.has(strconv.Itoa(r.Start-i) + "-" + hash) {
			return true
		}
	}
	return false
}

// ReplicateOnce copies from's queue database into to's once, through the
// server of srv (POST /_replicate, not continuous), carrying what a link
// carries, and returns when the copy is done.
func ReplicateOnce(ctx context.Context, srv *Server, from, to SiteEndpoint) error {
	doc := linkDoc(from, to)
	delete(doc, "continuous")
	delete(doc, "couchq")
	body, err := json.Marshal(doc)
	if err != nil {
		return fmt.Errorf("encoding a replication: %w", err)
	}
	opts := &chttp.Options{NoGzip: true, GetBody: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }}
	var resp struct {
		OK bool `json:"ok"`
	}
	if err := srv.raw.DoJSON(ctx, http.MethodPost, "/_replicate", opts, &resp); err != nil {
		return fmt.Errorf("replicating %s into %s once: %w", from.Site, to.Site, err)
	}
	if !resp.OK {
		return fmt.Errorf("replicating %s into %s once: the server did not say ok", from.Site, to.Site)
	}
	return nil
}

// putReplication writes (or replaces) a link's _replicator document. A
// link replaced starts again at once, even when nothing of it changed
// (restartLink).
func (s *Server) putReplication(ctx context.Context, id string, doc map[string]any) error {
	if err := s.Client.CreateDB(ctx, "_replicator"); err != nil && !isStatus(err, http.StatusPreconditionFailed) {
		return fmt.Errorf("creating _replicator: %w", err)
	}
	db := s.Client.DB("_replicator")
	for round := 0; ; round++ {
		var old map[string]any
		err := db.Get(ctx, id).ScanDoc(&old)
		switch {
		case isStatus(err, http.StatusNotFound):
			delete(doc, "_rev")
			delete(doc, "checkpoint_interval")
		case err != nil:
			return fmt.Errorf("reading _replicator/%s: %w", id, err)
		default:
			doc["_rev"] = old["_rev"]
			doc["checkpoint_interval"] = nextCheckpointInterval(old)
		}
		if _, err = db.Put(ctx, id, doc); err == nil {
			return nil
		}
		if !isStatus(err, http.StatusConflict) || round >= 4 {
			return fmt.Errorf("writing _replicator/%s: %w", id, err)
		}
	}
}

// Unlink removes the links this server holds for db, so that nothing
// replicates into (or, for a peer without a replicator, out of) it until
// the sites are linked again: how an operator cuts a site off on purpose.
// Linking again resumes from where the links were: the replicator keeps
// its checkpoints in the databases.
func (s *Server) Unlink(ctx context.Context, db string) (int, error) {
	repl := s.Client.DB("_replicator")
	rows := repl.AllDocs(ctx, kivik.Params(map[string]any{
		"startkey": "couchq-" + db + "-from-", "endkey": "couchq-" + db + "-from-\ufff0",
	}))
	defer rows.Close()
	type entry struct{ id, rev string }
	var docs []entry
	for rows.Next() {
		id, _ := rows.ID()
		var v struct {
			Rev string `json:"rev"`
		}
		if err := rows.ScanValue(&v); err != nil {
			return 0, fmt.Errorf("reading _replicator/%s: %w", id, err)
		}
		docs = append(docs, entry{id, v.Rev})
	}
	if err := rows.Err(); err != nil {
		if isStatus(err, http.StatusNotFound) {
			return 0, nil
		}
		return 0, fmt.Errorf("listing the links of %s: %w", db, err)
	}
	for _, e := range docs {
		if _, err := repl.Delete(ctx, e.id, e.rev); err != nil && !isStatus(err, http.StatusNotFound) {
			return 0, fmt.Errorf("removing _replicator/%s: %w", e.id, err)
		}
	}
	// The replicator stops a link's job a moment after its document is
	// deleted, and a write made meanwhile could still cross: wait until
	// its scheduler no longer has the job. _scheduler/docs forgets the
	// document before the job is stopped, so ask _scheduler/jobs.
	for _, e := range docs {
		s.awaitLinkStopped(ctx, e.id)
	}
	return len(docs), nil
}

// awaitLinkStopped waits, up to unlinkWait, until the replicator's
// scheduler no longer runs a job for _replicator/id.
func (s *Server) awaitLinkStopped(ctx context.Context, id string) {
	if s.raw == nil {
		return
	}
	deadline := time.Now().Add(unlinkWait)
	for time.Now().Before(deadline) {
		var resp struct {
			Jobs []struct {
				DocID string `json:"doc_id"`
			} `json:"jobs"`
		}
		if err := s.raw.DoJSON(ctx, http.MethodGet, "/_scheduler/jobs", nil, &resp); err != nil {
			return // not ours to read, or no scheduler: nothing to wait for
		}
		running := false
		for _, j := range resp.Jobs {
			running = running || j.DocID == id
		}
		if !running {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// CanUnlink says why Unlink cannot cut db's links on this server: PouchDB
// Server drives a producer's links in its own process (POST /_replicate)
// and cannot cancel them, so Unlink would find none and cut nothing.
func (s *Server) CanUnlink(db string) error {
	if s.Caps.Vendor == "couchdb" {
		return nil
	}
	return fmt.Errorf("unlinking %s: this server has no replicator of its own (%s): its links run in its process until it stops, and it cannot cancel them; restart it to cut them, and link again to resume", db, s.Caps.Vendor)
}

// unlinkWait bounds how long Unlink waits for the replicator to stop a
// link's job.
const unlinkWait = 10 * time.Second

// LinkState is one link as the replicator of the server holding it
// reports it (_scheduler/docs).
type LinkState struct {
	DocID string `json:"doc_id"`
	// From and To are the sites the link copies between.
	From, To string
	// State is the replicator's: running, pending, crashing, error,
	// failed, completed.
	State string `json:"state"`
	// ChangesPending is how many changes of the source the link has yet
	// to copy (-1 when the replicator does not say).
	ChangesPending int64
	// DocsWritten counts what the link has copied since it started, and
	// DocWriteFailures what the target refused (its validation, say).
	DocsWritten, DocWriteFailures int64
	// Error is the replicator's last error, if any.
	Error string
	// LastUpdated is when the replicator last reported on the link.
	LastUpdated time.Time
}

// Links lists the links this server holds for db.
func (s *Server) Links(ctx context.Context, db string) ([]LinkState, error) {
	return readLinks(ctx, s.raw, db)
}

// Links lists the links the client's server holds for its database, as
// Server.Links does. Only a client opened through a Server on Apache
// CouchDB (Server.Open) has the connection the replicator's state is read
// through; any other gets an error, as does a user who is not a server
// admin.
func (c *Client) Links(ctx context.Context) ([]LinkState, error) {
	if c.couch == nil {
		return nil, errors.New("reading the links: the client has no connection to an Apache CouchDB server's replicator (open it with Server.Open)")
	}
	return readLinks(ctx, c.couch, c.db.Name())
}

// readLinks lists the links held for db by the server raw speaks to.
func readLinks(ctx context.Context, raw *chttp.Client, db string) ([]LinkState, error) {
	var resp struct {
		Docs []struct {
			DocID       string         `json:"doc_id"`
			State       string         `json:"state"`
			Info        map[string]any `json:"info"`
			LastUpdated string         `json:"last_updated"`
		} `json:"docs"`
	}
	if err := raw.DoJSON(ctx, http.MethodGet, "/_scheduler/docs/_replicator", nil, &resp); err != nil {
		if isStatus(err, http.StatusNotFound) {
			return nil, nil // no replicator, or no _replicator database yet
		}
		return nil, fmt.Errorf("reading the replicator's state: %w", err)
	}
	prefix := "couchq-" + db + "-from-"
	var links []LinkState
	for _, d := range resp.Docs {
		rest, ok := strings.CutPrefix(d.DocID, prefix)
		if !ok {
			continue
		}
		from, to, _ := strings.Cut(rest, "-to-")
		l := LinkState{DocID: d.DocID, From: from, To: to, State: d.State, ChangesPending: -1}
		if v, ok := d.Info["changes_pending"].(float64); ok {
			l.ChangesPending = int64(v)
		}
		if v, ok := d.Info["docs_written"].(float64); ok {
			l.DocsWritten = int64(v)
		}
		if v, ok := d.Info["doc_write_failures"].(float64); ok {
			l.DocWriteFailures = int64(v)
		}
		if v, ok := d.Info["error"].(string); ok {
			l.Error = v
		}
		l.LastUpdated, _ = time.Parse(time.RFC3339, d.LastUpdated)
		links = append(links, l)
	}
	sort.Slice(links, func(i, j int) bool { return links[i].DocID < links[j].DocID })
	return links, nil
}

// linkProducer has the producer's server replicate both ways with the
// peer's database, continuously (POST /_replicate).
func linkProducer(ctx context.Context, producer, peer SiteEndpoint, srv *Server) error {
	if srv == nil {
		return fmt.Errorf("linking %s and %s: no connection to site %s, which drives the links", producer.Site, peer.Site, producer.Site)
	}
	remote, err := url.Parse(strings.TrimRight(peer.URL, "/") + "/" + url.PathEscape(peer.DB))
	if err != nil {
		return fmt.Errorf("linking %s and %s: site %s's URL: %w", producer.Site, peer.Site, peer.Site, err)
	}
	if peer.User != "" {
		remote.User = url.UserPassword(peer.User, peer.Password)
	}
	for _, dir := range [][2]string{{producer.DB, remote.String()}, {remote.String(), producer.DB}} {
		// Both ways, what a link between sites carries and no more: into
		// the producer, the peer's per-site documents would otherwise
		// reach every other site the producer links to; out of it, its
		// own design documents would conflict with the peer's. The
		// source runs the filter (PouchDB's replication passes it on).
		link := map[string]any{"source": dir[0], "target": dir[1], "continuous": true, "filter": designdocs.Name + "/replicate"}
		body, err := json.Marshal(link)
		if err != nil {
			return fmt.Errorf("encoding a link: %w", err)
		}
		opts := &chttp.Options{NoGzip: true, GetBody: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }}
		var resp map[string]any
		if err := srv.raw.DoJSON(ctx, http.MethodPost, "/_replicate", opts, &resp); err != nil {
			// Never the URL in the message: it carries the password.
			return fmt.Errorf("linking %s and %s at %s: %w", producer.Site, peer.Site, producer.Site, err)
		}
	}
	return nil
}

// RestartFailedLinks starts again, at once, the links that the client's
// server holds into its database and that its replicator reports failed
// (crashing, or error). CouchDB backs a failed replication off for 30 s,
// doubling with each failure, and starts it again only at its next
// scheduling pass (every minute by default). A link that failed once
// while its site restarted (the other site out of reach a moment, or this
// server not yet answering itself) then stays down for longer than the
// restarted site's workers wait to hear through it, and one that failed
// for as long as its other site was down (an hour: backoffs of up to
// half an hour) can come back long after the site. Rewriting the link's _replicator
// document starts it now, from its checkpoint; a link restarted less than
// notWithin ago (by another worker of the site, say) is left to that
// restart. It returns the links it restarted, as they were before.
// Reading the replicator's state and writing _replicator need a server
// admin's credentials: without them, or on a server without a replicator,
// it returns an error wrapping ErrLinksOutOfReach and restarts nothing.
func (c *Client) RestartFailedLinks(ctx context.Context, notWithin time.Duration) ([]LinkState, error) {
	if c.couch == nil {
		return nil, fmt.Errorf("%w: the client has no connection to an Apache CouchDB server's replicator", ErrLinksOutOfReach)
	}
	links, err := c.Links(ctx)
	if isStatus(err, http.StatusUnauthorized) || isStatus(err, http.StatusForbidden) {
		return nil, fmt.Errorf("%w: %w", ErrLinksOutOfReach, err)
	}
	if err != nil {
		return nil, err
	}
	var restarted []LinkState
	for _, l := range links {
		if l.To != c.cfg.Site || (l.State != "crashing" && l.State != "error") {
			continue
		}
		done, err := c.restartLink(ctx, l.DocID, notWithin)
		if err != nil {
			if isStatus(err, http.StatusUnauthorized) || isStatus(err, http.StatusForbidden) {
				err = fmt.Errorf("%w: %w", ErrLinksOutOfReach, err)
			}
			return restarted, fmt.Errorf("restarting the link from %s: %w", l.From, err)
		}
		if done {
			restarted = append(restarted, l)
		}
	}
	return restarted, nil
}

// linkCheckpointInterval is CouchDB's default checkpoint interval of a
// replication, in milliseconds: restartLink moves a link's between it and
// one more.
const linkCheckpointInterval = 30000

// ErrLinksOutOfReach says that the client may not read or restart its
// server's links: they need a server admin, and a server that runs
// CouchDB's replicator.
var ErrLinksOutOfReach = errors.New("the links are out of this client's reach")

// nextCheckpointInterval is the checkpoint interval that makes a
// rewrite of the link doc old start the link again. The replicator ignores
// a rewrite that leaves the replication as it was (its source, target and
// options), so a rewrite moves the interval by a millisecond, between
// CouchDB's default and one more: an option that is not part of the
// replication's id, so the link goes on from its checkpoint.
func nextCheckpointInterval(old map[string]any) int {
	if v, ok := old["checkpoint_interval"].(float64); ok && v == linkCheckpointInterval {
		return linkCheckpointInterval + 1
	}
	return linkCheckpointInterval
}

// restartLink rewrites _replicator/id so that the replicator starts the
// link again at once, unless it was restarted less than notWithin ago; it
// reports whether it did.
func (c *Client) restartLink(ctx context.Context, id string, notWithin time.Duration) (bool, error) {
	path := "/_replicator/" + url.PathEscape(id)
	var doc map[string]any
	if err := c.couch.DoJSON(ctx, http.MethodGet, path, nil, &doc); err != nil {
		return false, fmt.Errorf("reading _replicator/%s: %w", id, err)
	}
	mark, _ := doc["couchq"].(map[string]any)
	if mark == nil {
		mark = map[string]any{}
	}
	now := c.now()
	if at, ok := mark["restarted_at"].(float64); ok && now.Sub(FromUnix(at)) < notWithin {
		return false, nil
	}
	doc["checkpoint_interval"] = nextCheckpointInterval(doc)
	mark["restarted_at"] = ToUnix(now)
	doc["couchq"] = mark
	body, err := json.Marshal(doc)
	if err != nil {
		return false, fmt.Errorf("encoding _replicator/%s: %w", id, err)
	}
	opts := &chttp.Options{NoGzip: true, GetBody: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }}
	var resp struct {
		OK bool `json:"ok"`
	}
	err = c.couch.DoJSON(ctx, http.MethodPut, path, opts, &resp)
	if isStatus(err, http.StatusConflict) {
		return false, nil // rewritten meanwhile (another worker of the site): restarted too
	}
	if err != nil {
		return false, fmt.Errorf("writing _replicator/%s: %w", id, err)
	}
	return true, nil
}
