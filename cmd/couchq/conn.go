package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"

	"github.com/go-kivik/kivik/v4"
	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/protocol"
)

// defaultURL is the server used when neither --url nor $COUCHDB_URL is set.
const defaultURL = "http://127.0.0.1:5984"

// connUsage documents the flags every command shares.
const connUsage = `	--url URL         CouchDB server (default $COUCHDB_URL, else ` + defaultURL + `);
	                  repeat it (or give a comma-separated list) for a
	                  cluster's nodes: requests fail over to the next
	                  node when one cannot be reached. https:// works;
	                  see --ca-file for a private CA
	--user NAME       CouchDB user (default $COUCHDB_USER, else the URL's)
	--password-file F read the password from file F (default
	                  $COUCHDB_PASSWORD_FILE, else $COUCHDB_PASSWORD, else
	                  the URL's). A password in --url is visible to every
	                  user of this machine in ps: prefer the file or the
	                  environment
	--ca-file F       trust the CA certificates in PEM file F (as well as
	                  the system's) for https:// URLs
	--db NAME         database (default $COUCHQ_DB, else ` + protocol.DBDefault + `)
	--json            machine-readable JSON on stdout
	--log-level LVL   debug, info, warn, error or disabled (default warn)
`

// connFlags are the connection and output flags every command takes.
type connFlags struct {
	url          string
	db           string
	json         bool
	logLevel     string
	user         string
	passwordFile string
	caFile       string

	// password is the password from --password-file or the environment
	// (empty: the URL's, if any). Never printed.
	password string
	// fixedPassword is a password settled before resolve (a worker config
	// file's password_env); it wins over $COUCHDB_PASSWORD.
	fixedPassword string

	// rawURL is the URL with any credentials: for Dial only, never printed.
	rawURL string
	level  zerolog.Level
}

// newFlagSet returns a flag set for a command that prints usage (the
// command's text; flag's own listing would show defaults taken from the
// environment, credentials included) to stderr on -h, and leaves reporting
// parse errors to Main.exit so they are one line.
func (m *Main) newFlagSet(name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet("couchq "+name, flag.ContinueOnError)
	fs.SetOutput(m.Stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), commandUsage(usage)) }
	return fs
}

// commandUsage is a command's help: its own text, then the shared flags.
func commandUsage(usage string) string {
	return usage + "\nConnection flags:\n\n" + connUsage
}

// addConnFlags registers the shared flags on fs. Their defaults are
// resolved after parsing (resolve), not shown as flag defaults, because
// $COUCHDB_URL may carry a password.
func addConnFlags(fs *flag.FlagSet) *connFlags {
	c := &connFlags{}
	// Repeatable: each --url adds nodes of the same cluster (as a comma list does).
	fs.Func("url", "CouchDB server URL", func(v string) error {
		if c.url != "" {
			c.url += ","
		}
		c.url += v
		return nil
	})
	fs.StringVar(&c.db, "db", "", "database name")
	fs.StringVar(&c.user, "user", "", "CouchDB user")
	fs.StringVar(&c.passwordFile, "password-file", "", "file holding the CouchDB password")
	fs.StringVar(&c.caFile, "ca-file", "", "PEM file of CA certificates to trust")
	fs.BoolVar(&c.json, "json", false, "JSON output")
	fs.StringVar(&c.logLevel, "log-level", "warn", "log level")
	return c
}

// parseArgs parses args into fs, allowing flags after positional arguments
// (couchq show ID --json), and returns the positional arguments. -h
// prints the usage and returns flag.ErrHelp; other mistakes return a
// usage error.
func (m *Main) parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		// Parse errors are reported by Main.exit as one line; keep flag's
		// own message and usage dump out of the output.
		fs.SetOutput(io.Discard)
		err := fs.Parse(args)
		fs.SetOutput(m.Stderr)
		if errors.Is(err, flag.ErrHelp) {
			fs.Usage()
			return nil, flag.ErrHelp
		}
		if err != nil {
			return nil, &usageError{err: err}
		}
		rest := fs.Args()
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), nil
		}
		if len(rest) == 0 {
			return positional, nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// resolve fills in the defaults from the environment and validates the
// shared flags.
func (c *connFlags) resolve(m *Main) error {
	if err := c.resolveURL(m); err != nil {
		return err
	}
	if err := c.resolveCredentials(m); err != nil {
		return err
	}
	return c.resolveOthers(m)
}

// resolveCredentials settles the user and password: flags, then the
// environment; what is still empty comes from the URL (protocol.DialHTTP).
func (c *connFlags) resolveCredentials(m *Main) error {
	if c.user == "" {
		c.user = m.Getenv("COUCHDB_USER")
	}
	file := c.passwordFile
	if file == "" {
		file = m.Getenv("COUCHDB_PASSWORD_FILE")
	}
	if file == "" {
		c.password = m.Getenv("COUCHDB_PASSWORD")
		if c.fixedPassword != "" {
			c.password = c.fixedPassword
		}
		return nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return usageErrorf("reading the password file: %v", err)
	}
	// The file's last line break is not part of the password (echo adds one).
	c.password = strings.TrimRight(string(b), "\r\n")
	if c.password == "" {
		return usageErrorf("the password file %s is empty", file)
	}
	m.addSecret(c.password)
	if c.user == "" && !urlHasUser(c.rawURL) {
		return usageErrorf("a password file needs a user: --user NAME or $COUCHDB_USER")
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

// resolveURL settles the server URL: --url, else $COUCHDB_URL, else the default.
func (c *connFlags) resolveURL(m *Main) error {
	c.rawURL = c.url
	if c.rawURL == "" {
		c.rawURL = m.Getenv("COUCHDB_URL")
	}
	if c.rawURL == "" {
		c.rawURL = defaultURL
	}
	nodes := protocol.SplitNodeURLs(c.rawURL)
	redacted := make([]string, len(nodes))
	for i, n := range nodes {
		redacted[i] = protocol.Redact(n)
	}
	c.url = strings.Join(redacted, ",")
	if len(nodes) == 0 {
		return usageErrorf("invalid --url %q: want http(s)://[user:password@]host:port", c.url)
	}
	for i, n := range nodes {
		u, err := url.Parse(n)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return usageErrorf("invalid --url %q: want http(s)://[user:password@]host:port", redacted[i])
		}
	}
	return nil
}

// httpClient is the HTTP client for the server: for a list of nodes, one
// that fails over between them and says so in log (once a minute a node).
func (m *Main) httpClient(c *connFlags, log zerolog.Logger) (*http.Client, error) {
	hc := protocol.NewHTTPClient()
	if c.caFile != "" {
		pool, err := loadCAFile(c.caFile)
		if err != nil {
			return nil, &usageError{err: err}
		}
		tr := hc.Transport.(*http.Transport)
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	nodes := protocol.SplitNodeURLs(c.rawURL)
	if len(nodes) > 1 {
		f, err := protocol.NewFailover(hc.Transport, nodes, log)
		if err != nil {
			return nil, &usageError{err: err}
		}
		hc.Transport = f
	}
	return hc, nil
}

// loadCAFile is the system's CA pool plus the certificates in a PEM file.
func loadCAFile(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading --ca-file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--ca-file %s holds no PEM certificate", file)
	}
	return pool, nil
}

// resolveOthers settles the flags other than --url.
func (c *connFlags) resolveOthers(m *Main) error {
	if c.db == "" {
		c.db = m.Getenv("COUCHQ_DB")
	}
	if c.db == "" {
		c.db = protocol.DBDefault
	}
	if !validDBName(c.db) {
		return usageErrorf("invalid --db %q: a database name starts with a lowercase letter and has only a-z, 0-9 and _$()+-/", c.db)
	}
	level, err := zerolog.ParseLevel(strings.ToLower(c.logLevel))
	if err != nil || c.logLevel == "" {
		return usageErrorf("invalid --log-level %q: want debug, info, warn, error or disabled", c.logLevel)
	}
	c.level = level
	return nil
}

var dbNameRE = regexp.MustCompile(`^[a-z][a-z0-9_$()+/-]*$`)

// validDBName applies CouchDB's rule for database names, so a typo is a
// usage error here rather than a 400 from the server.
func validDBName(name string) bool { return dbNameRE.MatchString(name) }

// dial connects to the server (no request is made yet).
func (m *Main) dial(c *connFlags, log zerolog.Logger) (*kivik.Client, error) {
	hc, err := m.httpClient(c, log)
	if err != nil {
		return nil, err
	}
	client, err := protocol.DialHTTP(c.rawURL, c.user, c.password, hc)
	if err != nil {
		return nil, &usageError{err: err}
	}
	return client, nil
}

// connect settles the connection flags, sets the command's log level and
// opens the queue: what every command that works on jobs starts with.
func (m *Main) connect(ctx context.Context, c *connFlags, log zerolog.Logger) (*protocol.Client, zerolog.Logger, func(), error) {
	if err := c.resolve(m); err != nil {
		return nil, log, nil, err
	}
	log = log.Level(c.level)
	q, closeQueue, err := m.openQueue(ctx, c, log)
	return q, log, closeQueue, err
}

// openQueue connects to the server and the queue database, which must
// exist (couchq init creates it). close releases the connection.
func (m *Main) openQueue(ctx context.Context, c *connFlags, log zerolog.Logger) (q *protocol.Client, close func(), err error) {
	client, err := m.dial(c, log)
	if err != nil {
		return nil, nil, err
	}
	// ReadYourWrites: a command that lists jobs right after one that wrote
	// them sees the writes on a cluster, through any node.
	q, err = protocol.New(ctx, client.DB(c.db), protocol.Config{Logger: log, Actor: "cli", Now: m.Now, ReadYourWrites: true})
	if err != nil {
		_ = client.Close()
		if kivik.HTTPStatus(err) == http.StatusNotFound && !isNetError(err) {
			return nil, nil, fmt.Errorf("database %s does not exist on %s: run 'couchq init' first (%w)", c.db, c.url, err)
		}
		return nil, nil, serverError(c.url, err)
	}
	// Every command reads couchq's views or relies on its validation: a
	// database nobody ran couchq init on gets that advice, not "missing".
	if ok, err := designdocs.Exists(ctx, q.DB()); err != nil || !ok {
		_ = client.Close()
		if err != nil {
			return nil, nil, serverError(c.url, err)
		}
		return nil, nil, fmt.Errorf("database %s on %s has no couchq design document (%s): run `couchq init` as an admin", c.db, c.url, designdocs.ID)
	}
	return q, func() { _ = client.Close() }, nil
}

// serverError adds where the server is to errors that mean it could not be
// reached at all.
func serverError(where string, err error) error {
	if isNetError(err) && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("cannot reach CouchDB at %s (is it running? set --url or COUCHDB_URL): %w", where, err)
	}
	return err
}

// isNetError reports whether err is a transport failure rather than an
// answer from the server (kivik reports those as HTTP 502).
func isNetError(err error) bool {
	var ue *url.Error
	var ne net.Error
	return errors.As(err, &ue) || errors.As(err, &ne)
}

// statusCoder is how kivik errors carry the server's HTTP status.
type statusCoder interface{ HTTPStatus() int }

// describeError renders a failure for the one-line message: interrupted
// runs say so, and answers from the server end with their HTTP status.
func describeError(err error) string {
	if errors.Is(err, context.Canceled) {
		return "interrupted"
	}
	msg := err.Error()
	var sc statusCoder
	if errors.As(err, &sc) && !isNetError(err) {
		if status := sc.HTTPStatus(); status != 0 {
			msg += fmt.Sprintf(" (HTTP %d %s)", status, http.StatusText(status))
		}
	}
	return msg
}

// newLogger returns the run's logger: readable lines for a person at a
// terminal, JSON for anything else. Commands set the level from --log-level.
func newLogger(w io.Writer, terminal bool) zerolog.Logger {
	out := w
	if terminal {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05"}
	}
	return zerolog.New(out).Level(zerolog.WarnLevel).With().Timestamp().Logger()
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// secretsIn collects the passwords this run might know: the one in
// $COUCHDB_PASSWORD and the ones in any URL on the command line or in
// $COUCHDB_URL.
func secretsIn(args []string, getenv func(string) string) []string {
	var secrets []string
	add := func(s string) {
		if s != "" {
			secrets = append(secrets, s)
		}
	}
	add(getenv("COUCHDB_PASSWORD"))
	var words []string
	for _, s := range append([]string{getenv("COUCHDB_URL")}, args...) {
		// A --url may list several nodes, each with its credentials.
		words = append(words, strings.Split(s, ",")...)
	}
	for _, s := range words {
		// The user information of anything URL-shaped, as typed (maybe
		// percent-encoded) and decoded; parsing is not required, so that a
		// URL too broken to parse is covered as well.
		i, j := strings.Index(s, "://"), strings.LastIndex(s, "@")
		if i < 0 || j < i {
			continue
		}
		userinfo := s[i+3 : j]
		_, password, ok := strings.Cut(userinfo, ":")
		if !ok {
			continue // a user name alone is not secret
		}
		add(password)
		if p, err := url.PathUnescape(password); err == nil && p != password {
			add(p)
		}
	}
	return secrets
}

// scrubWriter replaces known secrets in everything written through it.
// Each write is one log line or message, so a secret is never split.
// Writes are serialized: the logger writes from every goroutine of a
// worker, and the writer underneath (a test's buffer, a pipe) need not be
// safe for concurrent use.
type scrubWriter struct {
	mu      sync.Mutex
	w       io.Writer
	secrets []string
}

// add makes s scrub one more secret from now on.
func (s *scrubWriter) add(secret string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.secrets = append(s.secrets, secret)
}

// addSecret keeps a secret learnt after the run began (a password file's)
// out of everything written to stderr.
func (m *Main) addSecret(secret string) {
	if sw, ok := m.Stderr.(*scrubWriter); ok {
		sw.add(secret)
	}
}

func (s *scrubWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := string(p)
	for _, secret := range s.secrets {
		out = strings.ReplaceAll(out, secret, "***")
	}
	if _, err := io.WriteString(s.w, out); err != nil {
		return 0, err
	}
	return len(p), nil
}
