// Package localserver runs PouchDB Server (tools/pouchdb-server, installed with npm) as a child
// process: a CouchDB-compatible server for the demo and for tests when no CouchDB is available.
package localserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

const (
	host                = "127.0.0.1"
	defaultStartTimeout = time.Minute
	stopGrace           = 10 * time.Second
	portAttempts        = 5
)

// Options configures Start.
type Options struct {
	// DataDir holds the databases, config.json and log.txt. Required; created if missing.
	DataDir string
	// Port to listen on (127.0.0.1 only). 0 picks a free port, kept across Restart.
	Port int
	// StartTimeout bounds the wait for the server to answer GET /. 0 means one minute.
	StartTimeout time.Duration
	Logger       zerolog.Logger
	// RestartOnCrash starts the server again, on the same port and data,
	// when it exits without being stopped. PouchDB Server 4.2.0 dies on a
	// long poll of the changes of a database deleted meanwhile (a
	// TypeError in express-pouchdb's changes route), which a test suite's
	// cleanup does; restarted, the suite's other tests go on. The crash is
	// logged all the same.
	RestartOnCrash bool
}

// PouchDB is a running (or stopped) PouchDB Server child process.
type PouchDB struct {
	dataDir  string
	port     int
	uuid     string // written to config.json; GET / must echo it, so we know we reached our process
	node     string
	script   string
	timeout  time.Duration
	logger   zerolog.Logger
	httpc    *http.Client
	mu       sync.Mutex
	proc     *process // nil when stopped
	autoPort bool
	restart  bool // Options.RestartOnCrash
}

type process struct {
	cmd  *exec.Cmd
	out  *Tail
	done chan struct{} // closed once cmd.Wait returned; err is set before
	err  error
	// stopping is set before the server is stopped or killed on purpose,
	// so that an exit without it is reported as a crash.
	stopping atomic.Bool
}

// Start installs PouchDB Server if needed (see EnsureInstalled) and starts it on opts.DataDir.
// It returns once the server answers GET /.
func Start(ctx context.Context, opts Options) (*PouchDB, error) {
	if opts.DataDir == "" {
		return nil, errors.New("starting PouchDB Server: Options.DataDir is required")
	}
	dataDir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return nil, fmt.Errorf("starting PouchDB Server: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, fmt.Errorf("starting PouchDB Server: creating data dir: %w", err)
	}
	if err := EnsureInstalled(ctx, opts.Logger); err != nil {
		return nil, err
	}
	dir, err := ToolsDir()
	if err != nil {
		return nil, err
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("starting PouchDB Server: node not found on PATH (install Node.js >= 18): %w", err)
	}
	uuid, err := ensureConfig(filepath.Join(dataDir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("starting PouchDB Server: %w", err)
	}
	p := &PouchDB{
		dataDir:  dataDir,
		port:     opts.Port,
		uuid:     uuid,
		node:     node,
		script:   binPath(dir),
		timeout:  opts.StartTimeout,
		logger:   opts.Logger,
		httpc:    &http.Client{Timeout: 2 * time.Second},
		autoPort: opts.Port == 0,
		restart:  opts.RestartOnCrash,
	}
	if p.timeout <= 0 {
		p.timeout = defaultStartTimeout
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.startLocked(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// URL is the server's base URL without a trailing slash, e.g. http://127.0.0.1:41234.
func (p *PouchDB) URL() string { return "http://" + net.JoinHostPort(host, strconv.Itoa(p.port)) }

// Port is the TCP port the server listens on.
func (p *PouchDB) Port() int { return p.port }

// DataDir is the absolute data directory.
func (p *PouchDB) DataDir() string { return p.dataDir }

// Stop sends SIGTERM to the server's process group, then SIGKILL if it has not exited within
// ten seconds or by ctx's deadline, and waits for it. Stopping a stopped server is a no-op.
func (p *PouchDB) Stop(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopLocked(ctx)
}

// Restart stops the server and starts it again on the same data directory and port.
func (p *PouchDB) Restart(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.stopLocked(ctx); err != nil {
		return err
	}
	// The port was free a moment ago and now belongs to this server: never move it, callers hold the URL.
	p.autoPort = false
	return p.startLocked(ctx)
}

func (p *PouchDB) startLocked(ctx context.Context) error {
	if p.proc != nil {
		return errors.New("starting PouchDB Server: already running")
	}
	for attempt := 1; ; attempt++ {
		if p.autoPort {
			port, err := freePort()
			if err != nil {
				return fmt.Errorf("starting PouchDB Server: %w", err)
			}
			p.port = port
		}
		proc, err := p.spawn()
		if err != nil {
			return err
		}
		err = p.waitReady(ctx, proc)
		if err == nil {
			p.proc = proc
			p.logger.Info().Str("url", p.URL()).Int("pid", proc.cmd.Process.Pid).Str("data_dir", p.dataDir).Msg("PouchDB Server started")
			return nil
		}
		p.kill(proc)
		// With -n, pouchdb-server 4.2.0 crashes in its EADDRINUSE handler (stopTailingLog is not a
		// function) before printing "already in use", so ask the kernel instead.
		if !portFree(p.port) {
			// A port picked by freePort can be taken by another process before the server binds it.
			if p.autoPort && attempt < portAttempts {
				p.logger.Debug().Int("port", p.port).Msg("port taken before PouchDB Server bound it; retrying")
				continue
			}
			return fmt.Errorf("port %d is already in use by another process: %w", p.port, err)
		}
		return err
	}
}

func (p *PouchDB) spawn() (*process, error) {
	out := NewTail(32 << 10)
	cmd := exec.Command(p.node, p.script,
		"-p", strconv.Itoa(p.port),
		"-o", host,
		"-d", p.dataDir,
		"-c", filepath.Join(p.dataDir, "config.json"),
		"-n", "--no-color")
	cmd.Dir = p.dataDir // pouchdb-server writes log.txt relative to its cwd
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting PouchDB Server (%s %s): %w", p.node, p.script, err)
	}
	proc := &process{cmd: cmd, out: out, done: make(chan struct{})}
	port := p.port
	go func() {
		proc.err = cmd.Wait()
		close(proc.done)
		if !proc.stopping.Load() {
			// Every request to it fails from now on: say why once, with
			// what it printed last.
			p.logger.Error().Err(proc.err).Int("port", port).Msg("PouchDB Server exited on its own" + p.outputTail(proc))
			if p.restart {
				p.restartAfterCrash(proc)
			}
		}
	}()
	return proc, nil
}

// restartAfterCrash starts the server again after proc exited on its own,
// unless it was stopped or restarted meanwhile.
func (p *PouchDB) restartAfterCrash(proc *process) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc != proc {
		return
	}
	p.proc = nil
	p.autoPort = false // callers hold the URL
	if err := p.startLocked(context.Background()); err != nil {
		p.logger.Error().Err(err).Msg("starting PouchDB Server again after it crashed")
		return
	}
	p.logger.Warn().Str("url", p.URL()).Msg("PouchDB Server started again after it crashed")
}

func (p *PouchDB) waitReady(ctx context.Context, proc *process) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if p.answers(ctx) {
			return nil
		}
		select {
		case <-proc.done:
			return fmt.Errorf("starting PouchDB Server on port %d: exited before becoming ready (%v)%s", p.port, proc.err, p.outputTail(proc))
		case <-ctx.Done():
			return fmt.Errorf("starting PouchDB Server on port %d: not ready: %w%s", p.port, ctx.Err(), p.outputTail(proc))
		case <-tick.C:
		}
	}
}

// answers reports whether GET / is answered by this server: checking the uuid guards against
// another process that happens to listen on the same port.
func (p *PouchDB) answers(ctx context.Context) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL()+"/", nil)
	if err != nil {
		return false
	}
	resp, err := p.httpc.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var welcome struct {
		UUID string `json:"uuid"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&welcome) != nil {
		return false
	}
	return welcome.UUID == p.uuid
}

func (p *PouchDB) stopLocked(ctx context.Context) error {
	proc := p.proc
	if proc == nil {
		return nil
	}
	p.proc = nil
	proc.stopping.Store(true)
	pid := proc.cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM) // negative pid: the whole process group (Setpgid)
	grace := time.NewTimer(stopGrace)
	defer grace.Stop()
	select {
	case <-proc.done:
	case <-grace.C:
		p.logger.Warn().Int("pid", pid).Msg("PouchDB Server ignored SIGTERM; killing it")
		p.kill(proc)
	case <-ctx.Done():
		p.kill(proc)
	}
	p.logger.Info().Str("url", p.URL()).Msg("PouchDB Server stopped")
	return nil
}

// kill SIGKILLs the process group and waits for the process to be reaped.
func (p *PouchDB) kill(proc *process) {
	proc.stopping.Store(true)
	_ = syscall.Kill(-proc.cmd.Process.Pid, syscall.SIGKILL)
	<-proc.done
}

// outputTail formats the server's stdout/stderr and the end of its log file for error messages.
func (p *PouchDB) outputTail(proc *process) string {
	var b strings.Builder
	if out := strings.TrimSpace(proc.out.String()); out != "" {
		b.WriteString("\n--- pouchdb-server output ---\n" + out)
	}
	if log, err := os.ReadFile(filepath.Join(p.dataDir, "log.txt")); err == nil && len(log) > 0 {
		if len(log) > 4<<10 {
			log = log[len(log)-4<<10:]
		}
		b.WriteString("\n--- end of " + filepath.Join(p.dataDir, "log.txt") + " ---\n" + strings.TrimSpace(string(log)))
	}
	return b.String()
}

// ensureConfig makes sure config.json exists and names a server uuid, returning it.
// Other settings in an existing file are preserved.
func ensureConfig(path string) (string, error) {
	cfg := map[string]any{}
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(data, &cfg); err != nil {
			return "", fmt.Errorf("parsing %s: %w", path, err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	section, _ := cfg["couchdb"].(map[string]any)
	if section == nil {
		section = map[string]any{}
		cfg["couchdb"] = section
	}
	if uuid, ok := section["uuid"].(string); ok && uuid != "" {
		return uuid, nil
	}
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	uuid := hex.EncodeToString(raw[:])
	section["uuid"] = uuid
	data, err = json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return "", fmt.Errorf("encoding %s: %w", path, err)
	}
	if err := writeFileAtomic(path, data); err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	return uuid, nil
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("picking a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
