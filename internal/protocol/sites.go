package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/go-kivik/kivik/v4"
)

// Sites: several databases, each at its own site with its own workers,
// linked by CouchDB's replication into one queue. Every job has one owner
// site, the only one whose workers claim it, so that two sites never claim
// the same revision of a job (each would be the only writer it sees, and
// both would run it). A job names its owner in its site field; a job
// without one belongs to the default site of the sites document, which
// replicates with the jobs. A database without a sites document is a
// single site, as before sites existed: every worker may claim every job.
// The why of the design is in docs/design/sites.md.

const (
	// SitesDocID is the sites document's id.
	SitesDocID = "sites"
	// SitesDocType is the sites document's type field.
	SitesDocType = "Sites"
	// SiteHeartbeatDocType is the type of a site's heartbeat document
	// (SiteHeartbeatID), which the site's workers keep fresh and links
	// carry to the other sites: how they see that it is alive, and how far
	// behind their copy of it is.
	SiteHeartbeatDocType = "SiteHeartbeat"
	// SiteNameRule says what a site name may be, for error messages.
	SiteNameRule = "1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit"
)

var siteNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ValidSiteName reports whether s may name a site.
func ValidSiteName(s string) bool { return siteNameRE.MatchString(s) }

// ErrNotOwner means a claim was refused before it was written because the
// job belongs to another site. It is a claim conflict: the claimant moves
// on to other work.
var ErrNotOwner = fmt.Errorf("%w: the job belongs to another site", ErrClaimConflict)

// ErrNoSite means a worker or agent without a site met a database that
// has sites: it cannot tell which jobs are its own.
var ErrNoSite = errors.New("the database has sites: a worker or agent must name its own (--site, COUCHQ_SITE, or site in the worker config file)")

// SiteInfo is one site's entry in the sites document.
type SiteInfo struct {
	// AddedAt is when the site joined (Unix seconds).
	AddedAt float64 `json:"added_at"`
	// TakenOverBy names the site that took this one's unfinished jobs
	// (TakeOver), and TakenOverAt says when; empty while it runs its own.
	TakenOverBy string  `json:"taken_over_by,omitempty"`
	TakenOverAt float64 `json:"taken_over_at,omitempty"`
}

// SitesDoc is the sites document: which sites form the queue and which
// of them owns the jobs that name none.
type SitesDoc struct {
	ID      string              `json:"_id"`
	Rev     string              `json:"_rev,omitempty"`
	Type    string              `json:"type"`
	Default string              `json:"default"`
	Sites   map[string]SiteInfo `json:"sites"`
}

// Names lists the sites in name order.
func (d *SitesDoc) Names() []string {
	names := make([]string, 0, len(d.Sites))
	for n := range d.Sites {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ReadSites reads the sites document; nil when the database has none.
func (c *Client) ReadSites(ctx context.Context) (*SitesDoc, error) {
	var d SitesDoc
	err := c.db.Get(ctx, SitesDocID, c.readOpts()...).ScanDoc(&d)
	if isStatus(err, http.StatusNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the sites document: %w", err)
	}
	if d.Type != SitesDocType || !ValidSiteName(d.Default) {
		return nil, fmt.Errorf("reading the sites document: %w", &MalformedError{ID: SitesDocID, Field: "default", Reason: "must name a site"})
	}
	return &d, nil
}

// AddSite adds a site to the sites document, creating it with the site as
// the default when the database has none. Adding a site that is there
// changes nothing.
func (c *Client) AddSite(ctx context.Context, name string) (*SitesDoc, error) {
	if !ValidSiteName(name) {
		return nil, fmt.Errorf("invalid site name %q: want %s", name, SiteNameRule)
	}
	return c.changeSites(ctx, func(d *SitesDoc) bool {
		if _, ok := d.Sites[name]; ok {
			return false
		}
		d.Sites[name] = SiteInfo{AddedAt: ToUnix(c.now())}
		if d.Default == "" {
			d.Default = name
		}
		return true
	})
}

// changeSites reads the sites document (an empty one when there is none),
// applies change and writes it when change says it changed, again on a
// 409.
func (c *Client) changeSites(ctx context.Context, change func(d *SitesDoc) bool) (*SitesDoc, error) {
	for round := 0; ; round++ {
		d, err := c.ReadSites(ctx)
		if err != nil {
			return nil, err
		}
		if d == nil {
			d = &SitesDoc{ID: SitesDocID, Type: SitesDocType}
		}
		if d.Sites == nil {
			d.Sites = map[string]SiteInfo{}
		}
		if !change(d) {
			return d, nil
		}
		rev, err := c.db.Put(ctx, SitesDocID, d, c.writeOpts()...)
		if err == nil {
			d.Rev = rev
			c.setSites(d)
			return d, nil
		}
		if !isStatus(err, http.StatusConflict) || round >= 4 {
			return nil, fmt.Errorf("writing the sites document: %w", err)
		}
	}
}

// siteState is what a client knows of the sites document.
type siteState struct {
	// multi is set when the database has a sites document.
	multi bool
	// def is the default site.
	def string
	// names are the sites the document lists.
	names map[string]bool
}

// setSites records what d says (nil: no sites document).
func (c *Client) setSites(d *SitesDoc) {
	st := siteState{}
	if d != nil {
		st = siteState{multi: true, def: d.Default, names: map[string]bool{}}
		for n := range d.Sites {
			st.names[n] = true
		}
	}
	c.sites.Store(&st)
}

// checkSites refuses, one error per item (nil for those that pass), the
// jobs that name a site the database's sites document does not list: no
// site would run them, and the default site's sweeper would fail them
// later. A miss reads the sites document again first (a site may have
// been added since the client last read it, here or at a linked site).
// A database without a sites document takes jobs for any site: it may be
// a producer that has not been linked yet (it learns the sites from its
// link), and its jobs run once they reach their owner.
func (c *Client) checkSites(ctx context.Context, items []*WorkItem) []error {
	errs := make([]error, len(items))
	unlisted := func(it *WorkItem) bool {
		st := c.siteView()
		return it != nil && it.Site != "" && st.multi && !st.names[it.Site]
	}
	sited := func(it *WorkItem) bool { return it != nil && it.Site != "" }
	if !slices.ContainsFunc(items, sited) {
		return errs
	}
	if err := c.loadSites(ctx); err == nil && !slices.ContainsFunc(items, unlisted) {
		if !c.siteView().multi && !c.warnedNoSites.Swap(true) {
			// Right for a producer not linked yet; in a database that is
			// no site, nothing will ever run these jobs.
			i := slices.IndexFunc(items, sited)
			c.log.Warn().Str("site", items[i].Site).Str("worker", items[i].Worker).
				Msg("enqueueing jobs for a site in a database without sites: no worker here runs them, only the site's once a link carries them there (couchq sites link); said once per client")
		}
		return errs
	}
	if err := c.RefreshSites(ctx); err != nil {
		for i, it := range items {
			if unlisted(it) {
				errs[i] = fmt.Errorf("enqueueing %s job for site %s: reading the sites document: %w", it.Worker, it.Site, err)
			}
		}
		return errs
	}
	for i, it := range items {
		if unlisted(it) {
			names := slices.Sorted(maps.Keys(c.siteView().names))
			errs[i] = fmt.Errorf("%w: site %s is not one of the database's sites (%s): add it (couchq sites add %s), or enqueue the job for a listed site",
				ErrInvalidJob, it.Site, strings.Join(names, ", "), it.Site)
		}
	}
	return errs
}

// loadSites reads the sites document unless this client has read it: a
// client without a site reads it only when it needs to know.
func (c *Client) loadSites(ctx context.Context) error {
	if c.sites.Load() != nil {
		return nil
	}
	return c.RefreshSites(ctx)
}

// siteView is what the client last read of the sites document.
func (c *Client) siteView() siteState {
	if st := c.sites.Load(); st != nil {
		return *st
	}
	return siteState{}
}

// RefreshSites reads the sites document again: a site added, or the
// default moved by a takeover, reaches a running worker this way.
func (c *Client) RefreshSites(ctx context.Context) error {
	d, err := c.ReadSites(ctx)
	if err != nil {
		return err
	}
	c.setSites(d)
	return nil
}

// SiteListed reports whether the sites document this client last read
// lists site, and whether the database has one at all.
func (c *Client) SiteListed(site string) (listed, haveSites bool) {
	st := c.siteView()
	return st.names[site], st.multi
}

// Site is the site this client works for; empty for none.
func (c *Client) Site() string { return c.cfg.Site }

// Owner is the site that owns item: its site field, else the default
// site; empty in a database without sites.
func (c *Client) Owner(item *WorkItem) string {
	if item.Site != "" {
		return item.Site
	}
	return c.siteView().def
}

// owns reports whether this client's workers may claim item, and if not,
// why.
func (c *Client) owns(item *WorkItem) error {
	st := c.siteView()
	switch {
	case !st.multi && item.Site == "":
		return nil // a single database, as before sites
	case c.cfg.Site == "":
		return ErrNoSite
	case c.Owner(item) != c.cfg.Site:
		return fmt.Errorf("claiming %s: %w (%s)", item.ID, ErrNotOwner, c.Owner(item))
	}
	return nil
}

// queueKeys are the first components of the due_priority keys of the
// jobs of type worker this client's site owns: the type alone for the
// jobs that name no site (a database without sites, or the default site),
// and [site, type] for those that name this site.
func (c *Client) queueKeys(worker string) []any {
	st := c.siteView()
	if c.cfg.Site == "" {
		return []any{worker}
	}
	keys := []any{[]any{c.cfg.Site, worker}}
	if !st.multi || st.def == c.cfg.Site {
		keys = append(keys, worker)
	}
	return keys
}

// siteSelector narrows a _changes selector to the jobs this site owns;
// nil without a site.
func (c *Client) siteSelector() map[string]any {
	if c.cfg.Site == "" {
		return nil
	}
	mine := []any{map[string]any{"site": c.cfg.Site}}
	if st := c.siteView(); !st.multi || st.def == c.cfg.Site {
		mine = append(mine, map[string]any{"site": map[string]any{"$exists": false}}, map[string]any{"site": nil})
	}
	return map[string]any{"$or": mine}
}

// CheckSite says whether this client may claim at all: ErrNoSite when the
// database has sites (as last read) and the client names none.
//
// A client of a site the sites document does not list (yet) may enqueue —
// a producer names its jobs' owner before its first link brought the
// document — but its workers may not claim: CheckSite says so.
func (c *Client) CheckSite() error {
	st := c.siteView()
	switch {
	case st.multi && c.cfg.Site == "":
		return ErrNoSite
	case c.cfg.Site == "":
		return nil
	case !st.multi:
		return fmt.Errorf("site %s: the database has no sites document (couchq sites add %s)", c.cfg.Site, c.cfg.Site)
	case !st.names[c.cfg.Site]:
		return fmt.Errorf("site %s is not one of the database's sites (couchq sites add %s)", c.cfg.Site, c.cfg.Site)
	}
	return nil
}

// ownsUnsited reports whether this client's site owns the documents that
// name no site, or whose site cannot be read (malformed ones, which it
// quarantines): the default site, or any client of a database without
// sites.
func (c *Client) ownsUnsited() bool {
	st := c.siteView()
	if !st.multi {
		return true
	}
	return c.cfg.Site != "" && st.def == c.cfg.Site
}

// ownsLeaves reports whether this client's site settles a conflicted
// job: the one its live branches name as owner. Branches disagree after a
// takeover (the old owner's copy still names it): the branch that records
// the latest takeover names the owner.
func (c *Client) ownsLeaves(leaves []Leaf) bool {
	owner := ownerLeaf(leaves)
	if owner == nil {
		return c.ownsUnsited()
	}
	return c.owns(owner) == nil
}

// ownerLeaf is the branch of a conflicted job that names its owner: the
// one with the latest takeover, else the first live one (nil: none).
func ownerLeaf(leaves []Leaf) *WorkItem {
	var owner *WorkItem
	latest := ""
	for _, l := range leaves {
		if l.Item == nil || l.Deleted {
			continue
		}
		if owner == nil {
			owner = l.Item
		}
		for _, e := range l.Item.History {
			if e.Event == EventSiteTakeover && e.At > latest {
				owner, latest = l.Item, e.At
			}
		}
	}
	return owner
}

// EventSiteTakeover is the history entry of a job moved to another site by
// a takeover.
const EventSiteTakeover = "site-takeover"

// TakeOver moves every unfinished job that site from owns to site to: for
// when from is gone (down, or cut off for longer than its jobs can wait).
// Each job then names to as its owner, a claim from's workers held is
// returned to the queue (its attempt stays counted), and its history gets
// a site-takeover entry. When from was the default site, to becomes it, so
// that the jobs that name no site are to's too. It returns how many jobs
// it moved. Run it at a site that is up; from's jobs that had not reached
// that site are not moved, and if from was only cut off and runs a moved
// job meanwhile, that job runs twice: its history shows both runs and the
// takeover.
func (c *Client) TakeOver(ctx context.Context, from, to string) (int, error) {
	if from == to {
		return 0, &describedError{fmt.Sprintf("taking site %s over: a site cannot take itself over", from), ErrInvalidJob}
	}
	var known, wasDefault bool
	_, err := c.changeSites(ctx, func(d *SitesDoc) bool {
		_, okFrom := d.Sites[from]
		_, okTo := d.Sites[to]
		known = okFrom && okTo
		if !known {
			return false
		}
		wasDefault = d.Default == from || d.Sites[from].TakenOverBy == to && d.Default == to
		info := d.Sites[from]
		info.TakenOverBy, info.TakenOverAt = to, ToUnix(c.now())
		d.Sites[from] = info
		if d.Default == from {
			d.Default = to
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	if !known {
		d, _ := c.ReadSites(ctx)
		var names []string
		if d != nil {
			names = d.Names()
		}
		missing := from
		if slices.Contains(names, from) {
			missing = to
		}
		return 0, &describedError{fmt.Sprintf("taking site %s over by %s: site %s is not one of the sites (%s)", from, to, missing, strings.Join(names, ", ")), ErrNotFound}
	}
	// The jobs that were from's before the default moved: those naming it,
	// and, when it was the default, those naming none.
	owned := func(it *WorkItem) bool { return it.Site == from || (it.Site == "" && wasDefault) }
	var ids []string
	for _, st := range []Status{StatusQueued, StatusRunning} {
		rows := c.view(ctx, "by_status", kivik.Params(map[string]any{
			"startkey": []any{string(st)}, "endkey": []any{string(st), map[string]any{}}, "include_docs": true,
		}))
		b, err := c.scan(rows, "listing the jobs of site "+from)
		if err != nil {
			return 0, err
		}
		for _, it := range b.Items {
			if owned(it) {
				ids = append(ids, it.ID)
			}
		}
	}
	moved := 0
	by := c.cfg.Actor
	for _, id := range ids {
		ok, err := c.moveJob(ctx, id, from, to, by, owned)
		if err != nil {
			return moved, err
		}
		if ok {
			moved++
		}
	}
	return moved, nil
}

// moveJob moves one job of from's to to, unless it finished or moved
// meanwhile.
func (c *Client) moveJob(ctx context.Context, id, from, to, by string, owned func(*WorkItem) bool) (bool, error) {
	for round := 0; ; round++ {
		var it WorkItem
		if err := c.db.Get(ctx, id, c.readOpts()...).ScanDoc(&it); err != nil {
			if isStatus(err, http.StatusNotFound) {
				return false, nil
			}
			return false, fmt.Errorf("reading job %s: %w", id, err)
		}
		if it.Status.Terminal() || !owned(&it) {
			return false, nil
		}
		next := it.Clone()
		next.Site = to
		if next.Claimed || next.Status == StatusRunning {
			c.unclaim(next)
			next.Status = StatusQueued
		}
		c.record(next, EventSiteTakeover, by, fmt.Sprintf("site %s taken over by %s", from, to))
		_, err := c.db.Put(ctx, id, next, c.writeOpts()...)
		if err == nil {
			return true, nil
		}
		if !isStatus(err, http.StatusConflict) || round >= 4 {
			return false, fmt.Errorf("moving job %s to site %s: %w", id, to, err)
		}
	}
}

// SiteHeartbeatID is the id of a site's heartbeat document.
func SiteHeartbeatID(site string) string { return "site:" + site }

// SiteHeartbeat is a site's heartbeat document.
type SiteHeartbeat struct {
	ID   string `json:"_id"`
	Rev  string `json:"_rev,omitempty"`
	Type string `json:"type"`
	Site string `json:"site"`
	// At is when a worker of the site last wrote it (Unix seconds, the
	// site's clock).
	At float64 `json:"at"`
	// CatchingUp says the site's workers started after it was down and
	// wait to hear from the other sites before they claim (BeatCatchingUp).
	CatchingUp bool `json:"catching_up,omitempty"`
}

// Beat writes this site's heartbeat document now; a client without a site
// writes nothing. Two workers of a site beating at once is no error: one
// of the two writes is enough.
func (c *Client) Beat(ctx context.Context) error { return c.beat(ctx, false) }

// BeatCatchingUp is Beat for a worker that waits to hear from the other
// sites before it claims: the other sites' workers hear from it, and this
// site's workers that start meanwhile wait too.
func (c *Client) BeatCatchingUp(ctx context.Context) error { return c.beat(ctx, true) }

func (c *Client) beat(ctx context.Context, catchingUp bool) error {
	if c.cfg.Site == "" {
		return nil
	}
	id := SiteHeartbeatID(c.cfg.Site)
	hb := SiteHeartbeat{ID: id, Type: SiteHeartbeatDocType, Site: c.cfg.Site, At: ToUnix(c.now()), CatchingUp: catchingUp}
	rev, err := currentRev(ctx, c.db, id)
	if err != nil && !isStatus(err, http.StatusNotFound) {
		return fmt.Errorf("reading site %s's heartbeat: %w", c.cfg.Site, err)
	}
	hb.Rev = rev
	if _, err := c.db.Put(ctx, id, hb, c.writeOpts()...); err != nil && !isStatus(err, http.StatusConflict) {
		return fmt.Errorf("writing site %s's heartbeat: %w", c.cfg.Site, err)
	}
	return nil
}

// SiteHeartbeats reads every site's heartbeat as this database has it.
func (c *Client) SiteHeartbeats(ctx context.Context) (map[string]SiteHeartbeat, error) {
	rows := c.db.AllDocs(ctx, kivik.Params(map[string]any{
		"include_docs": true, "startkey": "site:", "endkey": "site:\ufff0",
	}))
	defer rows.Close()
	out := map[string]SiteHeartbeat{}
	for rows.Next() {
		var hb SiteHeartbeat
		if err := rows.ScanDoc(&hb); err != nil || hb.Type != SiteHeartbeatDocType {
			continue
		}
		out[hb.Site] = hb
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the sites' heartbeats: %w", err)
	}
	return out, nil
}

// settleSites merges the branches of a conflicted sites document into
// one, written over CouchDB's winner, and deletes the others. Sites
// changed at two linked databases at once, or on both sides of a cut (a
// site added at one, another taken over at the other), leave such a
// conflict, and CouchDB alone would keep one branch: a site added on the
// other would be lost, and the default site's sweeper would then fail its
// jobs as a site the queue does not have. Every site's sweeper settles
// it. Two that merge the same branches write the same revisions (CouchDB
// derives a revision from its parent and its body, and the merge is
// deterministic), so their writes meet without conflicting again. It
// reports whether it settled one.
func (c *Client) settleSites(ctx context.Context) (bool, error) {
	if err := c.loadSites(ctx); err != nil || !c.siteView().multi {
		return false, err
	}
	var head struct {
		Conflicts []string `json:"_conflicts"`
	}
	err := c.db.Get(ctx, SitesDocID, kivik.Param("conflicts", true)).ScanDoc(&head)
	switch {
	case isStatus(err, http.StatusNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading the sites document's conflicts: %w", err)
	case len(head.Conflicts) == 0:
		return false, nil
	}
	leaves, err := c.Leaves(ctx, SitesDocID)
	if err != nil {
		return false, fmt.Errorf("reading the sites document's branches: %w", err)
	}
	var live []Leaf
	var branches []*SitesDoc
	for _, l := range leaves {
		var d SitesDoc
		if l.Deleted || json.Unmarshal(l.Doc, &d) != nil || d.Type != SitesDocType {
			continue
		}
		live, branches = append(live, l), append(branches, &d)
	}
	winner := winnerLeaf(live)
	if len(live) < 2 || winner == nil {
		return false, nil
	}
	merged := mergeSites(branches)
	merged.Rev = winner.Rev
	docs := []any{merged}
	for _, l := range live {
		if l.Rev != winner.Rev {
			docs = append(docs, map[string]any{"_id": SitesDocID, "_rev": l.Rev, "_deleted": true})
		}
	}
	results, err := c.db.BulkDocs(ctx, docs, c.bulkOpts()...)
	if err == nil {
		for _, r := range results {
			if r.Error != nil {
				err = r.Error
				break
			}
		}
	}
	if err != nil {
		return false, fmt.Errorf("settling the sites document's %d branches: %w", len(live), err)
	}
	_ = c.RefreshSites(ctx)
	c.log.Info().Int("branches", len(live)).Strs("sites", merged.Names()).Str("default", merged.Default).
		Msg("settled the sites document's conflicting branches into one")
	return true, nil
}

// mergeSites is the settled sites document of conflicting branches: every
// site any branch lists, added when the earliest says, with the latest
// takeover any branch records (a takeover is never undone); and the
// default, each branch's followed through the takeovers (a takeover of
// the default site moves the default to its taker), the least name if
// they still disagree. Its ID, Type and Sites are set; Rev is not.
func mergeSites(branches []*SitesDoc) *SitesDoc {
	out := &SitesDoc{ID: SitesDocID, Type: SitesDocType, Sites: map[string]SiteInfo{}}
	for _, d := range branches {
		for name, info := range d.Sites {
			have, ok := out.Sites[name]
			if !ok {
				out.Sites[name] = info
				continue
			}
			if info.AddedAt != 0 && (have.AddedAt == 0 || info.AddedAt < have.AddedAt) {
				have.AddedAt = info.AddedAt
			}
			if info.TakenOverAt > have.TakenOverAt || (info.TakenOverAt == have.TakenOverAt && info.TakenOverBy > have.TakenOverBy) {
				have.TakenOverBy, have.TakenOverAt = info.TakenOverBy, info.TakenOverAt
			}
			out.Sites[name] = have
		}
	}
	var defaults []string
	for _, d := range branches {
		def := d.Default
		for seen := map[string]bool{}; def != "" && !seen[def] && out.Sites[def].TakenOverBy != ""; {
			seen[def] = true
			def = out.Sites[def].TakenOverBy
		}
		if def != "" {
			defaults = append(defaults, def)
		}
	}
	if len(defaults) > 0 {
		out.Default = slices.Min(defaults)
	}
	return out
}

// unknownSiteLimit bounds the jobs of unknown sites one sweep fails.
const unknownSiteLimit = 100

// failUnknownSites fails the due jobs that name a site the sites document
// does not list, with a reason: no site would ever run them. The default
// site's sweeper does it, reading only the ranges of the claim view that
// lie between the known sites' own.
func (c *Client) failUnknownSites(ctx context.Context, by string) (int, error) {
	st := c.siteView()
	if !st.multi || c.cfg.Site == "" || st.def != c.cfg.Site {
		return 0, nil
	}
	known := make([]string, 0, len(st.names))
	for n := range st.names {
		known = append(known, n)
	}
	sort.Strings(known)
	// Site jobs are keyed [[site, type], p, date]: [[s]] sorts before every
	// key of site s and [[s, {}]] after them.
	var ranges []map[string]any
	from := []any{[]any{""}}
	for _, n := range append(known, "") {
		to := []any{[]any{map[string]any{}}}
		if n != "" {
			to = []any{[]any{n}}
		}
		ranges = append(ranges, map[string]any{"startkey": from, "endkey": to, "inclusive_end": false, "reduce": false, "limit": unknownSiteLimit})
		from = []any{[]any{n, map[string]any{}}}
	}
	var ids []string
	err := c.dueRanges(ctx, ranges, "listing jobs of unknown sites", func(rows *kivik.ResultSet) (bool, error) {
		for rows.Next() {
			if id, err := rows.ID(); err == nil {
				ids = append(ids, id)
			}
		}
		return len(ids) >= unknownSiteLimit, nil
	})
	if err != nil {
		return 0, err
	}
	failed := 0
	for _, id := range ids {
		var it WorkItem
		if err := c.db.Get(ctx, id).ScanDoc(&it); err != nil {
			continue // gone, or malformed: the sweeper's other paths see to it
		}
		if it.Site == "" || st.names[it.Site] || it.Status.Terminal() || it.Claimed {
			continue
		}
		next := it.Clone()
		reason := fmt.Sprintf("site %s is not one of the queue's sites (%s): add it (couchq sites add %s) and retry the job, or enqueue it for a known site",
			it.Site, strings.Join(known, ", "), it.Site)
		next.Status, next.LastError, next.FinishedAt = StatusFailed, reason, ToUnix(c.now())
		c.record(next, EventFailed, by, reason)
		if _, err := c.db.Put(ctx, id, next, c.writeOpts()...); err == nil {
			failed++
		}
	}
	return failed, nil
}

// RunsItsOwn reports whether a site whose heartbeat is hb runs its own
// jobs: it was never taken over, or it has beaten since it was (it came
// back, and its workers run the jobs enqueued for it since). The times
// come from two sites' clocks, which need only roughly agree: a takeover
// is a matter of minutes.
func RunsItsOwn(info SiteInfo, hb SiteHeartbeat) bool {
	return info.TakenOverBy == "" || hb.At > info.TakenOverAt
}
