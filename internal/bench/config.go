package bench

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/localserver"
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
	SectionClaimIndex = 8
	SectionSites      = 9
	SectionWorkflows  = 10
)

var sectionNames = map[int]string{
	SectionCeiling:    "server ceiling",
	SectionThroughput: "end-to-end throughput",
	SectionWakeup:     "idle wake-up latency",
	SectionContention: "claim contention",
	SectionBacklog:    "backlog scaling",
	SectionMemory:     "memory",
	SectionFeatures:   "feature costs",
	SectionClaimIndex: "claim index",
	SectionSites:      "sites",
	SectionWorkflows:  "workflows",
}

// Targets printed next to the figures.
const (
	// TargetThroughputShare is couchq's end-to-end throughput with
	// validation on, of what the server stores in _bulk_docs into a
	// database with couchq's design document (its validation and views),
	// over the three writes a job takes: the limit any queue keeping
	// couchq's design document has.
	TargetThroughputShare = 0.80
	// TargetNoValidationShare is couchq's end-to-end throughput with
	// validation off, of the bare database's bulk rate over three.
	TargetNoValidationShare = 0.40
	TargetWakeupP99         = 100 * time.Millisecond // idle enqueue -> handler start
	TargetConflicts         = 0.1                    // 409s per claimed job at 16 claimants
	TargetBacklogRatio      = 1.2                    // claim round, large backlog vs small
	TargetEnqueueShare      = 0.80                   // enqueue of the large backlog, of the bulk ceiling (bare)
	targetConflictWorkers   = 16
	// TargetSitesShare is a site's throughput linked to another, of its
	// throughput alone.
	TargetSitesShare = 0.90
	// TargetSitesCPUGrowth bounds a site's server CPU per job of its own
	// with 2 and 3 sites linked, as a multiple of its CPU per job alone:
	// the target is that it does not grow with the jobs of other sites,
	// with room for the noise of one shared machine.
	TargetSitesCPUGrowth = 1.25
	// TargetFleetShare is a fleet of separate worker processes' throughput
	// (Fleet x FleetConcurrency), of the in-process figure.
	TargetFleetShare = 0.80
	// TargetClusterCPU bounds the cluster's server CPU per job (three
	// nodes, three copies of every document) as a multiple of the single
	// node's in the same run: the cluster pays for its copies and little
	// more.
	TargetClusterCPU = 3.5
	// TargetClusterThroughput is the cluster's end-to-end target: twice
	// ClusterThroughputBaseline.
	TargetClusterThroughput = 2 * ClusterThroughputBaseline
	// ClusterThroughputBaseline is the cluster's end-to-end figure (jobs/s,
	// 16 goroutines, validation on) in the full bench run of 2026-11-26 on
	// the 2-core machine the targets were set on.
	ClusterThroughputBaseline = 58.0
	// TargetWorkerRSS100 bounds a `couchq worker` process's memory under
	// load: section 6 runs WorkerRSSConcurrency webhook jobs at once in
	// one process, each held by a slow receiver, and judges its VmHWM.
	TargetWorkerRSS100   = 32 << 20 // bytes: peak RSS of a worker process running WorkerRSSConcurrency jobs at once
	WorkerRSSConcurrency = 100      // jobs at once: the worker's --concurrency, and what the receiver must see
)

// Config is one bench run. The zero value of a field means its default
// (see WithDefaults), except URL: empty starts local servers (Servers).
type Config struct {
	// URL of the server, or a cluster's node URLs comma-separated (the
	// queue clients fail over between them, as couchq.Dial's do);
	// credentials may be in it or in User/Password. Empty measures the
	// local servers of Servers instead, each started in a temporary
	// directory and stopped at its end.
	URL, User, Password string
	// URLOrigin says where URL came from, for the report.
	URLOrigin string
	// Servers are the local servers to start and measure in turn when URL
	// is empty (ServerCouchDB, ServerCluster, ServerPouchDB). Empty: every
	// one available, those that are not (no Apache CouchDB release) skipped
	// with the reason; a server named here that cannot run is an error.
	Servers []string
	// CouchDBHome is the Apache CouchDB release the couchdb and cluster
	// servers start from; empty: localserver.FindCouchDB's default
	// (/opt/couchdb).
	CouchDBHome string
	// ClusterScale sizes sections 2 and 5 on the cluster as this share of
	// Jobs and BacklogLarge, and section 3's Rate (enqueueing half as many
	// jobs as on a node): three nodes replicating every write on the same
	// cores run the queue at a fraction of a single node's speed, and the
	// run must end in reasonable time. Section 4 keeps ContentionJobs: at a
	// tenth (40 jobs for 16 claimants with 4 slots each) it measured the
	// rush of the workers' first rounds only, and its 409s per claimed job
	// at 16 claimants moved between 0.10 and 0.23 from run to run.
	ClusterScale float64
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
	// CouchqBin is the couchq CLI for Procs and Fleet; empty builds
	// ./cmd/couchq.
	CouchqBin string
	// Fleet and FleetConcurrency: after its in-process run, section 2 runs
	// the same backlog with Fleet separate `couchq worker` processes of
	// FleetConcurrency each, as a fleet runs in production, and compares
	// the two (TargetFleetShare). A negative Fleet leaves it out.
	Fleet, FleetConcurrency int
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
	// SitesJobs is the jobs each site of section 9 enqueues and runs, in
	// each of its runs.
	SitesJobs int
	// Validation is how the queue's databases validate writes (sections 2
	// to 7): on (the default), mango or off, as couchq init --validation
	// sets it. Sections 1 and 2 measure all three (mango where the server
	// runs it).
	Validation designdocs.Validation
	// Language is the design documents' language, which picks the engine
	// of their functions, as couchq init --language sets it; the zero
	// value is what couchq init picks (QuickJS where the server has it).
	Language designdocs.Language
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
	// Timeout bounds each server's run.
	Timeout time.Duration
	// Logger receives progress (info) and the workers' warnings.
	Logger zerolog.Logger
}

// Defaults. Section 2 runs the 10,000 jobs its target is set for; with
// them `make bench`, which measures every local server, takes 13-17
// minutes on a 2-core machine running the servers next to the bench (13 min
// 27 s and 16 min 58 s on 2026-11-25, 9 min 52 s with 5,000 jobs). PouchDB
// Server 4.2.0 takes about 5-6 minutes (single-document writes 150-370/s,
// the queue 65-110 jobs/s, slower as its database grows). A single Apache
// CouchDB 3.5 node takes about 4-5: couchq's validate_doc_update runs in
// couchjs and holds its single-document writes to about 120-470/s, the
// queue to 150-200 jobs/s.
// The 3-node cluster replicates every write three times on the same two
// cores and runs the queue at a third of the node's rate (39-62 jobs/s),
// so it runs sections 2 and 5 at ClusterScaleDefault of these sizes (about
// 4-6 minutes). Scale up with the flags on a faster server.
const (
	ClientsDefault               = 8
	CeilingTimeDefault           = 2 * time.Second
	JobsDefault                  = 10000 // TargetThroughputShare is set for 10,000 jobs
	WorkersDefault               = 16
	InstancesDefault             = 1
	RateDefault                  = 20
	DurationDefault              = 10 * time.Second
	ContentionJobsDefault        = 400
	ContentionConcurrencyDefault = 4
	FleetDefault                 = 8
	FleetConcurrencyDefault      = 4
	BacklogSmallDefault          = 1000
	BacklogLargeDefault          = 100000
	ClaimsDefault                = 200
	ClusterScaleDefault          = 0.1
	// TimeoutDefault bounds each server's run. PouchDB Server, the
	// slowest, took 29.4 minutes of a full run on 2026-11-26 (2 cores):
	// the bound leaves it room, and still ends a run that hangs.
	TimeoutDefault = 45 * time.Minute
	// SitesJobsDefault keeps section 9 to a few minutes on a 2-core
	// machine: it runs 1, 2 (twice) and 3 sites, 8,000 jobs in all, with
	// up to three Apache CouchDB nodes sharing the cores. On 2026-11-26 it
	// took 5 min 47 s with a test suite running beside it (load average
	// 11 to 37), the three sites' run more than half of that.
	SitesJobsDefault = 1000
)

// ContentionWorkersDefault are the claimant counts compared in section 4.
func ContentionWorkersDefault() []int { return []int{1, 4, 16} }

// AllSections lists every section number.
func AllSections() []int {
	return []int{SectionCeiling, SectionThroughput, SectionWakeup, SectionContention, SectionBacklog, SectionMemory, SectionFeatures, SectionClaimIndex, SectionSites, SectionWorkflows}
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
	if c.Fleet == 0 { // negative: no fleet (setInt would turn it into the default)
		c.Fleet = FleetDefault
	}
	setInt(&c.FleetConcurrency, FleetConcurrencyDefault)
	setInt(&c.BacklogSmall, BacklogSmallDefault)
	setInt(&c.BacklogLarge, BacklogLargeDefault)
	setInt(&c.Claims, ClaimsDefault)
	setInt(&c.SitesJobs, SitesJobsDefault)
	if c.ClusterScale <= 0 {
		c.ClusterScale = ClusterScaleDefault
	}
	setDur(&c.Timeout, TimeoutDefault)
	if c.Validation == designdocs.ValidationKept {
		c.Validation = designdocs.ValidationOn
	}
	return c
}

// forServer is the configuration one server runs with: the cluster's
// sizes scaled down by ClusterScale (never below one job, and the large
// backlog never below the small one, so section 5 still compares); the
// contention backlog is not scaled.
func (c Config) forServer(kind string) Config {
	if kind != ServerCluster || c.ClusterScale >= 1 {
		return c
	}
	scale := func(n int) int { return max(int(float64(n)*c.ClusterScale+0.5), 1) }
	c.Jobs = scale(c.Jobs)
	c.BacklogLarge = max(scale(c.BacklogLarge), c.BacklogSmall)
	// Section 3 measures an idle worker: at the node's rate the cluster's
	// three nodes need about all of this machine's CPU (97 ms of server
	// CPU per job at 20 jobs/s on two cores), and a job waits for the
	// rounds before its own. It enqueues at the scaled rate, for as long
	// as it takes to enqueue half as many jobs as on a node, at most five
	// times as long.
	n := c.Rate * c.Duration.Seconds()
	c.Rate *= c.ClusterScale
	c.Duration = min(time.Duration(n/2/c.Rate*float64(time.Second)), 5*c.Duration)
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
			errs = append(errs, fmt.Errorf("unknown section %d (sections are 1-10)", s))
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
	if c.Fleet > 0 {
		check("fleet", c.Fleet, 1, maxWorkers)
		check("fleet-concurrency", c.FleetConcurrency, 1, maxWorkers)
	}
	if c.Procs > 0 && c.Instances > 1 {
		errs = append(errs, errors.New("--procs and --instances both split the workers: give one"))
	}
	check("contention-jobs", c.ContentionJobs, 1, maxJobs)
	check("contention-concurrency", c.ContentionConcurrency, 1, maxWorkers)
	check("backlog-small", c.BacklogSmall, 1, maxJobs)
	check("backlog-large", c.BacklogLarge, 1, maxJobs)
	check("claims", c.Claims, 1, min(c.BacklogSmall, c.BacklogLarge))
	check("sites-jobs", c.SitesJobs, 1, maxJobs)
	for _, w := range c.ContentionWorkers {
		check("contention-workers", w, 1, maxWorkers)
	}
	for _, s := range c.Servers {
		if !slices.Contains(LocalServers(), s) {
			errs = append(errs, fmt.Errorf("--servers: unknown server %q (servers are %s)", s, strings.Join(LocalServers(), ", ")))
		}
	}
	if len(c.Servers) > 0 && c.URL != "" {
		errs = append(errs, fmt.Errorf("--servers picks the local servers the bench starts; with a server URL (%s) it measures that one alone: give one", c.URLOrigin))
	}
	if !(c.ClusterScale > 0 && c.ClusterScale <= 1) {
		errs = append(errs, fmt.Errorf("--cluster-scale %g: want more than 0, at most 1", c.ClusterScale))
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
	// WriteDocs is the repository root whose docs the run rewrites
	// (WriteDocs), empty for none. ParseArgs refuses it for a partial run.
	WriteDocs string
	// Partial says why the run measures less than `make bench` does
	// (--servers, --sections, a server URL); empty for a full run.
	Partial string
	// Changed are the flags given that change what is measured, as typed
	// ("--jobs 500"), for the docs to say; --servers, --sections and
	// --url are in Partial instead.
	Changed []string
}

// outputFlags change how a run is shown, or bound it, not what it
// measures: the docs need not mention them.
var outputFlags = []string{"json", "v", "write-docs", "timeout", "couchq-bin", "servers", "sections", "url"}

// ParseArgs parses the command line (without the program name). getenv
// supplies COUCHDB_URL, COUCHDB_USER, COUCHDB_PASSWORD and
// COUCHQ_COUCHDB_HOME. It returns
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
	sections := fs.String("sections", "1,2,3,4,5,6,7,8,9,10", "sections to run, comma-separated")
	servers := fs.String("servers", "", "local servers to start and measure in turn, comma-separated: "+
		strings.Join(LocalServers(), ",")+" (default: every one available; not with --url)")
	contention := fs.String("contention-workers", "1,4,16", "claimant counts of section 4, comma-separated")
	fs.StringVar(&c.URL, "url", "", "server URL, or a cluster's node URLs comma-separated (default $COUCHDB_URL; unset: start the local --servers); loopback only")
	fs.IntVar(&c.Clients, "clients", ClientsDefault, "section 1: concurrent writers C")
	fs.DurationVar(&c.CeilingTime, "ceiling-time", CeilingTimeDefault, "section 1: duration of each measurement")
	fs.IntVar(&c.Jobs, "jobs", JobsDefault, "section 2: jobs N")
	fs.IntVar(&c.Workers, "workers", WorkersDefault, "section 2: worker goroutines W in all (section 3: the idle worker's concurrency)")
	fs.IntVar(&c.Instances, "instances", InstancesDefault, "section 2: worker.Worker instances sharing the W goroutines")
	fs.IntVar(&c.Procs, "procs", 0, "section 2: run the W goroutines as P `couchq worker --handler noop` processes instead (0: in this process)")
	fs.StringVar(&c.CouchqBin, "couchq-bin", "", "the couchq CLI for --procs and --fleet (default: go build ./cmd/couchq)")
	fs.IntVar(&c.Fleet, "fleet", FleetDefault, "section 2: then the same jobs with this many `couchq worker` processes (-1: not)")
	fs.IntVar(&c.FleetConcurrency, "fleet-concurrency", FleetConcurrencyDefault, "section 2: each --fleet process's concurrency")
	fs.Float64Var(&c.Rate, "rate", RateDefault, "section 3: enqueues per second")
	fs.DurationVar(&c.Duration, "duration", DurationDefault, "section 3: how long to enqueue")
	fs.IntVar(&c.ContentionJobs, "contention-jobs", ContentionJobsDefault, "section 4: backlog of each run")
	fs.IntVar(&c.ContentionConcurrency, "contention-concurrency", ContentionConcurrencyDefault, "section 4: concurrency of each claimant")
	fs.IntVar(&c.BacklogSmall, "backlog-small", BacklogSmallDefault, "sections 5 and 8: small backlog of due jobs")
	fs.IntVar(&c.BacklogLarge, "backlog-large", BacklogLargeDefault, "section 5: large backlog of due jobs")
	fs.IntVar(&c.Claims, "claims", ClaimsDefault, "sections 5 and 8: timed claims per backlog (section 8: per index)")
	fs.IntVar(&c.SitesJobs, "sites-jobs", SitesJobsDefault, "section 9: jobs each site enqueues and runs, in each of its runs")
	fs.Float64Var(&c.ClusterScale, "cluster-scale", ClusterScaleDefault, "the cluster's --jobs, --backlog-large and --rate, as a share of the given ones")
	validation := fs.String("validation", "on", "the queue databases' validation: on, mango or off (couchq init --validation)")
	language := fs.String("language", "", "the design documents' language: javascript or javascript_quickjs (couchq init --language; default: what init picks)")
	fs.BoolVar(&c.Keep, "keep", false, "keep the databases (default: drop each at the end of its section)")
	fs.BoolVar(&c.Instrument, "instrument", true, "count HTTP requests and TCP connections per job (false: use couchq.Connect's client as is)")
	fs.IntVar(&c.ClientIdleConns, "client-idle-conns", 0, "experiment: idle connections per host of the instrumented queue clients (0: couchq's own)")
	fs.DurationVar(&c.Timeout, "timeout", TimeoutDefault, "bound on each server's run")
	fs.BoolVar(&o.JSON, "json", false, "print the reports as JSON (an array, one report per server) instead of tables")
	fs.BoolVar(&o.Verbose, "v", false, "log progress and the workers' warnings to stderr")
	fs.StringVar(&o.WriteDocs, "write-docs", "", "after a full run, rewrite the generated regions of `DIR`/"+GuidePath+" and DIR/"+ReadmePath+
		" with its tables (DIR: the repository root, . in make bench); refused with --servers, --sections or a server URL")
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
	if c.Validation, err = designdocs.ParseValidation(*validation); err != nil {
		return c, o, fmt.Errorf("--validation: %w", err)
	}
	if *language != "" {
		if c.Language, err = designdocs.ParseLanguage(*language); err != nil {
			return c, o, fmt.Errorf("--language: %w", err)
		}
	}
	if *servers != "" {
		if c.Servers, err = parseNames(*servers); err != nil {
			return c, o, fmt.Errorf("--servers: %w", err)
		}
	}
	c.URLOrigin = "--url"
	if c.URL == "" {
		c.URL, c.URLOrigin = getenv("COUCHDB_URL"), "COUCHDB_URL"
	}
	if c.URL == "" {
		c.URLOrigin = ""
	}
	c.User, c.Password = getenv("COUCHDB_USER"), getenv("COUCHDB_PASSWORD")
	c.CouchDBHome = getenv(localserver.CouchDBHomeEnv)
	o.Partial, o.Changed = partialRun(c), changedFlags(fs)
	// Every flag has its default already: validate what was typed, so that
	// --jobs -5 is an error and not the default.
	if err := c.Validate(); err != nil {
		return c, o, err
	}
	if o.WriteDocs != "" && o.Partial != "" {
		// Refused up front: a partial run's tables would replace a full
		// run's, and the run takes minutes before it would find out.
		return c, o, fmt.Errorf("--write-docs rewrites the docs from a full run, one that measures what `make bench` does; %s makes this one partial: drop one of them", o.Partial)
	}
	return c, o, nil
}

// partialRun says why c measures less than a run with the defaults does,
// or "" when it measures as much: every local server (those this machine
// lacks are skipped, and the docs say so), every section.
func partialRun(c Config) string {
	var why []string
	if c.URL != "" {
		what := "a server URL"
		if c.URLOrigin == "COUCHDB_URL" {
			what = "COUCHDB_URL" // the URL itself may hold a password
		} else if c.URLOrigin != "" {
			what = c.URLOrigin
		}
		why = append(why, what)
	}
	if len(c.Servers) > 0 && !sameSet(c.Servers, LocalServers()) {
		why = append(why, "--servers "+strings.Join(c.Servers, ","))
	}
	if !sameSet(c.Sections, AllSections()) {
		var s []string
		for _, n := range c.Sections {
			s = append(s, strconv.Itoa(n))
		}
		why = append(why, "--sections "+strings.Join(s, ","))
	}
	return strings.Join(why, ", ")
}

// changedFlags are the flags given whose values are not their defaults,
// as a command line would give them, outputFlags left out.
func changedFlags(fs *flag.FlagSet) []string {
	var out []string
	fs.Visit(func(f *flag.Flag) {
		if slices.Contains(outputFlags, f.Name) || f.Value.String() == f.DefValue {
			return
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			if f.Value.String() == "true" {
				out = append(out, "--"+f.Name)
			} else {
				out = append(out, "--"+f.Name+"="+f.Value.String())
			}
			return
		}
		out = append(out, "--"+f.Name+" "+f.Value.String())
	})
	return out
}

// sameSet says whether a and b hold the same elements.
func sameSet[T cmp.Ordered](a, b []T) bool {
	return slices.Equal(slices.Compact(slices.Sorted(slices.Values(a))), slices.Compact(slices.Sorted(slices.Values(b))))
}

const usageHead = `usage: couchq-bench [flags]

Measures couchq against CouchDB-compatible servers (loopback only) and
prints one table per server: the server's own write ceiling, end-to-end
throughput, idle wake-up latency, claim contention, backlog scaling,
memory (judged on a ` + "`couchq worker`" + ` process with a webhook job in each
slot), feature costs, claim indexes, sites (section 9, on the single
Apache CouchDB node: linked to further nodes it starts as other sites) and
workflows (section 10: release latency, batch throughput).
Each section works in a fresh database, dropped at its end unless --keep.

With --url (or COUCHDB_URL) it measures that server alone. Without, it
starts and measures in turn every local server available, or those of
--servers: couchdb, a single Apache CouchDB node, and cluster, three nodes
joined (q=2, n=3; sizes scaled by --cluster-scale), both from the release
at $COUCHQ_COUCHDB_HOME or /opt/couchdb; pouchdb, PouchDB Server from
tools/pouchdb-server. --json prints a JSON array, one report per server.

--write-docs DIR, after a full run (every server, every section; make
bench passes --write-docs .), rewrites the generated regions of
DIR/docs/performance.md, and the summary of DIR/README.md if it has one,
with the run's tables: nothing outside their markers changes.

Flags:
`

// parseNames parses "a,b" (blanks allowed), keeping order, without repeats.
func parseNames(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

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
