package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/protocol"
)

// errShutdown is the cause a job's context carries when the worker stops
// before the job finished: its claim is released, not failed.
var errShutdown = errors.New("worker shutting down")

// errJobTimeout is the cause a handler's context carries when the job ran
// for JobTimeout.
var errJobTimeout = errors.New("job timeout")

// errRunSlotLost is the cause a job's context carries when its fleet-wide
// run slot was taken by another worker (its lease ran out while this one
// could not renew it) and no other was free: the job goes back to the
// queue, so that no more jobs run at once than the limit allows.
var errRunSlotLost = errors.New("run slot lost: another worker took the job's fleet-wide run slot")

// errLeaseLost is the cause a job's context carries when a lease renewal
// found the claim gone (swept or cancelled): its result will be refused.
var errLeaseLost = errors.New("lease lost: the job was swept or cancelled")

// Stats are counters a Worker keeps since it started.
type Stats struct {
	Claimed   int64 // jobs this worker claimed
	Conflicts int64 // claims not to run (409, a minority of a cluster's copies, another branch)
	// Conceded counts the Conflicts that were stored on a cluster and
	// given up soon after (withdrawn by the worker) rather than held for a
	// lease.
	Conceded  int64
	Completed int64
	Failed    int64 // failed attempts (retried or final)
	Lost      int64 // results refused because the claim was gone
	Queries   int64 // due-view queries
	// SlowRenewals counts lease renewals that took over a third of
	// LeaseDuration (each is logged, at most once a minute).
	SlowRenewals int64
}

// Worker runs handlers for its job types. Create it with New, then Start
// and Stop it, or Run it until its context ends.
type Worker struct {
	cfg    Config
	client *protocol.Client
	log    zerolog.Logger
	by     string // claimant id: host/pid/worker-id

	runners []*runner

	// stopClaiming closes when Stop begins: no new claims after that.
	stopClaiming chan struct{}
	stopOnce     sync.Once
	// begun is set by the first Start: a Worker runs once.
	begun atomic.Bool
	// stopped ends when Stop has done all it does: the outcomes still
	// being tried then (CouchDB not answering) are given up, so that a
	// stopped worker writes nothing more.
	stopped     context.Context
	markStopped context.CancelFunc
	// jobsCtx is the parent of every job's context; cancelJobs is called
	// (with errShutdown) when the shutdown timeout runs out.
	jobsCtx    context.Context
	cancelJobs context.CancelCauseFunc

	loops sync.WaitGroup // feed, sweeper, registry, runners
	jobs  sync.WaitGroup // running jobs
	// concedes counts the goroutines conceding unrun claims
	// (concedeLater); once concedesClosed is set (under concedeMu) none is
	// added, so that Stop may wait for them.
	concedes       sync.WaitGroup
	concedeMu      sync.Mutex
	concedesClosed bool
	drained        chan struct{} // closed when every runner drained (Drain mode)
	// jobsEnded counts the jobs that ended, outcome written (Drain mode).
	jobsEnded atomic.Uint64
	// firstPasses counts what a drain waits for before it may end: the
	// periodic schedules' first ticks (with the ticks they catch up on)
	// and its first sweep (the claims of killed workers, the waiting jobs
	// to release), which in Drain mode comes at once.
	firstPasses atomic.Int32
	// gate holds claims, sweeps and periodic ticks while the worker waits
	// to hear from the other sites: when it starts after its site's
	// workers were all stopped, and after it lost CouchDB for longer than
	// that (see await.go).
	gate siteGate
	// links paces the restarts of failed links into the site's database.
	links linkKeeper
	// clock paces the comparisons of the worker's clock with the server's.
	clock clockWatch

	pauseMu sync.Mutex // serialises refreshPaused

	mu      sync.Mutex
	running map[string]*runningJob
	started time.Time
	busy    time.Duration // summed job run time, for utilization

	registry *protocol.WorkerInfo // owned by register / heartbeatRegistry / unregister
	peers    peers                // the other live workers of each type (registry)

	stats struct {
		claimed, conflicts, conceded, completed, failed, lost, queries, slowRenewals atomic.Int64
	}
	// slowWarned is when the last slow-renewal warning went out (Unix ns).
	slowWarned atomic.Int64

	// health is what Ready reports; see noteContact and noteFeed.
	health struct {
		mu          sync.Mutex
		started     bool
		lastContact time.Time // last successful registry write (monotonic)
		contactErr  error     // the registry write's error since then
		// backAt is when a registry write succeeded after one failed
		// because CouchDB was out of reach or failing (see sweepLoop).
		backAt  time.Time
		feedErr error // non-nil while the changes feed is broken
	}
}

// New returns a Worker running cfg's handlers against the database that
// queue works on.
func New(queue *couchq.Client, cfg Config) (*Worker, error) {
	client := (*protocol.Client)(queue)
	if err := cfg.checkNegative(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	for _, p := range cfg.Periodic {
		if client == nil {
			break // Start refuses it
		}
		// A job the enqueue would refuse would be refused at every tick,
		// and a schedule that enqueues nothing is found out only by its
		// absence: refuse it now, as Enqueue would.
		j := p.Job
		j.ID = protocol.PeriodicJobID(p.Name, cfg.Now())
		if _, err := client.Draft(j); err != nil {
			return nil, fmt.Errorf("periodic schedule %q: its job: %w", p.Name, err)
		}
	}
	w := &Worker{
		cfg:          cfg,
		client:       client,
		log:          cfg.Logger.With().Str("worker", cfg.ID).Logger(),
		by:           fmt.Sprintf("%s/%d/%s", hostname(), os.Getpid(), cfg.ID),
		stopClaiming: make(chan struct{}),
		drained:      make(chan struct{}),
		gate:         siteGate{open: make(chan struct{})},
		running:      map[string]*runningJob{},
	}
	w.stopped, w.markStopped = context.WithCancel(context.Background())
	types := make([]string, 0, len(cfg.Handlers))
	for typ := range cfg.Handlers {
		types = append(types, typ)
	}
	sort.Strings(types)
	for _, typ := range types {
		w.runners = append(w.runners, &runner{
			w: w, typ: typ, handler: cfg.Handlers[typ],
			slots:        make(chan struct{}, cfg.Concurrency),
			finishing:    make(chan struct{}, cfg.Concurrency),
			wake:         make(chan struct{}, 1),
			unrepairable: map[string]struct{}{},
			claimedAt:    map[string]recentClaim{},
		})
	}
	return w, nil
}

// ClaimantID is how this worker signs its claims: host/pid/worker-id.
func (w *Worker) ClaimantID() string { return w.by }

// Types lists the job types this worker runs.
func (w *Worker) Types() []string {
	types := make([]string, len(w.runners))
	for i, r := range w.runners {
		types[i] = r.typ
	}
	return types
}

// Stats returns the worker's counters.
func (w *Worker) Stats() Stats {
	return Stats{
		Claimed: w.stats.claimed.Load(), Conflicts: w.stats.conflicts.Load(), Conceded: w.stats.conceded.Load(),
		Completed: w.stats.completed.Load(), Failed: w.stats.failed.Load(),
		Lost: w.stats.lost.Load(), Queries: w.stats.queries.Load(),
		SlowRenewals: w.stats.slowRenewals.Load(),
	}
}

// Start begins claiming and running jobs. It returns at once; the work goes
// on until Stop is called or ctx ends (which stops claiming, like Stop, but
// with no grace for running jobs). A Worker runs once: Start after Start
// or Stop returns an error; to run again, make another with New.
func (w *Worker) Start(ctx context.Context) error {
	if w.client == nil {
		return errors.New("starting the worker: its queue client is nil (open one with couchq.Open or couchq.Connect)")
	}
	select {
	case <-w.stopClaiming:
		return errors.New("starting the worker: it was stopped, and a Worker runs once: make another with worker.New")
	default:
	}
	if !w.begun.CompareAndSwap(false, true) {
		return errors.New("starting the worker: it was started already, and a Worker runs once: make another with worker.New")
	}
	w.started = w.cfg.Now()
	w.jobsCtx, w.cancelJobs = context.WithCancelCause(context.WithoutCancel(ctx))
	loopCtx, cancelLoops := context.WithCancel(ctx)
	go func() {
		select {
		case <-w.stopClaiming:
		case <-ctx.Done():
			w.stopOnce.Do(func() { close(w.stopClaiming) })
			w.cancelJobs(errShutdown)
		}
		cancelLoops()
	}()

	if err := w.register(ctx); err != nil {
		cancelLoops()
		return err
	}
	w.health.mu.Lock()
	w.health.started = true
	w.health.mu.Unlock()
	w.noteContact(nil)
	for _, r := range w.runners {
		w.cfg.Metrics.addSlots(r.typ, w.cfg.Concurrency)
	}
	// The feed's starting point comes before the runners' first look at
	// the due view: nothing enqueued in between goes unnoticed.
	since := "now"
	if !w.cfg.Drain {
		if seq, err := w.client.UpdateSeq(ctx); err == nil {
			since = seq
		} else {
			w.log.Warn().Err(err).Msg("reading the update sequence; the changes feed starts from now")
		}
	}
	w.refreshPaused(ctx) // before the first claim
	var drained sync.WaitGroup
	for _, r := range w.runners {
		w.loops.Add(1)
		drained.Add(1)
		go func() {
			defer w.loops.Done()
			if !w.untilClaimable(loopCtx) {
				drained.Done()
				return
			}
			r.loop(loopCtx, drained.Done)
		}()
	}
	go func() {
		drained.Wait()
		close(w.drained)
	}()
	if !w.cfg.Drain {
		w.loops.Add(1)
		go func() {
			defer w.loops.Done()
			w.followChanges(loopCtx, since)
		}()
	}
	if w.gate.waiting() {
		w.loops.Add(1)
		go func() {
			defer w.loops.Done()
			w.awaitSites(loopCtx)
		}()
	}
	// A sweep of this site's jobs from a copy the links have not brought
	// up to date would act on jobs another site took over, and a periodic
	// tick enqueues a job this site runs: both wait as claims do.
	sweepsFirst := w.cfg.Drain && w.cfg.SweepInterval > 0
	w.firstPasses.Store(int32(len(w.cfg.Periodic)))
	if sweepsFirst {
		w.firstPasses.Add(1)
	}
	if w.cfg.SweepInterval > 0 {
		w.loops.Add(1)
		go func() {
			defer w.loops.Done()
			swept := sync.OnceFunc(func() {
				if sweepsFirst {
					w.firstPasses.Add(-1)
					w.wakeAll()
				}
			})
			defer swept()
			if w.untilClaimable(loopCtx) {
				w.sweepLoop(loopCtx, sweepsFirst, swept)
			}
		}()
	}
	for _, p := range w.cfg.Periodic {
		w.loops.Add(1)
		go func() {
			defer w.loops.Done()
			ticked := sync.OnceFunc(func() {
				w.firstPasses.Add(-1)
				w.wakeAll() // what it enqueued is due: a drain looks for it
			})
			defer ticked()
			if w.untilClaimable(loopCtx) {
				w.periodicLoop(loopCtx, p, ticked)
			}
		}()
	}
	w.loops.Add(1)
	go func() {
		defer w.loops.Done()
		w.heartbeatRegistry(loopCtx)
	}()
	w.loops.Add(1)
	go func() {
		defer w.loops.Done()
		w.settleLoop(loopCtx)
	}()
	w.log.Info().Strs("types", w.Types()).Int("concurrency", w.cfg.Concurrency).
		Dur("lease", w.cfg.LeaseDuration).Str("claimant", w.by).Bool("drain", w.cfg.Drain).Msg("worker started")
	return nil
}

// Stop stops claiming, lets running jobs finish for up to the shutdown
// timeout (or until ctx ends), then cancels the rest and releases their
// claims back to the queue without charging an attempt. A handler that
// ignores the cancellation gets a heartbeat interval to return (half a
// second once ctx has ended) before Stop releases its claim itself; its
// result is then refused. Stop of a worker never started returns nil, and
// the worker cannot be started after it.
func (w *Worker) Stop(ctx context.Context) error {
	w.stopOnce.Do(func() { close(w.stopClaiming) })
	if w.cancelJobs == nil {
		return nil // never started: nothing runs, nothing is registered
	}
	w.loops.Wait()
	w.concedeMu.Lock()
	w.concedesClosed = true
	w.concedeMu.Unlock()
	w.concedes.Wait()

	grace, cancel := context.WithTimeout(ctx, w.cfg.ShutdownTimeout)
	defer cancel()
	finished := make(chan struct{})
	go func() {
		w.jobs.Wait()
		close(finished)
	}()
	select {
	case <-finished:
	case <-grace.Done():
		w.mu.Lock()
		n := len(w.running)
		w.mu.Unlock()
		w.log.Warn().Int("running", n).Msg("shutdown timeout: cancelling running jobs and releasing their claims")
		w.cancelJobs(errShutdown)
		// Cancelled handlers get a heartbeat interval to return and write
		// their own outcome; when ctx itself has ended the caller wants
		// Stop back now, so they get a moment only.
		windDown := w.cfg.HeartbeatInterval
		if ctx.Err() != nil {
			windDown = min(windDown, stopWindDown)
		}
		select {
		case <-finished:
		case <-time.After(windDown):
			// Handlers that ignore their context: release their claims
			// now; their results will be refused later.
			w.releaseStuck(context.WithoutCancel(ctx))
		}
	}
	w.cancelJobs(errShutdown)
	w.markStopped()
	// Only a started worker added its slots, and a second Stop must not
	// take them away again.
	w.health.mu.Lock()
	counted := w.health.started
	w.health.started = false
	w.health.mu.Unlock()
	if counted {
		for _, r := range w.runners {
			w.cfg.Metrics.addSlots(r.typ, -w.cfg.Concurrency)
		}
	}
	// The batches whose last jobs finished here within settleQuiet are
	// counted now, and the dependents of jobs finished then looked for
	// again, not left to the sweeper.
	w.settle(context.WithoutCancel(ctx), 0)
	w.unregister(context.WithoutCancel(ctx))
	w.log.Info().Msg("worker stopped")
	return nil
}

// stopWindDown is how long Stop waits for cancelled handlers to return
// once its context has ended, before it releases their claims itself.
const stopWindDown = 500 * time.Millisecond

// Run starts the worker and blocks until ctx ends (then stops gracefully)
// or, in Drain mode, until no due work remains.
func (w *Worker) Run(ctx context.Context) error {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	if err := w.Start(runCtx); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-w.drained:
		w.log.Info().Msg("drained: no due work left")
	}
	return w.Stop(context.WithoutCancel(ctx))
}

// readyHeartbeats is how many heartbeat intervals may pass without a
// successful registry write before Ready reports the worker not ready: one
// failed write is a blip, three mean CouchDB is not answering.
const readyHeartbeats = 3

// Ready reports whether the worker is doing its work: it returns nil when
// it has started and is not stopping, its last successful write to CouchDB
// (the registry heartbeat) is at most three heartbeat intervals old, and
// its changes feed is connected (or it has none: Drain mode), and it is
// not waiting to hear from the other sites (Config.AwaitSites). Otherwise
// the error says why. It makes no request: probes may call it often.
//
// A broken feed counts as connected again once a poll succeeds: the first
// after a break waits at most a second.
func (w *Worker) Ready() error {
	w.health.mu.Lock()
	defer w.health.mu.Unlock()
	h := &w.health
	switch {
	case w.stopping():
		return errors.New("worker stopping: claiming no new jobs")
	case !h.started:
		return errors.New("worker not started")
	}
	limit := readyHeartbeats * w.cfg.HeartbeatInterval
	if age := time.Since(h.lastContact); age > limit {
		err := h.contactErr
		if err == nil {
			err = errors.New("no answer yet")
		}
		return fmt.Errorf("CouchDB not reached for %s (over %d heartbeats): %w",
			age.Round(time.Millisecond), readyHeartbeats, err)
	}
	if h.feedErr != nil {
		return fmt.Errorf("changes feed disconnected: %w", h.feedErr)
	}
	switch {
	case w.gate.heldForOutage():
		return errors.New("not claiming: CouchDB was not reached for as long as this site's workers count as stopped; once it answers, the worker waits to hear from the other sites")
	case w.awaiting():
		return fmt.Errorf("not claiming yet: this site's workers were stopped, or CouchDB was out of reach, and it waits (up to %s) to hear from sites %s, so that what they did meanwhile is here first", w.cfg.AwaitSites, w.awaitedSites())
	}
	return nil
}

// noteContact records a registry write's outcome for Ready.
func (w *Worker) noteContact(err error) {
	w.health.mu.Lock()
	defer w.health.mu.Unlock()
	if err == nil {
		w.health.lastContact = time.Now()
		if outage(w.health.contactErr) {
			w.health.backAt = w.health.lastContact
		}
	}
	w.health.contactErr = err
}

// outOfReachLately reports whether the worker's last registry write
// failed because CouchDB was out of reach or failing, or the one before it
// did and the write after it was within within.
func (w *Worker) outOfReachLately(within time.Duration) bool {
	w.health.mu.Lock()
	defer w.health.mu.Unlock()
	return outage(w.health.contactErr) || (!w.health.backAt.IsZero() && time.Since(w.health.backAt) < within)
}

// noteFeed records whether the changes feed's last request failed.
func (w *Worker) noteFeed(err error) {
	w.health.mu.Lock()
	defer w.health.mu.Unlock()
	w.health.feedErr = err
}

// drainedAll reports, for a runner whose last look (begun when jobsEnded
// was ended) found nothing due, that its type has drained: no runner of
// the worker runs a job or is claiming one, and none ended since that
// look. A handler of any type may enqueue work of another, so a type
// drains only once every type is idle; and a job that ended after the
// look began may have enqueued what the look did not see.
func (w *Worker) drainedAll(ended uint64) bool {
	if w.firstPasses.Load() > 0 {
		return false // a schedule's catch-up may still enqueue due jobs
	}
	for _, r := range w.runners {
		if !r.idleSlots() || r.looking.Load() {
			return false
		}
	}
	return w.jobsEnded.Load() == ended
}

// Drained is closed when every type has drained (Drain mode only).
func (w *Worker) Drained() <-chan struct{} { return w.drained }

// wakeAll nudges every runner to look for due work that is new to it.
func (w *Worker) wakeAll() {
	for _, r := range w.runners {
		r.news.Store(true)
		r.nudge()
	}
}

func (w *Worker) stopping() bool {
	select {
	case <-w.stopClaiming:
		return true
	default:
		return false
	}
}

// sleep waits for d or until claiming stops; false means stop.
func (w *Worker) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-w.stopClaiming:
		return false
	}
}

// jitter spreads d by ±20% so that many workers do not act in lockstep.
func jitter(d time.Duration) time.Duration {
	return d - d/5 + time.Duration(rand.Int64N(int64(d/5)*2+1))
}

// settleQuiet is how long a batch must have had no job finished here before
// this worker counts it afresh (protocol.Client.SettleQuietBatches): while
// its jobs keep finishing, the index is read as it stands, which is cheap.
// It is also how long after a job finished here its dependents are looked
// for again (protocol.Client.LookAgainForDependents).
const settleQuiet = 250 * time.Millisecond

// settleLoop releases, every half settleQuiet, the callbacks of batches
// whose last jobs finished here while the index lagged behind them, and
// the jobs waiting for jobs finished here that the first look missed; it
// waits settleRetry after a request that failed (the server down: one
// warning then, not four a second).
func (w *Worker) settleLoop(ctx context.Context) {
	wait := settleQuiet / 2
	for w.sleep(ctx, wait) {
		wait = settleQuiet / 2
		if !w.settle(ctx, settleQuiet) {
			wait = settleRetry
		}
	}
}

// settleRetry is how long settleLoop waits after a failure.
const settleRetry = 5 * time.Second

// settle counts the batches quiet for quiet here and looks again for the
// dependents of the jobs finished here quiet ago (each bounded by
// QueryTimeout), and claims what they released; it reports false when
// either failed.
func (w *Worker) settle(ctx context.Context, quiet time.Duration) bool {
	qctx, cancel := context.WithTimeout(ctx, w.cfg.QueryTimeout)
	released, err := w.client.SettleQuietBatches(qctx, w.by, quiet)
	cancel()
	if err != nil && ctx.Err() == nil {
		w.log.Warn().Err(err).Msg("could not count the batches whose jobs finished here; will retry, and the sweeper releases their callbacks too")
	}
	w.claimReleased(ctx, released)
	qctx, cancel = context.WithTimeout(ctx, w.cfg.QueryTimeout)
	waiting, lerr := w.client.LookAgainForDependents(qctx, w.by, quiet)
	cancel()
	if lerr != nil && ctx.Err() == nil {
		w.log.Warn().Err(lerr).Msg("could not look again for the jobs waiting for jobs finished here; will retry, and the sweeper releases them too")
	}
	w.claimReleased(ctx, waiting)
	return err == nil && lerr == nil
}

// holds reports whether this worker still holds job id under claimant:
// its handler runs, or its outcome waits to be written. Its sweeps leave
// such a job alone even when its lease ran out (CouchDB was down, say):
// the worker writes the outcome or renews the lease once it can.
func (w *Worker) holds(id, claimant string) bool {
	if claimant != w.by {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.running[id]
	return ok
}

// sweepLoop returns expired claims to the queue every SweepInterval.
// A drain sweeps at once (now): cron runs of --drain may be every worker
// there is, and each may end before a sweep interval has passed. swept is
// called after the first sweep.
func (w *Worker) sweepLoop(ctx context.Context, now bool, swept func()) {
	wait := func() bool {
		if now {
			now = false
			return ctx.Err() == nil
		}
		return w.sleep(ctx, jitter(w.cfg.SweepInterval))
	}
	for wait() {
		if !w.untilClaimable(ctx) {
			return
		}
		// While CouchDB is out of reach no claimant can renew its lease,
		// and once it is back a live claimant renews at its next
		// heartbeat: leases that ran out meanwhile are not its death.
		// Sweeping them then would run its jobs again beside it. So the
		// sweeper waits two heartbeats after an outage it saw (its own
		// registry write failed: it fails during any outage long enough
		// to let a renewed lease run out).
		if w.outOfReachLately(2 * w.cfg.HeartbeatInterval) {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, w.cfg.QueryTimeout)
		res, err := w.client.SweepHolding(sctx, w.by, 0, w.holds)
		cancel()
		swept()
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn().Err(err).Msg("sweep failed; will retry")
			}
			continue
		}
		if res.Requeued+res.Failed > 0 {
			w.log.Info().Int("requeued", res.Requeued).Int("failed", res.Failed).Msg("swept expired leases")
			w.wakeAll()
		}
	}
}
