package localserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// CouchDB release lookup: a local Apache CouchDB release (the layout the official packages
// install: bin/couchdb, etc/default.ini, etc/vm.args, erts-*/bin/epmd).
const (
	// CouchDBHomeEnv names the release directory; CouchDBHomeDefault is used when it is unset.
	CouchDBHomeEnv     = "COUCHQ_COUCHDB_HOME"
	CouchDBHomeDefault = "/opt/couchdb"

	couchStartTimeout = 2 * time.Minute
	couchStopGrace    = 15 * time.Second
)

// FindCouchDB returns the Apache CouchDB release directory to use (COUCHQ_COUCHDB_HOME, else
// /opt/couchdb), or an error saying why there is none. getenv is os.Getenv in production.
func FindCouchDB(getenv func(string) string) (string, error) {
	home, from := getenv(CouchDBHomeEnv), CouchDBHomeEnv
	if home == "" {
		home, from = CouchDBHomeDefault, "the default location"
	}
	bin := filepath.Join(home, "bin", "couchdb")
	info, err := os.Stat(bin)
	if err != nil {
		return "", fmt.Errorf("no Apache CouchDB release at %s (%s): %w", home, from, err)
	}
	if info.IsDir() || info.Mode()&0o111 == 0 {
		return "", fmt.Errorf("no Apache CouchDB release at %s (%s): %s is not executable", home, from, bin)
	}
	for _, f := range []string{"etc/default.ini", "etc/vm.args"} {
		if _, err := os.Stat(filepath.Join(home, f)); err != nil {
			return "", fmt.Errorf("the Apache CouchDB release at %s (%s) is incomplete: %w", home, from, err)
		}
	}
	return home, nil
}

// CouchDBOptions configures StartCouchDB.
type CouchDBOptions struct {
	// Home is the release directory (see FindCouchDB). Required.
	Home string
	// Nodes is how many nodes to start: 1 is a single node, more are joined into one cluster.
	Nodes int
	// Q is the shard count of new databases on a cluster (default 2); N, their replica count,
	// is min(Nodes, 3).
	Q int
	// DataDir holds each node's configuration, data and log (node1/, node2/, ...). Required.
	DataDir string
	// User and Password are the admin credentials; empty ones are generated.
	User, Password string
	// StartTimeout bounds the wait for every node to answer (default two minutes).
	StartTimeout time.Duration
	Logger       zerolog.Logger
}

// CouchDB is a set of Apache CouchDB nodes started from a local release: a single node or a
// cluster. Every node listens on 127.0.0.1 only, on ports picked when it first starts and kept
// across restarts. Its methods are safe for concurrent use.
type CouchDB struct {
	opts     CouchDBOptions
	user     string
	password string
	cookie   string
	secret   string
	uuid     string
	prefix   string // node names are <prefix>N@127.0.0.1, unique to this set
	epmd     *couchProcess
	epmdPort int
	logger   zerolog.Logger
	httpc    *http.Client

	mu          sync.Mutex
	nodes       []*couchNode
	partitioned map[int]bool // nodes cut off by Partition
}

type couchNode struct {
	index    int // 1-based
	name     string
	ip       string // the loopback address it binds everything to
	httpPort int
	distPort int
	dir      string
	proc     *couchProcess // nil while stopped
}

type couchProcess struct {
	cmd  *exec.Cmd
	out  *Tail
	done chan struct{}
	err  error
}

// StartCouchDB starts opts.Nodes nodes from the release at opts.Home, joins them into a cluster
// when there are several, and returns once every node answers and knows every other.
func StartCouchDB(ctx context.Context, opts CouchDBOptions) (*CouchDB, error) {
	if opts.Home == "" || opts.DataDir == "" {
		return nil, errors.New("starting CouchDB: Home and DataDir are required")
	}
	if opts.Nodes <= 0 {
		opts.Nodes = 1
	}
	if opts.Q <= 0 {
		opts.Q = 2
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = couchStartTimeout
	}
	c := &CouchDB{
		opts:     opts,
		user:     opts.User,
		password: opts.Password,
		cookie:   randomToken(16),
		secret:   randomToken(16),
		uuid:     randomToken(16),
		prefix:   "couchq" + randomToken(3) + "n",
		logger:   opts.Logger,
		httpc:    &http.Client{Timeout: 10 * time.Second},
	}
	if c.user == "" {
		c.user = "admin"
	}
	if c.password == "" {
		c.password = randomToken(12)
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	if err := c.startEPMD(); err != nil {
		return nil, err
	}
	for i := 1; i <= opts.Nodes; i++ {
		ip := c.nodeIP(i)
		n := &couchNode{index: i, ip: ip, name: fmt.Sprintf("%s%d@%s", c.prefix, i, ip), dir: filepath.Join(opts.DataDir, fmt.Sprintf("node%d", i))}
		var err error
		if n.httpPort, err = freePort(); err == nil {
			n.distPort, err = freePort()
		}
		if err == nil {
			err = c.writeNodeConfig(n)
		}
		if err != nil {
			_ = c.Stop(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("starting CouchDB: %w", err)
		}
		c.nodes = append(c.nodes, n)
	}
	// Start every node before waiting on any: the release takes seconds to boot.
	for _, n := range c.nodes {
		if err := c.spawn(n); err != nil {
			_ = c.Stop(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	for _, n := range c.nodes {
		if err := c.waitUp(ctx, n); err != nil {
			_ = c.Stop(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	if err := c.join(ctx); err != nil {
		_ = c.Stop(context.WithoutCancel(ctx))
		return nil, err
	}
	c.logger.Info().Int("nodes", len(c.nodes)).Str("url", c.URL()).Str("data_dir", opts.DataDir).Msg("Apache CouchDB started")
	return c, nil
}

// URL is node 1's base URL, without credentials.
func (c *CouchDB) URL() string { return c.NodeURL(1) }

// NodeURL is node i's (1-based) base URL, without credentials.
func (c *CouchDB) NodeURL(i int) string {
	return "http://" + net.JoinHostPort(c.nodes[i-1].ip, strconv.Itoa(c.nodes[i-1].httpPort))
}

// nodeIP is the loopback address node i binds to: 127.0.0.1 for a single node; in a cluster
// 127.0.0.i, so that a node's cluster traffic (Erlang distribution, in and out) has an address
// of its own, which Partition cuts while the node's HTTP port stays reachable.
func (c *CouchDB) nodeIP(i int) string {
	if c.opts.Nodes == 1 {
		return host
	}
	return fmt.Sprintf("127.0.0.%d", i)
}

// NodeURLs are every node's base URL, node 1 first.
func (c *CouchDB) NodeURLs() []string {
	urls := make([]string, len(c.nodes))
	for i := range c.nodes {
		urls[i] = c.NodeURL(i + 1)
	}
	return urls
}

// Nodes is how many nodes the set has.
func (c *CouchDB) Nodes() int { return len(c.nodes) }

// NodeName is node i's Erlang node name (as _membership lists it).
func (c *CouchDB) NodeName(i int) string { return c.nodes[i-1].name }

// Shards are the shard count (q) and replica count (n) of new databases, as the nodes were
// configured: a benchmark's report says what it measured.
func (c *CouchDB) Shards() (q, n int) { return c.opts.Q, min(c.opts.Nodes, 3) }

// NodePIDs are the running nodes' process ids, node 1 first, 0 for a stopped node. Each is the
// node's Erlang VM (bin/couchdb execs it); the node's couchjs processes are its descendants
// (started through erl_child_setup, each in a session of its own), so a benchmark reads what
// the node costs in CPU from this process's tree.
func (c *CouchDB) NodePIDs() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	pids := make([]int, len(c.nodes))
	for i, n := range c.nodes {
		if n.proc != nil {
			pids[i] = n.proc.cmd.Process.Pid
		}
	}
	return pids
}

// Credentials are the admin's user name and password.
func (c *CouchDB) Credentials() (user, password string) { return c.user, c.password }

// StopNode stops node i (SIGTERM to its process group, SIGKILL after a grace period); the other
// nodes go on. Stopping a stopped node is a no-op.
func (c *CouchDB) StopNode(ctx context.Context, i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopNodeLocked(ctx, c.nodes[i-1], false)
}

// KillNode SIGKILLs node i at once, as a crash would.
func (c *CouchDB) KillNode(ctx context.Context, i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopNodeLocked(ctx, c.nodes[i-1], true)
}

// StartNode starts a stopped node i again on its data, ports and name, and waits until it
// answers. Starting a running node is a no-op.
func (c *CouchDB) StartNode(ctx context.Context, i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[i-1]
	if n.proc != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	if err := c.spawn(n); err != nil {
		return err
	}
	return c.waitUp(ctx, n)
}

// Stop stops every node and the name server. Data stays in DataDir (the caller owns it).
func (c *CouchDB) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for i := range c.partitioned {
		if err := c.healLocked(i); err != nil {
			errs = append(errs, err)
		}
	}
	var wg sync.WaitGroup
	var emu sync.Mutex
	for _, n := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.stopNodeLocked(ctx, n, false); err != nil {
				emu.Lock()
				errs = append(errs, err)
				emu.Unlock()
			}
		}()
	}
	wg.Wait()
	if c.epmd != nil {
		stopProcess(ctx, c.epmd, stopGrace)
		c.epmd = nil
	}
	return errors.Join(errs...)
}

// LogTail is the end of node i's log file and console output, for failure messages.
func (c *CouchDB) LogTail(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tail(c.nodes[i-1])
}

// startEPMD runs a private Erlang port mapper on a free port, in its own process group, so
// that this set's nodes register nowhere else and nothing outlives Stop.
func (c *CouchDB) startEPMD() error {
	epmd, err := findEPMD(c.opts.Home)
	if err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		out := NewTail(4 << 10)
		addrs := []string{host}
		for i := 2; i <= c.opts.Nodes; i++ {
			addrs = append(addrs, c.nodeIP(i))
		}
		cmd := exec.Command(epmd, "-port", strconv.Itoa(port), "-address", strings.Join(addrs, ","))
		cmd.Stdout, cmd.Stderr = out, out
		cmd.SysProcAttr = sysProcAttr()
		proc, err := startProcess(cmd, out)
		if err != nil {
			return fmt.Errorf("starting epmd (%s): %w", epmd, err)
		}
		if waitListening(port, proc, 5*time.Second) {
			c.epmd, c.epmdPort = proc, port
			return nil
		}
		stopProcess(context.Background(), proc, time.Second)
		if attempt >= portAttempts {
			return fmt.Errorf("starting epmd on port %d: not listening: %s", port, out.String())
		}
	}
}

func findEPMD(home string) (string, error) {
	matches, _ := filepath.Glob(filepath.Join(home, "erts-*", "bin", "epmd"))
	if len(matches) > 0 {
		return matches[0], nil
	}
	if p, err := exec.LookPath("epmd"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("no epmd in %s/erts-*/bin or on PATH", home)
}

func waitListening(port int, proc *couchProcess, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		select {
		case <-proc.done:
			return false
		default:
		}
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(host, strconv.Itoa(port)), 200*time.Millisecond)
		if err == nil {
			_ = conn.Close()
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// SchedulerFlags are the Erlang VM flags the nodes this package starts
// run with (written to their vm.args): schedulers that do not busy-wait.
// Recommended in production too, where a node shares its cores.
const SchedulerFlags = "+sbwt none +sbwtdcpu none +sbwtdio none"

// CompactionRatio is the nodes' automatic compaction threshold for
// databases and view indexes (smoosh's ratio_dbs and ratio_views channels'
// min_priority): a file is compacted once it has grown to this multiple of
// its live data. CouchDB's default, 2.0, keeps a queue's database in
// compaction for most of the time jobs are worked (each job's claim and
// outcome add revisions), and each compaction copies all the live data;
// at 5.0 it compacts about a quarter as often, for files up to five
// times their live data. Recommended for queue databases in production
// too (docs/deploying.md).
const CompactionRatio = "5.0"

// CompactionSettings are the ini sections and keys that set
// CompactionRatio, as local.ini or the _config API takes them.
func CompactionSettings() map[string]map[string]string {
	return map[string]map[string]string{
		"smoosh.ratio_dbs":   {"min_priority": CompactionRatio},
		"smoosh.ratio_views": {"min_priority": CompactionRatio},
	}
}

// clusterSettings are the ini sections and keys a cluster's nodes need for
// couchq (docs/clusters.md, "CouchDB after 3.5"). CouchDB's main branch
// (since March 2026, in no release yet) writes a document's copies one
// after another and takes a conflict from any copy as final; a copy that
// internal replication reached first then answers conflict for a write
// the first copy stored, and the client is told 409 for a write that
// happened. Off, copies are written at once, as in 3.5. Releases without
// the setting ignore it.
func clusterSettings() map[string]map[string]string {
	return map[string]map[string]string{
		"fabric": {"serialize_worker_startup": "false"},
	}
}

// writeNodeConfig writes node n's vm.args and local.ini: the release's own vm.args with this
// node's name, cookie and distribution port, and an ini that puts data and log under n.dir.
func (c *CouchDB) writeNodeConfig(n *couchNode) error {
	if err := os.MkdirAll(filepath.Join(n.dir, "data"), 0o755); err != nil {
		return fmt.Errorf("creating node data dir: %w", err)
	}
	base, err := os.ReadFile(filepath.Join(c.opts.Home, "etc", "vm.args"))
	if err != nil {
		return fmt.Errorf("reading the release's vm.args: %w", err)
	}
	var args strings.Builder
	for _, line := range strings.Split(string(base), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && (f[0] == "-name" || f[0] == "-sname" || f[0] == "-setcookie") ||
			strings.Contains(line, "inet_dist_listen") || strings.Contains(line, "inet_dist_use_interface") {
			continue
		}
		args.WriteString(line + "\n")
	}
	fmt.Fprintf(&args, "-name %s\n-setcookie %s\n", n.name, c.cookie)
	fmt.Fprintf(&args, "-kernel inet_dist_listen_min %d\n-kernel inet_dist_listen_max %d\n", n.distPort, n.distPort)
	erlIP := "{" + strings.ReplaceAll(n.ip, ".", ",") + "}"
	fmt.Fprintf(&args, "-kernel inet_dist_use_interface %s\n", erlIP)
	// Outgoing distribution connections leave from the node's own address too.
	fmt.Fprintf(&args, "-kernel inet_dist_connect_options [{ip,%s}]\n", erlIP)
	// A node cut off is seen as down in about 8 s rather than a minute.
	args.WriteString("-kernel net_ticktime 8\n")
	// The schedulers sleep when they run out of work instead of spinning
	// first, as the release's vm.args advises where CPU is scarce: here one
	// to three nodes share the machine with the tests or the bench. On two
	// cores, spinning made up 30 % of the node's CPU per job at 16 worker
	// goroutines and cost couchq 14-19 % of its throughput (README,
	// Performance).
	args.WriteString(SchedulerFlags + "\n")
	if err := os.WriteFile(filepath.Join(n.dir, "vm.args"), []byte(args.String()), 0o600); err != nil {
		return fmt.Errorf("writing vm.args: %w", err)
	}
	data := filepath.Join(n.dir, "data")
	single := "false"
	if c.opts.Nodes == 1 {
		single = "true"
	}
	ini := fmt.Sprintf(`; written by couchq's test harness for one node of a local test server
[couchdb]
database_dir = %[1]s
view_index_dir = %[1]s
uuid = %[2]s
single_node = %[3]s

[chttpd]
bind_address = %[11]s
port = %[4]d

[chttpd_auth]
secret = %[5]s

[cluster]
q = %[6]d
n = %[7]d

[log]
writer = file
file = %[8]s
level = warning

[admins]
%[9]s = %[10]s
`, data, c.uuid, single, n.httpPort, c.secret, c.opts.Q, min(c.opts.Nodes, 3),
		filepath.Join(n.dir, "couchdb.log"), c.user, c.password, n.ip)
	settings := CompactionSettings()
	if c.opts.Nodes > 1 {
		maps.Copy(settings, clusterSettings())
	}
	for _, section := range slices.Sorted(maps.Keys(settings)) {
		ini += "\n[" + section + "]\n"
		for _, key := range slices.Sorted(maps.Keys(settings[section])) {
			ini += key + " = " + settings[section][key] + "\n"
		}
	}
	if err := os.WriteFile(filepath.Join(n.dir, "local.ini"), []byte(ini), 0o600); err != nil {
		return fmt.Errorf("writing local.ini: %w", err)
	}
	return nil
}

func (c *CouchDB) spawn(n *couchNode) error {
	out := NewTail(16 << 10)
	cmd := exec.Command(filepath.Join(c.opts.Home, "bin", "couchdb"))
	cmd.Dir = n.dir
	cmd.Env = append(os.Environ(),
		"COUCHDB_ARGS_FILE="+filepath.Join(n.dir, "vm.args"),
		"COUCHDB_INI_FILES="+filepath.Join(c.opts.Home, "etc", "default.ini")+" "+filepath.Join(n.dir, "local.ini"),
		"ERL_EPMD_PORT="+strconv.Itoa(c.epmdPort),
		"HOME="+n.dir, // the Erlang runtime may write .erlang.cookie or crash dumps there
		"ERL_CRASH_DUMP="+filepath.Join(n.dir, "erl_crash.dump"),
	)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	proc, err := startProcess(cmd, out)
	if err != nil {
		return fmt.Errorf("starting CouchDB node %d (%s): %w", n.index, cmd.Path, err)
	}
	n.proc = proc
	return nil
}

func startProcess(cmd *exec.Cmd, out *Tail) (*couchProcess, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &couchProcess{cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// stopProcess sends SIGTERM to the process group, SIGKILL after grace or when ctx ends, and waits.
func stopProcess(ctx context.Context, p *couchProcess, grace time.Duration) {
	pid := p.cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	case <-ctx.Done():
	}
	// Also after a clean exit: the release's shell script execs the VM, but couchjs children may linger.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-p.done
}

func (c *CouchDB) stopNodeLocked(ctx context.Context, n *couchNode, kill bool) error {
	if n.proc == nil {
		return nil
	}
	select {
	case <-n.proc.done: // it died on its own: say why, before its output is gone
		c.logger.Warn().Int("node", n.index).AnErr("exit", n.proc.err).Msg("CouchDB node had crashed" + c.tail(n))
	default:
	}
	grace := couchStopGrace
	if kill {
		grace = 0
	}
	stopProcess(ctx, n.proc, grace)
	n.proc = nil
	c.logger.Debug().Int("node", n.index).Bool("killed", kill).Msg("CouchDB node stopped")
	return nil
}

// waitUp waits until node n answers GET /_up with its own uuid's server behind it.
func (c *CouchDB) waitUp(ctx context.Context, n *couchNode) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	url := "http://" + net.JoinHostPort(n.ip, strconv.Itoa(n.httpPort))
	for {
		var up struct {
			Status string `json:"status"`
		}
		if status, err := c.request(ctx, http.MethodGet, url+"/_up", nil, &up); err == nil && status == http.StatusOK && up.Status == "ok" {
			return nil
		}
		select {
		case <-n.proc.done:
			return fmt.Errorf("starting CouchDB node %d: exited before answering (%v)%s", n.index, n.proc.err, c.tail(n))
		case <-ctx.Done():
			return fmt.Errorf("starting CouchDB node %d on port %d: not up: %w%s", n.index, n.httpPort, ctx.Err(), c.tail(n))
		case <-tick.C:
		}
	}
}

// join adds nodes 2..N to node 1's node list, waits until every node's _membership lists all
// of them, and finishes the set-up with the cluster setup API (which creates the system
// databases). A single node creates its own (single_node = true).
func (c *CouchDB) join(ctx context.Context) error {
	if len(c.nodes) == 1 {
		return nil
	}
	first := c.NodeURL(1)
	for _, n := range c.nodes[1:] {
		status, err := c.request(ctx, http.MethodPut, first+"/_node/_local/_nodes/"+n.name, map[string]any{}, nil)
		if err != nil && status != http.StatusConflict {
			return fmt.Errorf("joining node %d to the cluster: %w", n.index, err)
		}
	}
	if err := c.waitMembership(ctx); err != nil {
		return err
	}
	status, err := c.request(ctx, http.MethodPost, first+"/_cluster_setup", map[string]any{"action": "finish_cluster"}, nil)
	if err != nil && status != http.StatusBadRequest { // 400 cluster_finished: already done
		return fmt.Errorf("finishing the cluster set-up: %w", err)
	}
	return nil
}

// waitMembership waits until every node's _membership lists every node both as configured
// (cluster_nodes) and as connected (all_nodes).
func (c *CouchDB) waitMembership(ctx context.Context) error {
	want := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		want[i] = n.name
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for i := range c.nodes {
		for {
			var m struct {
				All     []string `json:"all_nodes"`
				Cluster []string `json:"cluster_nodes"`
			}
			_, err := c.request(ctx, http.MethodGet, c.NodeURL(i+1)+"/_membership", nil, &m)
			if err == nil && containsAll(m.All, want) && containsAll(m.Cluster, want) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for node %d to see all %d nodes (sees %v / %v, last error %v): %w",
					i+1, len(want), m.All, m.Cluster, err, ctx.Err())
			case <-tick.C:
			}
		}
	}
	return nil
}

// WaitWhole waits until the cluster is whole again: every node running, none partitioned, and
// every node connected to every other. A test that stopped or cut off a node brings it back in
// its cleanup, but the node then needs a moment to reconnect; a database created meanwhile
// through another node is missing on it ("Database does not exist"), so the next test would
// fail for the last one's sake.
func (c *CouchDB) WaitWhole(ctx context.Context) error {
	c.mu.Lock()
	for _, n := range c.nodes {
		if n.proc == nil {
			c.mu.Unlock()
			return fmt.Errorf("CouchDB node %d is stopped", n.index)
		}
		if c.partitioned[n.index] {
			c.mu.Unlock()
			return fmt.Errorf("CouchDB node %d is partitioned", n.index)
		}
	}
	c.mu.Unlock()
	return c.waitMembership(ctx)
}

func containsAll(have, want []string) bool {
	set := make(map[string]bool, len(have))
	for _, h := range have {
		set[h] = true
	}
	for _, w := range want {
		if !set[w] {
			return false
		}
	}
	return true
}

func (c *CouchDB) request(ctx context.Context, method, url string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, err
	}
	req.SetBasicAuth(c.user, c.password)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := c.httpc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode >= 400 {
		return resp.StatusCode, fmt.Errorf("%s %s: %s: %s", method, req.URL.Path, resp.Status, bytes.TrimSpace(data))
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: decoding %q: %w", method, req.URL.Path, data, err)
		}
	}
	return resp.StatusCode, nil
}

func (c *CouchDB) tail(n *couchNode) string {
	var b strings.Builder
	if n.proc != nil {
		if out := strings.TrimSpace(n.proc.out.String()); out != "" {
			fmt.Fprintf(&b, "\n--- CouchDB node %d output ---\n%s", n.index, out)
		}
	}
	path := filepath.Join(n.dir, "couchdb.log")
	if log, err := os.ReadFile(path); err == nil && len(log) > 0 {
		if len(log) > 6<<10 {
			log = log[len(log)-6<<10:]
		}
		fmt.Fprintf(&b, "\n--- end of %s ---\n%s", path, strings.TrimSpace(string(log)))
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(&b, "\n(reading %s: %v)", path, err)
	}
	return b.String()
}

// randomToken is n random bytes in hex: cookies, secrets, generated passwords, name suffixes.
func randomToken(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b)
}
