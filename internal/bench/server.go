package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/protocol"
)

// target is the server a run measures: where it is, what it is, and the
// clients the sections use.
type target struct {
	base           string // node 1, no credentials
	user, password string
	info           ServerInfo
	// nodes are every node's URL for a cluster the bench started (the
	// queue clients fail over between them), else the server's URL alone.
	nodes []string
	// srv is what protocol.Connect returned; queue clients come from queue.
	srv *protocol.Server
	// queue opens the couchq clients the sections measure: srv itself, or
	// a copy whose kivik client counts requests (see Config.Instrument).
	queue *protocol.Server
	kivik *kivik.Client // queue's kivik client when instrumented, to close
	// raw is for the ceiling section and housekeeping: plain net/http with
	// enough idle connections for every ceiling writer, so the ceiling is
	// the server's and not the client's.
	raw   *http.Client
	stats *httpStats
	stop  func(context.Context) error // stops a local server; nil otherwise
	// serverPIDs are the local server's processes (one per node), whose
	// CPU, with their descendants', counts as the server's; none when
	// unknown (a --url server, or no /proc).
	serverPIDs []int
	// language is the queue databases' design document language
	// (Config.Language).
	language designdocs.Language
	// queueShards is the shards and copies of the queue databases, as
	// couchq's init created the first ("q=1, n=3"); empty until then, or
	// where the server has none.
	queueShards string
}

// connect starts the planned local server, or reaches the configured one.
func connect(ctx context.Context, cfg Config, ps plannedServer, log zerolog.Logger) (*target, error) {
	t := &target{stats: &httpStats{}, info: ServerInfo{Kind: ps.kind}, language: cfg.Language}
	var err error
	switch ps.kind {
	case serverURL:
		t.user, t.password = cfg.User, cfg.Password
		t.nodes, t.info.Origin = protocol.SplitNodeURLs(cfg.URL), cfg.URLOrigin
		if len(t.nodes) == 0 {
			err = fmt.Errorf("server URL %q: no URL in it", protocol.Redact(cfg.URL))
		}
	case ServerCouchDB, ServerCluster:
		err = t.startCouchDB(ctx, ps, log)
	case ServerPouchDB:
		err = t.startPouchDB(ctx, log)
	default:
		err = fmt.Errorf("unknown server %q", ps.kind)
	}
	if err == nil {
		err = t.setup(ctx, cfg)
	}
	if err != nil {
		_ = t.close(context.WithoutCancel(ctx))
		return nil, err
	}
	return t, nil
}

// setup checks t.nodes and connects the clients: housekeeping and the
// ceiling's writers to node 1, the queue clients to every node (with
// failover when there are several).
func (t *target) setup(ctx context.Context, cfg Config) error {
	for i, raw := range t.nodes {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return fmt.Errorf("server URL %s: want http(s)://host:port", protocol.Redact(raw))
		}
		if u.User != nil {
			// As protocol.Dial: credentials in the URL fill in what is not given.
			if t.user == "" {
				t.user = u.User.Username()
			}
			if pw, ok := u.User.Password(); ok && t.password == "" {
				t.password = pw
			}
			u.User = nil
		}
		t.nodes[i] = strings.TrimRight(u.String(), "/")
		if err := checkLoopback(ctx, u.Hostname()); err != nil {
			return fmt.Errorf("server %s: %w", t.nodes[i], err)
		}
	}
	t.base = t.nodes[0]
	var err error
	t.srv, err = protocol.Connect(ctx, t.base, t.user, t.password)
	if err != nil {
		return err
	}
	t.info.URL, t.info.Vendor, t.info.Version = t.base, t.srv.Caps.Vendor, t.srv.Caps.Version
	switch {
	case len(t.nodes) > 1:
		t.info.Nodes = t.nodes
		t.info.Clients = fmt.Sprintf("queue clients: the node list with failover (protocol.Dial with %d comma-separated URLs; "+
			"every request goes to node 1 while it answers); ceiling writers and housekeeping: node 1", len(t.nodes))
	default:
		t.info.Clients = "queue clients, ceiling writers and housekeeping: " + t.base
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = max(cfg.Clients, 64)
	t.raw = &http.Client{Transport: tr}
	t.queue = t.srv
	if cfg.Instrument || len(t.nodes) > 1 {
		// couchq's own HTTP client (counted when instrumented): the workers
		// see exactly what protocol.Connect gives them, _selector feed and
		// failover included.
		hc := protocol.NewHTTPClient()
		if cfg.Instrument {
			hc = &http.Client{Transport: newCountingTransport(t.stats, cfg.ClientIdleConns)}
		}
		if t.queue, err = protocol.ConnectHTTP(ctx, t.queueURL(), t.user, t.password, hc); err != nil {
			return err
		}
		t.kivik = t.queue.Client
	}
	return nil
}

// queueURL is what the queue clients (and --procs workers) dial: the
// comma-separated node list, or the one URL.
func (t *target) queueURL() string { return strings.Join(t.nodes, ",") }

// close releases the clients and stops a local server.
func (t *target) close(ctx context.Context) error {
	var errs []error
	if t.kivik != nil {
		errs = append(errs, t.kivik.Close())
	}
	if t.srv != nil {
		errs = append(errs, t.srv.Client.Close())
	}
	if t.raw != nil {
		t.raw.CloseIdleConnections()
	}
	if t.stop != nil {
		errs = append(errs, t.stop(ctx))
	}
	return errors.Join(errs...)
}

// checkLoopback refuses servers off this machine: the bench floods its
// target with writes and creates and drops databases.
func checkLoopback(ctx context.Context, host string) error {
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsLoopback() {
			return nil
		}
		return fmt.Errorf("%s is not a loopback address; the bench only runs against this machine", host)
	}
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return fmt.Errorf("resolving %s: %w", host, err)
	}
	for _, a := range addrs {
		if !a.IP.IsLoopback() {
			return fmt.Errorf("%s resolves to %s, not a loopback address; the bench only runs against this machine", host, a.IP)
		}
	}
	if len(addrs) == 0 {
		return fmt.Errorf("%s resolves to no address", host)
	}
	return nil
}

// newDB creates a fresh database with couchq's design document, its
// validation on or off.
func (t *target) newDB(ctx context.Context, section string, validation designdocs.Validation, log zerolog.Logger) (string, error) {
	name := "couchq_bench_" + section + "_" + randomHex(4)
	if _, err := protocol.InitWith(ctx, t.srv.Client, name, protocol.InitOptions{Validation: validation, Language: t.language}, log); err != nil {
		return "", fmt.Errorf("creating database %s: %w", name, err)
	}
	if t.queueShards == "" {
		if info, err := t.srv.Client.DB(name).Stats(ctx); err == nil && info.Cluster != nil {
			t.queueShards = fmt.Sprintf("q=%d, n=%d", info.Cluster.Shards, info.Cluster.Replicas)
		}
	}
	return name, nil
}

// designLanguage is the language the queue databases' design documents
// get: the configured one, else the one protocol.Init picks for this server.
// The bench's own design documents use it too, so that they run in the
// engine couchq's do.
func (t *target) designLanguage() designdocs.Language {
	if t.language == designdocs.LanguageKept {
		return designdocs.LanguageFor(t.info.Vendor, t.info.Version)
	}
	return t.language
}

// newBareDB creates a fresh database with nothing in it.
func (t *target) newBareDB(ctx context.Context, section string) (string, error) {
	name := "couchq_bench_" + section + "_" + randomHex(4)
	if err := t.srv.Client.CreateDB(ctx, name); err != nil {
		return "", fmt.Errorf("creating database %s: %w", name, err)
	}
	return name, nil
}

// dropDB deletes a database the bench created.
func (t *target) dropDB(ctx context.Context, name string) error {
	if err := t.srv.Client.DestroyDB(ctx, name); err != nil && kivik.HTTPStatus(err) != http.StatusNotFound {
		return fmt.Errorf("dropping database %s: %w", name, err)
	}
	return nil
}

// indexing reports how many of the server's index builds (CouchDB's
// _active_tasks of type "indexer") work on db; on a cluster a build of each
// copy of each shard counts. ok is false when the server does not say (no
// _active_tasks, or not allowed to read it).
func (t *target) indexing(ctx context.Context, db string) (n int, ok bool) {
	return t.activeTasks(ctx, db, "indexer")
}

// activeTasks counts the server's _active_tasks of the given types that
// work on db; ok is false when the server does not say.
func (t *target) activeTasks(ctx context.Context, db string, types ...string) (n int, ok bool) {
	var tasks []struct {
		Type     string `json:"type"`
		Database string `json:"database"`
	}
	if t.getJSON(ctx, t.base+"/_active_tasks", &tasks) != nil {
		return 0, false
	}
	for _, task := range tasks {
		// A shard of db is "shards/<range>/<db>.<suffix>".
		if slices.Contains(types, task.Type) && (task.Database == db || strings.Contains(task.Database, "/"+db+".")) {
			n++
		}
	}
	return n, true
}

// compactionWatch samples, while a run works db, whether the server is
// compacting it (CouchDB's automatic compaction, smoosh, starts on its own
// when a database's file has grown to a multiple of its live data, which a
// queue's updates make happen within seconds), so that a run's figures can
// say how much of its time the server spent compacting too.
type compactionWatch struct {
	stop    context.CancelFunc
	done    chan struct{}
	samples int
	busy    int
	ok      bool
}

// compactionWatchEvery is how often compactionWatch asks _active_tasks.
const compactionWatchEvery = 500 * time.Millisecond

// watchCompaction starts a compactionWatch of db; stopWatch ends it.
func (t *target) watchCompaction(ctx context.Context, db string) *compactionWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &compactionWatch{stop: cancel, done: make(chan struct{}), ok: true}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(compactionWatchEvery)
		defer tick.Stop()
		for {
			n, ok := t.activeTasks(ctx, db, "database_compaction", "view_compaction")
			if ctx.Err() != nil {
				return
			}
			if !ok {
				w.ok = false
				return
			}
			w.samples++
			if n > 0 {
				w.busy++
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// stopWatch ends the watch and returns the share of samples in which the
// server was compacting db (ok false when it could not tell).
func (w *compactionWatch) stopWatch() (share float64, ok bool) {
	w.stop()
	<-w.done
	if !w.ok || w.samples == 0 {
		return 0, false
	}
	return float64(w.busy) / float64(w.samples), true
}

// open returns a queue client on db, as the workers use it.
func (t *target) open(ctx context.Context, db string) (*protocol.Client, error) {
	return t.queue.Open(ctx, db, protocol.Config{})
}

// openSite returns a queue client on db working for site, as a site's
// workers and producers use it.
func (t *target) openSite(ctx context.Context, db, site string) (*protocol.Client, error) {
	return t.queue.Open(ctx, db, protocol.Config{Site: site, Actor: "couchq-bench@" + site})
}

// treeUse is the CPU time of a process and its descendants (treeCPU).
type treeUse struct {
	// total is every live process's time plus that of the children they
	// waited for: a server's couchjs processes that ended still count.
	total time.Duration
	// js is each live couchjs process's own time, by process id.
	js map[int]time.Duration
}

// cpuUse is CPU time used so far by the bench process and the server.
type cpuUse struct {
	bench time.Duration
	// server sums the server's process trees; js is what each live
	// couchjs process in them has used, by process id.
	server       time.Duration
	js           map[int]time.Duration
	ok, serverOK bool
}

func (t *target) cpu() cpuUse {
	var u cpuUse
	var err error
	u.bench, err = processCPU(os.Getpid())
	u.ok = err == nil
	u.serverOK = len(t.serverPIDs) > 0
	u.js = map[int]time.Duration{}
	for _, pid := range t.serverPIDs {
		g, err := treeCPU(pid)
		if err != nil {
			u.serverOK = false
			break
		}
		u.server += g.total
		maps.Copy(u.js, g.js)
	}
	return u
}

// jsSince is the CPU the couchjs processes used since before: a process
// that ended in between is not counted (its time went to its parent's
// children's times, which the server's total has).
func (u cpuUse) jsSince(before cpuUse) time.Duration {
	var d time.Duration
	for pid, t := range u.js {
		d += t - before.js[pid]
	}
	return d
}

// cpuRows adds CPU time per job between two readings, and returns the
// server's row (nil when the bench cannot read the server's processes).
func cpuRows(s *Section, prefix string, before, after cpuUse, jobs int) (server *Row) {
	if jobs == 0 {
		return nil
	}
	per := func(d time.Duration) time.Duration { return d / time.Duration(jobs) }
	if before.ok && after.ok {
		s.add(durRow(prefix+"CPU per job, bench process (queue clients + workers)", per(after.bench-before.bench)))
	}
	if before.serverOK && after.serverOK {
		server = s.add(durRow(prefix+"CPU per job, server processes", per(after.server-before.server)))
		if len(after.js) > 0 {
			s.add(durRow(prefix+"  of which couchjs (JavaScript: validate_doc_update, views)", per(after.jsSince(before))))
		}
	}
	return server
}

// cpuSpans adds up the CPU used in several spans of time, for cpuRows: the
// backlog section times two databases' rounds in turn and gives each its
// own. Each span includes one reading of /proc (target.cpu) in the bench
// process's figure, so a span should cover more than one round.
type cpuSpans struct {
	spent cpuUse // js is nil until the first span
}

// add adds what was used between before and after.
func (c *cpuSpans) add(before, after cpuUse) {
	if c.spent.js == nil {
		c.spent = cpuUse{ok: true, serverOK: true, js: map[int]time.Duration{}}
	}
	c.spent.ok = c.spent.ok && before.ok && after.ok
	c.spent.serverOK = c.spent.serverOK && before.serverOK && after.serverOK
	c.spent.bench += after.bench - before.bench
	c.spent.server += after.server - before.server
	if len(after.js) > 0 {
		// A sum over spans has no processes: the couchjs time goes under
		// one key, which cpuRows reads back whole (jsSince of an empty map).
		c.spent.js[0] += after.jsSince(before)
	}
}

// rows adds cpuRows for what the spans used over jobs jobs.
func (c *cpuSpans) rows(s *Section, prefix string, jobs int) {
	if c.spent.js == nil {
		return
	}
	cpuRows(s, prefix, cpuUse{ok: true, serverOK: true}, c.spent, jobs)
}

// httpStats counts the queue clients' HTTP traffic by kind of request,
// and the bytes on their connections.
type httpStats struct {
	dials          atomic.Int64
	sent, received atomic.Int64
	requests       [numKinds]atomic.Int64
}

// The kinds of request told apart.
const (
	kindDue      = iota // due views (a claim round's candidates, Next)
	kindFetch           // _all_docs (the documents a claim round picked)
	kindView            // any other view (sweeps, listings)
	kindChanges         // _changes long-polls
	kindBulk            // _bulk_docs (bulk enqueue, ClaimMany)
	kindJobPut          // PUT/DELETE of a job (Enqueue, Claim, Complete, ...)
	kindJobGet          // GET of a job (confirming reads)
	kindRegistry        // worker registry documents
	kindOther
	numKinds
)

var kindNames = [numKinds]string{
	"due views (claim candidates, Next)", "_all_docs (picked jobs' documents)", "other views", "_changes", "_bulk_docs",
	"job PUT/DELETE", "job GET", "worker registry", "other",
}

// traffic is the counters of httpStats at one moment, or the difference
// between two moments.
type traffic struct {
	reqs  [numKinds]int64 // requests by kind
	dials int64           // TCP connections opened
	// sent and received are bytes on the connections: HTTP headers and
	// bodies as they went over the wire.
	sent, received int64
}

// snapshot returns the counters.
func (s *httpStats) snapshot() traffic {
	var t traffic
	for i := range t.reqs {
		t.reqs[i] = s.requests[i].Load()
	}
	t.dials, t.sent, t.received = s.dials.Load(), s.sent.Load(), s.received.Load()
	return t
}

// since is the traffic between an earlier snapshot and this one.
func (t traffic) since(before traffic) traffic {
	d := traffic{dials: t.dials - before.dials, sent: t.sent - before.sent, received: t.received - before.received}
	for k := range d.reqs {
		d.reqs[k] = t.reqs[k] - before.reqs[k]
	}
	return d
}

// requests is every request, whatever its kind.
func (t traffic) requests() int64 {
	var n int64
	for _, r := range t.reqs {
		n += r
	}
	return n
}

type countingTransport struct {
	next  http.RoundTripper
	stats *httpStats
}

// newCountingTransport wraps couchq's transport (protocol.NewHTTPClient),
// counting dials and requests; idle > 0 overrides its idle connections
// per host.
func newCountingTransport(stats *httpStats, idle int) http.RoundTripper {
	tr := protocol.NewHTTPClient().Transport.(*http.Transport)
	if idle > 0 {
		tr.MaxIdleConnsPerHost = idle
	}
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		stats.dials.Add(1)
		return &countingConn{Conn: conn, stats: stats}, nil
	}
	return &countingTransport{next: tr, stats: stats}
}

// countingConn counts the bytes a connection carries: what a job costs
// the network, headers included, which body sizes alone would miss.
type countingConn struct {
	net.Conn
	stats *httpStats
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.stats.received.Add(int64(n))
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.stats.sent.Add(int64(n))
	return n, err
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.stats.requests[classify(req)].Add(1)
	return c.next.RoundTrip(req)
}

// classify sorts a request into a kind by method and path.
func classify(req *http.Request) int {
	p := req.URL.Path
	switch {
	case strings.Contains(p, "/_view/due"):
		return kindDue
	case strings.HasSuffix(p, "/_all_docs"):
		return kindFetch
	case strings.Contains(p, "/_view/"):
		return kindView
	case strings.HasSuffix(p, "/_changes"):
		return kindChanges
	case strings.HasSuffix(p, "/_bulk_docs"):
		return kindBulk
	case strings.Contains(p, "/worker:"), strings.Contains(p, "/worker%3A"):
		return kindRegistry
	case strings.Contains(p, "/job:"), strings.Contains(p, "/job%3A"):
		if req.Method == http.MethodGet || req.Method == http.MethodHead {
			return kindJobGet
		}
		return kindJobPut
	}
	return kindOther
}
