// Package worker is couchq's runtime: it runs handlers for one or more job
// types, claiming due WorkItems from CouchDB, renewing their leases while
// they run, retrying failures with backoff, sweeping claims of dead workers
// and shutting down without losing a job.
//
// A Worker wakes on the database's _changes feed, so new work starts within
// milliseconds; it sleeps exactly until the next scheduled job otherwise,
// with a slow fallback poll for changes it might have missed. Any number of
// worker processes on any number of machines can share one database.
package worker

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/protocol"
)

// Defaults for Config.
const (
	ConcurrencyDefault       = 4
	LeaseDurationDefault     = 30 * time.Second
	ClaimBatchDefault        = 100
	PickAmongDefault         = 32
	StealAfterDefault        = 500 * time.Millisecond
	ShutdownTimeoutDefault   = 30 * time.Second
	FeedTimeoutDefault       = 60 * time.Second
	QueryTimeoutDefault      = 30 * time.Second
	FallbackPollDefault      = 30 * time.Second
	RetryCapDefault          = 24 * time.Hour
	HeartbeatFractionDefault = 3 // heartbeat every lease / 3
	ProgressIntervalDefault  = 5 * time.Second
	AwaitSitesDefault        = time.Minute
)

// Config configures a Worker. The zero value of every field but Handlers
// means its default; see WithDefaults. A negative value is refused by New
// except where a field's doc gives it a meaning. How many attempts a job gets is the
// queue client's setting (couchq.Config.MaxAttempts, or the job's own
// max_attempts), so that the workers and the sweeper agree on it.
type Config struct {
	// Handlers maps each job type this worker runs to its handler.
	Handlers map[string]Handler
	// Concurrency is how many jobs of each type run at once.
	Concurrency int
	// LeaseDuration is how long a claim holds without renewal. A worker
	// that dies loses its jobs to the sweeper within about 1.5 times this
	// (the lease, then up to a sweep interval).
	LeaseDuration time.Duration
	// HeartbeatInterval is how often running jobs' leases are renewed and
	// the worker's registry document is updated; default LeaseDuration/3.
	HeartbeatInterval time.Duration
	// ProgressInterval is the shortest time between two writes of a job
	// that its progress reports (Job.Progress) cause: the latest report is
	// written then, or sooner with the job's next lease renewal, and the
	// last one with its outcome.
	ProgressInterval time.Duration
	// ClaimBatch is the most jobs claimed in one _bulk_docs request: a
	// claim round takes as many due jobs as there are free slots, up to
	// this. It bounds rounds only at Concurrency above it (a server takes
	// 100 documents in one request many times faster than in several).
	ClaimBatch int
	// PickAmong is K: each claim round picks among the first K due jobs
	// (with live peers: its own first, then those it may take from them,
	// see StealAfter; alone: at random), so that many workers do not all
	// fight over the same rows.
	// Rounds that lose claims to other workers widen it (up to 8 times),
	// and it narrows back once claims stop being lost.
	PickAmong int
	// StealAfter is how long a worker leaves a due job to the live peer it
	// hashes to (its owner) when that peer would take it in its next two
	// rounds (it is among the peer's oldest, twice as many as the peer
	// runs at once: the rows a worker reads may still list the peer's last
	// claims), so that workers do not race for the same jobs (each race
	// costs the loser a 409 and a round) even when few are due. Past StealAfter the job is
	// its owner's and one other peer's (its thief, also by hash), past
	// twice StealAfter a third peer's too (also by hash), past three times
	// anyone's: a busy or dead owner's jobs still run. It is what a new job
	// may wait when its owner is busy and others idle.
	// When a worker's claim rounds are slow (a loaded server), it waits
	// three of its rounds instead, up to 8 times StealAfter: an owner
	// takes its jobs in its next round, and a thief that does not wait
	// for it races it. A worker that joined in the last second also
	// leaves its own jobs to the peers that do not know of it yet, where
	// they would take them next.
	// Negative: a worker leaves no job to its owner (workers race for
	// every job, as before couchq gave jobs owners).
	StealAfter time.Duration
	// SweepInterval is how often this process sweeps expired leases;
	// default LeaseDuration/2. Negative disables the sweeper.
	SweepInterval time.Duration
	// Retry returns the delay before attempt+1 after attempt failed;
	// default DefaultRetry (attempt^4 seconds plus jitter, capped at a day).
	// A handler error with a method RetryAfter() time.Duration (as the
	// webhook handler's error for a 429 or 503 with a Retry-After header
	// has) makes the delay at least what that returns, up to
	// RetryCapDefault.
	Retry func(attempt int) time.Duration
	// ShutdownTimeout is how long Stop lets running jobs finish before it
	// cancels them and releases their claims.
	ShutdownTimeout time.Duration
	// JobTimeout bounds one attempt: when a handler has run this long its
	// context is cancelled (context.DeadlineExceeded), and if it returns
	// an error the attempt fails with "job timed out after JobTimeout" and
	// is retried as any failure is (a handler that returns nil anyway has
	// done the job). A handler that does not return holds its slot and
	// renews its lease until it does: the job is still running, and
	// another worker must not start it meanwhile. Zero: no bound (the
	// default), since a running job renews its lease however long it
	// takes. Built-in exec commands get SIGTERM, then SIGKILL.
	JobTimeout time.Duration
	// FeedTimeout is how long one _changes long-poll waits for a change.
	FeedTimeout time.Duration
	// QueryTimeout is how long a due-view query or a sweep (and each read
	// of the pause controls, the registry of peers, rate-limit and run
	// slots) may take before the worker gives up on it and asks again. CouchDB 3.5.0 was seen to
	// leave view queries unanswered for minutes after a node of the
	// cluster stopped mid-query (the cluster tier: both workers' due
	// queries hung, and no job ran); asking again is answered at once.
	// Keep it well above how long the due view takes to catch up after a
	// large enqueue: a query cut short only starts over.
	QueryTimeout time.Duration
	// FallbackPoll is how often each type looks for due work even when the
	// feed reported nothing (covers changes a broken feed missed).
	FallbackPoll time.Duration
	// Drain makes Run return once no due work of the worker's types remains
	// and nothing is running: the self-regulating cron pattern.
	Drain bool
	// DeleteDone lists job types whose finished jobs are deleted instead of
	// kept with status done: but for a batch's jobs, which its callback
	// counts, and unique jobs with a period, which hold their key until
	// it ends.
	DeleteDone map[string]bool
	// RateLimits bounds how many jobs of a type start per window across
	// every worker process together (see couchq.RateLimit); each process
	// must be given the same limit.
	RateLimits map[string]couchq.RateLimit
	// FleetConcurrency bounds how many jobs of a type run at once across
	// every worker process together (run slot documents); each process
	// must be given the same limit. Concurrency still bounds each process.
	FleetConcurrency map[string]int
	// Sequences gives a job type a slot sequence (see couchq.Sequence):
	// before each attempt the worker reserves the sequence's next free
	// slot and hands it to the handler as Job.Slot; when the handler
	// succeeds the slot is released as used (the sequence's marker moves
	// on), otherwise it is abandoned for the next job to take. The
	// reservation is not renewed while the handler runs: give the sequence
	// a TTL longer than the handler takes.
	Sequences map[string]couchq.Sequence
	// Periodic lists schedules this process enqueues jobs for (see
	// couchq.Periodic): any number of processes may run the same schedule,
	// and each tick yields one job.
	Periodic []couchq.Periodic
	// TakeOver, in a queue of several sites, lists the sites this worker's
	// site takes over by itself when their heartbeat (as this site's
	// database has it) is older than TakeOverAfter: their unfinished jobs
	// become this site's, as couchq sites takeover does. Off unless both
	// are set. Name one successor per site; a site only cut off may run a
	// job this site then runs too (its history shows both). Start fails
	// for a worker of no site, or when TakeOver names the worker's own site
	// or one the sites document does not list.
	TakeOver      []string
	TakeOverAfter time.Duration
	// AwaitSites, in a queue of several sites, bounds how long a worker
	// that starts after every worker of its site was stopped (the site's
	// heartbeat is over three heartbeat intervals old, or another worker
	// of the site is still waiting) holds its claims, sweeps and periodic
	// ticks until each other site that has workers has been heard from
	// twice through the links. What the other sites did while this one
	// was down, a takeover of its jobs above all, is then in its database
	// before it claims; otherwise it could claim a job another site now
	// owns, and the job would run twice. Past AwaitSites (a site down, or
	// a link) it claims anyway and logs the sites not heard from. Ready
	// reports the worker not ready while it waits. Negative: never wait.
	AwaitSites time.Duration
	// ID names this worker process in claims (host/pid/ID); default random.
	ID string
	// Middleware wraps every handler call of every type, the first in the
	// list outermost (see Middleware for where it runs and what it sees):
	// logging fields, error reporting, tracing, per-tenant context.
	Middleware []Middleware
	// Metrics, when set, records the worker's Prometheus metrics (see
	// NewMetrics); nil records none, at no cost. Workers may share one.
	Metrics *Metrics
	// Logger receives the worker's logs. The zero value discards them.
	Logger zerolog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.Concurrency <= 0 {
		c.Concurrency = ConcurrencyDefault
	}
	if c.LeaseDuration <= 0 {
		c.LeaseDuration = LeaseDurationDefault
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = c.LeaseDuration / HeartbeatFractionDefault
	}
	if c.ProgressInterval <= 0 {
		c.ProgressInterval = ProgressIntervalDefault
	}
	if c.ClaimBatch <= 0 {
		c.ClaimBatch = ClaimBatchDefault
	}
	if c.PickAmong <= 0 {
		c.PickAmong = PickAmongDefault
	}
	if c.StealAfter == 0 {
		c.StealAfter = StealAfterDefault
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = c.LeaseDuration / 2
	}
	if c.Retry == nil {
		c.Retry = DefaultRetry
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = ShutdownTimeoutDefault
	}
	if c.FeedTimeout <= 0 {
		c.FeedTimeout = FeedTimeoutDefault
	}
	if c.QueryTimeout <= 0 {
		c.QueryTimeout = QueryTimeoutDefault
	}
	if c.FallbackPoll <= 0 {
		c.FallbackPoll = FallbackPollDefault
	}
	if c.AwaitSites == 0 {
		c.AwaitSites = AwaitSitesDefault
	}
	if c.ID == "" {
		c.ID = fmt.Sprintf("w%06x", rand.IntN(1<<24))
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// validate reports configuration no worker could run with.
// checkNegative refuses a negative value where it means nothing: the
// defaults would otherwise stand in for it silently (a ShutdownTimeout of
// -1 meant as "no grace" would give 30 s).
func (c Config) checkNegative() error {
	for _, f := range []struct {
		name     string
		negative bool
	}{
		{"Concurrency", c.Concurrency < 0}, {"ClaimBatch", c.ClaimBatch < 0}, {"PickAmong", c.PickAmong < 0},
		{"LeaseDuration", c.LeaseDuration < 0}, {"HeartbeatInterval", c.HeartbeatInterval < 0},
		{"ProgressInterval", c.ProgressInterval < 0}, {"ShutdownTimeout", c.ShutdownTimeout < 0}, {"JobTimeout", c.JobTimeout < 0},
		{"FeedTimeout", c.FeedTimeout < 0}, {"QueryTimeout", c.QueryTimeout < 0}, {"FallbackPoll", c.FallbackPoll < 0},
	} {
		if f.negative {
			return fmt.Errorf("worker config: %s is negative: leave it 0 for its default", f.name)
		}
	}
	return nil
}

func (c Config) validate() error {
	if len(c.TakeOver) > 0 && c.TakeOverAfter < 3*c.HeartbeatInterval {
		return fmt.Errorf("worker config: TakeOverAfter %s must be at least three heartbeats (%s): a site must miss several before it counts as gone", c.TakeOverAfter, 3*c.HeartbeatInterval)
	}
	if len(c.Handlers) == 0 {
		return fmt.Errorf("worker config: no handlers: name at least one job type")
	}
	for typ, h := range c.Handlers {
		if typ == "" {
			return fmt.Errorf("worker config: empty job type")
		}
		if h == nil {
			return fmt.Errorf("worker config: job type %q has a nil handler", typ)
		}
	}
	for i, m := range c.Middleware {
		if m == nil {
			return fmt.Errorf("worker config: middleware %d is nil", i)
		}
	}
	for typ, rl := range c.RateLimits {
		if rl.N < 1 || rl.N > protocol.MaxRateSlots || rl.Per < 100*time.Millisecond {
			return fmt.Errorf("worker config: rate limit of %q: %s is out of range (1 to %d per 100ms or more)", typ, rl, protocol.MaxRateSlots)
		}
	}
	for typ, k := range c.FleetConcurrency {
		if k < 1 || k > protocol.MaxRateSlots {
			return fmt.Errorf("worker config: fleet concurrency of %q: %d is out of range (1 to %d)", typ, k, protocol.MaxRateSlots)
		}
	}
	for typ, seq := range c.Sequences {
		if err := seq.Validate(); err != nil {
			return fmt.Errorf("worker config: sequence of %q: %w", typ, err)
		}
	}
	names := map[string]bool{}
	for _, p := range c.Periodic {
		if _, err := protocol.CheckPeriodic(p); err != nil {
			return fmt.Errorf("worker config: %w", err)
		}
		if names[p.Name] {
			return fmt.Errorf("worker config: periodic schedule %q is given twice", p.Name)
		}
		names[p.Name] = true
	}
	if c.HeartbeatInterval >= c.LeaseDuration {
		return fmt.Errorf("worker config: heartbeat interval %s must be shorter than the lease %s",
			c.HeartbeatInterval, c.LeaseDuration)
	}
	return nil
}

// DefaultRetry waits attempt^4 seconds plus up to 10% jitter (so retries of
// jobs that failed together spread out), capped at RetryCapDefault.
func DefaultRetry(attempt int) time.Duration {
	return RetryBackoff(attempt, time.Second, RetryCapDefault)
}

// RetryBackoff is attempt^4 × unit plus up to 10% jitter, capped at limit.
func RetryBackoff(attempt int, unit, limit time.Duration) time.Duration {
	base := math.Pow(float64(max(attempt, 1)), 4) * float64(unit)
	if base > float64(limit) {
		return limit
	}
	d := time.Duration(base + rand.Float64()*base/10)
	return min(d, limit)
}

// hostname for claimant ids; unknown hosts still get unique ids via pid
// and worker id.
func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown-host"
	}
	return h
}
