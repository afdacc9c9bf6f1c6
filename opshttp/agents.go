package opshttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// The agents' endpoints: claimants that are not worker processes (a web
// review tool, a worker in another language) claim and finish jobs over
// HTTP as the CouchDB user they authenticate as. That user is the agent:
// it is recorded in the job's claimed_by and history, and may only
// complete, fail, extend, report the progress of or release what it holds; a server admin may
// release anyone's.
//
//	POST /api/claim                 {"type": T, "count": N, "lease": "1h"}
//	POST /api/jobs/{id}/complete    {"result": any JSON}
//	POST /api/jobs/{id}/fail        {"error": MSG, "no_retry": bool}
//	POST /api/jobs/{id}/extend      {"lease": "1h"}
//	POST /api/jobs/{id}/progress    {"done": N, "total": M, "note": TEXT}
//	POST /api/jobs/{id}/release     {}
//
// A job the agent does not hold is 409 with who holds it.

// badRequest is a request body an endpoint cannot use: 400, or status
// when set (413 for a body too large).
type badRequest struct {
	err    error
	status int
}

func (e *badRequest) Error() string { return e.err.Error() }

// maxAgentBody bounds a request body (a result is stored in the job).
const maxAgentBody = 1 << 20

// minAgentLease is the shortest lease an agent may ask for: one shorter
// runs out before the agent has heard of its claim.
const minAgentLease = 100 * time.Millisecond

// agentLeaseDefault is an agent's lease when the request gives none.
const agentLeaseDefault = time.Hour

// readBody decodes r's JSON body (an empty body is {}) into v.
func readBody(r *http.Request, v any) error {
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxAgentBody))
	if tooLarge := new(http.MaxBytesError); errors.As(err, &tooLarge) {
		return &badRequest{fmt.Errorf("the request body is larger than %d bytes: store a large result elsewhere and put where in the job's result", maxAgentBody), http.StatusRequestEntityTooLarge}
	}
	if err != nil {
		return &badRequest{err: fmt.Errorf("reading the request body: %w", err)}
	}
	if len(b) == 0 {
		return nil
	}
	// Unknown fields are refused: a misspelt "leese" would otherwise be
	// the default lease, silently.
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &badRequest{err: fmt.Errorf("the request body is not the JSON object wanted: %w", err)}
	}
	if dec.More() {
		return &badRequest{err: errors.New("the request body is not the JSON object wanted: more than one JSON value")}
	}
	return nil
}

// lease reads a lease like "1h" ("" is the default).
func parseLease(s string) (time.Duration, error) {
	if s == "" {
		return agentLeaseDefault, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, &badRequest{err: fmt.Errorf("invalid lease %q: want a positive duration like \"1h\"", s)}
	}
	if d < minAgentLease {
		return 0, &badRequest{err: fmt.Errorf("invalid lease %q: must be at least %s", s, minAgentLease)}
	}
	return d, nil
}

func (s *server) agentClaim(ctx context.Context, r *http.Request, u sessionUser) (any, error) {
	var req struct {
		Type  string `json:"type"`
		Count int    `json:"count"`
		Lease string `json:"lease"`
	}
	if err := readBody(r, &req); err != nil {
		return nil, err
	}
	if req.Count == 0 {
		req.Count = 1
	}
	lease, err := parseLease(req.Lease)
	if err != nil {
		return nil, err
	}
	got, err := s.q.ClaimForAgent(ctx, req.Type, req.Count, u.name, lease)
	if err != nil {
		return nil, err
	}
	return map[string]any{"agent": u.name, "jobs": got.Jobs(), "held": len(got.Held), "paused": got.Paused, "catching_up": got.CatchingUp}, nil
}

// heldJob is the job of the request's path, held by the user (or, for
// release, held by anyone when the user is a server admin).
func (s *server) heldJob(ctx context.Context, r *http.Request, u sessionUser, adminMay bool) (*protocol.WorkItem, error) {
	id := r.PathValue("id")
	it, err := s.q.HeldJob(ctx, id, u.name)
	if errors.Is(err, protocol.ErrNotHeld) && adminMay && u.serverAdmin() {
		if it, gerr := s.q.Get(ctx, id); gerr == nil && it.Claimed {
			return it, nil
		}
	}
	return it, err
}

func (s *server) agentComplete(ctx context.Context, r *http.Request, u sessionUser) (any, error) {
	var req struct {
		Result json.RawMessage `json:"result"`
	}
	if err := readBody(r, &req); err != nil {
		return nil, err
	}
	it, err := s.heldJob(ctx, r, u, false)
	if err != nil {
		return nil, err
	}
	if err := s.q.Complete(ctx, it, req.Result); err != nil {
		return it, err
	}
	s.q.AfterFinish(ctx, it, it.ClaimedBy)
	return it, nil
}

func (s *server) agentFail(ctx context.Context, r *http.Request, u sessionUser) (any, error) {
	var req struct {
		Error   string `json:"error"`
		NoRetry bool   `json:"no_retry"`
	}
	if err := readBody(r, &req); err != nil {
		return nil, err
	}
	if req.Error == "" {
		return nil, &badRequest{err: errors.New(`"error" is required: say what went wrong`)}
	}
	it, err := s.heldJob(ctx, r, u, false)
	if err != nil {
		return nil, err
	}
	// Retried after the workers' backoff.
	if err := s.q.Fail(ctx, it, req.Error, protocol.FailOptions{Final: req.NoRetry, RetryAfter: worker.DefaultRetry(it.Attempts)}); err != nil {
		return it, err
	}
	s.q.AfterFinish(ctx, it, "agent")
	return it, nil
}

func (s *server) agentExtend(ctx context.Context, r *http.Request, u sessionUser) (any, error) {
	var req struct {
		Lease string `json:"lease"`
	}
	if err := readBody(r, &req); err != nil {
		return nil, err
	}
	lease, err := parseLease(req.Lease)
	if err != nil {
		return nil, err
	}
	it, err := s.heldJob(ctx, r, u, false)
	if err != nil {
		return nil, err
	}
	return it, s.q.Extend(ctx, it, lease)
}

// agentProgress records how far the agent got: one write per call, the
// lease left as it is.
func (s *server) agentProgress(ctx context.Context, r *http.Request, u sessionUser) (any, error) {
	var req struct {
		Done  *int   `json:"done"`
		Total int    `json:"total"`
		Note  string `json:"note"`
	}
	if err := readBody(r, &req); err != nil {
		return nil, err
	}
	if req.Done == nil {
		return nil, &badRequest{err: errors.New(`"done" is required: the units done, 0 or more`)}
	}
	it, err := s.heldJob(ctx, r, u, false)
	if err != nil {
		return nil, err
	}
	return it, s.q.ReportProgress(ctx, it, *req.Done, req.Total, req.Note)
}

func (s *server) agentRelease(ctx context.Context, r *http.Request, u sessionUser) (any, error) {
	if err := readBody(r, &struct{}{}); err != nil {
		return nil, err
	}
	it, err := s.heldJob(ctx, r, u, true)
	if err != nil {
		return nil, err
	}
	return it, s.q.Release(ctx, it, "released by "+u.name+" over HTTP")
}
