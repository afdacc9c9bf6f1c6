package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/localserver"
	"github.com/couchq/couchq/internal/protocol"
)

const demoUsage = `Usage: couchq demo [--keep] [flags]

Shows couchq end to end in a few seconds. Without --url or $COUCHDB_URL it
starts a throwaway PouchDB Server (installing it with npm the first time);
otherwise it uses that server. It then creates a fresh database, enqueues
a few jobs, lists them, starts two workers in-process that run them all
(one fails once and is retried), lists them again, shows the retried one
with its history, and tells you where to look.

The database is couchq_demo unless --db names another one starting with
couchq_demo; it is deleted and created again on every run.

	--keep   leave the local server running until Ctrl-C, to explore it
`

// demoDBPrefix guards the demo's reset: it only ever deletes databases
// whose name says they belong to the demo.
const demoDBPrefix = "couchq_demo"

// demoStopTimeout bounds stopping the local server after an interrupt.
const demoStopTimeout = 15 * time.Second

// demo is one run of couchq demo. Each step uses what the earlier ones
// set up; the steps are a list so that more (starting workers, watching
// them finish jobs) slot in between.
type demo struct {
	m    *Main
	log  zerolog.Logger
	conn *connFlags
	keep bool
	out  io.Writer // step output, indented under the step's header

	local   *localserver.PouchDB // nil when using the caller's server
	dataDir string
	client  *kivik.Client
	q       *protocol.Client
	showID  string // the job the show step displays
	retryID string // the job that fails once, shown after the work
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

func (m *Main) runDemo(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("demo", demoUsage)
	conn := addConnFlags(fs)
	d := &demo{m: m, conn: conn, out: &indentWriter{w: m.Stdout, prefix: "    "}}
	fs.BoolVar(&d.keep, "keep", false, "keep the local server running until Ctrl-C")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageErrorf("unexpected argument %q", rest[0])
	}
	useLocal := conn.url == "" && m.Getenv("COUCHDB_URL") == ""
	if conn.db == "" {
		// Not $COUCHQ_DB: that names the real queue, which the demo resets.
		conn.db = demoDBPrefix
	}
	if !strings.HasPrefix(conn.db, demoDBPrefix) {
		return usageErrorf("invalid --db %q: the demo deletes its database, so the name must start with %s", conn.db, demoDBPrefix)
	}
	if !useLocal { // else the URL is the local server's, once it listens
		if err := conn.resolveURL(m); err != nil {
			return err
		}
		if err := conn.resolveCredentials(m); err != nil {
			return err
		}
	}
	if err := conn.resolveOthers(m); err != nil {
		return err
	}
	d.log = log.Level(conn.level)

	defer d.cleanup(ctx)
	for _, step := range d.steps() {
		if err := step.run(ctx); err != nil {
			return fmt.Errorf("demo step %s: %w", step.name, err)
		}
	}
	if d.keep && d.local != nil {
		<-ctx.Done() // Ctrl-C is how --keep ends: not an error
	}
	return nil
}

// header starts a step: what it does, usually as the equivalent command.
func (d *demo) header(format string, args ...any) {
	fmt.Fprintf(d.m.Stdout, "==> "+format+"\n", args...)
}

func (d *demo) startServer(ctx context.Context) error {
	if d.conn.rawURL != "" {
		d.header("Using CouchDB at %s", d.conn.url)
	} else {
		note := ""
		if !pouchDBInstalled() {
			note = " (installing it with npm first: this takes a minute, once)"
		}
		d.header("Starting PouchDB Server, a CouchDB-compatible server, as COUCHDB_URL is not set%s", note)
		dir, err := os.MkdirTemp("", "couchq-demo-")
		if err != nil {
			return fmt.Errorf("creating a data directory: %w", err)
		}
		d.dataDir = dir
		d.local, err = localserver.Start(ctx, localserver.Options{DataDir: dir, Logger: d.log})
		if err != nil {
			return err
		}
		d.conn.rawURL = d.local.URL()
		d.conn.url = d.local.URL()
		fmt.Fprintf(d.out, "listening on %s, data in %s\n", d.local.URL(), dir)
	}
	client, err := d.m.dial(d.conn, d.log)
	if err != nil {
		return err
	}
	d.client = client
	return nil
}

func (d *demo) initDB(ctx context.Context) error {
	d.header("couchq init --db %s", d.conn.db)
	// A fresh database every run, so the listing below shows this run's
	// jobs only. The name was checked to belong to the demo.
	if d.local == nil {
		err := d.client.DestroyDB(ctx, d.conn.db)
		if err != nil && !isNotFound(err) {
			return serverError(d.conn.url, fmt.Errorf("deleting the previous demo database %s: %w", d.conn.db, err))
		}
	}
	res, err := initDB(ctx, d.client, d.conn, protocol.InitOptions{}, d.log)
	if err != nil {
		return err
	}
	if err := printInit(d.out, res, d.conn.json); err != nil {
		return err
	}
	d.q, err = protocol.New(ctx, d.client.DB(d.conn.db), protocol.Config{Logger: d.log, Actor: "cli"})
	if err != nil {
		return serverError(d.conn.url, err)
	}
	return nil
}

func (d *demo) enqueue(ctx context.Context) error {
	now := d.m.Now()
	one := func(flags string, job protocol.NewJob) (*protocol.WorkItem, error) {
		d.header("couchq enqueue %s", flags)
		it, dup, err := enqueueOne(ctx, d.q, job)
		if err != nil {
			return nil, err
		}
		return it, printEnqueued(d.out, it, dup, d.conn.json)
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
	jobs := make([]fileJob, pings)
	for i := range jobs {
		jobs[i] = fileJob{line: i + 1, job: protocol.NewJob{Worker: "ping", Payload: map[string]int{"n": i + 1}}}
	}
	m := *d.m
	m.Stdout = d.out
	return m.enqueueFile(ctx, d.q, "pings.jsonl", jobs, d.conn.json)
}

func (d *demo) list(ctx context.Context) error {
	d.header("couchq ls")
	batch, err := d.q.List(ctx, protocol.ListOptions{Limit: 100})
	if err != nil {
		return err
	}
	return printJobs(d.out, d.q, batch, 100, d.m.Now(), d.conn.json)
}

func (d *demo) show(ctx context.Context) error {
	d.header("couchq show %s", d.showID)
	return showJob(ctx, d.out, d.q, d.showID, d.m.Now(), d.conn.json)
}

func (d *demo) explore(context.Context) error {
	base := withoutUser(protocol.SplitNodeURLs(d.conn.rawURL)[0])
	d.header("Look around")
	fmt.Fprintf(d.out, "Fauxton, CouchDB's web UI: %s/_utils/#/database/%s/_all_docs\n", base, url.PathEscape(d.conn.db))
	switch {
	case d.local == nil:
		fmt.Fprintf(d.out, "the CLI:                   couchq ls --db %s\n", d.conn.db)
	case d.keep:
		fmt.Fprintf(d.out, "the CLI:                   COUCHDB_URL=%s couchq ls --db %s\n", base, d.conn.db)
		fmt.Fprintln(d.out, "PouchDB Server keeps running: press Ctrl-C to stop it.")
	default:
		fmt.Fprintln(d.out, "(run 'couchq demo --keep' to keep the server running while you look)")
	}
	return nil
}

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
		d.log.Warn().Err(err).Str("data_dir", d.dataDir).Msg("stopping PouchDB Server")
		return
	}
	_ = os.RemoveAll(d.dataDir)
	d.header("Stopped PouchDB Server")
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
