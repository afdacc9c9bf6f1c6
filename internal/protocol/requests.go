package protocol

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/go-kivik/kivik/v4"
)

// Operator actions from any site. Only a job's owner site writes the job,
// so that no two sites ever write the same revision of it: a cancel or a
// retry issued elsewhere becomes a request document, which the links
// carry to the owner, whose sweeper applies it once and records the
// outcome in it (which the links carry back). A pause or resume of a job
// type at another site travels the same way: pause controls stay at
// their site, so only that site writes them.

const (
	// SiteRequestDocType is the type of a request document.
	SiteRequestDocType = "SiteRequest"
	requestPrefix      = "request:"
	// Request actions.
	requestCancel = "cancel"
	requestRetry  = "retry"
	requestPause  = "pause"
	requestResume = "resume"
	// Request states.
	RequestPending = "pending"
	RequestApplied = "applied"
	RequestRefused = "refused"
	// requestKeep is how long a request is kept once applied or refused:
	// long enough for the site that made it to read the outcome after an
	// outage; then the sweeps delete it, so that the requests every sweep
	// reads do not grow with the queue's age. The job's history keeps the
	// action.
	requestKeep = 7 * 24 * time.Hour
	// requestDeleteBatch is the most expired requests one _bulk_docs
	// deletes.
	requestDeleteBatch = 1000
)

// ErrForwarded means an action was not applied here: the job belongs to
// another site, and a request for the action was written for its owner,
// which applies it once it has it (Request says which).
var ErrForwarded = errors.New("forwarded to the job's owner site")

// SiteRequest is an operator's action on a job, for the job's owner site.
type SiteRequest struct {
	ID   string `json:"_id"`
	Rev  string `json:"_rev,omitempty"`
	Type string `json:"type"`
	// Job is the job a cancel or retry acts on; Worker the job type a
	// pause or resume acts on.
	Job    string `json:"job,omitempty"`
	Worker string `json:"worker,omitempty"`
	Action string `json:"action"`
	Reason string `json:"reason,omitempty"`
	// By is who asked, and From the site where (empty: a client of no
	// site).
	By   string `json:"by"`
	From string `json:"from,omitempty"`
	// Site is the owner the request was written for.
	Site      string  `json:"site"`
	CreatedAt float64 `json:"created_at"`
	// State is pending until the owner applies (applied) or refuses it
	// (refused, with Result saying why).
	State     string  `json:"state"`
	Result    string  `json:"result,omitempty"`
	AppliedAt float64 `json:"applied_at,omitempty"`
}

// ForwardedError is ErrForwarded with the request written.
type ForwardedError struct {
	Request *SiteRequest
}

func (e *ForwardedError) Error() string {
	if e.Request.Job == "" {
		return fmt.Sprintf("%s of job type %s forwarded to site %s (request %s)", e.Request.Action, e.Request.Worker, e.Request.Site, e.Request.ID)
	}
	return fmt.Sprintf("%s of job %s %s %s (request %s)", e.Request.Action, e.Request.Job, ErrForwarded, e.Request.Site, e.Request.ID)
}

func (e *ForwardedError) Unwrap() error { return ErrForwarded }

// forward reports whether an action on it must go to another site, after
// reading the sites document if the client has not yet.
func (c *Client) forward(ctx context.Context, it *WorkItem) (bool, error) {
	if c.sites.Load() == nil {
		if err := c.RefreshSites(ctx); err != nil {
			return false, err
		}
	}
	if !c.siteView().multi {
		return false, nil
	}
	return c.Owner(it) != c.cfg.Site, nil
}

// request writes a request for action on it for its owner; when one is
// pending already it is the answer, not a second one that the owner would
// refuse.
func (c *Client) request(ctx context.Context, it *WorkItem, action, by, reason string) error {
	reqs, err := c.Requests(ctx, it.ID)
	if err != nil {
		return err
	}
	for i := range reqs {
		if r := &reqs[i]; r.Action == action && r.State == RequestPending {
			return &ForwardedError{Request: r}
		}
	}
	req := &SiteRequest{
		ID: requestPrefix + strings.TrimPrefix(NewID(), "job:"), Type: SiteRequestDocType, Job: it.ID, Action: action,
		Reason: reason, By: by, From: c.cfg.Site, Site: c.Owner(it), CreatedAt: ToUnix(c.now()), State: RequestPending,
	}
	rev, err := c.db.Put(ctx, req.ID, req, c.writeOpts()...)
	if err != nil {
		return fmt.Errorf("writing a %s request for job %s: %w", action, it.ID, err)
	}
	req.Rev = rev
	return &ForwardedError{Request: req}
}

// Requests lists the requests this database has, oldest first: all of
// them, or those for one job.
func (c *Client) Requests(ctx context.Context, job string) ([]SiteRequest, error) {
	rows := c.db.AllDocs(ctx, kivik.Params(map[string]any{
		"include_docs": true, "startkey": requestPrefix, "endkey": requestPrefix + "\ufff0",
	}))
	defer rows.Close()
	var out []SiteRequest
	for rows.Next() {
		var r SiteRequest
		if err := rows.ScanDoc(&r); err != nil || r.Type != SiteRequestDocType {
			continue
		}
		if job == "" || r.Job == job {
			out = append(out, r)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing requests: %w", err)
	}
	return out, nil
}

// applyRequests applies the pending requests for jobs this site owns, once
// each: an action is recorded in the job's history with the request's id,
// so a request applied but not yet marked (the process died between the
// two writes) is marked, not applied again.
func (c *Client) applyRequests(ctx context.Context, by string) (int, error) {
	if c.cfg.Site == "" || !c.siteView().multi {
		return 0, nil
	}
	reqs, err := c.Requests(ctx, "")
	if err != nil {
		return 0, err
	}
	// In the order they were made, so that of a pause and a resume asked
	// of one type the later wins.
	sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].CreatedAt < reqs[j].CreatedAt })
	applied := 0
	var expired []any
	keptSince := ToUnix(c.now().Add(-requestKeep))
	for i := range reqs {
		r := &reqs[i]
		if r.State != RequestPending {
			// Any site may delete it: the same deletion of the same
			// revision gets the same revision id everywhere.
			if r.AppliedAt != 0 && r.AppliedAt < keptSince && len(expired) < requestDeleteBatch {
				expired = append(expired, map[string]any{"_id": r.ID, "_rev": r.Rev, "_deleted": true})
			}
			continue
		}
		if r.Job == "" {
			if r.Site != c.cfg.Site {
				continue // another site's
			}
			if err := c.applyTypeRequest(ctx, r, by); err != nil {
				return applied, err
			}
		} else if !c.applyJobRequest(ctx, r, by) {
			continue
		}
		r.AppliedAt = ToUnix(c.now())
		if _, err := c.db.Put(ctx, r.ID, r, c.writeOpts()...); err != nil && !isStatus(err, http.StatusConflict) {
			return applied, fmt.Errorf("recording request %s: %w", r.ID, err)
		}
		applied++
	}
	if len(expired) > 0 {
		// Best effort: a request deleted at the next sweep costs nothing.
		if _, err := c.db.BulkDocs(ctx, expired, c.bulkOpts()...); err != nil {
			c.log.Warn().Err(err).Int("requests", len(expired)).Msg("deleting requests applied or refused over a week ago; trying again at the next sweep")
		}
	}
	return applied, nil
}

// applyJobRequest applies a cancel or retry of a job this site owns,
// setting r's state; false when the request is not this site's to apply
// (yet).
func (c *Client) applyJobRequest(ctx context.Context, r *SiteRequest, by string) bool {
	it, err := c.Get(ctx, r.Job)
	switch {
	case errors.Is(err, ErrNotFound):
		if r.Site != c.cfg.Site {
			return false // it has not reached us yet, or was never ours
		}
		r.State, r.Result = RequestRefused, "the job does not exist at its owner site"
	case err != nil:
		c.log.Warn().Err(err).Str("request", r.ID).Msg("reading a request's job; trying again at the next sweep")
		return false
	case c.Owner(it) != c.cfg.Site:
		return false // another site's (the request follows the owner)
	default:
		c.applyRequest(ctx, r, it, by)
	}
	return true
}

// applyTypeRequest applies a pause or resume asked of this site, setting
// r's state. A change made at this site after the request was made wins
// over it: the request is refused as superseded. Applying is recorded as
// the control's last change, so a request applied but not yet marked is
// marked, not applied again over a later change.
func (c *Client) applyTypeRequest(ctx context.Context, r *SiteRequest, by string) error {
	actor := fmt.Sprintf("%s via request %s", r.By, r.ID)
	ctls, err := c.Controls(ctx, r.Worker)
	if err != nil {
		return fmt.Errorf("applying request %s: %w", r.ID, err)
	}
	ctl := ctls[r.Worker]
	switch {
	case ctl.ChangedBy == actor:
		r.State, r.Result = RequestApplied, "applied: the type's control has it"
		return nil
	case ctl.ChangedAt > r.CreatedAt && !byEarlierRequest(ctl.ChangedBy, r.ID):
		r.State, r.Result = RequestRefused, fmt.Sprintf("superseded: %s was %s at this site by %s after the request was made",
			r.Worker, map[bool]string{true: "paused", false: "resumed"}[ctl.Paused], ctl.ChangedBy)
		return nil
	}
	switch r.Action {
	case requestPause:
		err = c.Pause(ctx, r.Worker, actor, r.Reason)
	case requestResume:
		err = c.Resume(ctx, r.Worker, actor)
	default:
		err = fmt.Errorf("unknown action %q", r.Action)
	}
	if err != nil {
		r.State, r.Result = RequestRefused, err.Error()
		return nil
	}
	r.State, r.Result = RequestApplied, "applied by "+by
	return nil
}

// byEarlierRequest reports whether actor, who last changed a type's
// control, is a request made before the request id (request ids are
// time-ordered): applied later than this one was made, it still came
// first, and requests are applied in the order they were made.
func byEarlierRequest(actor, id string) bool {
	_, earlier, ok := strings.Cut(actor, " via request ")
	return ok && strings.HasPrefix(earlier, requestPrefix) && earlier < id
}

// PauseAt pauses typ at site: at once when site is this client's own,
// else through a request the site applies (a *ForwardedError).
func (c *Client) PauseAt(ctx context.Context, site, typ, by, reason string) error {
	return c.typeAt(ctx, site, typ, requestPause, by, reason)
}

// ResumeAt resumes typ at site, as PauseAt pauses it.
func (c *Client) ResumeAt(ctx context.Context, site, typ, by string) error {
	return c.typeAt(ctx, site, typ, requestResume, by, "")
}

func (c *Client) typeAt(ctx context.Context, site, typ, action, by, reason string) error {
	if typ == "" {
		return fmt.Errorf("%s at site %s: %w: the job type is required", action, site, ErrInvalidJob)
	}
	if site == "" || site == c.cfg.Site {
		if action == requestPause {
			return c.Pause(ctx, typ, by, reason)
		}
		return c.Resume(ctx, typ, by)
	}
	if !ValidSiteName(site) {
		return fmt.Errorf("%s of %s: %w: %q is not a site name", action, typ, ErrInvalidJob, site)
	}
	if err := c.RefreshSites(ctx); err != nil {
		return err
	}
	if st := c.siteView(); !st.names[site] {
		names := slices.Sorted(maps.Keys(st.names))
		return &describedError{fmt.Sprintf("%s of %s at site %s: site %s is not one of the sites (%s)", action, typ, site, site, strings.Join(names, ", ")), ErrNotFound}
	}
	// Asked again while the same request is the type's latest pending one
	// at that site: the answer is that request, not a second.
	reqs, err := c.Requests(ctx, "")
	if err != nil {
		return err
	}
	var latest *SiteRequest
	for i := range reqs {
		if r := &reqs[i]; r.Job == "" && r.Worker == typ && r.Site == site && r.State == RequestPending {
			latest = r
		}
	}
	if latest != nil && latest.Action == action {
		return &ForwardedError{Request: latest}
	}
	req := &SiteRequest{
		ID: requestPrefix + strings.TrimPrefix(NewID(), "job:"), Type: SiteRequestDocType, Worker: typ, Action: action,
		Reason: reason, By: by, From: c.cfg.Site, Site: site, CreatedAt: ToUnix(c.now()), State: RequestPending,
	}
	rev, err := c.db.Put(ctx, req.ID, req, c.writeOpts()...)
	if err != nil {
		return fmt.Errorf("writing a %s request for job type %s: %w", action, typ, err)
	}
	req.Rev = rev
	return &ForwardedError{Request: req}
}

// applyRequest applies r to it, the job as this site has it, setting r's
// state.
func (c *Client) applyRequest(ctx context.Context, r *SiteRequest, it *WorkItem, by string) {
	actor := fmt.Sprintf("%s via request %s", r.By, r.ID)
	for _, e := range it.History {
		if e.By == actor {
			r.State, r.Result = RequestApplied, "applied: the job's history has it"
			return
		}
	}
	var err error
	switch r.Action {
	case requestCancel:
		_, err = c.CancelJob(ctx, r.Job, actor, r.Reason)
	case requestRetry:
		_, err = c.Retry(ctx, r.Job, actor)
	default:
		err = fmt.Errorf("unknown action %q", r.Action)
	}
	if err != nil {
		r.State, r.Result = RequestRefused, err.Error()
		return
	}
	r.State, r.Result = RequestApplied, "applied by "+by
}
