package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
)

// connUsage documents the flags every command shares.
const connUsage = `	--url URL         CouchDB server (default $COUCHDB_URL, else ` + cli.DefaultURL + `);
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
	--site NAME       the site this command works for, in a queue of
	                  several sites (couchq sites): a worker claims only
	                  its jobs, and what it enqueues is its own (default
	                  $COUCHQ_SITE)
	--json            machine-readable JSON on stdout
	--log-level LVL   debug, info, warn, error or disabled (default warn)
`

// connFlags are the connection and output flags every command takes.
type connFlags struct {
	cli.Conn
	json     bool
	logLevel string
	level    zerolog.Level
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
		if c.URL != "" {
			c.URL += ","
		}
		c.URL += v
		return nil
	})
	fs.StringVar(&c.DB, "db", "", "database name")
	fs.StringVar(&c.Site, "site", "", "the site this command works for")
	fs.StringVar(&c.User, "user", "", "CouchDB user")
	fs.StringVar(&c.PasswordFile, "password-file", "", "file holding the CouchDB password")
	fs.StringVar(&c.CAFile, "ca-file", "", "PEM file of CA certificates to trust")
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
			return nil, &cli.UsageError{Err: flagValueError(fs, err)}
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

// badFlagValue matches the flag package's error for a value its type
// cannot parse, which says only "parse error".
var badFlagValue = regexp.MustCompile(`^invalid value "(.*)" for flag -(\S+): parse error$`)

// flagValueError says what a flag of fs wants, where the flag package's
// error says only that its value did not parse.
func flagValueError(fs *flag.FlagSet, err error) error {
	m := badFlagValue.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	f := fs.Lookup(m[2])
	if f == nil {
		return err
	}
	getter, ok := f.Value.(flag.Getter)
	if !ok {
		return err
	}
	switch getter.Get().(type) {
	case time.Duration:
		return fmt.Errorf("invalid --%s %q: want a duration such as 90s, 10m or 2h", m[2], m[1])
	case int, int64, uint, uint64:
		return fmt.Errorf("invalid --%s %q: want a whole number", m[2], m[1])
	case float64:
		return fmt.Errorf("invalid --%s %q: want a number", m[2], m[1])
	case bool:
		return fmt.Errorf("invalid --%s %q: want true or false", m[2], m[1])
	}
	return err
}

// resolve fills in the defaults from the environment and validates the
// shared flags.
func (c *connFlags) resolve(m *Main) error {
	if err := c.Resolve(m.Getenv, m.addSecret); err != nil {
		return err
	}
	return c.resolveLevel()
}

// resolveLevel settles --log-level.
func (c *connFlags) resolveLevel() error {
	level, err := zerolog.ParseLevel(strings.ToLower(c.logLevel))
	if err != nil || c.logLevel == "" {
		return cli.Usagef("invalid --log-level %q: want debug, info, warn, error or disabled", c.logLevel)
	}
	c.level = level
	return nil
}

// connect settles the connection flags, sets the command's log level and
// opens the queue: what every command that works on jobs starts with.
func (m *Main) connect(ctx context.Context, c *connFlags, log zerolog.Logger) (*protocol.Client, zerolog.Logger, func() error, error) {
	if err := c.resolve(m); err != nil {
		return nil, log, nil, err
	}
	log = log.Level(c.level)
	q, closeQueue, err := c.OpenQueue(ctx, log, m.Now)
	return q, log, closeQueue, err
}

// output is where and how the command writes.
func (m *Main) output(c *connFlags) cli.Output {
	return cli.Output{Stdout: m.Stdout, Stderr: m.Stderr, Terminal: m.stderrTTY, JSON: c.json}
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
