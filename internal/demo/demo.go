// Package demo is couchq demo: a few seconds of couchq end to end, against
// the caller's CouchDB or a throwaway local server (an Apache CouchDB node
// from a local release, else PouchDB Server), printed as the commands it
// stands for would print.
package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/localserver"
	"github.com/couchq/couchq/internal/protocol"
)

// DBPrefix guards the demo's reset: it only ever deletes databases
// whose name says they belong to the demo.
const DBPrefix = "couchq_demo"

// demoStopTimeout bounds stopping the local server after an interrupt.
const demoStopTimeout = 15 * time.Second

// Options are what a run of the demo takes.
type Options struct {
	// Conn is the server to use, resolved but for a local server (Local).
	Conn *cli.Conn
	// Local starts a throwaway local server, whose URL Conn takes: a
	// single Apache CouchDB node from the local release, else PouchDB
	// Server.
	Local bool
	// Getenv reads the environment that names the local release
	// (localserver.FindCouchDB); nil is os.Getenv.
	Getenv func(string) string
	// Keep leaves the local server running until ctx ends.
	Keep bool
	// Out is where the steps print, as the commands they stand for would.
	Out cli.Output
	// Now is the clock of relative times.
	Now func() time.Time
	// Log receives the logs of the server and the workers.
	Log zerolog.Logger
}

// Run shows couchq end to end: it starts a server (or uses Conn's),
// creates a fresh database, enqueues a few jobs, lists them, runs them
// with two workers in-process, shows one with its history, and tells
// where to look.
func Run(ctx context.Context, opts Options) error {
	d := &demo{opts: opts, conn: opts.Conn, log: opts.Log, out: &indentWriter{w: opts.Out.Stdout, prefix: "    "}}
	defer d.cleanup(ctx)
	for _, step := range d.steps() {
		if err := step.run(ctx); err != nil {
			return fmt.Errorf("demo step %s: %w", step.name, err)
		}
	}
	if opts.Keep && d.local != nil {
		<-ctx.Done() // Ctrl-C is how --keep ends: not an error
	}
	return nil
}

// demo is one run of couchq demo. Each step uses what the earlier ones
// set up; the steps are a list so that more (starting workers, watching
// them finish jobs) slot in between.
type demo struct {
	opts Options
	log  zerolog.Logger // opts.Log
	conn *cli.Conn      // opts.Conn
	out  io.Writer      // step output, indented under the step's header

	local      localServer // nil when using the caller's server
	serverName string      // what local is, for messages
	dataDir    string
	client     *kivik.Client
	q          *protocol.Client
	showID     string // the job the show step displays
	retryID    string // the job that fails once, shown after the work
}

type demoStep struct {
	name string
	run  func(ctx context.Context) error
}

func (d *demo) steps() []demoStep {
	return []demoStep{
		{"server", d.startServer},
		{"init", d.initDB},
		{"enqueue", d.enqueue},
		{"ls", d.list},
		{"show", d.show},
		{"work", d.work},
		{"ls", d.list},
		{"show", d.showRetried},
		{"explore", d.explore},
	}
}

// header starts a step: what it does, usually as the equivalent command.
func (d *demo) header(format string, args ...any) {
	fmt.Fprintf(d.opts.Out.Stdout, "==> "+format+"\n", args...)
}

// localServer is the throwaway server the demo started.
type localServer interface {
	URL() string
	Stop(ctx context.Context) error
}

// startServer uses the caller's server, or starts one as the tests do: a
// single Apache CouchDB node from a local release (the reference server),
// else PouchDB Server, and says which and why.
func (d *demo) startServer(ctx context.Context) error {
	if !d.opts.Local {
		d.header("Using CouchDB at %s", d.conn.URL)
	} else {
		dir, err := os.MkdirTemp("", "couchq-demo-")
		if err != nil {
			return fmt.Errorf("creating a data directory: %w", err)
		}
		d.dataDir = dir
		getenv := d.opts.Getenv
		if getenv == nil {
			getenv = os.Getenv
		}
		home, noRelease := localserver.FindCouchDB(getenv)
		if noRelease == nil {
			d.header("Starting Apache CouchDB from %s, as COUCHDB_URL is not set", home)
			c, err := localserver.StartCouchDB(ctx, localserver.CouchDBOptions{Home: home, Nodes: 1, DataDir: dir, Logger: d.log})
			if err != nil {
				return err
			}
			d.local, d.serverName = c, "Apache CouchDB"
			d.conn.User, d.conn.Password = c.Credentials()
		} else {
			note := ""
			if !pouchDBInstalled() {
				note = " (installing it with npm first: this takes a minute, once)"
			}
			d.header("Starting PouchDB Server, a CouchDB-compatible server, as COUCHDB_URL is not set%s", note)
			fmt.Fprintf(d.out, "(%v)\n", noRelease)
			p, err := localserver.Start(ctx, localserver.Options{DataDir: dir, Logger: d.log})
			if err != nil {
				return err
			}
			d.local, d.serverName = p, "PouchDB Server"
		}
		d.conn.RawURL = d.local.URL()
		d.conn.URL = d.local.URL()
		fmt.Fprintf(d.out, "listening on %s, data in %s\n", d.local.URL(), dir)
	}
	client, err := d.conn.Dial(d.log)
	if err != nil {
		return err
	}
	d.client = client
	return nil
}

func (d *demo) initDB(ctx context.Context) error {
	d.header("couchq init --db %s", d.conn.DB)
	// A fresh database every run, so the listing below shows this run's
	// jobs only. The name was checked to belong to the demo.
	if d.local == nil {
		err := d.client.DestroyDB(ctx, d.conn.DB)
		if err != nil && !cli.IsNotFound(err) {
			return cli.ServerError(d.conn.URL, fmt.Errorf("deleting the previous demo database %s: %w", d.conn.DB, err))
		}
	}
	res, err := cli.InitDB(ctx, d.client, d.conn, protocol.InitOptions{}, d.log)
	if err != nil {
		return err
	}
	if err := cli.PrintInit(d.out, res, d.opts.Out.JSON); err != nil {
		return err
	}
	d.q, err = protocol.New(ctx, d.client.DB(d.conn.DB), protocol.Config{Logger: d.log, Actor: "cli"})
	if err != nil {
		return cli.ServerError(d.conn.URL, err)
	}
	return nil
}

func (d *demo) enqueue(ctx context.Context) error {
	now := d.opts.Now()
	one := func(flags string, job protocol.NewJob) (*protocol.WorkItem, error) {
		d.header("couchq enqueue %s", flags)
		it, dup, err := cli.EnqueueOne(ctx, d.q, job)
		if err != nil {
			return nil, err
		}
		return it, cli.PrintEnqueued(d.out, it, dup, d.opts.Out.JSON)
	}
	first, err := one(`--type email --payload '{"to":"ada@example.com","template":"welcome"}'`, protocol.NewJob{
		Worker: "email", Payload: json.RawMessage(`{"to":"ada@example.com","template":"welcome"}`),
	})
	if err != nil {
		return err
	}
	d.showID = first.ID
	if _, err := one(`--type email --payload '{"to":"grace@example.com","template":"welcome"}'`, protocol.NewJob{
		Worker: "email", Payload: json.RawMessage(`{"to":"grace@example.com","template":"welcome"}`),
	}); err != nil {
		return err
	}
	thumb, err := one(`--type thumbnail --payload '{"image":"cat.png","width":128}' --max-attempts 3`, protocol.NewJob{
		Worker: "thumbnail", Payload: json.RawMessage(`{"image":"cat.png","width":128}`), MaxAttempts: 3,
	})
	if err != nil {
		return err
	}
	d.retryID = thumb.ID
	// The report is unique per day: enqueueing it again finds the first.
	report := protocol.NewJob{
		Worker: "report", Payload: json.RawMessage(`{"period":"daily"}`), At: now.Add(2 * time.Second),
		Unique: protocol.UniqueOpts{Key: "daily", For: 24 * time.Hour},
	}
	for range 2 {
		if _, err := one(`--type report --payload '{"period":"daily"}' --in 2s --unique-key daily --unique-for 24h`, report); err != nil {
			return err
		}
	}
	const pings = 6
	d.header("couchq enqueue --file pings.jsonl   (%d ping jobs in one _bulk_docs request)", pings)
	jobs := make([]cli.FileJob, pings)
	for i := range jobs {
		jobs[i] = cli.FileJob{Line: i + 1, Job: protocol.NewJob{Worker: "ping", Payload: map[string]int{"n": i + 1}}}
	}
	out := d.opts.Out
	out.Stdout = d.out
	return cli.EnqueueFile(ctx, d.q, "pings.jsonl", jobs, out)
}

func (d *demo) list(ctx context.Context) error {
	d.header("couchq ls")
	batch, err := d.q.List(ctx, protocol.ListOptions{Limit: 100})
	if err != nil {
		return err
	}
	return cli.PrintJobs(ctx, d.out, d.q, batch, 100, d.opts.Now(), d.opts.Out.JSON)
}

func (d *demo) show(ctx context.Context) error {
	d.header("couchq show %s", d.showID)
	return cli.ShowJob(ctx, d.out, d.q, d.showID, d.opts.Now(), d.opts.Out.JSON)
}

func (d *demo) explore(ctx context.Context) error {
	base := withoutUser(protocol.SplitNodeURLs(d.conn.RawURL)[0])
	d.header("Look around")
	if d.fauxtonServed(ctx, base) {
		fmt.Fprintf(d.out, "Fauxton, CouchDB's web UI: %s/_utils/#/database/%s/_all_docs\n", base, url.PathEscape(d.conn.DB))
	} else {
		fmt.Fprintf(d.out, "Fauxton, CouchDB's web UI: not served at %s/_utils/ (a server built without it)\n", base)
	}
	switch {
	case d.local == nil:
		fmt.Fprintf(d.out, "the CLI:                   couchq ls --db %s\n", d.conn.DB)
	case d.opts.Keep:
		env := "COUCHDB_URL=" + base
		if d.conn.User != "" {
			// This server's own admin, made up for this run: the way in
			// to Fauxton and the CLI while it runs.
			env += " COUCHDB_USER=" + d.conn.User + " COUCHDB_PASSWORD=" + d.conn.Password
			fmt.Fprintf(d.out, "Fauxton's login:           %s, password %s\n", d.conn.User, d.conn.Password)
		}
		fmt.Fprintf(d.out, "the CLI:                   %s couchq ls --db %s\n", env, d.conn.DB)
		fmt.Fprintf(d.out, "%s keeps running: press Ctrl-C to stop it.\n", d.serverName)
	default:
		fmt.Fprintln(d.out, "(run 'couchq demo --keep' to keep the server running while you look)")
	}
	return nil
}

// fauxtonServed says whether the server at base serves Fauxton: a CouchDB
// release can be built without it, and then a link to it is a 404. It asks
// with the connection's own HTTP client (its CA file, its nodes).
func (d *demo) fauxtonServed(ctx context.Context, base string) bool {
	hc, err := d.conn.HTTPClient(d.log)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, fauxtonCheckTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/_utils/", nil)
	if err != nil {
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// fauxtonCheckTimeout bounds fauxtonServed: the demo's last lines must not
// wait on a slow answer.
const fauxtonCheckTimeout = 2 * time.Second

// cleanup stops the local server, even after an interrupt, and removes its
// data directory.
func (d *demo) cleanup(ctx context.Context) {
	if d.client != nil {
		_ = d.client.Close()
	}
	if d.local == nil {
		if d.dataDir != "" {
			_ = os.RemoveAll(d.dataDir)
		}
		return
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), demoStopTimeout)
	defer cancel()
	if err := d.local.Stop(stopCtx); err != nil {
		d.log.Warn().Err(err).Str("data_dir", d.dataDir).Msg("stopping " + d.serverName)
		return
	}
	_ = os.RemoveAll(d.dataDir)
	d.header("Stopped %s", d.serverName)
}

// pouchDBInstalled guesses whether starting PouchDB Server will run npm
// first; it only changes what the demo says while it waits.
func pouchDBInstalled() bool {
	dir, err := localserver.ToolsDir()
	if err != nil {
		return true // Start will explain the problem
	}
	_, err = os.Stat(filepath.Join(dir, "node_modules", ".bin", "pouchdb-server"))
	return err == nil
}

// withoutUser drops credentials from a URL meant to be clicked or pasted.
func withoutUser(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return protocol.Redact(raw)
	}
	u.User = nil
	return strings.TrimRight(u.String(), "/")
}

// indentWriter prefixes every line written through it.
type indentWriter struct {
	w       io.Writer
	prefix  string
	midLine bool
}

func (iw *indentWriter) Write(p []byte) (int, error) {
	out := make([]byte, 0, len(p)+len(iw.prefix))
	for _, c := range p {
		if !iw.midLine && c != '\n' {
			out = append(out, iw.prefix...)
		}
		out = append(out, c)
		iw.midLine = c != '\n'
	}
	if _, err := iw.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}
