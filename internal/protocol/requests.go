package protocol

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/go-kivik/kivik/v4"
)

// Operator actions from any site. Only a job's owner site writes the job,
// so that no two sites ever write the same revision of it: a cancel or a
// retry issued elsewhere becomes a request document, which the links
// carry to the owner, whose sweeper applies it once and records the
// outcome in it (which the links carry back).

const (
	// SiteRequestDocType is the type of a request document.
	SiteRequestDocType = "SiteRequest"
	requestPrefix      = "request:"
	// Request actions.
	requestCancel = "cancel"
	requestRetry  = "retry"
	// Request states.
	RequestPending = "pending"
	RequestApplied = "applied"
	RequestRefused = "refused"
)

// ErrForwarded means an action was not applied here: the job belongs to
// another site, and a request for the action was written for its owner,
// which applies it once it has it (Request says which).
var ErrForwarded = errors.New("forwarded to the job's owner site")

// SiteRequest is an operator's action on a job, for the job's owner site.
type SiteRequest struct {
	ID     string `json:"_id"`
	Rev    string `json:"_rev,omitempty"`
	Type   string `json:"type"`
	Job    string `json:"job"`
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

// request writes a request for action on it for its owner.
func (c *Client) request(ctx context.Context, it *WorkItem, action, by, reason string) error {
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
	applied := 0
	for i := range reqs {
		r := &reqs[i]
		if r.State != RequestPending {
			continue
		}
		it, err := c.Get(ctx, r.Job)
		switch {
		case errors.Is(err, ErrNotFound):
			if r.Site != c.cfg.Site {
				continue // it has not reached us yet, or was never ours
			}
			r.State, r.Result = RequestRefused, "the job does not exist at its owner site"
		case err != nil:
			return applied, err
		case c.Owner(it) != c.cfg.Site:
			continue // another site's (the request follows the owner)
		default:
			c.applyRequest(ctx, r, it, by)
		}
		r.AppliedAt = ToUnix(c.now())
		if _, err := c.db.Put(ctx, r.ID, r, c.writeOpts()...); err != nil && !isStatus(err, http.StatusConflict) {
			return applied, fmt.Errorf("recording request %s: %w", r.ID, err)
		}
		applied++
	}
	return applied, nil
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
