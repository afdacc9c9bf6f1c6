package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// stallTimeout ends a wait in which no job completed for this long: the
// queue is stuck (the runtime's fallback poll is 30 s, so a missed wake-up
// alone does not trip it).
const stallTimeout = 45 * time.Second

// workedBacklog is what running a backlog measured, in-process or not.
type workedBacklog struct {
	claimed, conflicts int64
	queries            int64 // -1 when unknown (worker processes)
	wall               time.Duration
	// workerCPU is the worker processes' CPU, when they are separate.
	workerCPU time.Duration
	workerOK  bool
	// waits are enqueue -> handler start of each job's first attempt, as
	// the in-process handler saw it (none with worker processes).
	waits []time.Duration
}

// runThroughput enqueues N jobs in bulk, then lets W worker goroutines run
// them with the no-op handler, and measures jobs/s from the first claim to
// the last done as the documents record them.
func (b *run) runThroughput(ctx context.Context, s *Section) error {
	cfg := b.cfg
	if cfg.Procs > 0 {
		// Before anything is timed: the first build takes a while.
		if _, err := b.cliPath(ctx); err != nil {
			return err
		}
	}
	db, err := b.newDB(ctx, s, "throughput")
	if err != nil {
		return err
	}
	c, err := b.t.open(ctx, db)
	if err != nil {
		return err
	}
	took, err := enqueueBulk(ctx, c, cfg.Jobs)
	if err != nil {
		return err
	}
	s.add(numRow(fmt.Sprintf("bulk enqueue of %d jobs (EnqueueMany, %d per request)", cfg.Jobs, enqueueBatch),
		rate(int64(cfg.Jobs), took), "jobs/s", 0))
	built, err := buildViews(ctx, c)
	if err != nil {
		return err
	}
	others, err := b.buildOtherIndexes(ctx, db)
	if err != nil {
		return err
	}
	s.add(textRow(fmt.Sprintf("%d jobs: claim view build, every index on every copy built (before timing)", cfg.Jobs),
		fmt.Sprintf("%.1f s, %.1f s", built.Seconds(), others.Seconds())))

	traffic0 := b.t.stats.snapshot()
	alloc0 := heapAllocated()
	cpu0 := b.t.cpu()
	counters0 := b.t.counters(ctx)
	var wb workedBacklog
	var compacting float64
	var compactingOK bool
	who := fmt.Sprintf("%d worker goroutines", cfg.Workers)
	if cfg.Procs > 0 {
		who = fmt.Sprintf("%d goroutines over %d processes", cfg.Workers, cfg.Procs)
		wb, err = b.workInProcesses(ctx, c, db)
	} else {
		if cfg.Instances > 1 {
			who = fmt.Sprintf("%d goroutines over %d workers", cfg.Workers, cfg.Instances)
		}
		watch := b.t.watchCompaction(ctx, db)
		wb, err = b.workInProcess(ctx, db, splitConcurrency(cfg.Workers, cfg.Instances), cfg.Jobs)
		compacting, compactingOK = watch.stopWatch()
	}
	cpu1 := b.t.cpu()
	alloc := heapAllocated() - alloc0
	tr := b.t.stats.snapshot().since(traffic0)
	if err != nil {
		return err
	}

	jt, err := readDone(ctx, c, cfg.Jobs)
	if err != nil {
		return err
	}
	span := jt.span()
	tput := rate(int64(cfg.Jobs), span)
	row := s.add(numRow(fmt.Sprintf("throughput, %s, first claim -> last done", who), tput, "jobs/s", 0))
	row.Key = keyThroughput
	b.judgeThroughput(s, row, tput, b.cfg.Validation)
	s.add(durRow("first claim -> last done", span))
	// The whole backlog is enqueued before the workers start: these are
	// waits in the queue, which grow with the backlog over the throughput.
	waits, what := wb.waits, "enqueue -> handler start"
	if cfg.Procs > 0 {
		waits, what = jt.waits, "enqueue -> claim (created_at -> started_at)"
	}
	if sum := Summarize(waits); sum.N > 0 {
		s.add(durRow(what+" p50 (backlog enqueued before the workers started)", sum.P50))
		s.add(durRow(what+" p99", sum.P99))
	}
	if cfg.Procs > 0 {
		s.add(durRow("processes started -> registry reports all done", wb.wall))
	} else {
		s.add(durRow("workers started -> all handlers returned", wb.wall))
	}
	s.add(numRow("jobs run more than once", float64(jt.reruns), "", 0))
	compactionRow(s, "", compacting, compactingOK)
	if wb.queries >= 0 {
		s.add(numRow("due-view queries per claimed job", ratio(float64(wb.queries), float64(wb.claimed)), "", 2))
	}
	s.add(numRow("claim conflicts (409) per claimed job", ratio(float64(wb.conflicts), float64(wb.claimed)), "", 3))
	if cfg.Procs == 0 {
		b.requestRows(s, tr, cfg.Jobs)
		if server := cpuRows(s, "", cpu0, cpu1, cfg.Jobs); server != nil {
			server.Key = keyServerCPU
			b.judgeClusterCPU(s, server.Value)
		}
		s.add(numRow("Go heap allocated per job, bench process", float64(alloc)/float64(cfg.Jobs)/1024, "KiB", 1))
		if err := b.couchqCounterRows(ctx, s, db, counters0, cfg.Jobs); err != nil {
			return err
		}
		if err := b.runWithoutValidation(ctx, s); err != nil {
			return err
		}
		if err := b.runWithMangoValidation(ctx, s); err != nil {
			return err
		}
		if err := b.runFleet(ctx, s, tput); err != nil {
			return err
		}
		return b.runMinimalQueues(ctx, s, cfg.Jobs, tput)
	}
	if wb.workerOK {
		s.add(durRow("CPU per job, worker processes", wb.workerCPU/time.Duration(cfg.Jobs)))
	}
	cpu0.ok = false // the bench process only watched the worker processes
	cpuRows(s, "", cpu0, cpu1, cfg.Jobs)
	if err := b.couchqCounterRows(ctx, s, db, counters0, cfg.Jobs); err != nil {
		return err
	}
	return b.runMinimalQueues(ctx, s, cfg.Jobs, tput)
}

// couchqCounterRows gives the server's counters per job from before
// couchq's run to after its self-updating views caught up with the last
// job, as the minimal queues give theirs (see serverCounters).
func (b *run) couchqCounterRows(ctx context.Context, s *Section, db string, before serverCounters, jobs int) error {
	if !before.ok {
		counterRow(s, before, before, int64(jobs)) // why, if the server has them
		return nil
	}
	catchUp, err := b.bringIndexesUpToDate(ctx, db, autoIndexed()...)
	if err != nil {
		return fmt.Errorf("after couchq's run: %w", err)
	}
	s.add(durRow("  views' catch-up after the last job", catchUp))
	counterRow(s, before, b.t.counters(ctx), int64(jobs))
	return nil
}

// workInProcess runs the backlog with worker.Worker values in this process.
func (b *run) workInProcess(ctx context.Context, db string, conc []int, jobs int) (workedBacklog, error) {
	h, err := noop()
	if err != nil {
		return workedBacklog{}, err
	}
	waits := &queueWaits{}
	b.memory.start()
	defer b.memory.stop()
	p, err := startPool(ctx, b.t, db, waits.handler(h), conc, b.cfg)
	if err != nil {
		return workedBacklog{}, err
	}
	began := time.Now()
	waitErr := p.waitCompleted(ctx, int64(jobs), stallTimeout)
	wall := time.Since(began)
	p.stop(ctx)
	st := p.stats()
	return workedBacklog{claimed: st.Claimed, conflicts: st.Conflicts, queries: st.Queries, wall: wall, waits: waits.all()}, waitErr
}

// queueWaits records, for each job's first attempt, the time from its
// enqueue (the document's created_at, written by this machine's clock) to
// the handler's start.
type queueWaits struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (q *queueWaits) handler(next worker.Handler) worker.Handler {
	return worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		now := time.Now()
		if job.Attempt == 1 && job.Item != nil && job.Item.CreatedAt > 0 {
			q.mu.Lock()
			q.waits = append(q.waits, now.Sub(protocol.FromUnix(job.Item.CreatedAt)))
			q.mu.Unlock()
		}
		return next.Handle(ctx, job)
	})
}

func (q *queueWaits) all() []time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.waits)
}

// workInProcesses runs the backlog with `couchq worker` processes.
func (b *run) workInProcesses(ctx context.Context, c *protocol.Client, db string) (workedBacklog, error) {
	wb := workedBacklog{queries: -1}
	began := time.Now()
	p, err := b.startProcs(ctx, db, splitConcurrency(b.cfg.Workers, b.cfg.Procs))
	if err != nil {
		return wb, err
	}
	defer p.stop(b)
	if err := p.waitCompleted(ctx, c, int64(b.cfg.Jobs), stallTimeout); err != nil {
		return wb, err
	}
	wb.wall = time.Since(began)
	// The registry lags by a heartbeat at most; good enough for a ratio.
	wb.claimed, wb.conflicts, _, err = p.registry(ctx, c)
	if err != nil {
		return wb, err
	}
	wb.workerCPU, err = p.cpu()
	wb.workerOK = err == nil
	if b.procRSS, err = p.peakRSS(); err != nil {
		b.log.Warn().Err(err).Msg("no peak RSS for the worker processes")
	}
	return wb, nil
}

// runFleet runs the same backlog again, in a database of its own, with
// Fleet separate `couchq worker` processes of FleetConcurrency each — how
// a fleet runs in production, each process with its own feed, registry
// entry and peers — and compares it with the in-process figure.
func (b *run) runFleet(ctx context.Context, s *Section, inProcess float64) error {
	cfg := b.cfg
	if cfg.Fleet <= 0 {
		return nil
	}
	if b.t.info.Vendor != "couchdb" {
		// On PouchDB Server 4.2.0 eight processes had run about half of
		// 10,000 jobs after eight minutes, longer than the rest of the
		// server's run together. The fleet target is about couchq's
		// processes, which the reference server judges.
		s.add(textRow("fleet of `couchq worker` processes", "not run: Apache CouchDB only (on PouchDB Server it took longer than the rest of the run)"))
		return nil
	}
	if _, err := b.cliPath(ctx); err != nil { // built before anything is timed
		return err
	}
	db, c, err := b.indexedBacklog(ctx, s, "fleet", cfg.Validation)
	if err != nil {
		return err
	}
	conc := make([]int, cfg.Fleet)
	for i := range conc {
		conc[i] = cfg.FleetConcurrency
	}
	cpu0 := b.t.cpu()
	p, err := b.startProcs(ctx, db, conc)
	if err != nil {
		return err
	}
	defer p.stop(b)
	if err := p.waitCompleted(ctx, c, int64(cfg.Jobs), stallTimeout); err != nil {
		return err
	}
	cpu1 := b.t.cpu()
	jt, err := readDone(ctx, c, cfg.Jobs)
	if err != nil {
		return err
	}
	tput := rate(int64(cfg.Jobs), jt.span())
	row := s.add(numRow(fmt.Sprintf("fleet: %d `couchq worker` processes x %d, first claim -> last done", cfg.Fleet, cfg.FleetConcurrency),
		tput, "jobs/s", 0))
	row.Key = keyFleet
	share := s.add(numRow("fleet / in-process", 100*ratio(tput, inProcess), "%", 1))
	share.target(fmt.Sprintf(">= %.0f%% of in-process", TargetFleetShare*100), tput >= TargetFleetShare*inProcess)
	share.Key = keyFleetShare
	s.add(numRow("  fleet: jobs run more than once", float64(jt.reruns), "", 0))
	if cpu, err := p.cpu(); err == nil {
		s.add(durRow("  fleet: CPU per job, worker processes", cpu/time.Duration(cfg.Jobs)))
	}
	cpu0.ok = false // the bench process only watched the worker processes
	cpuRows(s, "  fleet: ", cpu0, cpu1, cfg.Jobs)
	return b.runFleetShape(ctx, s, conc, tput, inProcess)
}

// runFleetShape runs the backlog once more with the fleet's shape (Fleet
// worker.Worker values of FleetConcurrency each) in this process, and
// splits the fleet's gap to the in-process figure in two: what separate
// processes cost (fleet / the same shape here), and what workers of
// FleetConcurrency slots cost against the in-process run's (the same
// shape here / in-process). A worker claims and finishes its jobs in
// batches of up to its free slots, so workers of 4 slots send several
// times the requests per job of one of 16; the second share says whether
// the fleet target is within reach of workers of that size at all.
func (b *run) runFleetShape(ctx context.Context, s *Section, conc []int, fleet, inProcess float64) error {
	cfg := b.cfg
	db, c, err := b.indexedBacklog(ctx, s, "fleetshape", cfg.Validation)
	if err != nil {
		return err
	}
	cpu0 := b.t.cpu()
	if _, err := b.workInProcess(ctx, db, conc, cfg.Jobs); err != nil {
		return err
	}
	cpu1 := b.t.cpu()
	jt, err := readDone(ctx, c, cfg.Jobs)
	if err != nil {
		return err
	}
	shape := rate(int64(cfg.Jobs), jt.span())
	s.add(numRow(fmt.Sprintf("the fleet's shape in one process: %d workers x %d, first claim -> last done", cfg.Fleet, cfg.FleetConcurrency),
		shape, "jobs/s", 0))
	s.add(numRow("  fleet / the same shape in one process (what separate processes cost)", 100*ratio(fleet, shape), "%", 1))
	s.add(reachFleetRow(shape, inProcess, cfg.FleetConcurrency))
	cpuRows(s, "  the fleet's shape in one process: ", cpu0, cpu1, cfg.Jobs)
	return nil
}

// reachFleetRow says whether the fleet target is within reach of workers
// of slots slots each: shape, the fleet's shape in one process, as a share
// of inProcess.
func reachFleetRow(shape, inProcess float64, slots int) Row {
	share := 100 * ratio(shape, inProcess)
	verdict := "no"
	if shape >= TargetFleetShare*inProcess {
		verdict = "yes"
	}
	return Row{Metric: fmt.Sprintf("  within reach of workers of %d slots? (the same shape in one process / in-process)", slots),
		Value: share, Unit: "%", Text: fmt.Sprintf("%s: %.1f %%", verdict, share), Key: keyFleetReach}
}

// judgeThroughput sets the end-to-end target on row, couchq's throughput
// tput with validation as given, and adds its share of the limits section
// 1 measured. On the node (and on PouchDB Server, held to the same rule)
// the limit is what the server stores in bulk into a database like the
// queue's, over the three writes a job takes: with validation on, a
// database with couchq's design document; with it off, a bare one, of
// which a smaller share is asked (TargetNoValidationShare). The cluster
// has a target of its own, against the figure it had when the targets
// were set (TargetClusterThroughput).
func (b *run) judgeThroughput(s *Section, row *Row, tput float64, validation designdocs.Validation) {
	if b.server.kind == ServerCluster {
		row.target(fmt.Sprintf(">= %.0f jobs/s (2 x %.0f, the cluster's figure when the target was set)", TargetClusterThroughput, ClusterThroughputBaseline),
			tput >= TargetClusterThroughput)
	}
	if b.ceiling == nil {
		if row.Target == "" {
			row.Target = "vs bulk/3: run section 1"
		}
		return
	}
	bare := b.ceiling.jobsLimit()
	if validation == designdocs.ValidationOff {
		if row.Target == "" {
			row.target(fmt.Sprintf(">= %.0f%% of %.0f jobs/s (bulk, bare / 3)", TargetNoValidationShare*100, bare), tput >= TargetNoValidationShare*bare)
		}
		s.add(numRow("  share of the physical limit (bulk, bare / 3)", 100*ratio(tput, bare), "%", 1)).Key = keyNoValidationShare
		return
	}
	limit := b.ceiling.designLimit()
	if row.Target == "" {
		row.target(fmt.Sprintf(">= %.0f%% of %.0f jobs/s (bulk with couchq's design doc / 3)", TargetThroughputShare*100, limit), tput >= TargetThroughputShare*limit)
	}
	s.add(numRow("share of the limit with couchq's design doc (bulk with its validation and views / 3)", 100*ratio(tput, limit), "%", 1)).Key = keyThroughputShare
	s.add(numRow("share of the physical limit (bulk, bare / 3)", 100*ratio(tput, bare), "%", 1))
	s.add(numRow("share of the single-doc limit (best single-doc rate / 3)", 100*ratio(tput, b.ceiling.putLimit()), "%", 1))
}

// judgeClusterCPU adds, on the cluster, its server CPU per job (perJob,
// in ms) as a multiple of the single node's in the same run, judged
// against TargetClusterCPU.
func (b *run) judgeClusterCPU(s *Section, perJob float64) {
	if b.server.kind != ServerCluster {
		return
	}
	const metric = "  server CPU per job, of the single node's in this run"
	node, ok := b.priorHeadline(ServerCouchDB, keyServerCPU)
	if !ok || node.Value <= 0 {
		s.add(textRow(metric, "not judged: no single node measured before the cluster in this run"))
		return
	}
	x := perJob / node.Value
	row := s.add(numRow(metric, x, "x", 2))
	row.Key = keyClusterCPU
	row.target(fmt.Sprintf("<= %.1f x (%s on the node)", TargetClusterCPU, node.Text), x <= TargetClusterCPU)
}

// priorHeadline is the headline row of key in the report of the server of
// that kind measured earlier in this run.
func (b *run) priorHeadline(kind, key string) (Row, bool) {
	for _, r := range b.prior {
		if r.Server.Kind == kind {
			return r.headline(key)
		}
	}
	return Row{}, false
}

// runWithoutValidation runs section 2's backlog again, in process as the
// main run, in a database whose design document has validation off, and
// judges it against TargetNoValidationShare. It runs only when the main
// run had validation on (with it off, the main run is this one).
func (b *run) runWithoutValidation(ctx context.Context, s *Section) error {
	if b.cfg.Validation == designdocs.ValidationOff {
		return nil
	}
	r, err := b.runValidated(ctx, s, "novalidation", designdocs.ValidationOff)
	if err != nil {
		return err
	}
	row := s.add(numRow(fmt.Sprintf("validation off: throughput, %d worker goroutines, first claim -> last done", b.cfg.Workers), r.tput, "jobs/s", 0))
	row.Key = keyNoValidation
	if b.server.kind == ServerCluster {
		// Not judged: the cluster's targets are its own, validation on.
		if b.ceiling != nil {
			s.add(numRow("  share of the physical limit (bulk, bare / 3)", 100*ratio(r.tput, b.ceiling.jobsLimit()), "%", 1)).Key = keyNoValidationShare
		}
	} else {
		b.judgeThroughput(s, row, r.tput, designdocs.ValidationOff)
	}
	r.rows(s, "  validation off: ", b.cfg.Jobs)
	return nil
}

// runWithMangoValidation runs section 2's backlog again, in process as
// the main run, in a database validated by the Mango selector (validation
// mango), where the server runs one, beside validation on and off. Not
// judged: the targets are set for validation on and off.
func (b *run) runWithMangoValidation(ctx context.Context, s *Section) error {
	const metric = "validation mango: throughput"
	if b.cfg.Validation == designdocs.ValidationMango {
		return nil // the main run is this one
	}
	var r *validatedRun
	var err error
	if b.noMango == nil {
		r, err = b.runValidated(ctx, s, "mangovalidation", designdocs.ValidationMango)
		if errors.Is(err, protocol.ErrNoMangoValidation) {
			b.noMango, err = err, nil
		}
	}
	switch {
	case err != nil:
		return err
	case b.noMango != nil:
		s.add(textRow(metric, "not measured: the server runs no Mango validate_doc_update"))
		return nil
	}
	s.add(numRow(fmt.Sprintf("%s, %d worker goroutines, first claim -> last done", metric, b.cfg.Workers), r.tput, "jobs/s", 0))
	if b.ceiling != nil {
		if b.ceiling.bulkMango > 0 {
			s.add(numRow("  share of bulk with couchq's design doc, validation mango / 3", 100*ratio(r.tput, b.ceiling.bulkMango/3), "%", 1))
		}
		s.add(numRow("  share of bulk with couchq's design doc, validation on / 3", 100*ratio(r.tput, b.ceiling.designLimit()), "%", 1))
		s.add(numRow("  share of the physical limit (bulk, bare / 3)", 100*ratio(r.tput, b.ceiling.jobsLimit()), "%", 1))
	}
	r.rows(s, "  validation mango: ", b.cfg.Jobs)
	return nil
}

// validatedRun is section 2's backlog worked again in a database of its
// own, validated another way than the main run's.
type validatedRun struct {
	tput         float64
	jt           jobTimes
	cpu0, cpu1   cpuUse
	compacting   float64
	compactingOK bool
}

// runValidated enqueues and indexes section 2's backlog in a database
// validated as given and works it in process as the main run does.
func (b *run) runValidated(ctx context.Context, s *Section, what string, validation designdocs.Validation) (*validatedRun, error) {
	cfg := b.cfg
	db, c, err := b.indexedBacklog(ctx, s, what, validation)
	if err != nil {
		return nil, err
	}
	r := &validatedRun{cpu0: b.t.cpu()}
	watch := b.t.watchCompaction(ctx, db)
	_, err = b.workInProcess(ctx, db, splitConcurrency(cfg.Workers, cfg.Instances), cfg.Jobs)
	r.compacting, r.compactingOK = watch.stopWatch()
	if err != nil {
		return nil, err
	}
	r.cpu1 = b.t.cpu()
	if r.jt, err = readDone(ctx, c, cfg.Jobs); err != nil {
		return nil, err
	}
	r.tput = rate(int64(cfg.Jobs), r.jt.span())
	return r, nil
}

// rows adds what every validated run reports: reruns, compaction and CPU
// per job, each metric led by prefix.
func (r *validatedRun) rows(s *Section, prefix string, jobs int) {
	s.add(numRow(prefix+"jobs run more than once", float64(r.jt.reruns), "", 0))
	compactionRow(s, prefix, r.compacting, r.compactingOK)
	cpuRows(s, prefix, r.cpu0, r.cpu1, jobs)
}

// compactionRow gives the share of a run's time in which the server was
// compacting the run's database (compactionWatch), when it could tell.
// CouchDB compacts a queue's database on its own while jobs are worked
// (its files grow by a revision per claim and per outcome); the ceiling's
// short bulk runs finish before it starts.
func compactionRow(s *Section, prefix string, share float64, ok bool) {
	if ok {
		s.add(numRow(prefix+"server compacting the database (automatic compaction), share of the run", 100*share, "%", 0))
	}
}

// indexedBacklog creates a database for s with validation as given,
// enqueues section 2's backlog in it and builds every index before
// anything is timed, as the in-process run does with its own.
func (b *run) indexedBacklog(ctx context.Context, s *Section, what string, validation designdocs.Validation) (string, *protocol.Client, error) {
	db, err := b.newDBValidation(ctx, s, what, validation)
	if err != nil {
		return "", nil, err
	}
	c, err := b.t.open(ctx, db)
	if err != nil {
		return "", nil, err
	}
	if _, err := enqueueBulk(ctx, c, b.cfg.Jobs); err != nil {
		return "", nil, err
	}
	if _, err := buildViews(ctx, c); err != nil {
		return "", nil, err
	}
	if _, err := b.buildOtherIndexes(ctx, db); err != nil {
		return "", nil, err
	}
	return db, c, nil
}
