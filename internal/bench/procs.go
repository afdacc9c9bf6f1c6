package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/couchq/couchq/handlers"
	"github.com/couchq/couchq/internal/localserver"
	"github.com/couchq/couchq/internal/protocol"
)

// procHeartbeat is the --heartbeat the worker processes run with: their
// registry documents carry the completed counts the bench waits on, and
// the default (lease/3 = 10 s) would only be read that often. One small
// write a second per process is noise next to the jobs' writes.
const procHeartbeat = time.Second

// cliPath returns the couchq CLI to start: --couchq-bin, else a build of
// ./cmd/couchq from the module the bench runs in, made once per run.
func (b *run) cliPath(ctx context.Context) (string, error) {
	if b.cfg.CouchqBin != "" {
		return b.cfg.CouchqBin, nil
	}
	if b.cliBuilt != "" {
		return b.cliBuilt, nil
	}
	dir, err := b.tempDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "couchq")
	b.log.Info().Str("to", bin).Msg("building the couchq CLI for --procs")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/couchq/couchq/cmd/couchq")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the couchq CLI (run the bench inside the couchq module, or give --couchq-bin): %w\n%s", err, out)
	}
	b.cliBuilt = bin
	return bin, nil
}

// tempDir is the run's scratch directory, removed when the run ends.
func (b *run) tempDir() (string, error) {
	if b.scratch == "" {
		dir, err := os.MkdirTemp("", "couchq-bench-cli-*")
		if err != nil {
			return "", fmt.Errorf("creating a scratch directory: %w", err)
		}
		b.scratch = dir
	}
	return b.scratch, nil
}

// child is one `couchq worker` process.
type child struct {
	cmd  *exec.Cmd
	out  *localserver.Tail
	done chan struct{} // closed when the process has been waited for
	err  error
}

// procPool is a set of `couchq worker` processes working one database.
type procPool struct {
	children []*child
}

// startProcs starts one `couchq worker --handler noop` process per entry
// of concurrencies.
func (b *run) startProcs(ctx context.Context, db string, concurrencies []int) (*procPool, error) {
	return b.startProcsWith(ctx, db, concurrencies, handlers.NameNoop)
}

// startProcsWith is startProcs with the built-in handler named handler,
// and extra flags appended to each process's command line (section 6's
// webhook worker needs both).
func (b *run) startProcsWith(ctx context.Context, db string, concurrencies []int, handler string, extra ...string) (*procPool, error) {
	bin, err := b.cliPath(ctx)
	if err != nil {
		return nil, err
	}
	env := make([]string, 0, len(os.Environ())+2)
	for _, kv := range os.Environ() {
		// The children get the server and database from the flags, and the
		// credentials (never on a command line) from the bench.
		if !strings.HasPrefix(kv, "COUCHDB_") && !strings.HasPrefix(kv, "COUCHQ_") {
			env = append(env, kv)
		}
	}
	if b.t.user != "" {
		env = append(env, "COUCHDB_USER="+b.t.user, "COUCHDB_PASSWORD="+b.t.password)
	}
	p := &procPool{}
	for _, conc := range concurrencies {
		args := append([]string{"worker", "--type", jobType, "--handler", handler,
			"--url", b.t.queueURL(), "--db", db, "--concurrency", strconv.Itoa(conc),
			"--heartbeat", procHeartbeat.String(), "--log-level", "warn"}, extra...)
		cmd := exec.Command(bin, args...)
		c := &child{cmd: cmd, out: localserver.NewTail(16 << 10), done: make(chan struct{})}
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = c.out, c.out
		cmd.SysProcAttr = childProcAttr()
		if err := cmd.Start(); err != nil {
			p.stop(b)
			return nil, fmt.Errorf("starting %s worker --handler %s: %w", bin, handler, err)
		}
		go func() {
			c.err = cmd.Wait()
			close(c.done)
		}()
		p.children = append(p.children, c)
	}
	return p, nil
}

func (p *procPool) pids() map[int]bool {
	m := make(map[int]bool, len(p.children))
	for _, c := range p.children {
		m[c.cmd.Process.Pid] = true
	}
	return m
}

// exited reports a child that ended on its own: the run cannot go on.
func (p *procPool) exited() error {
	for _, c := range p.children {
		select {
		case <-c.done:
			return fmt.Errorf("worker process %d exited early (%v):\n%s", c.cmd.Process.Pid, c.err, c.out.String())
		default:
		}
	}
	return nil
}

// registry sums what the children's registry documents report.
func (p *procPool) registry(ctx context.Context, c *protocol.Client) (claimed, conflicts, completed int64, err error) {
	infos, err := c.Workers(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	pids := p.pids()
	host, _ := os.Hostname()
	for _, in := range infos {
		if pids[in.PID] && (host == "" || in.Host == host) {
			claimed += in.Claimed
			conflicts += in.Conflicts
			completed += in.Completed
		}
	}
	return claimed, conflicts, completed, nil
}

// waitCompleted polls the registry until the children completed n jobs,
// giving up after stall without progress or when a child exits.
func (p *procPool) waitCompleted(ctx context.Context, c *protocol.Client, n int64, stall time.Duration) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	last, lastAt := int64(-1), time.Now()
	for {
		if err := p.exited(); err != nil {
			return err
		}
		_, _, got, err := p.registry(ctx, c)
		if err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		if got != last {
			last, lastAt = got, time.Now()
		}
		if time.Since(lastAt) > stall {
			return fmt.Errorf("the worker processes completed %d of %d jobs, none for %s", got, n, stall)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the worker processes completed %d of %d jobs: %w", got, n, ctx.Err())
		case <-tick.C:
		}
	}
}

// cpu is the CPU time the children used so far.
func (p *procPool) cpu() (time.Duration, error) {
	var sum time.Duration
	for _, c := range p.children {
		d, err := processCPU(c.cmd.Process.Pid)
		if err != nil {
			return 0, err
		}
		sum += d
	}
	return sum, nil
}

// peakRSS is each child's VmHWM; read before stopping them, since it
// goes with the process.
func (p *procPool) peakRSS() ([]uint64, error) {
	out := make([]uint64, 0, len(p.children))
	for _, c := range p.children {
		v, err := peakRSSOf(c.cmd.Process.Pid)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// stop sends SIGTERM (a graceful stop: running jobs finish and their
// outcomes are written) and waits; a child still running after
// stopTimeout is killed. Only the bench's own children are signalled.
func (p *procPool) stop(b *run) {
	for _, c := range p.children {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.NewTimer(stopTimeout)
	defer deadline.Stop()
	for _, c := range p.children {
		select {
		case <-c.done:
		case <-deadline.C:
			b.log.Warn().Int("pid", c.cmd.Process.Pid).Msg("worker process ignored SIGTERM; killing it")
			_ = c.cmd.Process.Kill()
			<-c.done
		}
		var ee *exec.ExitError
		if c.err != nil && !errors.As(c.err, &ee) {
			b.log.Warn().Err(c.err).Int("pid", c.cmd.Process.Pid).Msg("waiting for worker process")
		} else if c.err != nil {
			b.log.Warn().Err(c.err).Int("pid", c.cmd.Process.Pid).Str("output", c.out.String()).Msg("worker process exited with an error")
		}
	}
}
