// Package protocol is couchq's domain and claim protocol: WorkItem documents,
// enqueueing, listing due work, and claiming and finishing jobs safely on a
// single CouchDB node or a cluster.
//
// A claim is a PUT of the job with claimed=true and the _rev that was read.
// On one node CouchDB answers 409 to every other claimant. On a cluster two
// claims carrying the same _rev can both be stored by different copies and
// become a stored conflict a moment later, so every write is made with w =
// a majority and only CouchDB's 201 commits it, and a committed claim reads
// the job's whole revision tree before it runs (see cluster.go).
package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/go-kivik/kivik/v4/couchdb" // the CouchDB driver, registered as "couch"
	"github.com/go-kivik/kivik/v4/couchdb/chttp"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/designdocs"
)

// Defaults for Config.
const (
	// MaxAttemptsDefault is how many times a job runs before it stays failed.
	MaxAttemptsDefault = 25
	// HistoryLimitDefault bounds a job's activity log.
	HistoryLimitDefault = 50
	// DBDefault is the database name when none is configured.
	DBDefault = "couchq"
	// WriteLingerDefault is how long a lone write of a held job waits for
	// others to join it (see Config.WriteLinger).
	WriteLingerDefault = time.Millisecond
)

// Config configures a Client.
type Config struct {
	// Logger receives the protocol's warnings (skipped malformed documents,
	// conflict clean-up). The zero value discards them.
	Logger zerolog.Logger
	// Actor names who makes the writes in the activity log when a call does
	// not name a claimant (enqueue, operator commands); default "cli".
	Actor string
	// MaxAttempts applies to jobs without their own max_attempts.
	MaxAttempts int
	// EnqueueMaxAttempts, when above 0, is stored as max_attempts in the
	// jobs this client enqueues without their own: a producer's choice
	// (couchq.Config.MaxAttempts), which the workers that run them,
	// whatever their own default, then keep.
	EnqueueMaxAttempts int
	// HistoryLimit bounds each job's history; the oldest entries go first,
	// but the first "enqueued" entry is kept.
	HistoryLimit int
	// Replicas overrides the replica count n read from the server. Leave 0.
	Replicas int
	// AlwaysConfirm makes claims do the cluster's confirming read, and the
	// sweeper check for conflicting revisions, even on a single node (n = 1),
	// where a 409 already settles every race. Tests use it to prove the
	// cluster path against one server.
	AlwaysConfirm bool
	// ReadYourWrites makes every write on a cluster wait for all n copies
	// (w = n) rather than a majority, so that a view read right after,
	// through any node, sees it: CouchDB serves each view from one copy of
	// each shard, whichever answers first. The CLI sets it for its commands
	// (couchq retry --failed, then couchq ls). A write that reaches fewer
	// copies (a node down) is answered 202 and read back as usual. Workers
	// leave it off: a majority is what their protocol needs, and faster.
	ReadYourWrites bool
	// WriteLinger is how long a write of a held job (an outcome, a lease
	// renewal, a sweep's) that finds no request of the client's in flight
	// waits for others to go with it in one _bulk_docs; those that come
	// while a request is in flight go in the next one anyway. Jobs that end
	// together, as a claim round's short jobs do, then cost the server one
	// request instead of two: Apache CouchDB spends several milliseconds of
	// CPU on every write request, whatever its size (README, Performance).
	// Negative: the first write goes at once.
	WriteLinger time.Duration
	// Now is the clock; default time.Now. Tests and metrics scripts set it.
	Now func() time.Time
	// Site is the site this client's workers run for, in a database of
	// several sites linked by replication (sites.go): they claim only the
	// jobs it owns. Empty in a database without sites.
	Site string
	// BeforeEnqueue hooks run, in order, on every job this client
	// enqueues (Enqueue, EnqueueMany, unique and periodic jobs) before it
	// is checked and stored: they may set its fields (Extra, Trace). An
	// error refuses the job.
	BeforeEnqueue []func(ctx context.Context, job *NewJob) error
}

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.Actor == "" {
		c.Actor = "cli"
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = MaxAttemptsDefault
	}
	if c.HistoryLimit <= 0 {
		c.HistoryLimit = HistoryLimitDefault
	}
	if c.WriteLinger == 0 {
		c.WriteLinger = WriteLingerDefault
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Client runs the queue protocol against one database.
type Client struct {
	db  *kivik.DB
	cfg Config
	log zerolog.Logger
	// n is the database's replica count: when n > 1, writes wait for a
	// majority and claims are confirmed by reading from one (cluster.go).
	n int
	// couch, set on Apache CouchDB 2 or later (Server.Open), makes the
	// requests kivik has no call for: _changes with a native _selector
	// filter (otherwise the design document's filter), and the leaves of
	// many jobs in one _bulk_get (otherwise a read each).
	couch *chttp.Client
	// batcher coalesces concurrent writes of held jobs into _bulk_docs.
	batcher writeBatcher
	// singleQueries is set once the server turned down a multi-range view
	// request (.../queries; PouchDB Server): DueFirst then asks range by
	// range.
	singleQueries atomic.Bool
	// fullViews holds, per view (*atomic.Int64 by name), when a query of
	// it last asked every shard copy (Unix ns; see view). Per view: the
	// sweeper's lease queries, every SweepInterval, took every turn of a
	// single shared clock, so the due view was read from the stable
	// copies only, and a job those lacked stayed unseen for minutes.
	fullViews sync.Map
	// membershipDenied warns once that the user cannot read _membership.
	membershipDenied sync.Once
	// sites is what the client last read of the sites document (sites.go).
	sites atomic.Pointer[siteState]
	// warnedNoSites is set once the client has warned that it stored jobs
	// for a site in a database without sites (checkSites).
	warnedNoSites atomic.Bool
	// flow is what the client knows of the database's waiting jobs (flow.go).
	flow flowState
	// warnedSchedules holds the names of periodic schedules the client
	// has warned are run with another schedule elsewhere (TickPeriodic).
	warnedSchedules sync.Map
}

// New returns a Client for db. It asks the server for the database's
// replica count (cluster.n); a server that reports none has one replica.
func New(ctx context.Context, db *kivik.DB, cfg Config) (*Client, error) {
	cfg = cfg.WithDefaults()
	c := &Client{db: db, cfg: cfg, log: cfg.Logger, n: cfg.Replicas}
	if c.n <= 0 {
		stats, err := db.Stats(ctx)
		if err != nil {
			return nil, fmt.Errorf("reading database %s info: %w", db.Name(), err)
		}
		c.n = 1
		if stats.Cluster != nil && stats.Cluster.Replicas > 0 {
			c.n = stats.Cluster.Replicas
		}
	}
	if cfg.Site != "" && !ValidSiteName(cfg.Site) {
		return nil, fmt.Errorf("site name %q: want %s", cfg.Site, SiteNameRule)
	}
	if cfg.Site != "" {
		// Which jobs are the site's. A client without a site learns of
		// sites when it asks (RefreshSites; workers do at start and every
		// heartbeat).
		if err := c.RefreshSites(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// DB is the database the client works on.
func (c *Client) DB() *kivik.DB { return c.db }

// Replicas is the replica count n the protocol writes and reads with.
func (c *Client) Replicas() int { return c.n }

// Config returns the client's configuration with defaults applied.
func (c *Client) Config() Config { return c.cfg }

func (c *Client) now() time.Time { return c.cfg.Now() }

// confirming reports whether claims need the confirming read.
//
// A site's database confirms too: replication can bring another site's
// revision of a job at any time, so a claim's 409 settles nothing there.
func (c *Client) confirming() bool { return c.n > 1 || c.cfg.AlwaysConfirm || c.cfg.Site != "" }

// Init creates the database when it does not exist and installs or upgrades
// the design document, keeping the stored document's validation choice (on
// for a new database). Safe to run from many processes at once.
//
// Unlike InitWith, Init keeps design documents of its own schema from
// another couchq build, with a warning: workers call it as they start,
// and during a rolling deploy the two builds' workers would otherwise
// replace each other's documents at every start, and CouchDB rebuild
// their indexes each time. couchq init installs this build's.
func Init(ctx context.Context, client *kivik.Client, dbName string, log zerolog.Logger) (designdocs.Outcome, error) {
	return InitWith(ctx, client, dbName, InitOptions{keepOtherBuild: true}, log)
}

// InitAtStart is what an application runs at every start (the Go API's
// Server.Init): InitWith, keeping design documents of this schema that
// another couchq build wrote, as Init does, unless opts choose a
// validation or a language, which is then installed. Without it, the
// builds of a rolling deploy (or a rollback) put back their own documents
// at every start, weaker validation included.
func InitAtStart(ctx context.Context, client *kivik.Client, dbName string, opts InitOptions, log zerolog.Logger) (designdocs.Outcome, error) {
	opts.keepOtherBuild = opts.Validation == designdocs.ValidationKept && opts.Language == designdocs.LanguageKept
	return InitWith(ctx, client, dbName, opts, log)
}

// InitOptions are what an admin chooses at couchq init.
type InitOptions struct {
	// Validation turns the database's validation on, off or to a Mango
	// selector (mango, where the server runs one), or lets Init choose
	// (auto: mango where the server runs it, unless Roles, else on); the
	// zero value keeps what the database has, on for a new one. See
	// designdocs.Validation for what each costs and guards.
	Validation designdocs.Validation
	// Roles says the database's _security has couchq's roles, or is about
	// to (couchq init --workers/--producers): only validation on enforces
	// them, so auto chooses it.
	Roles bool
	// Language picks the JavaScript engine the design documents' functions
	// run in; the zero value keeps the stored documents' choice, and for a
	// new database (or one from before the choice existed) takes the
	// fastest the server has: QuickJS on Apache CouchDB 3.4 and later.
	Language designdocs.Language
	// Shards is the number of shards (CouchDB's q) of a database Init
	// creates; a database that exists keeps its own, which CouchDB fixes
	// when it creates one. The zero value is couchq's choice: one shard
	// on a cluster, the server's own default (two on Apache CouchDB 3) on
	// a single node. On a cluster every shard has a copy on each of n
	// nodes and a request pays for every copy of every shard it touches:
	// with one shard a job cost a 3-node cluster a fifth less server CPU,
	// and bulk enqueues went faster too. On a single node two shards let
	// a bulk enqueue be validated on two cores at once, about 1.6 times
	// as fast as one.
	Shards int

	// keepOtherBuild keeps stored design documents of this schema that
	// another couchq build wrote (see Init).
	keepOtherBuild bool
}

// createDB creates the queue database with shards shards, or couchq's
// choice for zero (see InitOptions.Shards). Another process creating it
// at the same time is no error.
func createDB(ctx context.Context, client *kivik.Client, dbName string, shards int) error {
	if shards < 0 {
		return fmt.Errorf("creating database %s: %d shards: the number of shards must be positive", dbName, shards)
	}
	if shards == 0 && onCluster(ctx, client) {
		shards = 1
	}
	var opts []kivik.Option
	if shards > 0 {
		opts = append(opts, kivik.Param("q", shards))
	}
	if err := client.CreateDB(ctx, dbName, opts...); err != nil && kivik.HTTPStatus(err) != http.StatusPreconditionFailed {
		if s := kivik.HTTPStatus(err); s == http.StatusUnauthorized || s == http.StatusForbidden {
			return fmt.Errorf("%w: database %s does not exist, and only an admin may create it: %w", designdocs.ErrNeedsAdmin, dbName, err)
		}
		return fmt.Errorf("creating database %s: %w", dbName, err)
	}
	return nil
}

// checkShards refuses shards for a database that exists with another
// number of them: CouchDB fixes a database's shards when it is created, so
// asking for others would be silently ignored. A server that does not say
// (PouchDB Server has no shards) is not refused.
func checkShards(ctx context.Context, client *kivik.Client, dbName string, shards int) error {
	info, err := client.DB(dbName).Stats(ctx)
	if err != nil {
		return fmt.Errorf("reading database %s's shards: %w", dbName, err)
	}
	if info.Cluster == nil || info.Cluster.Shards == 0 || info.Cluster.Shards == shards {
		return nil
	}
	return fmt.Errorf("database %s exists with %d shards, and CouchDB fixes a database's shards when it is created: "+
		"leave out the shards to keep its %d, or make a new database with %d", dbName, info.Cluster.Shards, info.Cluster.Shards, shards)
}

// onCluster reports whether the server is a cluster of several nodes
// (GET /_membership). A server that does not say, as PouchDB Server does
// not, is one node.
func onCluster(ctx context.Context, client *kivik.Client) bool {
	m, err := client.Membership(ctx)
	return err == nil && len(m.ClusterNodes) > 1
}

// InitWith is Init with options.
func InitWith(ctx context.Context, client *kivik.Client, dbName string, opts InitOptions, log zerolog.Logger) (designdocs.Outcome, error) {
	exists, err := client.DBExists(ctx, dbName)
	if err != nil {
		return "", fmt.Errorf("checking database %s: %w", dbName, err)
	}
	if exists && opts.Shards > 0 {
		if err := checkShards(ctx, client, dbName, opts.Shards); err != nil {
			return "", err
		}
	}
	if !exists && opts.Validation == designdocs.ValidationMango {
		// Asked before the database is made, so that a server without
		// Mango validation is left without a database init then refuses.
		if err := mangoValidation(ctx, client); err != nil {
			return "", err
		}
	}
	if !exists {
		if err := createDB(ctx, client, dbName, opts.Shards); err != nil {
			return "", err
		}
	}
	docs, err := designdocs.Defaults()
	if err != nil {
		return "", err
	}
	db := client.DB(dbName)
	lang := opts.Language
	if lang == designdocs.LanguageKept {
		if lang, err = keptLanguage(ctx, client, db); err != nil {
			return "", err
		}
	}
	for i, d := range docs {
		docs[i] = d.WithLanguage(lang)
	}
	validation, err := chooseValidation(ctx, client, db, opts, log)
	if err != nil {
		return "", err
	}
	if validation == designdocs.ValidationMango {
		// The selector first, so that no write finds the database with
		// neither it nor the function.
		v, err := designdocs.DefaultValidate()
		if err != nil {
			return "", err
		}
		if _, err := install(ctx, db, v, designdocs.ValidationKept, opts, log); err != nil {
			if kivik.HTTPStatus(err) == http.StatusBadRequest {
				// The database chose mango on another server: a site's,
				// whose design documents replicated here.
				return "", fmt.Errorf("%w: %s validates with a Mango selector (validation mango, chosen where its design documents were first installed), and this server refuses the selector's design document; run couchq init --validation on here and at every site it is linked to: %w",
					designdocs.ErrNoMangoValidation, dbName, err)
			}
			return "", err
		}
	}
	outcome, err := install(ctx, db, docs[0], validation, opts, log)
	if err != nil {
		return "", err
	}
	if validation != designdocs.ValidationMango && outcome != designdocs.KeptNewer && outcome != designdocs.KeptStored {
		if err := designdocs.Remove(ctx, db, designdocs.ValidateID, log); err != nil {
			return "", err
		}
	}
	for _, d := range docs[1:] {
		o, err := install(ctx, db, d, designdocs.ValidationKept, opts, log)
		if err != nil {
			return "", err
		}
		// One outcome for all: the claim document's, unless only another
		// document's content changed. Another's creation beside an
		// unchanged claim document is not reported: concurrent installers
		// of a new database race for it, and exactly one of them reports
		// "created".
		if outcome == designdocs.Unchanged && o == designdocs.Upgraded {
			outcome = designdocs.Upgraded
		}
	}
	return outcome, nil
}

// install is designdocs.Install, but for a document of want's schema from
// another couchq build when opts.keepOtherBuild: that is kept as it is.
func install(ctx context.Context, db *kivik.DB, want *designdocs.Doc, validation designdocs.Validation, opts InitOptions, log zerolog.Logger) (designdocs.Outcome, error) {
	if opts.keepOtherBuild {
		have, err := storedDoc(ctx, db, want.ID)
		if err != nil {
			return "", err
		}
		// Of this schema and in the language asked for: a different hash
		// is then another build's. A language switch is a choice, made.
		if have != nil && have.Couchq.Schema == want.Couchq.Schema && have.Language == want.Language {
			// Compared as Install would write it: with the stored
			// validation unless asked for another.
			v := validation
			if v == designdocs.ValidationKept && have.ValidationOf() != designdocs.ValidationOn {
				v = have.ValidationOf()
			}
			if mine := want.WithValidation(v).Couchq.Hash; have.Couchq.Hash != "" && have.Couchq.Hash != mine {
				log.Warn().Str("design_doc", want.ID).Int("schema", want.Couchq.Schema).Str("stored_hash", have.Couchq.Hash).Str("our_hash", mine).
					Msg("design document comes from another couchq build of the same schema: using it; run `couchq init` as an admin to install this version")
				return designdocs.KeptStored, nil
			}
		}
	}
	return designdocs.Install(ctx, db, want, validation, log)
}

// storedDoc reads db's design document id, nil when there is none or it
// is not one couchq can read (Install replaces that).
func storedDoc(ctx context.Context, db *kivik.DB, id string) (*designdocs.Doc, error) {
	var raw json.RawMessage
	if err := db.Get(ctx, id).ScanDoc(&raw); err != nil {
		if kivik.HTTPStatus(err) == http.StatusNotFound {
			return nil, nil
		}
		return nil, fmt.Errorf("reading design document %s: %w", id, err)
	}
	var have designdocs.Doc
	if err := json.Unmarshal(raw, &have); err != nil {
		return nil, nil
	}
	return &have, nil
}

// keptLanguage is the language db's claim design document chose (schema
// designdocs.LanguageSchema or later), else the fastest the server has.
func keptLanguage(ctx context.Context, client *kivik.Client, db *kivik.DB) (designdocs.Language, error) {
	have, err := designdocs.Stored(ctx, db)
	if err != nil {
		return "", err
	}
	if have != nil && have.Couchq.Schema >= designdocs.LanguageSchema {
		if lang, err := designdocs.ParseLanguage(have.Language); err == nil {
			return lang, nil
		}
	}
	ver, err := client.Version(ctx)
	if err != nil {
		return "", fmt.Errorf("asking the server what it is, to choose the design documents' language: %w", err)
	}
	caps := detectCaps(ver)
	return designdocs.LanguageFor(caps.Vendor, caps.Version), nil
}

// Dial connects to the CouchDB server at rawURL. Credentials may be in the
// URL or given as user and password; they are sent as basic auth and kept
// out of the URL the driver holds, so no error message can carry them.
// rawURL may list several nodes of one cluster, comma-separated: requests
// then fail over between them (see Failover; the first URL's credentials
// apply to all).
func Dial(rawURL, user, password string) (*kivik.Client, error) {
	return DialHTTP(rawURL, user, password, NewHTTPClient())
}

// DialHTTP is Dial over the given HTTP client (for TLS settings, proxies or
// instrumentation); NewHTTPClient is what Dial uses. For a list of nodes
// it fails over through a copy of hc, unless hc's transport is already a
// Failover (made with NewFailover to log through a logger).
func DialHTTP(rawURL, user, password string, hc *http.Client) (*kivik.Client, error) {
	rawURL, hc, err := couchHTTPClient(rawURL, hc, zerolog.Nop())
	if err != nil {
		return nil, err
	}
	base, user, password, err := splitCredentials(rawURL, user, password)
	if err != nil {
		return nil, err
	}
	client, err := kivik.New("couch", base, clientOptions(user, password, hc)...)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", base, err)
	}
	return client, nil
}

// idleConnsPerHost is how many idle connections to the server a client
// keeps. Go's default of two makes a worker running more jobs than that at
// once open a new TCP connection for nearly every request.
const idleConnsPerHost = 64

// NewHTTPClient returns the HTTP client couchq talks to CouchDB with: Go's
// default transport keeping enough idle connections for a busy worker.
func NewHTTPClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = idleConnsPerHost
	return &http.Client{Transport: tr}
}

// clientOptions are the kivik options every couchq client uses. Request
// bodies are sent uncompressed: they are small JSON documents, and gzip
// cost a worker about 1 MiB of allocation per job (couchq-bench).
func clientOptions(user, password string, hc *http.Client) []kivik.Option {
	return []kivik.Option{couchdb.OptionHTTPClient(hc), couchdb.OptionNoRequestCompression(), authOption(user, password)}
}

// splitCredentials takes the credentials out of rawURL; explicit ones win.
func splitCredentials(rawURL, user, password string) (base, u, p string, err error) {
	parsed, err := url.Parse(rawURL)
	if err != nil || parsed.Scheme == "" || parsed.Host == "" {
		return "", "", "", fmt.Errorf("invalid CouchDB URL %q: want http(s)://host:port", Redact(rawURL))
	}
	if parsed.User != nil {
		if user == "" {
			user = parsed.User.Username()
		}
		if pw, ok := parsed.User.Password(); ok && password == "" {
			password = pw
		}
		parsed.User = nil
	}
	return strings.TrimRight(parsed.String(), "/"), user, password, nil
}

// authOption sends basic auth when there is a user, and nothing otherwise.
func authOption(user, password string) kivik.Option {
	if user == "" {
		return kivik.Params(nil)
	}
	return couchdb.BasicAuth(user, password)
}

// DialEnv is Dial with COUCHDB_USER and COUCHDB_PASSWORD filling in the
// credentials the URL lacks.
func DialEnv(rawURL string) (*kivik.Client, error) {
	return Dial(rawURL, os.Getenv("COUCHDB_USER"), os.Getenv("COUCHDB_PASSWORD"))
}

// Redact hides the password in a URL for messages and logs.
func Redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		// Where a password would sit in a broken URL is anyone's guess.
		return "(unparseable URL)"
	}
	if _, ok := u.User.Password(); ok {
		return u.Redacted()
	}
	if u.User == nil && u.Host == "" {
		// A URL whose scheme is missing or mistyped ("user:pw@host:5984",
		// "http//user:pw@host", "http:/user:pw@host") parses without
		// credentials or host, and the password stands before an "@": hide
		// what precedes the last "@" (before any query), from after the
		// scheme and its slashes.
		start := 0
		if u.Scheme != "" {
			start = len(u.Scheme) + 1
		} else if i := strings.Index(rawURL, "//"); i >= 0 {
			start = i + 2
		}
		for start < len(rawURL) && rawURL[start] == '/' {
			start++
		}
		rest := rawURL[start:]
		if end := strings.IndexAny(rest, "?#"); end >= 0 {
			rest = rest[:end]
		}
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			return rawURL[:start] + "xxxxx" + rawURL[start+at:]
		}
	}
	return rawURL // nothing to hide: shown as given, not re-encoded
}

// currentRev is the current revision of document id (an error of status
// 404 when there is none), read from the document itself: PouchDB Server
// answers the HEAD request of kivik's GetRev with an ETag that is no
// revision, and a write with it is refused ("Invalid rev format").
func currentRev(ctx context.Context, db *kivik.DB, id string) (string, error) {
	var doc struct {
		Rev string `json:"_rev"`
	}
	if err := db.Get(ctx, id).ScanDoc(&doc); err != nil {
		return "", err
	}
	return doc.Rev, nil
}

// isStatus reports whether err carries the HTTP status code.
func isStatus(err error, code int) bool {
	return err != nil && kivik.HTTPStatus(err) == code
}

// wrapLost turns a 409 on a held claim into ErrClaimLost, keeping the cause.
func wrapLost(what, id string, err error) error {
	if isStatus(err, http.StatusConflict) || errors.Is(err, ErrClaimLost) {
		return fmt.Errorf("%s %s: %w (%w)", what, id, ErrClaimLost, err)
	}
	if missingDoc(err) {
		return fmt.Errorf("%s %s: %w (%w)", what, id, ErrNotFound, err)
	}
	return fmt.Errorf("%s %s: %w", what, id, err)
}

// missingDoc reports whether err is CouchDB's 404 for a document. A
// database that does not exist is answered 404 too, and is no job's
// absence: code that drops a job it is told is gone must not drop it for
// a mistyped or deleted database.
func missingDoc(err error) bool {
	if !isStatus(err, http.StatusNotFound) {
		return false
	}
	msg := err.Error() // Apache CouchDB's reason, and PouchDB Server's
	return !strings.Contains(msg, "Database does not exist") && !strings.Contains(msg, "no_db_file")
}

// As returns a client of the same database, with the same configuration,
// whose requests go to baseURL (the server's URL without credentials)
// through hc and carry no credentials of their own: hc's transport adds
// whoever's the requests are made as. The dashboard reads as the person
// reading this way, so that the database's _security applies to them.
// Nothing is asked of the server.
func (c *Client) As(hc *http.Client, baseURL string) (*Client, error) {
	opts := []kivik.Option{couchdb.OptionHTTPClient(hc), couchdb.OptionNoRequestCompression()}
	kc, err := kivik.New("couch", baseURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", Redact(baseURL), err)
	}
	as := &Client{db: kc.DB(c.db.Name()), cfg: c.cfg, log: c.log, n: c.n}
	if c.couch != nil {
		if as.couch, err = chttp.New(hc, baseURL, allOptions(opts)); err != nil {
			return nil, fmt.Errorf("connecting to %s: %w", Redact(baseURL), err)
		}
	}
	as.singleQueries.Store(c.singleQueries.Load())
	as.sites.Store(c.sites.Load())
	return as, nil
}
