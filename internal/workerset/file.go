package workerset

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/handlers"
	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
)

// workerFile is a worker configuration file (couchq worker --config F,
// fleet.Load): TOML, read strictly (an unknown key is an error naming the
// file, line and key). Every key of a type's table is optional; [defaults]
// gives values for all types, the built-in defaults the rest, and flags
// given on the command line override both for every type. Package fleet's
// documentation shows every key.
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
	Site         string `toml:"site"`
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
	JobTimeout       *fileDuration `toml:"job_timeout"`
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
	// Payload of the jobs the schedule enqueues: any TOML value, handed
	// to the handler as JSON.
	Payload any `toml:"payload"`
}

// fileDuration is a Go duration written as a string ("30s", "1m30s").
type fileDuration struct{ time.Duration }

func (d *fileDuration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return &durationError{value: string(b)}
	}
	d.Duration = v
	return nil
}

// durationError is a value that is no duration.
type durationError struct{ value string }

func (e *durationError) Error() string {
	return fmt.Sprintf("invalid duration %q: want a string such as \"30s\" or \"1m\"", e.value)
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

// File is a worker configuration file, read and decoded.
type File struct {
	path string
	src  []byte
	wf   workerFile
}

// LoadFile reads and decodes the file at path strictly.
func LoadFile(path string) (*File, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, cli.Usagef("reading --config: %w", err)
	}
	f := &File{path: path, src: src}
	dec := toml.NewDecoder(bytes.NewReader(src))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f.wf); err != nil {
		var de *toml.DecodeError
		var se *toml.StrictMissingError
		switch {
		case errors.As(err, &se) && len(se.Errors) > 0:
			first := se.Errors[0]
			row, _ := first.Position()
			return nil, f.fail(row, strings.Join(first.Key(), "."), "unknown key (see 'couchq help worker' for the file's keys)")
		case errors.As(err, &de):
			row, _ := de.Position()
			return nil, f.fail(row, strings.Join(de.Key(), "."), "%s", plainDecodeError(de.Error()))
		}
		var bad *durationError
		if errors.As(err, &bad) {
			// go-toml gives no position for a value its type refused: find
			// the duration key that holds it.
			line, key := f.findValue(bad.value)
			return nil, f.fail(line, key, "%v", bad)
		}
		return nil, cli.Usagef("reading --config %s: %v", path, err)
	}
	if lvl := f.wf.Worker.LogLevel; lvl != "" {
		if _, err := zerolog.ParseLevel(strings.ToLower(lvl)); err != nil {
			return nil, f.fail(keyLine(src, "worker", "log_level"), "worker.log_level", "invalid %q: want debug, info, warn, error or disabled", lvl)
		}
	}
	if addr := f.wf.Worker.HealthAddr; addr != "" {
		if _, err := cli.CheckListenAddr("health_addr", addr, "127.0.0.1:8081"); err != nil {
			return nil, f.fail(keyLine(src, "worker", "health_addr"), "worker.health_addr", "%s", strings.Replace(err.Error(), "--health_addr", "health_addr", 1))
		}
	}
	return f, nil
}

// tomlTypeRE matches go-toml's message for a value of the wrong type,
// which names Go's types.
var tomlTypeRE = regexp.MustCompile(`cannot decode TOML (\w+) into (?:struct field \S+ of type |a Go value of type )(\S+)`)

// plainDecodeError says a decode error in the file's terms, not Go's.
func plainDecodeError(msg string) string {
	msg = strings.TrimPrefix(msg, "toml: ")
	m := tomlTypeRE.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	want := map[string]string{
		"int": "a whole number", "*int": "a whole number", "bool": "true or false", "*bool": "true or false",
		"string": "a string", "[]workerset.filePeriodic": "[[periodic]] tables",
	}[m[2]]
	if strings.Contains(m[2], "fileDuration") {
		want = `a duration such as "30s" or "1m"`
	}
	if want == "" {
		return fmt.Sprintf("a TOML %s is not what this key takes", m[1])
	}
	return fmt.Sprintf("want %s, got a TOML %s", want, m[1])
}

// findValue finds the line and key of a duration key whose value is
// value, for an error go-toml gives without a position.
func (f *File) findValue(value string) (int, string) {
	header := regexp.MustCompile(`^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$`)
	keyRE := regexp.MustCompile(`^\s*"?([A-Za-z0-9_-]+)"?\s*=\s*"?` + regexp.QuoteMeta(value) + `"?\s*(#.*)?$`)
	table := ""
	for i, line := range strings.Split(string(f.src), "\n") {
		if m := header.FindStringSubmatch(line); m != nil {
			table = strings.ReplaceAll(strings.ReplaceAll(m[1], `"`, ""), " ", "")
			continue
		}
		if m := keyRE.FindStringSubmatch(line); m != nil {
			return i + 1, strings.TrimPrefix(table+"."+m[1], ".")
		}
	}
	return 0, ""
}

// LogLevel is [worker] log_level, unchecked ("" when not given).
func (f *File) LogLevel() string { return f.wf.Worker.LogLevel }

// fail is a usage error: a mistake at line (0: unknown) of the file, in
// key ("" for the file as a whole).
func (f *File) fail(line int, key, format string, args ...any) error {
	return &cli.UsageError{Err: &fileError{file: f.path, line: line, key: key, msg: fmt.Sprintf(format, args...)}}
}

// keyLine finds the line of key in table (e.g. "types.email") in src, for
// errors found after decoding; 0 when it cannot tell.
func keyLine(src []byte, table, key string) int {
	header := regexp.MustCompile(`^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$`)
	keyRE := regexp.MustCompile(`^\s*"?` + regexp.QuoteMeta(key) + `"?\s*=`)
	current := ""
	table = strings.ReplaceAll(table, " ", "") // as the headers are read
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

// Specs turns the file and the command line into one spec per job type,
// each checked as the command line alone would be. flags holds the flags
// given on the command line (flags.Set says which; nil for none). A type
// whose table names no handler is an error when requireHandler, else one
// for Go handlers (Spec.Handlers) to run.
func (f *File) Specs(flags *Spec, requireHandler bool) ([]*Spec, error) {
	wf, path := &f.wf, f.path
	if flags == nil {
		flags = &Spec{}
	}
	if len(wf.Types) == 0 {
		return nil, f.fail(0, "", "no [types.NAME] tables: name at least one job type to run")
	}
	types := make([]string, 0, len(wf.Types))
	for t := range wf.Types {
		types = append(types, t)
	}
	slices.Sort(types)
	for _, t := range types {
		// A comma would make one table run several types, as --type a,b
		// does, each under the table's settings.
		if t == "" || strings.TrimSpace(t) != t || strings.Contains(t, ",") {
			return nil, f.fail(keyLine(f.src, "types."+t, ""), "", "invalid job type %q: a [types.NAME] table names one job type, without commas or surrounding spaces", t)
		}
	}
	if flags.Types != "" {
		// --type with --config runs only those of the file's types.
		var only []string
		for _, t := range strings.Split(flags.Types, ",") {
			t = strings.TrimSpace(t)
			if _, ok := wf.Types[t]; !ok {
				return nil, cli.Usagef("--type %s: %s has no [types.%s] table", t, path, t)
			}
			only = append(only, t)
		}
		types = only
	}
	var specs []*Spec
	for _, t := range types {
		s, err := f.spec(t, flags, requireHandler)
		if err != nil {
			return nil, err
		}
		specs = append(specs, s)
	}
	// Periodic schedules run in the first worker of the process; the type
	// they enqueue need not be one it runs.
	schedules, err := f.periodic()
	if err != nil {
		return nil, err
	}
	specs[0].Schedules = append(specs[0].Schedules, schedules...)
	return specs, nil
}

// spec is the spec of type t: its table over [defaults] over the built-in
// defaults, with the command line's flags over all.
func (f *File) spec(t string, flags *Spec, requireHandler bool) (*Spec, error) {
	wf := &f.wf
	table := "types." + t
	ft := merge(wf.Defaults, wf.Types[t])
	fail := func(key, format string, args ...any) error {
		line, name := keyLine(f.src, table, key), table+"."+key
		if line == 0 {
			if l := keyLine(f.src, "defaults", key); l > 0 {
				line, name = l, "defaults."+key // the value came from [defaults]
			}
		}
		if line == 0 { // a key missing: the type's table
			line = keyLine(f.src, table, "")
		}
		return f.fail(line, name, format, args...)
	}
	s := NewSpec()
	s.Types, s.Handler, s.Exec = t, ft.Handler, ft.Exec
	switch {
	case ft.Handler == "" && requireHandler:
		return nil, fail("handler", "required: one of %s", strings.Join(handlers.Names(), ", "))
	case ft.Handler != "" && !slices.Contains(handlers.Names(), ft.Handler):
		return nil, fail("handler", "unknown handler %q: want one of %s", ft.Handler, strings.Join(handlers.Names(), ", "))
	case ft.Exec != "" && ft.Handler != handlers.NameExec:
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
		s.Set[strings.ReplaceAll(key, "_", "-")] = true
		return nil
	}
	setInt := func(key string, v *int, dst *int) error {
		if v == nil {
			return nil
		}
		if *v < 1 {
			return fail(key, "must be at least 1, got %d", *v)
		}
		if *v > math.MaxInt32 {
			return fail(key, "must be at most %d, got %d", math.MaxInt32, *v)
		}
		*dst = *v
		return nil
	}
	for _, err := range []error{
		setDur("http_timeout", ft.HTTPTimeout, &s.HTTPTimeout, true),
		setDur("lease", ft.Lease, &s.Lease, true),
		setDur("retry_delay", ft.RetryDelay, &s.RetryDelay, false),
		setDur("job_timeout", ft.JobTimeout, &s.JobTimeout, false),
		setDur("heartbeat", ft.Heartbeat, &s.Heartbeat, true),
		setDur("sweep_interval", ft.SweepInterval, &s.SweepInterval, false),
		setDur("feed_timeout", ft.FeedTimeout, &s.FeedTimeout, true),
		setDur("query_timeout", ft.QueryTimeout, &s.QueryTimeout, true),
		setDur("fallback_poll", ft.FallbackPoll, &s.FallbackPoll, true),
		setInt("concurrency", ft.Concurrency, &s.Concurrency),
		setInt("max_attempts", ft.MaxAttempts, &s.MaxAttempts),
	} {
		if err != nil {
			return nil, err
		}
	}
	if ft.RetryDelay != nil && ft.RetryDelay.Duration < 0 {
		return nil, fail("retry_delay", "must not be negative, got %s", ft.RetryDelay.Duration)
	}
	if ft.JobTimeout != nil && ft.JobTimeout.Duration < 0 {
		return nil, fail("job_timeout", "must not be negative (0 sets no bound), got %s", ft.JobTimeout.Duration)
	}
	if ft.DeleteDone != nil {
		s.DeleteDone = *ft.DeleteDone
	}
	if wf.Worker.ShutdownTimeout != nil {
		if wf.Worker.ShutdownTimeout.Duration <= 0 {
			return nil, f.fail(keyLine(f.src, "worker", "shutdown_timeout"), "worker.shutdown_timeout", "must be positive")
		}
		s.ShutdownTimeout = wf.Worker.ShutdownTimeout.Duration
	}
	s.HealthAddr = wf.Worker.HealthAddr
	if ft.Rate != "" {
		if _, err := protocol.ParseRate(ft.Rate); err != nil {
			return nil, fail("rate", "%v", err)
		}
		s.Rates = Repeated{t + "=" + ft.Rate}
	}
	if ft.FleetConcurrency != nil {
		if *ft.FleetConcurrency < 1 || *ft.FleetConcurrency > protocol.MaxRateSlots {
			return nil, fail("fleet_concurrency", "must be from 1 to %d, got %d", protocol.MaxRateSlots, *ft.FleetConcurrency)
		}
		s.Fleet = Repeated{t + "=" + strconv.Itoa(*ft.FleetConcurrency)}
	}
	flags.overrideInto(s)
	if err := s.check(requireHandler); err != nil {
		var ue *cli.UsageError
		if errors.As(err, &ue) {
			return nil, f.fail(keyLine(f.src, table, ""), table, "%s", strings.ReplaceAll(ue.Error(), "--", ""))
		}
		return nil, err
	}
	return s, nil
}

// periodic reads the [[periodic]] tables.
func (f *File) periodic() ([]protocol.Periodic, error) {
	var out []protocol.Periodic
	seen := map[string]bool{}
	for i, p := range f.wf.Periodic {
		key := fmt.Sprintf("periodic[%d]", i)
		failP := func(format string, args ...any) error {
			return f.fail(periodicLine(f.src, i), key, format, args...)
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
		job := protocol.NewJob{Worker: p.Type, Priority: p.Priority}
		if p.Payload != nil {
			// Checked here: a value JSON cannot hold would otherwise fail
			// every tick's enqueue.
			raw, err := json.Marshal(p.Payload)
			if err != nil {
				return nil, failP("payload: %v", err)
			}
			job.Payload = json.RawMessage(raw)
		}
		sched := protocol.Periodic{Name: p.Type, Schedule: p.Schedule, Location: loc, Job: job, CatchUp: catchUp}
		if _, err := protocol.CheckPeriodic(sched); err != nil {
			return nil, failP("%v", err)
		}
		out = append(out, sched)
	}
	return out, nil
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
		{&out.HTTPTimeout, &t.HTTPTimeout}, {&out.Lease, &t.Lease}, {&out.RetryDelay, &t.RetryDelay}, {&out.JobTimeout, &t.JobTimeout},
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
func (o *Spec) overrideInto(s *Spec) {
	for name := range o.Set {
		s.Set[name] = true
		switch name {
		case "handler":
			s.Handler = o.Handler
			if !o.Set["exec"] && o.Handler != handlers.NameExec {
				s.Exec = "" // the file's command was for the file's handler
			}
		case "exec":
			s.Exec = o.Exec
		case "http-timeout":
			s.HTTPTimeout = o.HTTPTimeout
		case "concurrency":
			s.Concurrency = o.Concurrency
		case "lease":
			s.Lease = o.Lease
		case "drain":
			s.Drain = o.Drain
		case "delete-done":
			s.DeleteDone = o.DeleteDone
		case "max-attempts":
			s.MaxAttempts = o.MaxAttempts
		case "shutdown-timeout":
			s.ShutdownTimeout = o.ShutdownTimeout
		case "heartbeat":
			s.Heartbeat = o.Heartbeat
		case "sweep-interval":
			s.SweepInterval = o.SweepInterval
		case "feed-timeout":
			s.FeedTimeout = o.FeedTimeout
		case "query-timeout":
			s.QueryTimeout = o.QueryTimeout
		case "fallback-poll":
			s.FallbackPoll = o.FallbackPoll
		case "retry-delay":
			s.RetryDelay = o.RetryDelay
		case "job-timeout":
			s.JobTimeout = o.JobTimeout
		case "health-addr":
			s.HealthAddr = o.HealthAddr
		case "await-sites":
			s.AwaitSites = o.AwaitSites
		}
	}
	// --rate and --fleet-concurrency for this type replace the file's.
	for _, list := range []struct{ dst, src *Repeated }{{&s.Rates, &o.Rates}, {&s.Fleet, &o.Fleet}} {
		for _, v := range *list.src {
			if typ, _, _ := strings.Cut(v, "="); strings.TrimSpace(typ) == s.Types {
				*list.dst = Repeated{v}
			}
		}
	}
}

// ApplyConn fills the connection settings the command line left unset
// (given names the flags it set) from the file's [couchdb] table. The
// environment (getenv) wins over the file, and a password it names is
// passed to addSecret, if not nil.
func (f *File) ApplyConn(conn *cli.Conn, given map[string]bool, getenv func(string) string, addSecret func(string)) error {
	c := f.wf.CouchDB
	urls, err := c.urls()
	if err != nil {
		return f.fail(keyLine(f.src, "couchdb", "url"), "couchdb.url", "%s", err.Error())
	}
	// Flags, then the environment, then the file: a deployment (a systemd
	// credential, a compose secret) overrides the shared file without
	// editing it.
	env := func(name string) bool { return getenv(name) != "" }
	if !given["url"] && !env("COUCHDB_URL") && len(urls) > 0 {
		conn.URL = strings.Join(urls, ",")
	}
	if !given["db"] && !env("COUCHQ_DB") && c.DB != "" {
		conn.DB = c.DB
	}
	if !given["site"] && !env("COUCHQ_SITE") && c.Site != "" {
		conn.Site = c.Site
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
			pw := getenv(c.PasswordEnv)
			if pw == "" {
				return cli.Usagef("[couchdb] password_env: $%s is empty or unset", c.PasswordEnv)
			}
			conn.FixedPassword = pw
			if addSecret != nil {
				addSecret(pw)
			}
		}
	}
	return nil
}

// CheckLogLevel checks [worker] log_level, which couchq worker checks as
// its --log-level.
func (f *File) CheckLogLevel() error {
	level := f.wf.Worker.LogLevel
	if _, err := zerolog.ParseLevel(strings.ToLower(level)); err != nil {
		return f.fail(keyLine(f.src, "worker", "log_level"), "worker.log_level", "invalid %q: want debug, info, warn, error or disabled", level)
	}
	return nil
}
