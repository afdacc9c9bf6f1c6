// Package bench measures couchq against CouchDB-compatible servers, one
// after the other: for each, the server's own write ceiling, end-to-end
// throughput as a share of it, idle wake-up latency, claim contention,
// backlog scaling, memory, feature costs, claim indexes, sites and
// workflows. The
// couchq-bench command is a thin main around Run.
package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/designdocs"
)

const warnLevel = zerolog.WarnLevel

// run is one bench run in progress.
type run struct {
	cfg Config
	log zerolog.Logger
	t   *target
	// ceiling is section 1's result, when it ran.
	ceiling *ceilingResult
	// noMango says why the server runs no Mango validate_doc_update, once
	// a section found out.
	noMango error
	// memory samples the Go heap while workers run.
	memory *heapSampler
	// scratch is a temporary directory (the CLI built for --procs).
	scratch, cliBuilt string
	// procRSS is each worker process's peak RSS, when --procs ran.
	procRSS []uint64
	// earlier is how many servers this process measured before this one.
	earlier int
	// prior are the reports of the servers measured before this one, for
	// targets that compare servers (the cluster's CPU per job, of the
	// node's).
	prior []*Report
	// server is the server as planned: what kind, and the Apache CouchDB
	// release section 9 starts the other sites from.
	server plannedServer
	// notes are what sections explain beyond their rows (what a server
	// could not measure, and why).
	notes []string
}

// Run measures each server of the configuration in turn (planServers: the
// URL's, else the local servers) and returns one report per server, in
// order, skipped servers included with the reason. A section that fails
// records its error and the run goes on; so does the next server when one
// cannot be started. The returned error is then non-nil too, with the
// reports complete otherwise. A configuration error, or a --url server
// that cannot be reached, returns no report.
func Run(ctx context.Context, cfg Config) ([]*Report, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	plan, err := planServers(cfg)
	if err != nil {
		return nil, err
	}
	var reps []*Report
	var errs []error
	measured := 0
	for _, ps := range plan {
		if ps.skip != "" {
			cfg.Logger.Info().Str("server", ps.kind).Str("reason", ps.skip).Msg("server skipped")
			reps = append(reps, &Report{Started: time.Now(), Server: ServerInfo{Kind: ps.kind}, Skipped: ps.skip})
			continue
		}
		if err := ctx.Err(); err != nil {
			errs = append(errs, fmt.Errorf("%s: not measured: %w", ps.kind, err))
			continue
		}
		rep, err := runServer(ctx, cfg.forServer(ps.kind), ps, measured, reps)
		measured++
		if rep == nil { // the --url server: nothing measured, nothing to report
			return nil, err
		}
		if err != nil {
			err = fmt.Errorf("%s: %w", ps.kind, err)
			errs = append(errs, err)
		}
		reps = append(reps, rep)
	}
	return reps, errors.Join(errs...)
}

// runServer runs the configured sections against one server. A server
// that cannot be started or reached gives a report holding the error.
func runServer(ctx context.Context, cfg Config, ps plannedServer, earlier int, prior []*Report) (*Report, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	start := time.Now()
	log := cfg.Logger.With().Str("server", ps.kind).Logger()
	log.Info().Msg("server starting")
	t, err := connect(ctx, cfg, ps, log)
	if err != nil {
		if ps.kind == serverURL {
			return nil, err
		}
		return &Report{Started: start, Server: ServerInfo{Kind: ps.kind}, Error: err.Error(),
			Host: hostInfo(), WallSeconds: time.Since(start).Seconds()}, err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := t.close(stopCtx); err != nil {
			log.Warn().Err(err).Msg("closing the server connection")
		}
	}()
	b := &run{cfg: cfg, log: log, t: t, memory: newHeapSampler(), earlier: earlier, prior: prior, server: ps}
	defer func() {
		if b.scratch != "" {
			_ = os.RemoveAll(b.scratch)
		}
	}()
	rep := &Report{Started: start, Server: t.info, Host: hostInfo(), Settings: settings(cfg, ps.kind)}
	if cfg.Language == designdocs.LanguageKept {
		// Say which engine init picked: since schema 4 tables of the same
		// server differ by it, and a run without --language must say so.
		rep.Settings["language"] = string(t.designLanguage())
	}
	var errs []error
	for _, id := range cfg.Sections {
		s := &Section{ID: id, Name: sectionNames[id]}
		rep.Sections = append(rep.Sections, s)
		log.Info().Int("section", id).Str("name", s.Name).Msg("section starting")
		began := time.Now()
		err := b.section(ctx, s)
		s.Seconds = time.Since(began).Seconds()
		if err != nil {
			s.Error = err.Error()
			errs = append(errs, fmt.Errorf("section %d (%s): %w", id, s.Name, err))
			log.Error().Err(err).Int("section", id).Msg("section failed")
		}
		if err := b.dropAll(ctx, s); err != nil {
			errs = append(errs, err)
		}
		log.Info().Int("section", id).Float64("seconds", s.Seconds).Msg("section done")
	}
	rep.Notes = append(b.standardNotes(rep), b.notes...)
	rep.WallSeconds = time.Since(start).Seconds()
	rep.Host.LoadEnd = loadAverage()
	return rep, errors.Join(errs...)
}

// hostInfo describes this machine now.
func hostInfo() HostInfo {
	return HostInfo{CPUs: runtime.NumCPU(), CPUModel: cpuModel(), Memory: hostMemory(),
		GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH, LoadStart: loadAverage()}
}

func (b *run) section(ctx context.Context, s *Section) error {
	switch s.ID {
	case SectionCeiling:
		return b.runCeiling(ctx, s)
	case SectionThroughput:
		return b.runThroughput(ctx, s)
	case SectionWakeup:
		return b.runWakeup(ctx, s)
	case SectionContention:
		return b.runContention(ctx, s)
	case SectionBacklog:
		return b.runBacklog(ctx, s)
	case SectionMemory:
		return b.runMemory(ctx, s)
	case SectionFeatures:
		return b.runFeatures(ctx, s)
	case SectionClaimIndex:
		return b.runClaimIndex(ctx, s)
	case SectionWorkflows:
		return b.runWorkflows(ctx, s)
	case SectionSites:
		return b.runSites(ctx, s)
	}
	return fmt.Errorf("unknown section %d", s.ID)
}

// newDB creates a fresh database for s with the design document, its
// validation as configured, and remembers it for dropAll.
func (b *run) newDB(ctx context.Context, s *Section, what string) (string, error) {
	return b.newDBValidation(ctx, s, what, b.cfg.Validation)
}

// newDBValidation is newDB with validation on or off.
func (b *run) newDBValidation(ctx context.Context, s *Section, what string, validation designdocs.Validation) (string, error) {
	name, err := b.t.newDB(ctx, what, validation, b.log)
	if err != nil {
		return "", err
	}
	s.Databases = append(s.Databases, name)
	return name, nil
}

// newBareDB creates a fresh database without couchq's design document
// and remembers it for dropAll.
func (b *run) newBareDB(ctx context.Context, s *Section, what string) (string, error) {
	name, err := b.t.newBareDB(ctx, what)
	if err != nil {
		return "", err
	}
	s.Databases = append(s.Databases, name)
	return name, nil
}

// dropAll drops the section's databases unless --keep.
func (b *run) dropAll(ctx context.Context, s *Section) error {
	if b.cfg.Keep {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	var errs []error
	for _, db := range s.Databases {
		errs = append(errs, b.t.dropDB(ctx, db))
	}
	return errors.Join(errs...)
}

func (b *run) standardNotes(rep *Report) []string {
	var n []string
	if b.cfg.Keep {
		var kept []string
		for _, s := range rep.Sections {
			kept = append(kept, s.Databases...)
		}
		switch {
		case len(kept) > 0 && b.t.stop != nil:
			n = append(n, "--keep: the databases were kept, but the local server's data directory is removed "+
				"at the end of the run; give --url to keep them: "+strings.Join(kept, ", "))
		case len(kept) > 0:
			n = append(n, "--keep: the databases are still there: "+strings.Join(kept, ", "))
		}
	}
	if b.cfg.Instrument {
		idle := "couchq's idle connections per host"
		if b.cfg.ClientIdleConns > 0 {
			idle = fmt.Sprintf("%d idle connections per host (EXPERIMENT)", b.cfg.ClientIdleConns)
		}
		n = append(n, "Queue clients are instrumented: couchq.ConnectHTTP over a counting wrapper of couchq's own transport, with "+
			idle+". --instrument=false uses couchq.Connect's client as is.")
	}
	if b.t.queueShards != "" {
		n = append(n, "The databases with couchq's design documents are made by couchq's init, with the shards it chooses: "+
			b.t.queueShards+" (one shard on a cluster); bare databases have the server's own.")
	}
	if slices.Contains(b.cfg.Sections, SectionThroughput) {
		n = append(n, minimalNote())
	}
	if b.earlier > 0 && slices.Contains(b.cfg.Sections, SectionMemory) {
		n = append(n, fmt.Sprintf("The peak RSS of this process (section 6) is the whole command's: it includes the %d server(s) measured before this one.", b.earlier))
	}
	if b.cfg.Procs > 0 {
		n = append(n, fmt.Sprintf("Section 2 ran its workers as %d `couchq worker --handler noop` processes "+
			"(couchq.Connect's own client, not instrumented; --heartbeat %s so their registry documents report progress); "+
			"sections 3 and 4 run workers in this process.", b.cfg.Procs, procHeartbeat))
	}
	return n
}

// settings is the configuration as the report shows it (no credentials),
// with the sizes this server ran with.
func settings(c Config, kind string) map[string]any {
	scaled := ""
	if kind == ServerCluster && c.ClusterScale < 1 {
		scaled = fmt.Sprintf("the cluster's: --jobs, --backlog-large and --rate scaled by --cluster-scale %g", c.ClusterScale)
	}
	set := map[string]any{
		"sections":               c.Sections,
		"clients":                c.Clients,
		"ceiling_time":           c.CeilingTime.String(),
		"jobs":                   c.Jobs,
		"workers":                c.Workers,
		"instances":              c.Instances,
		"procs":                  c.Procs,
		"rate":                   c.Rate,
		"duration":               c.Duration.String(),
		"contention_jobs":        c.ContentionJobs,
		"contention_workers":     c.ContentionWorkers,
		"contention_concurrency": c.ContentionConcurrency,
		"backlog_small":          c.BacklogSmall,
		"backlog_large":          c.BacklogLarge,
		"claims":                 c.Claims,
		"keep":                   c.Keep,
		"instrument":             c.Instrument,
		"client_idle_conns":      c.ClientIdleConns,
		"cluster_scale":          c.ClusterScale,
		"validation":             string(c.Validation),
		"language":               string(c.Language),
	}
	if scaled != "" {
		set["scaled"] = scaled
	}
	if kind == ServerCouchDB && slices.Contains(c.Sections, SectionSites) {
		// Only where section 9 runs (sitesSkip): elsewhere the size
		// would be one the report has no figures of.
		set["sites_jobs"] = c.SitesJobs
	}
	return set
}

// splitConcurrency spreads total goroutines over n workers as evenly as
// possible.
func splitConcurrency(total, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = total / n
		if i < total%n {
			out[i]++
		}
	}
	return out
}

// requestRows adds the queue clients' HTTP traffic per job: requests in
// all, then each kind that occurred, connections opened and bytes.
func (b *run) requestRows(s *Section, tr traffic, jobs int) {
	if !b.cfg.Instrument || jobs == 0 {
		return
	}
	per := func(n int64) float64 { return float64(n) / float64(jobs) }
	s.add(numRow("HTTP requests per job", per(tr.requests()), "", 2))
	for k, n := range tr.reqs {
		if n > 0 {
			s.add(numRow("  "+kindNames[k], per(n), "", 2))
		}
	}
	s.add(numRow("TCP connections opened per job", per(tr.dials), "", 2))
	s.add(numRow("bytes sent per job (on the wire: HTTP headers and bodies)", per(tr.sent), "B", 0))
	s.add(numRow("bytes received per job (on the wire: HTTP headers and bodies)", per(tr.received), "B", 0))
}
