package handlers

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/couchq/couchq/worker"
)

// The names New knows.
const (
	NameExec      = "exec"
	NameHTTPCheck = "http-check"
	NameNoop      = "noop"
	NameWebhook   = "webhook"
)

// DefaultHTTPTimeout bounds one http-check or webhook request when neither
// the payload nor Options say otherwise.
const DefaultHTTPTimeout = 10 * time.Second

// Options configures the handlers New builds. Each handler reads only the
// fields it needs.
type Options struct {
	// HTTPTimeout bounds each http-check and webhook request unless the
	// payload has a "timeout"; 0 means DefaultHTTPTimeout.
	HTTPTimeout time.Duration
	// Client sends http-check and webhook requests; nil means a client from
	// NewHTTPClient.
	Client *http.Client
	// Exec is the command (program and arguments) the exec handler runs
	// for every job. Required for exec.
	Exec []string
	// ExecDir is the exec command's working directory; empty means the
	// worker's.
	ExecDir string
	// ExecKillGrace is how long a cancelled exec command gets between
	// SIGTERM and SIGKILL; 0 means DefaultKillGrace.
	ExecKillGrace time.Duration
	// ExecEnv is the environment the exec command starts from (Exec.Env);
	// nil means the worker's own.
	ExecEnv []string
}

// Names lists the handler names New accepts, sorted.
func Names() []string {
	return []string{NameExec, NameHTTPCheck, NameNoop, NameWebhook}
}

// New builds the built-in handler called name. It fails on an unknown name
// and on options the handler cannot run with (such as exec without a
// command, or a command that cannot be found), so that the CLI can refuse
// to start instead of failing every job.
func New(name string, opts Options) (worker.Handler, error) {
	if opts.HTTPTimeout < 0 {
		return nil, fmt.Errorf("handler %s: HTTP timeout %s is negative", name, opts.HTTPTimeout)
	}
	if opts.ExecKillGrace < 0 {
		return nil, fmt.Errorf("handler %s: exec kill grace %s is negative", name, opts.ExecKillGrace)
	}
	client := opts.Client
	if client == nil {
		client = NewHTTPClient()
	}
	switch name {
	case NameHTTPCheck:
		return &HTTPCheck{Client: client, Timeout: opts.HTTPTimeout}, nil
	case NameNoop:
		return Noop{}, nil
	case NameWebhook:
		return &Webhook{Client: client, Timeout: opts.HTTPTimeout}, nil
	case NameExec:
		if err := checkCommand(opts.Exec, opts.ExecDir); err != nil {
			return nil, fmt.Errorf("handler exec: %w", err)
		}
		return &Exec{
			Argv:      append([]string(nil), opts.Exec...),
			Dir:       opts.ExecDir,
			KillGrace: opts.ExecKillGrace,
			Env:       opts.ExecEnv,
		}, nil
	default:
		return nil, fmt.Errorf("unknown handler %q (built-in handlers: %s)", name, strings.Join(Names(), ", "))
	}
}

// checkCommand reports early what would otherwise fail every exec job.
func checkCommand(argv []string, dir string) error {
	if len(argv) == 0 || argv[0] == "" {
		return errors.New("no command given: exec needs the program (and its arguments) to run for each job")
	}
	if dir != "" {
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return fmt.Errorf("working directory %q: not a directory the command can run in", dir)
		}
	}
	prog := argv[0]
	// A relative path with a separator is resolved against the command's
	// working directory by os/exec, so check it there too.
	if strings.ContainsRune(prog, filepath.Separator) && !filepath.IsAbs(prog) && dir != "" {
		prog = filepath.Join(dir, prog)
	}
	if _, err := exec.LookPath(prog); err != nil {
		return fmt.Errorf("command %q: %w", argv[0], err)
	}
	return nil
}
