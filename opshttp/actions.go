package opshttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/couchq/couchq/internal/protocol"
)

// authRealm names the credentials the actions ask for.
const authRealm = `Basic realm="couchq"`

// errNoCredentials: the request carries neither basic credentials nor a
// CouchDB session cookie, or CouchDB does not know them.
var errNoCredentials = errors.New("log in with a CouchDB user (basic auth or an AuthSession cookie)")

// sessionCookie is the cookie CouchDB's cookie authentication sets.
const sessionCookie = "AuthSession"

// sessionUser is who CouchDB says the request's credentials belong to.
type sessionUser struct {
	name  string
	roles []string
}

// serverAdmin reports whether the user is one of CouchDB's server admins.
func (u sessionUser) serverAdmin() bool {
	for _, r := range u.roles {
		if r == "_admin" {
			return true
		}
	}
	return false
}

// authenticateUser asks CouchDB who the request's credentials belong to
// and whether that user may read the database (login), and, where the
// database has couchq's roles, whether the user holds the worker role:
// only they act on its jobs, as they could through CouchDB itself. It
// returns the user, whose name goes in the activity log.
func (s *server) authenticateUser(ctx context.Context, r *http.Request) (sessionUser, int, error) {
	if s.cfg.CouchURL == "" {
		return sessionUser{}, http.StatusForbidden, errors.New("actions are off: the handler was not given CouchDB's URL to check credentials against (opshttp.Config.CouchURL)")
	}
	user, code, err := s.login(ctx, r)
	if err != nil {
		return user, code, err
	}
	ask := func(path string) (*http.Response, error) { return s.askCouch(ctx, r, path) }
	// The actions write with this handler's own connection, so they must
	// not let a user do what CouchDB would refuse it: where the database
	// has couchq's roles (couchq init --workers/--producers), acting takes
	// the worker role or an admin's.
	resp, err := ask("/" + url.PathEscape(s.db) + "/_security")
	if err != nil {
		return sessionUser{}, http.StatusBadGateway, fmt.Errorf("reading the roles of database %s: %w", s.db, err)
	}
	var sec struct {
		Admins protocol.Access `json:"admins"`
		Couchq *protocol.Roles `json:"couchq"`
	}
	err = json.NewDecoder(resp.Body).Decode(&sec)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || err != nil {
		return sessionUser{}, http.StatusForbidden, fmt.Errorf("cannot tell whether %s may act on database %s: reading its _security answered %s", user.name, s.db, resp.Status)
	}
	if sec.Couchq != nil && !user.serverAdmin() && !user.in(sec.Admins) && !user.in(sec.Couchq.Workers) {
		return sessionUser{}, http.StatusForbidden, fmt.Errorf("CouchDB user %s is not a couchq worker or an admin of database %s: the actions need the worker role (couchq init --workers)", user.name, s.db)
	}
	return user, http.StatusOK, nil
}

// in reports whether the user is named in a, by name or by a role.
func (u sessionUser) in(a protocol.Access) bool {
	for _, n := range a.Names {
		if n == u.name {
			return true
		}
	}
	for _, r := range u.roles {
		for _, ar := range a.Roles {
			if r == ar {
				return true
			}
		}
	}
	return false
}

// action wraps an action: it authenticates, runs do with the user's name
// and answers 200 with what do returns, 409 when the job is not in a state
// the action applies to, 404 when there is no such job.
func (s *server) action(do func(ctx context.Context, r *http.Request, by string) (any, error)) http.HandlerFunc {
	return s.actionAs(func(ctx context.Context, r *http.Request, u sessionUser) (any, error) { return do(ctx, r, u.name) })
}

// actionAs is action for actions that need the user's roles too.
func (s *server) actionAs(do func(ctx context.Context, r *http.Request, u sessionUser) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RefreshTimeout)
		defer cancel()
		u, code, err := s.authenticateUser(ctx, r)
		user := u.name
		if err != nil {
			refused(w, r, code, err)
			return
		}
		out, err := do(ctx, r, u)
		var forwarded *protocol.ForwardedError
		switch {
		case errors.As(err, &forwarded):
			// Another site's job: the request waits for its owner, which
			// applies it when the links bring it.
			s.cfg.Logger.Info().Str("user", user).Str("action", r.URL.Path).Str("request", forwarded.Request.ID).Msg("action forwarded to the owner site")
			s.invalidate()
			s.writeJSONStatus(w, http.StatusAccepted, map[string]any{
				"forwarded": forwarded.Request, "message": err.Error() + ": the owner applies it when the request reaches it",
			})
			return
		case errors.Is(err, protocol.ErrWrongState):
			writeAPIError(w, http.StatusConflict, err.Error())
			return
		case errors.Is(err, protocol.ErrNotFound):
			writeAPIError(w, http.StatusNotFound, err.Error())
			return
		case errors.Is(err, protocol.ErrNotHeld), errors.Is(err, protocol.ErrClaimLost):
			writeAPIError(w, http.StatusConflict, err.Error())
			return
		case errors.Is(err, protocol.ErrNoSite):
			// The request was fine and CouchDB answered: this server was
			// started without the site it claims for.
			writeAPIError(w, http.StatusConflict, "the database has sites and this server claims for none: start it with couchq serve --site NAME (or COUCHQ_SITE)")
			return
		case errors.As(err, new(*badRequest)):
			status := http.StatusBadRequest
			if bad := new(badRequest); errors.As(err, &bad) && bad.status != 0 {
				status = bad.status
			}
			writeAPIError(w, status, err.Error())
			return
		case errors.Is(err, protocol.ErrInvalidJob):
			writeAPIError(w, http.StatusBadRequest, err.Error())
			return
		case err != nil:
			s.serverFailed(w, err)
			return
		}
		s.cfg.Logger.Info().Str("user", user).Str("action", r.URL.Path).Msg("action done")
		s.invalidate()
		s.writeJSON(w, out)
	}
}

func (s *server) retry(ctx context.Context, r *http.Request, by string) (any, error) {
	it, err := s.q.Retry(ctx, r.PathValue("id"), by)
	if err != nil {
		return nil, err
	}
	return s.hidePayload(it)
}

func (s *server) cancelJob(ctx context.Context, r *http.Request, by string) (any, error) {
	it, err := s.q.CancelJob(ctx, r.PathValue("id"), by, "cancelled from the dashboard by "+by)
	if err != nil {
		return nil, err
	}
	return s.hidePayload(it)
}

func (s *server) pause(ctx context.Context, r *http.Request, by string) (any, error) {
	typ := r.PathValue("type")
	return map[string]any{"type": typ, "paused": true}, s.q.Pause(ctx, typ, by, "paused from the dashboard")
}

func (s *server) resume(ctx context.Context, r *http.Request, by string) (any, error) {
	typ := r.PathValue("type")
	return map[string]any{"type": typ, "paused": false}, s.q.Resume(ctx, typ, by)
}
