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
	"strings"

	"github.com/go-kivik/kivik/v4/couchdb/chttp"
)

// Access names users and roles of the server's authentication database.
type Access struct {
	Names []string `json:"names"`
	Roles []string `json:"roles"`
}

// Empty reports whether a names no one.
func (a Access) Empty() bool { return len(a.Names) == 0 && len(a.Roles) == 0 }

// String is the list as ParseAccess reads it: names, then role:NAME.
func (a Access) String() string {
	parts := slices.Clone(a.Names)
	for _, r := range a.Roles {
		parts = append(parts, RolePrefix+r)
	}
	return strings.Join(parts, ",")
}

// RolePrefix marks a role in an access list (ParseAccess): role:ops is the
// role ops, alice the user alice.
const RolePrefix = "role:"

// ParseAccess reads a comma-separated list of user names and role:NAME
// roles, the form of couchq init --workers and --producers.
func ParseAccess(list string) (Access, error) {
	var a Access
	for part := range strings.SplitSeq(list, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if role, ok := strings.CutPrefix(part, RolePrefix); ok {
			if role == "" {
				return Access{}, fmt.Errorf("%q names no role: want role:NAME", part)
			}
			if !slices.Contains(a.Roles, role) {
				a.Roles = append(a.Roles, role)
			}
			continue
		}
		if strings.HasPrefix(part, "_") {
			return Access{}, fmt.Errorf("%q: user names do not start with _ (CouchDB reserves them)", part)
		}
		if !slices.Contains(a.Names, part) {
			a.Names = append(a.Names, part)
		}
	}
	return a, nil
}

// Roles says who may use a queue database and how. couchq keeps it in the
// database's security object (_security), under "couchq", where the design
// document's validate_doc_update reads it on every write:
//
//   - producers may create jobs and edit jobs nobody holds; claiming,
//     finishing, cancelling, deleting or editing a held job is refused;
//   - workers may do anything to couchq's documents (jobs, control,
//     worker, slot and schedule documents);
//   - the database's and the server's admins may do anything.
//
// Both are made members of the database, so that nobody else can read or
// write it. Without a "couchq" section every member may do anything.
type Roles struct {
	Workers   Access `json:"workers"`
	Producers Access `json:"producers"`
}

// securityRolesKey is where Roles live in the security object. CouchDB
// keeps fields other than admins and members as they are and passes the
// whole object to validate_doc_update.
const securityRolesKey = "couchq"

// SecurityObject is what SetRoles left in the database's _security.
type SecurityObject struct {
	Admins  Access `json:"admins"`
	Members Access `json:"members"`
	Couchq  *Roles `json:"couchq,omitempty"`
}

// ErrNoRoles means SetRoles was given neither workers nor producers.
var ErrNoRoles = errors.New("no workers and no producers given")

// Security reads the database's security object with the roles couchq
// keeps in it (Couchq nil when none were set).
func (s *Server) Security(ctx context.Context, dbName string) (*SecurityObject, error) {
	obj, err := s.readSecurity(ctx, dbName)
	if err != nil {
		return nil, err
	}
	return decodeSecurity(obj)
}

// SetRoles writes r into the database's security object (admin only): the
// members become those r names plus any the object had that an earlier
// SetRoles did not add (people given access by hand keep it); admins and
// other fields are left as they are.
func (s *Server) SetRoles(ctx context.Context, dbName string, r Roles) (*SecurityObject, error) {
	if r.Workers.Empty() && r.Producers.Empty() {
		return nil, ErrNoRoles
	}
	obj, err := s.readSecurity(ctx, dbName)
	if err != nil {
		return nil, err
	}
	before, err := decodeSecurity(obj)
	if err != nil {
		return nil, err
	}
	members := before.Members
	if before.Couchq != nil {
		// Members couchq added last time leave unless named again.
		for _, a := range []Access{before.Couchq.Workers, before.Couchq.Producers} {
			members.Names = slices.DeleteFunc(members.Names, func(n string) bool { return slices.Contains(a.Names, n) })
			members.Roles = slices.DeleteFunc(members.Roles, func(n string) bool { return slices.Contains(a.Roles, n) })
		}
	}
	for _, a := range []Access{r.Workers, r.Producers} {
		for _, n := range a.Names {
			if !slices.Contains(members.Names, n) {
				members.Names = append(members.Names, n)
			}
		}
		for _, n := range a.Roles {
			if !slices.Contains(members.Roles, n) {
				members.Roles = append(members.Roles, n)
			}
		}
	}
	r = Roles{Workers: normalize(r.Workers), Producers: normalize(r.Producers)}
	members = normalize(members)
	obj["members"] = members
	obj[securityRolesKey] = r
	if _, ok := obj["admins"]; !ok {
		obj["admins"] = normalize(Access{})
	}
	body, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encoding the security object of %s: %w", dbName, err)
	}
	// kivik's typed SetSecurity would drop the couchq field: raw PUT.
	_, err = s.raw.DoError(ctx, http.MethodPut, securityPath(dbName), &chttp.Options{
		GetBody: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil },
		Header:  http.Header{"Content-Type": {"application/json"}},
	})
	if err != nil {
		return nil, fmt.Errorf("writing the security object of %s: %w", dbName, err)
	}
	return &SecurityObject{Admins: normalize(before.Admins), Members: members, Couchq: &r}, nil
}

// normalize gives a non-nil lists, which CouchDB requires in _security.
func normalize(a Access) Access {
	if a.Names == nil {
		a.Names = []string{}
	}
	if a.Roles == nil {
		a.Roles = []string{}
	}
	return a
}

func securityPath(dbName string) string { return "/" + url.PathEscape(dbName) + "/_security" }

// readSecurity reads the whole security object, fields kivik's typed
// Security would drop included.
func (s *Server) readSecurity(ctx context.Context, dbName string) (map[string]any, error) {
	var obj map[string]any
	if err := s.raw.DoJSON(ctx, http.MethodGet, securityPath(dbName), nil, &obj); err != nil {
		return nil, fmt.Errorf("reading the security object of %s: %w", dbName, err)
	}
	if obj == nil {
		obj = map[string]any{}
	}
	return obj, nil
}

func decodeSecurity(obj map[string]any) (*SecurityObject, error) {
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var s SecurityObject
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("decoding the security object: %w", err)
	}
	return &s, nil
}
