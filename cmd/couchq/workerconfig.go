package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/couchq/couchq/handlers"
	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// The worker configuration file (couchq worker --config F): TOML, read
// strictly (an unknown key is an error naming the file, line and key).
// Every key of a type's table is optional; [defaults] gives values for all
// types, the built-in defaults the rest, and flags given on the command
// line override both for every type.
//
//	[couchdb]
//	url = ["http://couch1:5984", "http://couch2:5984"]  # or one string
//	user = "couchq-worker"
//	password_file = "/run/secrets/couchq"   # or password_env = "VAR"
//	ca_file = "/etc/couchq/ca.pem"
//	db = "couchq"
//
//	[defaults]
//	concurrency = 4
//
//	[types.email]
//	handler = "exec"
//	exec = "/usr/local/bin/send-mail --from ops@example.com"
//	concurrency = 8
//	lease = "1m"
//	max_attempts = 5
//	retry_delay = "30s"        # fixed delay; without it attempt^4 s backoff
//	delete_done = true
//	rate = "10/s"              # fleet-wide starts
//	fleet_concurrency = 20     # fleet-wide running
//	http_timeout = "10s"       # http-check and webhook
//
//	[[periodic]]
//	type = "report"
//	schedule = "0 7 * * 1-5"
//	timezone = "Europe/Berlin"
//	catch_up = "once"
//	priority = 2               # of the jobs it enqueues: 1 (first) to 5
//
// Passwords are never written in the file itself: password_file names a
// file holding it (mode 0600), password_env an environment variable.
type workerFile struct {
	CouchDB  fileConn            `toml:"couchdb"`
	Defaults fileType            `toml:"defaults"`
	Types    map[string]fileType `toml:"types"`
	Periodic []filePeriodic      `toml:"periodic"`
	Worker   fileProcess         `toml:"worker"`
}

type fileConn struct {
	URL          any    `toml:"url"` // a string or a list of strings
	User         string `toml:"user"`
	PasswordFile string `toml:"password_file"`
	PasswordEnv  string `toml:"password_env"`
	CAFile       string `toml:"ca_file"`
	DB           string `toml:"db"`
}

// fileProcess holds the settings of the whole process rather than a type.
type fileProcess struct {
	ShutdownTimeout *fileDuration `toml:"shutdown_timeout"`
	LogLevel        string        `toml:"log_level"`
	// HealthAddr is where the process serves /healthz, /readyz, /metrics.
	HealthAddr string `toml:"health_addr"`
}

type fileType struct {
	Handler          string        `toml:"handler"`
	Exec             string        `toml:"exec"`
	HTTPTimeout      *fileDuration `toml:"http_timeout"`
	Concurrency      *int          `toml:"concurrency"`
	Lease            *fileDuration `toml:"lease"`
	MaxAttempts      *int          `toml:"max_attempts"`
	RetryDelay       *fileDuration `toml:"retry_delay"`
	DeleteDone       *bool         `toml:"delete_done"`
	Rate             string        `toml:"rate"`
	FleetConcurrency *int          `toml:"fleet_concurrency"`
	Heartbeat        *fileDuration `toml:"heartbeat"`
	SweepInterval    *fileDuration `toml:"sweep_interval"`
	FeedTimeout      *fileDuration `toml:"feed_timeout"`
	QueryTimeout     *fileDuration `toml:"query_timeout"`
	FallbackPoll     *fileDuration `toml:"fallback_poll"`
}

type filePeriodic struct {
	Type     string `toml:"type"`
	Schedule string `toml:"schedule"`
	Timezone string `toml:"timezone"`
	CatchUp  string `toml:"catch_up"`
	// Priority of the jobs the schedule enqueues: 1 (first) to 5.
	Priority int `toml:"priority"`
}

// fileDuration is a Go duration written as a string ("30s", "1m30s").
type fileDuration struct{ time.Duration }

func (d *fileDuration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("invalid duration %q: want e.g. \"30s\" or \"1m\"", b)
	}
	d.Duration = v
	return nil
}

// urls reads [couchdb] url: one string or a list of strings.
func (c fileConn) urls() ([]string, error) {
	switch v := c.URL.(type) {
	case nil:
		return nil, nil
	case string:
		return []string{v}, nil
	case []any:
		out := make([]string, 0, len(v))
		for _, e := range v {
			s, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("want a string or a list of strings")
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, fmt.Errorf("want a string or a list of strings")
}

// fileError is a mistake in the configuration file, with where it is.
type fileError struct {
	file string
	line int
	key  string
	msg  string
}

func (e *fileError) Error() string {
	where := e.file
	if e.line > 0 {
		where += ":" + strconv.Itoa(e.line)
	}
	if e.key != "" {
		return fmt.Sprintf("%s: %s: %s", where, e.key, e.msg)
	}
	return fmt.Sprintf("%s: %s", where, e.msg)
}

// loadWorkerFile reads and decodes the file strictly.
func loadWorkerFile(path string) (*workerFile, []byte, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, cli.Usagef("reading --config: %v", err)
	}
	var wf workerFile
	dec := toml.NewDecoder(bytes.NewReader(src))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&wf); err != nil {
		var de *toml.DecodeError
		var se *toml.StrictMissingError
		switch {
		case errors.As(err, &se) && len(se.Errors) > 0:
			first := se.Errors[0]
			row, _ := first.Position()
			return nil, nil, &cli.UsageError{Err: &fileError{file: path, line: row, key: strings.Join(first.Key(), "."),
				msg: "unknown key (see 'couchq help worker' for the file's keys)"}}
		case errors.As(err, &de):
			row, _ := de.Position()
			msg := strings.TrimPrefix(de.Error(), "toml: ")
			return nil, nil, &cli.UsageError{Err: &fileError{file: path, line: row, key: strings.Join(de.Key(), "."), msg: msg}}
		}
		return nil, nil, cli.Usagef("reading --config %s: %v", path, err)
	}
	return &wf, src, nil
}

// keyLine finds the line of key in table (e.g. "types.email") in src, for
// errors found after decoding; 0 when it cannot tell.
func keyLine(src []byte, table, key string) int {
	header := regexp.MustCompile(`^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$`)
	keyRE := regexp.MustCompile(`^\s*"?` + regexp.QuoteMeta(key) + `"?\s*=`)
	current := ""
	for i, line := range strings.Split(string(src), "\n") {
		if m := header.FindStringSubmatch(line); m != nil {
			current = strings.ReplaceAll(strings.ReplaceAll(m[1], `"`, ""), " ", "")
			if key == "" && current == table {
				return i + 1
			}
			continue
		}
		if key != "" && current == table && keyRE.MatchString(line) {
			return i + 1
		}
	}
	return 0
}

// workerSpecs turns the file and the command line into one set of worker
// flags per job type, each checked as the command line alone would be.
// flags holds the flags given on the command line (flags.set says which).
func workerSpecs(path string, wf *workerFile, src []byte, flags *workerFlags) ([]*workerFlags, error) {
	if len(wf.Types) == 0 {
		return nil, &cli.UsageError{Err: &fileError{file: path, msg: "no [types.NAME] tables: name at least one job type to run"}}
	}
	types := make([]string, 0, len(wf.Types))
	for t := range wf.Types {
		types = append(types, t)
	}
	slices.Sort(types)
	if flags.types != "" {
		// --type with --config runs only those of the file's types.
		var only []string
		for _, t := range strings.Split(flags.types, ",") {
			t = strings.TrimSpace(t)
			if _, ok := wf.Types[t]; !ok {
				return nil, cli.Usagef("--type %s: %s has no [types.%s] table", t, path, t)
			}
			only = append(only, t)
		}
		types = only
	}
	var specs []*workerFlags
	for _, t := range types {
		table := "types." + t
		ft := merge(wf.Defaults, wf.Types[t])
		fail := func(key, format string, args ...any) error {
			line := keyLine(src, table, key)
			if line == 0 {
				line = keyLine(src, "defaults", key)
			}
			if line == 0 { // a key missing: the type's table
				line = keyLine(src, table, "")
			}
			return &cli.UsageError{Err: &fileError{file: path, line: line, key: table + "." + key, msg: fmt.Sprintf(format, args...)}}
		}
		f := &workerFlags{
			types: t, handler: ft.Handler, exec: ft.Exec,
			httpTimeout: handlers.DefaultHTTPTimeout, concurrency: worker.ConcurrencyDefault,
			lease: worker.LeaseDurationDefault, maxAttempts: protocol.MaxAttemptsDefault,
			shutdownTimeout: worker.ShutdownTimeoutDefault, feedTimeout: worker.FeedTimeoutDefault,
			queryTimeout: worker.QueryTimeoutDefault,
			fallbackPoll: worker.FallbackPollDefault, periodicTZ: "UTC", catchUp: "once",
			set: map[string]bool{},
		}
		if ft.Handler == "" {
			return nil, fail("handler", "required: one of %s", strings.Join(handlers.Names(), ", "))
		}
		if !slices.Contains(handlers.Names(), ft.Handler) {
			return nil, fail("handler", "unknown handler %q: want one of %s", ft.Handler, strings.Join(handlers.Names(), ", "))
		}
		if ft.Exec != "" && ft.Handler != handlers.NameExec {
			return nil, fail("exec", "only for handler %q", handlers.NameExec)
		}
		setDur := func(key string, v *fileDuration, dst *time.Duration, positive bool) error {
			if v == nil {
				return nil
			}
			if positive && v.Duration <= 0 {
				return fail(key, "must be positive, got %s", v.Duration)
			}
			*dst = v.Duration
			f.set[strings.ReplaceAll(key, "_", "-")] = true
			return nil
		}
		setInt := func(key string, v *int, dst *int) error {
			if v == nil {
				return nil
			}
			if *v < 1 {
				return fail(key, "must be at least 1, got %d", *v)
			}
			*dst = *v
			return nil
		}
		for _, err := range []error{
			setDur("http_timeout", ft.HTTPTimeout, &f.httpTimeout, true),
			setDur("lease", ft.Lease, &f.lease, true),
			setDur("retry_delay", ft.RetryDelay, &f.retryDelay, false),
			setDur("heartbeat", ft.Heartbeat, &f.heartbeat, true),
			setDur("sweep_interval", ft.SweepInterval, &f.sweepInterval, false),
			setDur("feed_timeout", ft.FeedTimeout, &f.feedTimeout, true),
			setDur("query_timeout", ft.QueryTimeout, &f.queryTimeout, true),
			setDur("fallback_poll", ft.FallbackPoll, &f.fallbackPoll, true),
			setInt("concurrency", ft.Concurrency, &f.concurrency),
			setInt("max_attempts", ft.MaxAttempts, &f.maxAttempts),
		} {
			if err != nil {
				return nil, err
			}
		}
		if ft.RetryDelay != nil && ft.RetryDelay.Duration < 0 {
			return nil, fail("retry_delay", "must not be negative, got %s", ft.RetryDelay.Duration)
		}
		if ft.DeleteDone != nil {
			f.deleteDone = *ft.DeleteDone
		}
		if wf.Worker.ShutdownTimeout != nil {
			if wf.Worker.ShutdownTimeout.Duration <= 0 {
				return nil, &cli.UsageError{Err: &fileError{file: path, line: keyLine(src, "worker", "shutdown_timeout"),
					key: "worker.shutdown_timeout", msg: "must be positive"}}
			}
			f.shutdownTimeout = wf.Worker.ShutdownTimeout.Duration
		}
		f.healthAddr = wf.Worker.HealthAddr
		if ft.Rate != "" {
			if _, err := protocol.ParseRate(ft.Rate); err != nil {
				return nil, fail("rate", "%v", err)
			}
			f.rates = repeatedFlag{t + "=" + ft.Rate}
		}
		if ft.FleetConcurrency != nil {
			if *ft.FleetConcurrency < 1 || *ft.FleetConcurrency > protocol.MaxRateSlots {
				return nil, fail("fleet_concurrency", "must be from 1 to %d, got %d", protocol.MaxRateSlots, *ft.FleetConcurrency)
			}
			f.fleet = repeatedFlag{t + "=" + strconv.Itoa(*ft.FleetConcurrency)}
		}
		flags.overrideInto(f)
		if err := f.check(); err != nil {
			var ue *cli.UsageError
			if errors.As(err, &ue) {
				return nil, &cli.UsageError{Err: &fileError{file: path, line: keyLine(src, table, ""), key: table,
					msg: strings.ReplaceAll(ue.Error(), "--", "")}}
			}
			return nil, err
		}
		specs = append(specs, f)
	}
	// Periodic schedules run in the first worker of the process; the type
	// they enqueue need not be one it runs.
	seen := map[string]bool{}
	for i, p := range wf.Periodic {
		key := fmt.Sprintf("periodic[%d]", i)
		failP := func(format string, args ...any) error {
			return &cli.UsageError{Err: &fileError{file: path, line: periodicLine(src, i), key: key, msg: fmt.Sprintf(format, args...)}}
		}
		if p.Type == "" || p.Schedule == "" {
			return nil, failP("type and schedule are required")
		}
		if seen[p.Type] {
			return nil, failP("a schedule for %s is already given", p.Type)
		}
		seen[p.Type] = true
		loc, err := time.LoadLocation(orDefault(p.Timezone, "UTC"))
		if err != nil {
			return nil, failP("timezone: %v", err)
		}
		catchUp := protocol.CatchUpOnce
		switch p.CatchUp {
		case "", "once":
		case "all":
			catchUp = protocol.CatchUpAll
		default:
			return nil, failP("catch_up: want once or all, got %q", p.CatchUp)
		}
		if p.Priority != 0 && (p.Priority < protocol.PriorityHighest || p.Priority > protocol.PriorityLowest) {
			return nil, failP("priority: want %d (first) to %d, got %d", protocol.PriorityHighest, protocol.PriorityLowest, p.Priority)
		}
		sched := protocol.Periodic{Name: p.Type, Schedule: p.Schedule, Location: loc, Job: protocol.NewJob{Worker: p.Type, Priority: p.Priority}, CatchUp: catchUp}
		if _, err := protocol.CheckPeriodic(sched); err != nil {
			return nil, failP("%v", err)
		}
		specs[0].schedules = append(specs[0].schedules, sched)
	}
	return specs, nil
}

// periodicLine is the line of the i-th [[periodic]] table.
func periodicLine(src []byte, i int) int {
	n := -1
	for j, line := range strings.Split(string(src), "\n") {
		if strings.TrimSpace(line) == "[[periodic]]" {
			if n++; n == i {
				return j + 1
			}
		}
	}
	return 0
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// merge is a type's table over [defaults].
func merge(def, t fileType) fileType {
	out := def
	if t.Handler != "" {
		out.Handler = t.Handler
	}
	if t.Exec != "" {
		out.Exec = t.Exec
	}
	if t.Rate != "" {
		out.Rate = t.Rate
	}
	for _, p := range []struct{ dst, src **fileDuration }{
		{&out.HTTPTimeout, &t.HTTPTimeout}, {&out.Lease, &t.Lease}, {&out.RetryDelay, &t.RetryDelay},
		{&out.Heartbeat, &t.Heartbeat}, {&out.SweepInterval, &t.SweepInterval},
		{&out.FeedTimeout, &t.FeedTimeout}, {&out.QueryTimeout, &t.QueryTimeout}, {&out.FallbackPoll, &t.FallbackPoll},
	} {
		if *p.src != nil {
			*p.dst = *p.src
		}
	}
	for _, p := range []struct{ dst, src **int }{
		{&out.Concurrency, &t.Concurrency}, {&out.MaxAttempts, &t.MaxAttempts}, {&out.FleetConcurrency, &t.FleetConcurrency},
	} {
		if *p.src != nil {
			*p.dst = *p.src
		}
	}
	if t.DeleteDone != nil {
		out.DeleteDone = t.DeleteDone
	}
	return out
}

// overrideInto copies the flags given on the command line (other than
// --type) over a file-made spec: flags win over the file.
func (o *workerFlags) overrideInto(f *workerFlags) {
	for name := range o.set {
		f.set[name] = true
		switch name {
		case "handler":
			f.handler = o.handler
		case "exec":
			f.exec = o.exec
		case "http-timeout":
			f.httpTimeout = o.httpTimeout
		case "concurrency":
			f.concurrency = o.concurrency
		case "lease":
			f.lease = o.lease
		case "drain":
			f.drain = o.drain
		case "delete-done":
			f.deleteDone = o.deleteDone
		case "max-attempts":
			f.maxAttempts = o.maxAttempts
		case "shutdown-timeout":
			f.shutdownTimeout = o.shutdownTimeout
		case "heartbeat":
			f.heartbeat = o.heartbeat
		case "sweep-interval":
			f.sweepInterval = o.sweepInterval
		case "feed-timeout":
			f.feedTimeout = o.feedTimeout
		case "query-timeout":
			f.queryTimeout = o.queryTimeout
		case "fallback-poll":
			f.fallbackPoll = o.fallbackPoll
		case "retry-delay":
			f.retryDelay = o.retryDelay
		case "health-addr":
			f.healthAddr = o.healthAddr
		}
	}
	// --rate and --fleet-concurrency for this type replace the file's.
	for _, list := range []struct{ dst, src *repeatedFlag }{{&f.rates, &o.rates}, {&f.fleet, &o.fleet}} {
		for _, v := range *list.src {
			if typ, _, _ := strings.Cut(v, "="); strings.TrimSpace(typ) == f.types {
				*list.dst = repeatedFlag{v}
			}
		}
	}
}

// applyFileConn fills the connection flags the command line left unset
// from the file's [couchdb] table.
func applyFileConn(m *Main, path string, src []byte, conn *connFlags, given map[string]bool, c fileConn) error {
	urls, err := c.urls()
	if err != nil {
		return &cli.UsageError{Err: &fileError{file: path, line: keyLine(src, "couchdb", "url"), key: "couchdb.url", msg: err.Error()}}
	}
	// Flags, then the environment, then the file: a deployment (a systemd
	// credential, a compose secret) overrides the shared file without
	// editing it.
	env := func(name string) bool { return m.Getenv(name) != "" }
	if !given["url"] && !env("COUCHDB_URL") && len(urls) > 0 {
		conn.URL = strings.Join(urls, ",")
	}
	if !given["db"] && !env("COUCHQ_DB") && c.DB != "" {
		conn.DB = c.DB
	}
	if !given["user"] && !env("COUCHDB_USER") && c.User != "" {
		conn.User = c.User
	}
	if !given["ca-file"] && c.CAFile != "" {
		conn.CAFile = c.CAFile
	}
	if c.PasswordFile != "" && c.PasswordEnv != "" {
		return cli.Usagef("[couchdb] gives both password_file and password_env: keep one")
	}
	if !given["password-file"] && !env("COUCHDB_PASSWORD_FILE") && !env("COUCHDB_PASSWORD") {
		switch {
		case c.PasswordFile != "":
			conn.PasswordFile = c.PasswordFile
		case c.PasswordEnv != "":
			pw := m.Getenv(c.PasswordEnv)
			if pw == "" {
				return cli.Usagef("[couchdb] password_env: $%s is empty or unset", c.PasswordEnv)
			}
			conn.FixedPassword = pw
			m.addSecret(pw)
		}
	}
	return nil
}

// printWorkerCheck prints the effective settings of every type (no
// secrets: the password's source, never the password).
func printWorkerCheck(w io.Writer, conn *connFlags, specs []*workerFlags) error {
	pw := "none"
	switch {
	case conn.PasswordFile != "":
		pw = "from file " + conn.PasswordFile
	case conn.FixedPassword != "":
		pw = "from the environment"
	case conn.Password != "":
		pw = "from $COUCHDB_PASSWORD"
	}
	fmt.Fprintf(w, "couchdb: %s database %s user %s password %s", conn.URL, conn.DB, orDefault(conn.User, "(none)"), pw)
	if conn.CAFile != "" {
		fmt.Fprintf(w, " ca_file %s", conn.CAFile)
	}
	fmt.Fprintln(w)
	for _, f := range specs {
		retry := "backoff attempt^4 s"
		if f.set["retry-delay"] {
			retry = "fixed " + f.retryDelay.String()
		}
		fmt.Fprintf(w, "type %s: handler %s", f.types, f.handler)
		if f.exec != "" {
			fmt.Fprintf(w, " exec %q", f.exec)
		}
		fmt.Fprintf(w, ", concurrency %d, lease %s, heartbeat %s, max_attempts %d, retry %s, delete_done %v, http_timeout %s",
			f.concurrency, f.lease, f.heartbeatInterval(), f.maxAttempts, retry, f.deleteDone, f.httpTimeout)
		if rl, ok := f.rateLimits[f.types]; ok {
			fmt.Fprintf(w, ", rate %d/%s", rl.N, rl.Per)
		}
		if k, ok := f.fleetLimits[f.types]; ok {
			fmt.Fprintf(w, ", fleet_concurrency %d", k)
		}
		fmt.Fprintln(w)
		for _, p := range f.schedules {
			fmt.Fprintf(w, "periodic %s: %q in %s, catch up %s, priority %d\n", p.Name, p.Schedule, p.Location,
				map[protocol.CatchUp]string{protocol.CatchUpOnce: "once", protocol.CatchUpAll: "all"}[p.CatchUp], (&protocol.WorkItem{Priority: p.Job.Priority}).EffectivePriority())
		}
	}
	_, err := fmt.Fprintf(w, "shutdown_timeout %s\n", specs[0].shutdownTimeout)
	return err
}
