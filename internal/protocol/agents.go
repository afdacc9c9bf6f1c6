package protocol

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-kivik/kivik/v4"
)

// Agents are claimants that are not worker processes: a script, a crawler
// in another language, a person in a review tool. They claim a few jobs
// under their name (claimed_by), hold them for a lease (an hour for an
// editor), and complete, fail, extend or release them; a lease that runs
// out returns the job through the sweeper like any other.

// ErrNotHeld means a job is not held by the agent acting on it: it is not
// claimed, another claimant holds it, or its lease was swept.
var ErrNotHeld = errors.New("job not held by this agent")

// AgentClaim is what ClaimForAgent returned.
type AgentClaim struct {
	// Held are jobs the agent already held, returned first (an agent that
	// restarts gets its own work back).
	Held []*WorkItem
	// Claimed are jobs claimed now.
	Claimed []*WorkItem
	// Paused is set when the type is paused: nothing new was claimed.
	Paused bool
	// CatchingUp is set when the agent's site came back after an outage
	// and its workers wait to hear from the other sites before they
	// claim: nothing new was claimed, as by those workers, since this
	// site's database may not have a takeover of its jobs yet.
	CatchingUp bool
}

// Jobs are Held then Claimed.
func (a *AgentClaim) Jobs() []*WorkItem {
	return append(append([]*WorkItem{}, a.Held...), a.Claimed...)
}

// maxAgentClaim bounds one ClaimForAgent.
const maxAgentClaim = 1000

// ClaimForAgent returns up to count jobs of type worker for agent: those it
// already holds first, then due jobs claimed now (highest priority first)
// with lease.
func (c *Client) ClaimForAgent(ctx context.Context, worker string, count int, agent string, lease time.Duration) (*AgentClaim, error) {
	switch {
	case agent == "":
		return nil, fmt.Errorf("%w: an agent needs a name", ErrInvalidJob)
	case worker == "":
		return nil, fmt.Errorf("%w: claiming needs a job type", ErrInvalidJob)
	case count < 1 || count > maxAgentClaim:
		return nil, fmt.Errorf("%w: claim from 1 to %d jobs, not %d", ErrInvalidJob, maxAgentClaim, count)
	case lease <= 0:
		return nil, fmt.Errorf("%w: a claim needs a positive lease", ErrInvalidJob)
	}
	// An agent of no site in a database of sites, or of a site the
	// database does not list, would find nothing it may claim: say so
	// rather than answer that nothing is due. The sites document is read
	// again first, since it may have changed since this client read it.
	if err := c.loadSites(ctx); err != nil {
		return nil, err
	}
	if c.CheckSite() != nil {
		if err := c.RefreshSites(ctx); err != nil {
			return nil, err
		}
		if err := c.CheckSite(); err != nil {
			return nil, fmt.Errorf("claiming %s jobs for %s: %w", worker, agent, err)
		}
	}
	held, err := c.HeldBy(ctx, agent, worker)
	if err != nil {
		return nil, err
	}
	out := &AgentClaim{Held: held[:min(len(held), count)]}
	want := count - len(out.Held)
	if want <= 0 {
		return out, nil
	}
	paused, err := c.Paused(ctx, worker)
	if err != nil {
		return nil, err
	}
	if paused[worker] {
		out.Paused = true
		return out, nil
	}
	if out.CatchingUp, err = c.siteCatchingUp(ctx); err != nil || out.CatchingUp {
		return out, err
	}
	// A few rounds: claims lost to other claimants leave room for more.
	// Claims stored but not standing (on a cluster: short of a majority,
	// or beside another claim) are conceded before answering, as a
	// worker's are: left live, one could become the job's winning branch
	// and come back to the agent as held while the claim that stood runs.
	var unrun []*UnrunClaim
	defer func() { c.concedeNow(ctx, agent, unrun) }()
	for round := 0; round < 3 && want > 0; round++ {
		batch, err := c.DueFirst(ctx, worker, want*2)
		if err != nil {
			return nil, err
		}
		if len(batch.Items) == 0 {
			break
		}
		items := batch.Items[:min(len(batch.Items), want)]
		for _, r := range c.ClaimMany(ctx, items, agent, lease) {
			if r.Unrun != nil {
				unrun = append(unrun, r.Unrun)
			}
			if r.Err == nil {
				out.Claimed = append(out.Claimed, r.Item)
				want--
			} else if !errors.Is(r.Err, ErrClaimConflict) {
				return out, r.Err
			}
		}
	}
	return out, nil
}

// concedeNow concedes claims that will not run after the longest of their
// waits (UnrunClaim.Wait, at most a couple of seconds): time for the claim
// that stood to withdraw them first.
func (c *Client) concedeNow(ctx context.Context, by string, claims []*UnrunClaim) {
	if len(claims) == 0 {
		return
	}
	var wait time.Duration
	for _, u := range claims {
		wait = max(wait, u.Wait)
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(wait):
	}
	c.Concede(ctx, by, claims)
}

// HeldBy lists the jobs of type worker (all types for "") that claimant
// holds, soonest lease end first.
func (c *Client) HeldBy(ctx context.Context, claimant, worker string) ([]*WorkItem, error) {
	start, end := []any{claimant}, []any{claimant, map[string]any{}}
	if worker != "" {
		start, end = []any{claimant, worker}, []any{claimant, worker, map[string]any{}}
	}
	rows := c.view(ctx, "held", kivik.Params(map[string]any{
		"startkey": start, "endkey": end, "include_docs": true, "reduce": false, "limit": maxAgentClaim,
	}))
	defer rows.Close()
	var out []*WorkItem
	for rows.Next() {
		var it WorkItem
		if err := rows.ScanDoc(&it); err != nil {
			continue // a malformed document is the workers' to quarantine
		}
		// The view may trail the document on a cluster: trust the document.
		if it.Claimed && it.ClaimedBy == claimant {
			out = append(out, &it)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing the jobs %s holds: %w", claimant, err)
	}
	if c.n <= 1 || len(out) == 0 {
		return out, nil
	}
	return c.heldOnEveryBranch(ctx, claimant, out)
}

// heldOnEveryBranch keeps, of jobs a cluster's view and documents show
// claimant holding, those it holds on every live branch read from a
// majority of the copies, each as that branch. A view's row and its
// document come from one copy, which may be behind (the job finished or
// swept since) or hold a claim that lost to another claimant's: handed to
// the agent, such a job would run beside the claim that stood, or again.
func (c *Client) heldOnEveryBranch(ctx context.Context, claimant string, jobs []*WorkItem) ([]*WorkItem, error) {
	ids := make([]string, len(jobs))
	for i, it := range jobs {
		ids[i] = it.ID
	}
	all, err := c.leavesMany(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("confirming the jobs %s holds: %w", claimant, err)
	}
	var out []*WorkItem
	for _, id := range ids {
		var held *WorkItem
		for _, l := range all[id] {
			if l.Deleted && l.Withdrawn {
				continue
			}
			if l.Deleted || l.Item == nil || !l.Claimed || l.ClaimedBy != claimant || held != nil || l.Item.Conceded() {
				held = nil
				break
			}
			held = l.Item
		}
		if held != nil {
			out = append(out, held)
		}
	}
	return out, nil
}

// HeldJob reads job id and checks that claimant holds it (ErrNotHeld
// otherwise, saying who does): what an agent acts on.
func (c *Client) HeldJob(ctx context.Context, id, claimant string) (*WorkItem, error) {
	it, err := c.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	switch {
	case !it.Claimed && it.Status == StatusQueued:
		return nil, fmt.Errorf("%s: %w: it is queued and nobody holds it (released, or never claimed, or a lease that ran out was swept)", id, ErrNotHeld)
	case !it.Claimed:
		return nil, fmt.Errorf("%s: %w: it is %s and nobody holds it", id, ErrNotHeld, it.Status)
	case it.ClaimedBy != claimant:
		return nil, fmt.Errorf("%s: %w: %s holds it", id, ErrNotHeld, it.ClaimedBy)
	}
	return it, nil
}

// catchingUpFor is how long a site's heartbeat that says it is catching up
// holds agents' claims back: a waiting worker writes it every heartbeat
// interval, so an older one is from a worker that has gone, and must not
// stop agents for ever.
const catchingUpFor = 3 * time.Minute

// siteCatchingUp reports whether this client's site's heartbeat says its
// workers wait to hear from the other sites (BeatCatchingUp), recently.
func (c *Client) siteCatchingUp(ctx context.Context) (bool, error) {
	if c.cfg.Site == "" {
		return false, nil
	}
	var hb SiteHeartbeat
	err := c.db.Get(ctx, SiteHeartbeatID(c.cfg.Site), c.readOpts()...).ScanDoc(&hb)
	switch {
	case isStatus(err, http.StatusNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading site %s's heartbeat: %w", c.cfg.Site, err)
	}
	return hb.CatchingUp && c.now().Sub(FromUnix(hb.At)) < catchingUpFor, nil
}
