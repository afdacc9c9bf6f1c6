package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/protocol"
)

// DefaultURL is the server used when neither --url nor $COUCHDB_URL is set.
const DefaultURL = "http://127.0.0.1:5984"

// Conn is how to reach the queue, from the connection flags every command
// takes, a worker configuration file's [couchdb] table or a
// fleet.Connection. Resolve fills in the defaults from the environment and
// checks it; then it dials.
type Conn struct {
	// URL is the server as given: one URL, or a comma-separated list of a
	// cluster's nodes, maybe with credentials. Resolve replaces it with
	// its redacted form, for messages.
	URL          string
	DB           string
	User         string
	PasswordFile string
	CAFile       string
	// Site is the site the command works for, in a queue of several
	// sites (couchq sites): a worker claims its jobs, an enqueue makes
	// them its own. Default $COUCHQ_SITE; none in a single database.
	Site string

	// Password is the password from PasswordFile or the environment
	// (empty: the URL's, if any). Never printed.
	Password string
	// FixedPassword is a password settled before Resolve (a worker
	// configuration file's password_env); it wins over $COUCHDB_PASSWORD.
	FixedPassword string

	// RawURL is the URL with any credentials: for dialling only, never
	// printed. ResolveURL sets it.
	RawURL string
	// URLFlag is the flag that gave URL, for messages; empty is --url.
	URLFlag string
}

// Resolve fills in the defaults from the environment (getenv) and
// validates the settings. addSecret, if not nil, learns a password read
// from a file, to keep it out of what the command prints.
func (c *Conn) Resolve(getenv func(string) string, addSecret func(string)) error {
	if err := c.ResolveURL(getenv); err != nil {
		return err
	}
	if err := c.ResolveCredentials(getenv, addSecret); err != nil {
		return err
	}
	return c.ResolveDB(getenv)
}

// ResolveCredentials settles the user and password: the settings, then
// the environment; what is still empty comes from the URL
// (protocol.DialHTTP).
func (c *Conn) ResolveCredentials(getenv func(string) string, addSecret func(string)) error {
	if c.User == "" {
		c.User = getenv("COUCHDB_USER")
	}
	file := c.PasswordFile
	if file == "" {
		file = getenv("COUCHDB_PASSWORD_FILE")
	}
	if file == "" {
		if c.Password == "" {
			c.Password = getenv("COUCHDB_PASSWORD")
		}
		if c.FixedPassword != "" {
			c.Password = c.FixedPassword
		}
		return nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return Usagef("reading the password file: %v", err)
	}
	c.PasswordFile = file // where it came from, for worker --check
	// The file's last line break is not part of the password (echo adds one).
	c.Password = strings.TrimRight(string(b), "\r\n")
	if c.Password == "" {
		return Usagef("the password file %s is empty", file)
	}
	if addSecret != nil {
		addSecret(c.Password)
	}
	if c.User == "" && !urlHasUser(c.RawURL) {
		return Usagef("a password file needs a user: --user NAME or $COUCHDB_USER")
	}
	return nil
}

// urlHasUser reports whether the first node's URL names a user.
func urlHasUser(raw string) bool {
	nodes := protocol.SplitNodeURLs(raw)
	if len(nodes) == 0 {
		return false
	}
	u, err := url.Parse(nodes[0])
	return err == nil && u.User != nil && u.User.Username() != ""
}

// ResolveURL settles the server URL: the setting, else $COUCHDB_URL, else
// DefaultURL.
func (c *Conn) ResolveURL(getenv func(string) string) error {
	c.RawURL = c.URL
	if c.RawURL == "" {
		c.RawURL = getenv("COUCHDB_URL")
	}
	if c.RawURL == "" {
		c.RawURL = DefaultURL
	}
	nodes := protocol.SplitNodeURLs(c.RawURL)
	redacted := make([]string, len(nodes))
	for i, n := range nodes {
		redacted[i] = protocol.Redact(n)
	}
	c.URL = strings.Join(redacted, ",")
	flag := c.URLFlag
	if flag == "" {
		flag = "--url"
	}
	if len(nodes) == 0 {
		return Usagef("invalid %s %q: want http(s)://[user:password@]host:port", flag, c.URL)
	}
	for i, n := range nodes {
		u, err := url.Parse(n)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return Usagef("invalid %s %q: want http(s)://[user:password@]host:port", flag, redacted[i])
		}
	}
	return nil
}

// ResolveDB settles the database: the setting, else $COUCHQ_DB, else
// protocol.DBDefault.
func (c *Conn) ResolveDB(getenv func(string) string) error {
	if c.DB == "" {
		c.DB = getenv("COUCHQ_DB")
	}
	if c.DB == "" {
		c.DB = protocol.DBDefault
	}
	if !validDBName(c.DB) {
		return Usagef("invalid --db %q: a database name starts with a lowercase letter and has only a-z, 0-9 and _$()+-/", c.DB)
	}
	if c.Site == "" {
		c.Site = getenv("COUCHQ_SITE")
	}
	if c.Site != "" && !protocol.ValidSiteName(c.Site) {
		return Usagef("invalid --site %q: want a site name, %s", c.Site, protocol.SiteNameRule)
	}
	return nil
}

// dbNameRE is CouchDB's rule for database names.
var dbNameRE = regexp.MustCompile(`^[a-z][a-z0-9_$()+/-]*$`)

// validDBName applies CouchDB's rule for database names, so a typo is a
// usage error here rather than a 400 from the server.
func validDBName(name string) bool { return dbNameRE.MatchString(name) }

// HTTPClient is the HTTP client for the server: for a list of nodes, one
// that fails over between them and says so in log (once a minute a node).
func (c *Conn) HTTPClient(log zerolog.Logger) (*http.Client, error) {
	hc := protocol.NewHTTPClient()
	if c.CAFile != "" {
		pool, err := loadCAFile(c.CAFile)
		if err != nil {
			return nil, &UsageError{Err: err}
		}
		tr := hc.Transport.(*http.Transport)
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	nodes := protocol.SplitNodeURLs(c.RawURL)
	if len(nodes) > 1 {
		f, err := protocol.NewFailover(hc.Transport, nodes, log)
		if err != nil {
			return nil, &UsageError{Err: err}
		}
		hc.Transport = f
	}
	return hc, nil
}

// Passwords are the passwords the connection carries: the one resolved
// and any in its URLs. Resolve first.
func (c *Conn) Passwords() []string {
	var out []string
	if c.Password != "" {
		out = append(out, c.Password)
	}
	for _, node := range protocol.SplitNodeURLs(c.RawURL) {
		if u, err := url.Parse(node); err == nil && u.User != nil {
			if pw, ok := u.User.Password(); ok && pw != "" && !slices.Contains(out, pw) {
				out = append(out, pw)
			}
		}
	}
	return out
}

// loadCAFile is the system's CA pool plus the certificates in a PEM file.
func loadCAFile(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading the CA file (--ca-file, ca_file): %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("the CA file %s (--ca-file, ca_file) holds no PEM certificate", file)
	}
	return pool, nil
}

// Dial connects to the server (no request is made yet).
func (c *Conn) Dial(log zerolog.Logger) (*kivik.Client, error) {
	hc, err := c.HTTPClient(log)
	if err != nil {
		return nil, err
	}
	client, err := protocol.DialHTTP(c.RawURL, c.User, c.Password, hc)
	if err != nil {
		return nil, &UsageError{Err: err}
	}
	return client, nil
}

// Connect connects to the server and asks it what it can do, as a worker
// process does. Its errors are the server's (see ServerError) but for
// settings that cannot work, which are usage errors.
func (c *Conn) Connect(ctx context.Context, log zerolog.Logger) (*protocol.Server, error) {
	hc, err := c.HTTPClient(log)
	if err != nil {
		return nil, err
	}
	return protocol.ConnectHTTP(ctx, c.RawURL, c.User, c.Password, hc)
}

// OpenQueue connects to the server and the queue database for a command:
// the database must exist with couchq's design documents (couchq init).
// The client writes as "cli", reading its own writes on a cluster. close
// releases the connection.
func (c *Conn) OpenQueue(ctx context.Context, log zerolog.Logger, now func() time.Time) (q *protocol.Client, close func() error, err error) {
	client, err := c.Dial(log)
	if err != nil {
		return nil, nil, err
	}
	q, err = protocol.New(ctx, client.DB(c.DB), CommandConfig(log, now, c.Site))
	if err != nil {
		_ = client.Close()
		return nil, nil, c.openError(err)
	}
	if err := c.checkDesign(ctx, q, log); err != nil {
		_ = client.Close()
		return nil, nil, err
	}
	return q, client.Close, nil
}

// CommandConfig is the queue client configuration of the commands
// (OpenQueue's): it writes as "cli", for site, and with ReadYourWrites, so
// that a command that lists jobs right after one that wrote them sees the
// writes on a cluster, through any node.
func CommandConfig(log zerolog.Logger, now func() time.Time, site string) protocol.Config {
	return protocol.Config{Logger: log, Actor: "cli", Now: now, ReadYourWrites: true, Site: site}
}

// Open connects as Connect does and opens the queue database with cfg, as
// OpenQueue does: a client that workers can run on (it follows the
// changes feed with a _selector filter where the server has one).
func (c *Conn) Open(ctx context.Context, cfg protocol.Config) (q *protocol.Client, close func() error, err error) {
	srv, err := c.Connect(ctx, cfg.Logger)
	if err != nil {
		return nil, nil, ServerError(c.URL, err)
	}
	if cfg.Site == "" {
		cfg.Site = c.Site
	}
	q, err = srv.Open(ctx, c.DB, cfg)
	if err != nil {
		_ = srv.Client.Close()
		return nil, nil, c.openError(err)
	}
	if err := c.checkDesign(ctx, q, cfg.Logger); err != nil {
		_ = srv.Client.Close()
		return nil, nil, err
	}
	return q, srv.Client.Close, nil
}

// openError explains why the queue database could not be opened.
func (c *Conn) openError(err error) error {
	if kivik.HTTPStatus(err) == http.StatusNotFound && !IsNetError(err) {
		return fmt.Errorf("database %s does not exist on %s: run 'couchq init' first (%w)", c.DB, c.URL, err)
	}
	return ServerError(c.URL, err)
}

// sweepSchema is the first schema with the sweep design document
// (_design/couchq-sweep), whose views most commands read.
const sweepSchema = 3

// checkDesign makes sure the database has couchq's design document: every
// command reads its views or relies on its validation, and a database
// nobody ran couchq init on gets that advice, not "missing". Design
// documents of an older couchq are said too: a view they lack would
// otherwise fail a command with CouchDB's bare "missing".
func (c *Conn) checkDesign(ctx context.Context, q *protocol.Client, log zerolog.Logger) error {
	have, err := designdocs.Stored(ctx, q.DB())
	if err != nil {
		return ServerError(c.URL, err)
	}
	if have == nil {
		return fmt.Errorf("database %s on %s has no couchq design document (%s): run `couchq init` as an admin", c.DB, c.URL, designdocs.ID)
	}
	if have.Couchq.Schema < sweepSchema {
		// Without the sweep design document most commands fail.
		return fmt.Errorf("database %s on %s has the design documents of an older couchq (schema %d; this couchq needs %d): run `couchq init` as an admin",
			c.DB, c.URL, have.Couchq.Schema, designdocs.SchemaVersion)
	}
	if missing, err := missingDesignDocs(ctx, q.DB(), designdocs.SweepID, designdocs.OpsID); err != nil {
		return ServerError(c.URL, err)
	} else if len(missing) > 0 {
		// Deleted by hand, say from Fauxton: the views they hold would
		// fail with CouchDB's bare "deleted".
		return fmt.Errorf("database %s on %s lacks couchq's design document %s (deleted?): run `couchq init` as an admin to install it again",
			c.DB, c.URL, strings.Join(missing, " and "))
	}
	if have.Couchq.Schema < designdocs.SchemaVersion {
		log.Warn().Int("stored_schema", have.Couchq.Schema).Int("our_schema", designdocs.SchemaVersion).
			Msg("the database's design documents are an older couchq's: a command that reads a view they lack fails until `couchq init` runs as an admin")
	}
	return nil
}
