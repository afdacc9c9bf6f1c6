package bench

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// The bench's sections, by number.
const (
	SectionCeiling    = 1
	SectionThroughput = 2
	SectionWakeup     = 3
	SectionContention = 4
	SectionBacklog    = 5
	SectionMemory     = 6
	SectionFeatures   = 7
)

var sectionNames = map[int]string{
	SectionCeiling:    "server ceiling",
	SectionThroughput: "end-to-end throughput",
	SectionWakeup:     "idle wake-up latency",
	SectionContention: "claim contention",
	SectionBacklog:    "backlog scaling",
	SectionMemory:     "memory",
	SectionFeatures:   "feature costs",
}

// Targets printed next to the figures.
const (
	TargetThroughputShare = 0.80                   // of the server's ceiling / 3
	TargetWakeupP99       = 250 * time.Millisecond // idle enqueue -> handler start
	TargetConflicts       = 0.2                    // 409s per claimed job at 16 claimants
	targetConflictWorkers = 16
)

// Config is one bench run. The zero value of a field means its default
// (see WithDefaults), except URL: empty starts a local PouchDB Server.
type Config struct {
	// URL of the server; credentials may be in it or in User/Password.
	// Empty starts a PouchDB Server in a temporary directory.
	URL, User, Password string
	// URLOrigin says where URL came from, for the report.
	URLOrigin string
	// Sections to run, in order; default all.
	Sections []int
	// Clients is C, the concurrent writers of the ceiling section.
	Clients int
	// CeilingTime is how long each ceiling measurement writes.
	CeilingTime time.Duration
	// Jobs is N, the end-to-end backlog.
	Jobs int
	// Workers is W, the end-to-end worker goroutines in all.
	Workers int
	// Instances splits W over this many worker.Worker values (each its
	// own claimant, Concurrency W/Instances).
	Instances int
	// Procs, when > 0, runs section 2's workers as this many `couchq
	// worker --handler noop` processes instead (W split over them).
	Procs int
	// CouchqBin is the couchq CLI for Procs; empty builds ./cmd/couchq.
	CouchqBin string
	// Rate and Duration pace the wake-up section's enqueues.
	Rate     float64
	Duration time.Duration
	// ContentionJobs is the backlog of each contention run, worked by each
	// of ContentionWorkers claimants with ContentionConcurrency each.
	ContentionJobs        int
	ContentionWorkers     []int
	ContentionConcurrency int
	// BacklogSmall and BacklogLarge are the due-job counts compared by the
	// backlog section, with Claims timed claims each.
	BacklogSmall, BacklogLarge, Claims int
	// Keep leaves the databases in place.
	Keep bool
	// Instrument counts the HTTP requests and TCP connections the queue
	// makes (through a clone of Go's default transport, so connection
	// reuse is what couchq gets). Off, the workers use the client
	// couchq.Connect makes, with CouchDB's native _selector feed.
	Instrument bool
	// ClientIdleConns changes the instrumented clients' idle connections
	// per host from what couchq.NewHTTPClient keeps, to measure a change.
	ClientIdleConns int
	// Timeout bounds the whole run.
	Timeout time.Duration
	// Logger receives progress (info) and the workers' warnings.
	Logger zerolog.Logger
}

// Defaults. They are sized so that a run with defaults ends within 3 minutes on a
// 2-core machine running PouchDB Server 4.2.0 next to the bench: that
// server's ceiling is about 250-450 single-document writes/s (80-150 jobs/s
// at three writes a job), and with 16 claimants the queue runs about 10
// jobs/s. Scale up with the flags on a faster server.
const (
	ClientsDefault               = 8
	CeilingTimeDefault           = 2 * time.Second
	JobsDefault                  = 5000
	WorkersDefault               = 16
	InstancesDefault             = 1
	RateDefault                  = 20
	DurationDefault              = 10 * time.Second
	ContentionJobsDefault        = 400
	ContentionConcurrencyDefault = 4
	BacklogSmallDefault          = 1000
	BacklogLargeDefault          = 20000
	ClaimsDefault                = 200
	TimeoutDefault               = 15 * time.Minute
)

// ContentionWorkersDefault are the claimant counts compared in section 4.
func ContentionWorkersDefault() []int { return []int{1, 4, 16} }

// AllSections lists every section number.
func AllSections() []int {
	return []int{SectionCeiling, SectionThroughput, SectionWakeup, SectionContention, SectionBacklog, SectionMemory, SectionFeatures}
}

// WithDefaults fills in every unset field.
func (c Config) WithDefaults() Config {
	if len(c.Sections) == 0 {
		c.Sections = AllSections()
	}
	// In order: section 2 compares with section 1, section 6 reports the
	// whole run.
	c.Sections = slices.Sorted(slices.Values(c.Sections))
	setInt(&c.Clients, ClientsDefault)
	setDur(&c.CeilingTime, CeilingTimeDefault)
	setInt(&c.Jobs, JobsDefault)
	setInt(&c.Workers, WorkersDefault)
	setInt(&c.Instances, InstancesDefault)
	if c.Rate <= 0 {
		c.Rate = RateDefault
	}
	setDur(&c.Duration, DurationDefault)
	setInt(&c.ContentionJobs, ContentionJobsDefault)
	if len(c.ContentionWorkers) == 0 {
		c.ContentionWorkers = ContentionWorkersDefault()
	}
	setInt(&c.ContentionConcurrency, ContentionConcurrencyDefault)
	setInt(&c.BacklogSmall, BacklogSmallDefault)
	setInt(&c.BacklogLarge, BacklogLargeDefault)
	setInt(&c.Claims, ClaimsDefault)
	setDur(&c.Timeout, TimeoutDefault)
	return c
}

func setInt(p *int, def int) {
	if *p <= 0 {
		*p = def
	}
}

func setDur(p *time.Duration, def time.Duration) {
	if *p <= 0 {
		*p = def
	}
}

// Upper bounds keep a typo from running for a day.
const (
	maxJobs    = 1_000_000
	maxWorkers = 1024
	maxRate    = 10_000
	maxTime    = time.Hour
)

// Validate reports settings the bench cannot run with.
func (c Config) Validate() error {
	var errs []error
	for _, s := range c.Sections {
		if sectionNames[s] == "" {
			errs = append(errs, fmt.Errorf("unknown section %d (sections are 1-7)", s))
		}
	}
	check := func(name string, v, lo, hi int) {
		if v < lo || v > hi {
			errs = append(errs, fmt.Errorf("--%s %d: want %d..%d", name, v, lo, hi))
		}
	}
	check("clients", c.Clients, 1, maxWorkers)
	check("jobs", c.Jobs, 1, maxJobs)
	check("workers", c.Workers, 1, maxWorkers)
	check("instances", c.Instances, 1, c.Workers)
	check("procs", c.Procs, 0, c.Workers)
	if c.Procs > 0 && c.Instances > 1 {
		errs = append(errs, errors.New("--procs and --instances both split the workers: give one"))
	}
	check("contention-jobs", c.ContentionJobs, 1, maxJobs)
	check("contention-concurrency", c.ContentionConcurrency, 1, maxWorkers)
	check("backlog-small", c.BacklogSmall, 1, maxJobs)
	check("backlog-large", c.BacklogLarge, 1, maxJobs)
	check("claims", c.Claims, 1, min(c.BacklogSmall, c.BacklogLarge))
	for _, w := range c.ContentionWorkers {
		check("contention-workers", w, 1, maxWorkers)
	}
	if c.ClientIdleConns != 0 && !c.Instrument {
		errs = append(errs, errors.New("--client-idle-conns changes the instrumented clients: it needs --instrument"))
	}
	check("client-idle-conns", c.ClientIdleConns, 0, maxWorkers)
	if !(c.Rate > 0 && c.Rate <= maxRate) {
		errs = append(errs, fmt.Errorf("--rate %g: want more than 0, at most %d", c.Rate, maxRate))
	}
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"ceiling-time", c.CeilingTime}, {"duration", c.Duration}, {"timeout", c.Timeout}} {
		if d.d <= 0 || d.d > maxTime {
			errs = append(errs, fmt.Errorf("--%s %s: want more than 0, at most %s", d.name, d.d, maxTime))
		}
	}
	return errors.Join(errs...)
}

// Options are the command line's settings that are not part of a run.
type Options struct {
	JSON    bool
	Verbose bool
}

// ParseArgs parses the command line (without the program name). getenv
// supplies COUCHDB_URL, COUCHDB_USER and COUCHDB_PASSWORD. It returns
// flag.ErrHelp for -h after printing the usage to stderr.
func ParseArgs(args []string, getenv func(string) string, stderr io.Writer) (Config, Options, error) {
	var c Config
	var o Options
	fs := flag.NewFlagSet("couchq-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageHead)
		fs.PrintDefaults()
	}
	sections := fs.String("sections", "1,2,3,4,5,6,7", "sections to run, comma-separated")
	contention := fs.String("contention-workers", "1,4,16", "claimant counts of section 4, comma-separated")
	fs.StringVar(&c.URL, "url", "", "server URL (default $COUCHDB_URL; unset: start a local PouchDB Server); loopback only")
	fs.IntVar(&c.Clients, "clients", ClientsDefault, "section 1: concurrent writers C")
	fs.DurationVar(&c.CeilingTime, "ceiling-time", CeilingTimeDefault, "section 1: duration of each measurement")
	fs.IntVar(&c.Jobs, "jobs", JobsDefault, "section 2: jobs N")
	fs.IntVar(&c.Workers, "workers", WorkersDefault, "section 2: worker goroutines W in all (section 3: the idle worker's concurrency)")
	fs.IntVar(&c.Instances, "instances", InstancesDefault, "section 2: worker.Worker instances sharing the W goroutines")
	fs.IntVar(&c.Procs, "procs", 0, "section 2: run the W goroutines as P `couchq worker --handler noop` processes instead (0: in this process)")
	fs.StringVar(&c.CouchqBin, "couchq-bin", "", "the couchq CLI for --procs (default: go build ./cmd/couchq)")
	fs.Float64Var(&c.Rate, "rate", RateDefault, "section 3: enqueues per second")
	fs.DurationVar(&c.Duration, "duration", DurationDefault, "section 3: how long to enqueue")
	fs.IntVar(&c.ContentionJobs, "contention-jobs", ContentionJobsDefault, "section 4: backlog of each run")
	fs.IntVar(&c.ContentionConcurrency, "contention-concurrency", ContentionConcurrencyDefault, "section 4: concurrency of each claimant")
	fs.IntVar(&c.BacklogSmall, "backlog-small", BacklogSmallDefault, "section 5: small backlog of due jobs")
	fs.IntVar(&c.BacklogLarge, "backlog-large", BacklogLargeDefault, "section 5: large backlog of due jobs")
	fs.IntVar(&c.Claims, "claims", ClaimsDefault, "section 5: timed claims per backlog")
	fs.BoolVar(&c.Keep, "keep", false, "keep the databases (default: drop each at the end of its section)")
	fs.BoolVar(&c.Instrument, "instrument", true, "count HTTP requests and TCP connections per job (false: use couchq.Connect's client as is)")
	fs.IntVar(&c.ClientIdleConns, "client-idle-conns", 0, "experiment: idle connections per host of the instrumented queue clients (0: couchq's own)")
	fs.DurationVar(&c.Timeout, "timeout", TimeoutDefault, "bound on the whole run")
	fs.BoolVar(&o.JSON, "json", false, "print the report as JSON instead of a table")
	fs.BoolVar(&o.Verbose, "v", false, "log progress and the workers' warnings to stderr")
	if err := fs.Parse(args); err != nil {
		return c, o, err
	}
	if fs.NArg() > 0 {
		return c, o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if c.Sections, err = parseInts(*sections); err != nil {
		return c, o, fmt.Errorf("--sections: %w", err)
	}
	if c.ContentionWorkers, err = parseInts(*contention); err != nil {
		return c, o, fmt.Errorf("--contention-workers: %w", err)
	}
	c.URLOrigin = "--url"
	if c.URL == "" {
		c.URL, c.URLOrigin = getenv("COUCHDB_URL"), "COUCHDB_URL"
	}
	if c.URL == "" {
		c.URLOrigin = ""
	}
	c.User, c.Password = getenv("COUCHDB_USER"), getenv("COUCHDB_PASSWORD")
	// Every flag has its default already: validate what was typed, so that
	// --jobs -5 is an error and not the default.
	return c, o, c.Validate()
}

const usageHead = `usage: couchq-bench [flags]

Measures couchq against one CouchDB-compatible server (loopback only) and
prints one table: the server's own write ceiling, end-to-end throughput,
idle wake-up latency, claim contention, backlog scaling and memory. Each
section works in a fresh database, dropped at its end unless --keep.

Flags:
`

// parseInts parses "1,2,3" (blanks allowed), keeping order, without repeats.
func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", f)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}
