package couchtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// AddUser creates a user in the server's _users database (as the admin)
// and waits until the server authenticates it: on a cluster a new user
// document reaches every node's authentication cache a moment after the
// write. It fails with ErrNoUsers when the server does not authenticate
// CouchDB users at all.
func (s *Server) AddUser(ctx context.Context, name, password string, roles ...string) error {
	if roles == nil {
		roles = []string{}
	}
	doc := map[string]any{"name": name, "password": password, "roles": roles, "type": "user"}
	if _, err := s.do(ctx, http.MethodPut, "/_users/"+url.PathEscape("org.couchdb.user:"+name), doc, nil); err != nil {
		return fmt.Errorf("%w: creating user %s: %w", ErrNoUsers, name, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		who, err := s.SessionUser(ctx, name, password)
		if err == nil && who == name {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: user %s was created but the server authenticates it as %q (%v)", ErrNoUsers, name, who, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ErrNoUsers means the server does not authenticate CouchDB users.
var ErrNoUsers = errors.New("the server does not authenticate CouchDB users")

// SessionUser is the name GET /_session gives for these credentials ("" for
// an anonymous session).
func (s *Server) SessionUser(ctx context.Context, name, password string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL()+"/_session", nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Accept", "application/json")
	req.SetBasicAuth(name, password)
	resp, err := s.httpc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var sess struct {
		UserCtx struct {
			Name *string `json:"name"`
		} `json:"userCtx"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /_session: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&sess); err != nil {
		return "", fmt.Errorf("GET /_session: %w", err)
	}
	if sess.UserCtx.Name == nil {
		return "", nil
	}
	return *sess.UserCtx.Name, nil
}

// URLAs is the server's URL with other credentials.
func (s *Server) URLAs(name, password string) string {
	u := *s.base
	u.User = url.UserPassword(name, password)
	return u.String()
}
