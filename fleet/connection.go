package fleet

import (
	"context"
	"os"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
)

// Connection says how to reach a couchq queue: the CouchDB server, the
// credentials and the database. It is used as it is: Load and
// ConnectionFromEnv are what read the environment.
type Connection struct {
	// URL is the CouchDB server, http(s)://[user:password@]host:port, or a
	// comma-separated list of a cluster's nodes: requests then fail over
	// to the next node when one cannot be reached (the first URL's
	// credentials apply to all). Default http://127.0.0.1:5984.
	URL string
	// User is the CouchDB user; default the URL's.
	User string
	// Password is the user's password; default the URL's.
	Password string
	// PasswordFile names a file holding the password (its last line break
	// is dropped), which wins over Password. It needs a User, here or in
	// the URL.
	PasswordFile string
	// CAFile names a PEM file of CA certificates trusted, as well as the
	// system's, for https:// URLs.
	CAFile string
	// DB is the queue's database; default "couchq".
	DB string
	// Site is the site the fleet works for, in a queue of several sites
	// linked by replication: its workers claim only the site's jobs. Empty
	// in a single database.
	Site string
}

// ConnectionFromEnv is the connection the environment describes, as the
// couchq command reads it when no flag is given: $COUCHDB_URL,
// $COUCHDB_USER, $COUCHDB_PASSWORD_FILE, $COUCHDB_PASSWORD, $COUCHQ_DB and $COUCHQ_SITE.
func ConnectionFromEnv() Connection {
	return Connection{
		URL: os.Getenv("COUCHDB_URL"), User: os.Getenv("COUCHDB_USER"), Password: os.Getenv("COUCHDB_PASSWORD"),
		PasswordFile: os.Getenv("COUCHDB_PASSWORD_FILE"), DB: os.Getenv("COUCHQ_DB"), Site: os.Getenv("COUCHQ_SITE"),
	}
}

// Open connects to the server and opens the queue database, which must
// exist with couchq's design documents (couchq init, or a Run, creates
// them). The client is what worker.New runs on, and what enqueues; close
// releases the connection once the client is no longer used.
func (c Connection) Open(ctx context.Context, log zerolog.Logger) (q *couchq.Client, close func() error, err error) {
	conn, err := c.resolve()
	if err != nil {
		return nil, nil, err
	}
	pq, close, err := conn.Open(ctx, protocol.Config{Logger: log})
	return (*couchq.Client)(pq), close, err
}

// String describes c for messages and logs without its secrets: the URL
// with any password in it redacted, and the database.
func (c Connection) String() string {
	conn := c.conn()
	_ = conn.Resolve(noEnv, nil) // as far as it goes: a mistake shows as given, redacted
	return conn.URL + " database " + conn.DB
}

// resolve is c with its defaults, checked and ready to dial.
func (c Connection) resolve() (*cli.Conn, error) {
	conn := c.conn()
	if err := conn.Resolve(noEnv, nil); err != nil {
		return nil, plain(err)
	}
	return conn, nil
}

// conn is c as the couchq command holds its connection settings.
func (c Connection) conn() *cli.Conn {
	return &cli.Conn{URL: c.URL, User: c.User, Password: c.Password, PasswordFile: c.PasswordFile, CAFile: c.CAFile, DB: c.DB, Site: c.Site}
}

// connectionOf is the Connection of a command's settings, unresolved.
func connectionOf(conn *cli.Conn) Connection {
	pw := conn.Password
	if conn.FixedPassword != "" {
		pw = conn.FixedPassword
	}
	return Connection{URL: conn.URL, User: conn.User, Password: pw, PasswordFile: conn.PasswordFile, CAFile: conn.CAFile, DB: conn.DB, Site: conn.Site}
}

// noEnv is an empty environment: a Connection is used as it is.
func noEnv(string) string { return "" }
