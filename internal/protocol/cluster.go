package protocol

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/go-kivik/kivik/v4/couchdb"
	"github.com/go-kivik/kivik/v4/couchdb/chttp"
)

// The cluster protocol. On a database with n > 1 copies of each shard,
// CouchDB has no compare-and-swap: each copy checks the _rev on its own, so
// two claims of one revision can both be stored (each on the copies it
// reached first) and become a stored conflict. couchq therefore:
//
//   - writes with w = a majority of the copies and trusts only a write
//     CouchDB answers 201 for ("committed"). Each copy takes one child of a
//     revision, and two majorities share a copy, so of the claims of one
//     revision at most one is committed. A 202 ("accepted": fewer copies
//     took it) claim is sent again unchanged (claimAgain) and runs only if
//     the copies that took the tries add up to a majority; a holder's
//     write answered 202 means the claim is lost (a sweep or an operator
//     reached the majority first).
//   - after a committed claim, reads every leaf revision of the job from a
//     majority of the copies (open_revs=all, r = majority; the union of
//     what they hold). Leaves that are other claims of the same revision
//     cannot be committed and are withdrawn; any other live leaf (a branch
//     that split off earlier, which this claim cannot rule out) makes the
//     claimant back off without running the job; the sweeper settles such a
//     job once no leaf holds a live lease.
//   - withdraws a revision by deleting it with a tombstone that says so
//     (withdrawn: true), and never withdraws its own: a tombstone on the
//     only branch would delete the job.
//
// A job deleted on purpose (delete-done, purge) leaves a tombstone without
// that mark, which counts as finished: no other branch runs after it.

// quorum is the majority of the database's copies.
func (c *Client) quorum() int { return c.n/2 + 1 }

// readOpts read from a majority of the copies on a cluster.
func (c *Client) readOpts() []kivik.Option {
	if c.n > 1 {
		return []kivik.Option{kivik.Param("r", c.quorum())}
	}
	return nil
}

// errNoMajority marks a write CouchDB stored on fewer than a majority of
// the copies (it answered 202 Accepted with w = majority).
var errNoMajority = errors.New("write reached fewer than a majority of the copies (202 Accepted)")

// errBranchLive marks a committed claim that backed off because the job
// has another live branch.
var errBranchLive = errors.New("the job has another live revision branch; backing off")

// commitTrace records what CouchDB answered to one write request: kivik
// reports 201 and 202 alike, and a _bulk_docs answer marks each document
// stored on fewer than w copies with "accepted": true.
type commitTrace struct {
	mu       sync.Mutex
	status   int
	accepted map[string]bool // id + "\x00" + rev
}

// traced returns ctx with a trace recording the answer of the one request
// made with it. Off a cluster it records nothing and costs nothing.
func (c *Client) traced(ctx context.Context) (context.Context, *commitTrace) {
	t := &commitTrace{}
	if c.n <= 1 {
		return ctx, t
	}
	return chttp.WithClientTrace(ctx, &chttp.ClientTrace{HTTPResponseBody: t.record}), t
}

func (t *commitTrace) record(r *http.Response) {
	body, _ := io.ReadAll(r.Body)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.status = r.StatusCode
	if r.StatusCode != http.StatusAccepted {
		return
	}
	t.accepted = map[string]bool{}
	type result struct {
		ID       string `json:"id"`
		Rev      string `json:"rev"`
		Accepted bool   `json:"accepted"`
	}
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '[' {
		var rs []result
		_ = json.Unmarshal(body, &rs)
		for _, r := range rs {
			if r.Accepted {
				t.accepted[r.ID+"\x00"+r.Rev] = true
			}
		}
		return
	}
	var one result
	_ = json.Unmarshal(body, &one)
	t.accepted[one.ID+"\x00"+one.Rev] = true
}

// commit records that the write of id that produced rev reached a
// majority of the copies after all (claimAgain).
func (t *commitTrace) commit(id, rev string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.accepted, id+"\x00"+rev)
}

// uncommitted reports whether the write of id that produced rev reached
// fewer than a majority of the copies.
func (t *commitTrace) uncommitted(id, rev string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.accepted[id+"\x00"+rev]
}

// Leaf is one leaf revision of a job document, as a majority of the
// copies hold it.
type Leaf struct {
	Rev string
	// Parent is the revision this one was written over ("" for a first).
	Parent  string
	Deleted bool
	// Withdrawn marks a tombstone couchq wrote to withdraw a claim or a
	// stale branch (not a deletion of the job).
	Withdrawn  bool
	Status     Status
	Claimed    bool
	ClaimedBy  string
	LeaseUntil float64
	// Item is the leaf decoded as a job; nil for tombstones and documents
	// that do not decode.
	Item *WorkItem
	// Doc is the leaf as stored, for documents that are not jobs (slots).
	Doc  json.RawMessage
	pos  int
	hash string
	// path is the leaf's revision history, newest first.
	path []string
}

// descends reports whether rev is an ancestor of the leaf.
func (l *Leaf) descends(rev string) bool {
	for _, r := range l.path[min(1, len(l.path)):] {
		if r == rev {
			return true
		}
	}
	return false
}

// live reports whether the leaf holds a claim whose lease has not run out.
func (l *Leaf) live(now float64) bool {
	return !l.Deleted && l.Claimed && l.LeaseUntil > now
}

// conceded reports whether the leaf is a claim its claimant gave up.
func (l *Leaf) conceded() bool { return !l.Deleted && l.Item != nil && l.Item.Conceded() }

// concededSibling reports whether the leaf is a claim of parent that its
// claimant conceded: one revision on from the claim.
func (l *Leaf) concededSibling(parent string) bool {
	return l.conceded() && len(l.path) > 2 && l.path[2] == parent
}

// finishedTombstone reports whether the leaf deleted the job on purpose.
func (l *Leaf) finishedTombstone() bool { return l.Deleted && !l.Withdrawn }

// Leaves reads every leaf revision of a job from a majority of the copies
// (one copy off a cluster), tombstones included. A job that never existed
// has none.
func (c *Client) Leaves(ctx context.Context, id string) ([]Leaf, error) {
	var (
		mu     sync.Mutex
		status int
		body   []byte
	)
	// kivik cannot read open_revs=all (it asks for a list of revisions); the
	// trace keeps CouchDB's JSON answer, and kivik's complaint about it (an
	// array, not one document) is ignored when the answer is there.
	tctx := chttp.WithClientTrace(ctx, &chttp.ClientTrace{HTTPResponseBody: func(r *http.Response) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		status, body = r.StatusCode, b
		mu.Unlock()
	}})
	params := map[string]any{"open_revs": "all", "revs": true}
	if c.n > 1 {
		params["r"] = c.quorum()
	}
	err := c.db.Get(tctx, id, couchdb.OptionNoMultipartGet(), kivik.Params(params)).ScanDoc(&json.RawMessage{})
	mu.Lock()
	defer mu.Unlock()
	if status == http.StatusNotFound || isStatus(err, http.StatusNotFound) {
		return nil, nil
	}
	if status != http.StatusOK {
		if err == nil {
			err = fmt.Errorf("status %d", status)
		}
		return nil, fmt.Errorf("reading the revisions of %s: %w", id, err)
	}
	var replies []leafReply
	if err := json.Unmarshal(body, &replies); err != nil {
		return nil, fmt.Errorf("reading the revisions of %s: %w", id, err)
	}
	leaves, err := leavesOf(replies)
	if err != nil {
		return nil, fmt.Errorf("reading the revisions of %s: %w", id, err)
	}
	return leaves, nil
}

// leafReply is one entry of CouchDB's answer to a read of every leaf:
// {"ok": doc} or {"missing": rev} (GET open_revs=all), {"error": ...}
// (_bulk_get).
type leafReply struct {
	OK    json.RawMessage `json:"ok"`
	Error json.RawMessage `json:"error"`
}

// leavesOf decodes the leaves of one job, in CouchDB's own order: the first
// is the one it shows (live before deleted, then the longest history, then
// the highest revision id).
func leavesOf(replies []leafReply) ([]Leaf, error) {
	leaves := make([]Leaf, 0, len(replies))
	for _, r := range replies {
		if len(r.OK) == 0 {
			continue // not found on the copies asked
		}
		l, err := parseLeaf(r.OK)
		if err != nil {
			return nil, err
		}
		leaves = append(leaves, l)
	}
	sort.SliceStable(leaves, func(i, j int) bool { return leaves[i].outranks(&leaves[j]) })
	return leaves, nil
}

// LeavesMany is Leaves for several jobs, by id; a job that never existed
// has none. Exported for tools that settle many jobs, and for tests.
func (c *Client) LeavesMany(ctx context.Context, ids []string) (map[string][]Leaf, error) {
	return c.leavesMany(ctx, ids)
}

// leavesMany is Leaves for several jobs. On Apache CouchDB it is one
// _bulk_get naming no revision, which CouchDB (3.x: read in 3.2.0 and 3.5.0) answers with
// every leaf of each document, read from r copies and merged as GET
// open_revs=all does (fabric_open_revs); so a round's confirming reads cost
// one request instead of one per claim. Elsewhere, or when the batch fails,
// it reads job by job.
func (c *Client) leavesMany(ctx context.Context, ids []string) (map[string][]Leaf, error) {
	out := make(map[string][]Leaf, len(ids))
	if c.couch != nil && len(ids) > 1 {
		err := c.bulkLeaves(ctx, ids, out)
		if err == nil {
			return out, nil
		}
		c.log.Debug().Err(err).Int("jobs", len(ids)).Msg("reading leaves in one _bulk_get failed; reading them job by job")
	}
	for _, id := range ids {
		if _, ok := out[id]; ok {
			continue
		}
		leaves, err := c.Leaves(ctx, id)
		if err != nil {
			return nil, err
		}
		out[id] = leaves
	}
	return out, nil
}

// bulkLeaves fills out with the leaves of ids read through _bulk_get. A
// document CouchDB reports an error for other than not_found is left out
// (and read on its own by leavesMany); an error means none was read.
func (c *Client) bulkLeaves(ctx context.Context, ids []string, out map[string][]Leaf) error {
	docs := make([]map[string]string, len(ids))
	for i, id := range ids {
		docs[i] = map[string]string{"id": id}
	}
	body, err := json.Marshal(map[string]any{"docs": docs})
	if err != nil {
		return fmt.Errorf("encoding a _bulk_get: %w", err)
	}
	q := url.Values{"revs": {"true"}}
	if c.n > 1 {
		q.Set("r", strconv.Itoa(c.quorum()))
	}
	var resp struct {
		Results []struct {
			ID   string      `json:"id"`
			Docs []leafReply `json:"docs"`
		} `json:"results"`
	}
	// The body goes through GetBody, as the _selector feed's does.
	err = c.couch.DoJSON(ctx, http.MethodPost, "/"+url.PathEscape(c.db.Name())+"/_bulk_get",
		&chttp.Options{Query: q, NoGzip: true, GetBody: func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(body)), nil
		}}, &resp)
	if err != nil {
		return fmt.Errorf("reading the revisions of %d jobs: %w", len(ids), err)
	}
	if len(resp.Results) != len(ids) {
		return fmt.Errorf("reading the revisions of %d jobs: %d results", len(ids), len(resp.Results))
	}
	for _, r := range resp.Results {
		var failed bool
		for _, d := range r.Docs {
			var e struct {
				Error string `json:"error"`
			}
			if len(d.Error) > 0 && (json.Unmarshal(d.Error, &e) != nil || e.Error != "not_found") {
				failed = true
			}
		}
		if failed {
			continue
		}
		leaves, err := leavesOf(r.Docs)
		if err != nil {
			continue
		}
		out[r.ID] = leaves
	}
	return nil
}

// parseLeaf reads the fields the protocol needs leniently: a malformed
// value reads as missing, since a leaf must be seen whatever it holds.
func parseLeaf(raw json.RawMessage) (Leaf, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return Leaf{}, err
	}
	l := Leaf{Doc: raw}
	var revs revisions
	_ = json.Unmarshal(fields["_rev"], &l.Rev)
	_ = json.Unmarshal(fields["_deleted"], &l.Deleted)
	_ = json.Unmarshal(fields["withdrawn"], &l.Withdrawn)
	_ = json.Unmarshal(fields["status"], &l.Status)
	_ = json.Unmarshal(fields["claimed"], &l.Claimed)
	_ = json.Unmarshal(fields["claimed_by"], &l.ClaimedBy)
	_ = json.Unmarshal(fields["lease_until"], &l.LeaseUntil)
	_ = json.Unmarshal(fields["_revisions"], &revs)
	for k, id := range revs.IDs {
		l.path = append(l.path, strconv.Itoa(revs.Start-k)+"-"+id)
	}
	if len(l.path) > 1 {
		l.Parent = l.path[1]
	}
	if p, h, ok := strings.Cut(l.Rev, "-"); ok {
		l.pos, _ = strconv.Atoi(p)
		l.hash = h
	}
	if !l.Deleted {
		var it WorkItem
		if err := json.Unmarshal(raw, &it); err == nil {
			l.Item = &it
			l.Status = it.Status // a hand-written job without one is queued
		}
	}
	return l, nil
}

// outranks is CouchDB's choice of the winning revision.
func (l *Leaf) outranks(o *Leaf) bool {
	if l.Deleted != o.Deleted {
		return !l.Deleted
	}
	if l.pos != o.pos {
		return l.pos > o.pos
	}
	return l.hash > o.hash
}

// ConfirmClaim is the check ClaimMany makes of each committed claim when
// the database has more than one copy (or Config.AlwaysConfirm is set):
// claimed is the job as the claim wrote it, parentRev the revision it was
// written over. It returns nil when the claim stands, and an error
// wrapping ErrClaimConflict when the claimant must not run the job.
// Exported for claimants that write their own claims, and for tests.
func (c *Client) ConfirmClaim(ctx context.Context, claimed *WorkItem, parentRev string) error {
	if err := c.confirmClaim(ctx, claimed, parentRev); err != nil {
		if errors.Is(err, errBranchLive) || errors.Is(err, errLostRace) {
			return c.claimError(claimed.ID, err)
		}
		return fmt.Errorf("confirming claim of %s: %w", claimed.ID, err)
	}
	return nil
}

// confirmClaim settles a committed claim (claimed is the job as written,
// parent the revision it was written over) against the job's other leaves.
// Other claims of parent cannot be committed: they are withdrawn. Other
// leaves that nobody can be running — queued, or a claim whose lease ran
// out — are stale branches: they are withdrawn too, and the claim runs only
// if every withdrawal is committed (a claimant of such a leaf and this
// withdrawal cannot both win it). A live claim on another branch, or a job
// finished on another branch, makes it report errBranchLive: the claimant
// backs off, and the sweeper settles the job once no lease is live.
func (c *Client) confirmClaim(ctx context.Context, claimed *WorkItem, parent string) error {
	leaves, err := c.Leaves(ctx, claimed.ID)
	if err != nil {
		return err
	}
	return c.judgeClaim(ctx, claimed, parent, leaves)
}

// judgeClaim is confirmClaim on the job's leaves, already read.
func (c *Client) judgeClaim(ctx context.Context, claimed *WorkItem, parent string, leaves []Leaf) error {
	now := ToUnix(c.now())
	mine := false
	var siblings, stale []Leaf
	for _, l := range leaves {
		switch {
		case l.Rev == claimed.Rev:
			mine = true
		case l.Deleted && l.Withdrawn:
		case !l.Deleted && l.Parent == parent && l.Claimed, l.concededSibling(parent):
			siblings = append(siblings, l)
		case !l.Deleted && l.Item != nil && c.cfg.Site != "" && c.Owner(l.Item) != c.cfg.Site:
			// A branch that gives the job to another site (a takeover this
			// site's copy had not seen): not stale, and not ours to withdraw.
			c.log.Warn().Str("job", claimed.ID).Str("other_rev", l.Rev).Str("owner", c.Owner(l.Item)).
				Msg("claim committed but another branch gives the job to another site; not running it")
			return errBranchLive
		case !l.Deleted && !l.live(now) && l.Item != nil && !l.Status.Terminal():
			stale = append(stale, l)
		default:
			c.log.Warn().Str("job", claimed.ID).Str("rev", claimed.Rev).Str("other_rev", l.Rev).
				Str("other_status", string(l.Status)).Bool("other_deleted", l.Deleted).
				Msg("claim committed but the job is live or finished on another branch; not running it (the sweeper settles it)")
			return errBranchLive
		}
	}
	if !mine {
		return fmt.Errorf("%w: the claim was overwritten before it was confirmed", errLostRace)
	}
	for _, l := range stale {
		if err := c.withdraw(ctx, claimed.ID, l, claimed.ClaimedBy); err != nil {
			c.log.Debug().Err(err).Str("job", claimed.ID).Str("other_rev", l.Rev).
				Msg("could not withdraw a stale branch; not running the job")
			return errBranchLive
		}
	}
	// The withdrawn claims go into the holder's history with its next write.
	const why = "a competing claim of the same revision reached fewer than a majority of the copies; it was withdrawn and did not run"
	moved := false
	for _, s := range siblings {
		err := c.withdraw(ctx, claimed.ID, s, claimed.ClaimedBy)
		if err == nil {
			c.record(claimed, EventClaimWithdrawn, s.ClaimedBy, why)
		}
		moved = moved || isStatus(err, http.StatusConflict)
	}
	if moved {
		// A sibling moved on since the leaves were read: its claimant
		// conceded it. Withdraw the concession as well; left standing, it
		// could show as the job (CouchDB's winner) until a sweep.
		if leaves, err := c.Leaves(ctx, claimed.ID); err == nil {
			for _, l := range leaves {
				if l.concededSibling(parent) && c.withdraw(ctx, claimed.ID, l, claimed.ClaimedBy) == nil {
					c.record(claimed, EventClaimWithdrawn, l.ClaimedBy, why)
				}
			}
		}
	}
	return nil
}

// HeldWriteStands settles a holder's write (renewal, outcome) that CouchDB
// stored on fewer than a majority of the copies: slow or failing copies
// answer 202 as well as a competitor that wrote over the held revision
// first. It reads the leaves from a majority: the write stands when rev is
// a leaf and no other write continued from parent (a sweep, an operator's
// cancel). Competing writes of the held revision need its lease to have
// run out, or an operator: the same cases a single node answers with 409.
// With parent "" it settles the creation of a document (a unique job):
// any other live leaf is another creation of the same id.
// Every held-job write of this package does it; exported for holders that
// write their own documents, and for tests.
func (c *Client) HeldWriteStands(ctx context.Context, id, parent, rev string) (bool, error) {
	stands, err := c.writeStands(ctx, id, parent, rev)
	if errors.Is(err, errUnconfirmed) {
		return false, nil
	}
	return stands, err
}

// errUnconfirmed: a write stored on fewer copies than asked, through a
// node that cannot show it reaches a majority of the cluster (or for a
// user who may not read the membership that would show it).
var errUnconfirmed = errors.New("stored on fewer copies than asked, and the node cannot show it reaches a majority of the cluster " +
	"(reading GET /_membership needs a server admin)")

// writeStands is HeldWriteStands, with errUnconfirmed where it cannot tell.
func (c *Client) writeStands(ctx context.Context, id, parent, rev string) (bool, error) {
	// CouchDB answers a read with r = majority from the copies it reaches,
	// even fewer: on the minority side of a partition the read back would
	// see only that side. A node that is not connected to a majority of the
	// cluster cannot vouch for anything.
	if c.n > 1 {
		ok, err := c.coordinatorInMajority(ctx)
		if s := kivik.HTTPStatus(err); s == http.StatusUnauthorized || s == http.StatusForbidden {
			c.membershipDenied.Do(func() {
				c.log.Warn().Err(err).Msg("this user may not read the cluster membership (only server admins may): " +
					"a write the cluster answers 202 cannot be shown to stand, so it counts as lost and the job runs again after its lease")
			})
		}
		if err != nil || !ok {
			c.log.Debug().Err(err).Str("job", id).Bool("majority", ok).
				Msg("the node cannot show it reaches a majority of the cluster; the write does not stand")
			return false, errUnconfirmed
		}
	}
	leaves, err := c.Leaves(ctx, id)
	if err != nil {
		return false, err
	}
	mine := false
	for _, l := range leaves {
		switch {
		case l.Rev == rev:
			mine = true
		case l.Deleted && l.Withdrawn:
		case l.Rev == parent || l.descends(parent) || (parent == "" && !l.Deleted):
			// (parent "": a document created; any other live leaf is
			// another creation of the same id.)
			c.log.Debug().Str("job", id).Str("rev", rev).Str("other_rev", l.Rev).Msg("another write continued from the held revision")
			return false, nil
		}
	}
	return mine, nil
}

// coordinatorInMajority reports whether the node answering is connected to
// a majority of the cluster's nodes (GET /_membership: all_nodes are the
// ones it is connected to). It needs a server admin; without one it cannot
// tell, and says so as an error.
func (c *Client) coordinatorInMajority(ctx context.Context) (bool, error) {
	m, err := c.db.Client().Membership(ctx)
	if err != nil {
		return false, fmt.Errorf("reading the cluster membership: %w", err)
	}
	connected := map[string]bool{}
	for _, n := range m.AllNodes {
		connected[n] = true
	}
	reached := 0
	for _, n := range m.ClusterNodes {
		if connected[n] {
			reached++
		}
	}
	return reached >= len(m.ClusterNodes)/2+1, nil
}

// withdraw deletes a leaf that must not stand with a tombstone marked
// withdrawn (w = a majority). It fails when the leaf moved on, and reports
// errNoMajority when the tombstone reached fewer than a majority.
func (c *Client) withdraw(ctx context.Context, id string, l Leaf, by string) error {
	tomb := map[string]any{
		"_id": id, "_rev": l.Rev, "_deleted": true, "type": "WorkItem",
		"withdrawn": true, "withdrawn_by": by, "status": l.Status, "claimed_by": l.ClaimedBy,
	}
	ctx, trace := c.traced(ctx)
	rev, err := c.db.Put(ctx, id, tomb, c.claimOpts(false)...)
	if err != nil {
		c.log.Debug().Err(err).Str("job", id).Str("rev", l.Rev).Msg("could not withdraw a revision")
		return err
	}
	if trace.uncommitted(id, rev) {
		c.log.Debug().Str("job", id).Str("rev", l.Rev).Msg("withdrawal reached a minority of the copies")
		return errNoMajority
	}
	c.log.Debug().Str("job", id).Str("rev", l.Rev).Str("claimant", l.ClaimedBy).Msg("withdrew a revision")
	return nil
}

// UnrunClaim is a claim that was stored but must not run (ClaimResult.Unrun).
type UnrunClaim struct {
	claim, parent *WorkItem
	reason        string
	// Wait is how long to wait before conceding it: time for a committed
	// claim of the same revision to confirm and withdraw this one, which
	// leaves nothing behind. A concession made first stands beside that
	// claim (sometimes as CouchDB's winner, which reads show) until a sweep
	// settles the job. It is a few times what writing the claim took.
	Wait time.Duration
}

// ID is the claimed job's id.
func (u *UnrunClaim) ID() string { return u.claim.ID }

// How long a claimant waits before conceding an unrun claim: this many
// times what writing the claim took, within these bounds.
const (
	concedeWaitFactor = 4
	concedeWaitMin    = 50 * time.Millisecond
	concedeWaitMax    = 2 * time.Second
)

// Concede gives up claims that will not run (EventClaimConceded) and
// returns how many it gave up. Over each claim it writes the job as it was
// before the claim, still held by the claimant so that no claimant takes it
// from the due view, with a lease that ended when the claim was made. Then
// it sweeps those jobs at once, as the sweeper would: nobody ever runs a
// conceded claim, so the sweeper and other claims' confirmations treat it
// as an expired one, without waiting for its lease, and requeue the job
// (uncharged) as soon as no other branch of it is live.
//
// Without it, two claims split between the copies (a node down, each claim
// on one of the two live copies) held the job for a whole lease although
// neither ran, often more than once. A concession that fails (the claim
// was withdrawn meanwhile, or the write failed) leaves the claim to its
// lease, as before. by names the claimant; ctx bounds the writes.
func (c *Client) Concede(ctx context.Context, by string, claims []*UnrunClaim) int {
	if len(claims) == 0 {
		return 0
	}
	docs := make([]*WorkItem, len(claims))
	body := make([]any, len(claims))
	ids := make([]string, len(claims))
	for i, u := range claims {
		next := u.parent.Clone()
		next.Rev = u.claim.Rev
		next.Claimed, next.Status = true, StatusRunning
		next.ClaimedBy, next.ClaimedAt = u.claim.ClaimedBy, u.claim.ClaimedAt
		next.LeaseUntil = u.claim.ClaimedAt
		// Its attempt is the job's as it was, the claim's not charged: the
		// reason names the attempt the claim would have run.
		c.record(next, EventClaimConceded, u.claim.ClaimedBy, fmt.Sprintf("%s (the claim of attempt %d)", u.reason, u.claim.Attempts))
		docs[i], body[i], ids[i] = next, next, u.claim.ID
	}
	var conceded []*WorkItem
	for i, r := range c.writeClaims(ctx, ids, body) {
		if r.Error != nil {
			// Withdrawn by the committed claimant meanwhile (409), or the
			// write failed: the claim holds the job until its lease ends.
			c.log.Debug().Err(r.Error).Str("job", r.ID).Msg("could not concede a claim")
			continue
		}
		docs[i].Rev = r.Rev
		conceded = append(conceded, docs[i])
		c.log.Debug().Str("job", r.ID).Str("claimant", docs[i].ClaimedBy).Msg("conceded a claim that will not run")
	}
	var swept SweepResult
	if err := c.sweepItems(ctx, by, c.now(), conceded, &swept); err != nil {
		c.log.Debug().Err(err).Msg("could not sweep conceded claims; the sweeper will")
	}
	return len(conceded)
}

// Settle makes a job with several live leaves (a stored conflict) whole
// again, once none of them holds a live lease: it keeps the leaf that went
// furthest (finished, else queued, else an expired claim, which the sweeper
// requeues, else a conceded one, which it requeues) and withdraws the others. A tombstone left by a deletion of the
// job wins over every live leaf. It reports whether the job is settled.
func (c *Client) Settle(ctx context.Context, id, by string) (bool, error) {
	leaves, err := c.Leaves(ctx, id)
	if err != nil {
		return false, err
	}
	_, settled := c.settle(ctx, id, leaves, by)
	return settled, nil
}

// whole reports whether a job's leaves are just rev: no conflict, and no
// deletion on another branch.
func whole(leaves []Leaf, rev string) bool {
	n := 0
	for _, l := range leaves {
		switch {
		case l.Deleted && l.Withdrawn:
		case l.Rev == rev && !l.Deleted:
			n++
		default:
			return false
		}
	}
	return n == 1
}

// settle is Settle on leaves already read; it also returns how many leaves
// it withdrew.
func (c *Client) settle(ctx context.Context, id string, leaves []Leaf, by string) (int, bool) {
	now := ToUnix(c.now())
	var live []Leaf
	ended := false
	for _, l := range leaves {
		if l.live(now) {
			return 0, false // a holder may be running it: wait for it
		}
		switch {
		case l.finishedTombstone():
			ended = true
		case !l.Deleted:
			live = append(live, l)
		}
	}
	if len(live) == 0 || (len(live) == 1 && !ended) {
		return 0, true
	}
	keep := -1
	if !ended {
		keep = c.keptLeafOf(live)
	}
	var gone []Leaf
	for i, l := range live {
		if i == keep {
			continue
		}
		if err := c.withdraw(ctx, id, l, by); err != nil {
			return len(gone), false // it moved on: settle again next sweep
		}
		gone = append(gone, l)
	}
	if keep >= 0 && live[keep].Item != nil {
		c.traceWithdrawn(ctx, live[keep], gone, by)
	}
	withdrawn := len(gone)
	c.log.Info().Str("job", id).Int("leaves", len(live)).Bool("deleted", ended).Msg("settled a conflicted job")
	return withdrawn, true
}

// traceWithdrawn writes what happened on the withdrawn branches into the
// kept one, so that a run on a branch that lost (a claimant on the minority
// side of a partition, a claim swept while its holder was slow) still shows
// in the job's history: one claim-withdrawn entry per branch, naming its
// claimant and listing the branch's own events. They are not copied as
// events: the metrics count claimed and done entries, and a withdrawn
// branch's would count twice. It is written like a claim (a majority of
// the copies); when it fails only the trace is lost: the job is settled
// either way, and a claim racing this write is settled by the claim's
// confirmation. A kept claim that was conceded is requeued by the same
// write.
func (c *Client) traceWithdrawn(ctx context.Context, kept Leaf, gone []Leaf, by string) {
	next := kept.Item.Clone()
	seen := make(map[Event]bool, len(next.History))
	for _, e := range next.History {
		seen[e] = true
	}
	for _, l := range gone {
		claimant, what := l.ClaimedBy, string(l.Status)
		if l.Claimed {
			what = "claimed by " + l.ClaimedBy
		}
		var own []string
		if l.Item != nil {
			for _, e := range l.Item.History {
				if seen[e] {
					continue
				}
				own = append(own, fmt.Sprintf("%s by %s at %s", e.Event, e.By, e.At))
				if claimant == "" {
					claimant = e.By
				}
			}
		}
		msg := fmt.Sprintf("a conflicting branch (%s, revision %s) was withdrawn by %s when the job was settled", what, l.Rev, by)
		if len(own) > 0 {
			msg += "; on it: " + strings.Join(own, "; ")
		}
		c.record(next, EventClaimWithdrawn, claimant, msg)
	}
	if kept.conceded() {
		// Nobody ran it and no other branch is left: back to the queue
		// now rather than at the next sweep.
		c.unclaim(next)
		next.Status = StatusQueued
	}
	ctx, trace := c.traced(ctx)
	rev, err := c.db.Put(ctx, next.ID, next, c.claimOpts(false)...)
	switch {
	case err != nil:
		c.log.Debug().Err(err).Str("job", next.ID).Msg("could not write the withdrawn branches' history into the kept one")
	case trace.uncommitted(next.ID, rev):
		c.log.Debug().Str("job", next.ID).Msg("the withdrawn branches' history reached a minority of the copies")
	}
}

// keptLeaf is the index of the leaf settling keeps among a job's live
// leaves: the highest settleRank, ties to CouchDB's winner (live is in its
// order, as Leaves returns them).
// keptLeafOf is keptLeaf, except that in a queue of several sites, among
// unfinished leaves, a branch that gives the job to its owner (the site
// the latest takeover names, ownerLeaf) is kept over one that gives it to
// another: keeping the old owner's branch would hand the job back to a
// site that was taken over. Readers at every site and the owner's sweep
// settle alike.
func (c *Client) keptLeafOf(live []Leaf) int {
	keep := keptLeaf(live)
	if !c.siteView().multi || live[keep].Item == nil || live[keep].Status.Terminal() {
		return keep
	}
	ol := ownerLeaf(live)
	if ol == nil {
		return keep
	}
	owner := c.Owner(ol)
	if c.Owner(live[keep].Item) == owner {
		return keep
	}
	apart := unrelatedUnworked(live)
	for i := range live {
		if !apart[i] && live[i].Item != nil && !live[i].Status.Terminal() && c.Owner(live[i].Item) == owner && settleRank(&live[i]) >= 2 {
			return i
		}
	}
	return keep
}

func keptLeaf(live []Leaf) int {
	keep := -1
	apart := unrelatedUnworked(live)
	for i := range live {
		if apart[i] {
			continue
		}
		if keep < 0 || settleRank(&live[i]) > settleRank(&live[keep]) {
			keep = i
		}
	}
	return max(keep, 0)
}

// unrelatedUnworked marks the leaves that settling passes over because
// they share no revision with a leaf that shows work (a claim, an attempt,
// a start or an outcome) and show none themselves: a job's id created a
// second time apart from its history. Every write couchq makes of a job
// descends from the job's first revision, so its branches share that
// history; a separate history under the same id comes from a second
// create elsewhere (a unique or periodic job enqueued at two sites or
// through two nodes, both fresh) or from a replicated revision planted
// beside the job. Either way the job's own history, the one that was
// worked, is the one kept, whatever revision CouchDB would pick (a planted
// branch can be edited to a later generation than the job's). Leaves of
// unknown history (a server that gave no _revisions) are never passed
// over.
func unrelatedUnworked(live []Leaf) []bool {
	apart := make([]bool, len(live))
	var worked []int
	for i := range live {
		if len(live[i].path) == 0 {
			return apart
		}
		if live[i].worked() {
			worked = append(worked, i)
		}
	}
	if len(worked) == 0 {
		return apart
	}
	history := map[string]bool{}
	for _, j := range worked {
		for _, rev := range live[j].path {
			history[rev] = true
		}
	}
	for i := range live {
		if live[i].worked() {
			continue
		}
		related := false
		for _, rev := range live[i].path {
			if history[rev] {
				related = true
				break
			}
		}
		apart[i] = !related
	}
	return apart
}

// worked reports whether the leaf shows that the job was worked on: a
// claim, an attempt, a start or an outcome. A producer writes none of
// these (validate_doc_update).
func (l *Leaf) worked() bool {
	if l.Item == nil {
		return false
	}
	it := l.Item
	return it.Claimed || it.Attempts > 0 || it.StartedAt > 0 || it.Status.Terminal()
}

// settleRank orders the leaves of a conflicted job: a finished one stays,
// done before failed before cancelled; else a conceded claim, then a
// queued leaf, then an expired claim.
//
// Among finished leaves, the one that says the work was done wins: two
// can only meet when they were written over one revision, such as a
// worker's outcome and an operator's cancel (or a failure) made through a
// copy that had not seen it. On one copy the later of the two is refused;
// here the handler ran to the end whichever came first, and a cancel
// there was made of a job that had already been run.
//
// A conceded claim outranks what its claim found beside it because the
// claim may have withdrawn that: a claim withdraws every stale branch (a
// queued leaf, an expired claim) before it runs, and when a withdrawal
// reaches fewer than a majority of the copies the claim does not run but
// is conceded, while the withdrawal may still land. A sweep that kept the
// stale branch and withdrew the concession could leave the job with no
// leaf at all; keeping the concession agrees with what the claim did. An
// expired claim that ran loses its attempt that way, but not its trace:
// the kept leaf's history names it (traceWithdrawn).
func settleRank(l *Leaf) int {
	switch {
	case l.Item == nil:
		return 0
	case l.Status == StatusDone:
		return 6
	case l.Status == StatusFailed:
		return 5
	case l.Status.Terminal():
		return 4
	case l.conceded():
		return 3
	case l.Status == StatusQueued && !l.Claimed:
		return 2
	default:
		return 1
	}
}

// claimAgainWaits are the pauses before claimAgain sends a claim that
// reached a minority of the copies once more.
var claimAgainWaits = [...]time.Duration{10 * time.Millisecond, 40 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond}

// claimAgain sends again, unchanged, the claims of a write that reached
// fewer than a majority of the copies (aligned[k] for items[index[k]],
// whose claim is docs[k]), and turns into committed those that a majority
// of the copies took between the tries.
//
// A claim read from the changes feed can reach the copies before the
// job's own write has reached all of them: the feed reports a job as soon
// as one copy stores it, and the others may still be taking it (each runs
// validate_doc_update on its own). Those copies answer the claim with a
// conflict, and CouchDB answers 202. No other claimant need be involved:
// about one claim in 100 in the bench's wake-up section, and one in 15 of
// a client claiming each job the moment one copy had it, was answered so,
// conceded, and claimed again a round later.
//
// The same claim written over the same revision has the same revision id
// on every copy (CouchDB derives it from the body and the parent), and a
// copy answers it ok only while the parent is a leaf there, so the copies
// that answer ok to each try are copies that had not taken it before:
// their counts add up. A 202 counts one copy, a 201 a majority; once they
// add up to a majority the claim is committed, as if the first try had
// been answered 201. A 409 counts none and does not end the tries: copies
// that still lack the job answer it so (under load, for longer than the
// first pause), as do copies holding another claim or this one already
// (through internal replication). A claim the tries do not commit is
// conceded, as before.
func (c *Client) claimAgain(ctx context.Context, items []*WorkItem, index []int, docs []any, aligned []kivik.BulkResult, first *commitTrace) {
	if c.n <= 1 {
		return
	}
	held := make(map[int]int) // k -> copies known to hold the claim
	for k, r := range aligned {
		if r.Error == nil && first.uncommitted(r.ID, r.Rev) {
			held[k] = 1
		}
	}
	for _, wait := range claimAgainWaits {
		if len(held) == 0 {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		ks := slices.Sorted(maps.Keys(held))
		again := make([]any, len(ks))
		ids := make([]string, len(ks))
		for j, k := range ks {
			claim := docs[k].(*WorkItem)
			claim.Rev = items[index[k]].Rev // the revision claimed over, as the first try
			again[j], ids[j] = claim, claim.ID
		}
		wctx, trace := c.traced(ctx)
		res := c.writeClaims(wctx, ids, again)
		for j, k := range ks {
			docs[k].(*WorkItem).Rev = aligned[k].Rev
			r := res[j]
			if r.Error != nil {
				continue // taken by no copy: try again
			}
			if r.Rev != aligned[k].Rev {
				// Cannot happen while CouchDB derives revision ids from
				// the body: the claim is left to its lease, not run.
				c.log.Warn().Str("job", r.ID).Str("rev", r.Rev).Str("first", aligned[k].Rev).Msg("a claim sent again got another revision id")
				delete(held, k)
				continue
			}
			if trace.uncommitted(r.ID, r.Rev) {
				held[k]++
			} else {
				held[k] += c.quorum()
			}
			if held[k] >= c.quorum() {
				c.log.Debug().Str("job", r.ID).Str("rev", r.Rev).Msg("a claim sent again reached a majority of the copies")
				first.commit(r.ID, r.Rev)
				delete(held, k)
			}
		}
	}
}
