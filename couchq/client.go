package couchq

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/protocol"
)

// Defaults for Config, and the database couchq's commands use.
const (
	// MaxAttemptsDefault is how many times a job runs before it stays
	// failed, for jobs that do not say.
	MaxAttemptsDefault = protocol.MaxAttemptsDefault
	// HistoryLimitDefault bounds each job's activity log.
	HistoryLimitDefault = protocol.HistoryLimitDefault
	// ActorDefault names who writes, in jobs' activity logs, when a call
	// names no one.
	ActorDefault = "cli"
	// DBDefault is the database couchq's command uses when none is named.
	DBDefault = protocol.DBDefault
)

// Config configures a Client. The zero value is ready to use.
type Config struct {
	// Logger receives warnings: skipped malformed documents, conflicts
	// cleaned up. The zero value discards them.
	Logger zerolog.Logger
	// Actor names who makes this client's writes in the jobs' activity
	// logs (retries, cancels, pauses); default ActorDefault.
	Actor string
	// MaxAttempts is how many attempts a job gets. Set, it is stored as
	// max_attempts in the jobs this client enqueues without their own
	// (NewJob.MaxAttempts), so that the workers that run them keep it
	// whatever their own default; and it is the default of the workers
	// given this client, for jobs that have none (written by hand, or by
	// a client without it). Default MaxAttemptsDefault, which is not
	// stored.
	MaxAttempts int
	// HistoryLimit bounds each job's activity log, the oldest entries going
	// first (the enqueued entry stays); default HistoryLimitDefault.
	HistoryLimit int
	// ReadYourWrites makes every write on a cluster wait for all copies
	// rather than a majority, so that a list right after a write sees it
	// through any node. Producers that list what they just wrote want it;
	// workers do not.
	ReadYourWrites bool
	// Site is the site this client works for, in a queue of several
	// databases linked by replication (see the sites guide): its workers
	// claim only the jobs the site owns, and the jobs it enqueues are the
	// site's unless NewJob.Site names another. Empty in a single database.
	Site string
	// BeforeEnqueue hooks run, in order, on every job the client enqueues
	// (Enqueue, EnqueueMany, EnqueueBatch and its callback, unique jobs,
	// the children a handler enqueues, and the periodic jobs of workers
	// given the client) before it is checked and stored, with the
	// caller's context (for a child the handler's, for a periodic job the
	// worker's, which carries none of the application's values): they may set its fields, such as a tenant in
	// Extra or the caller's trace context in Trace (otelcouchq's
	// EnqueueHook). A hook's error refuses the job, wrapped in an error
	// that names the hook's place in the list.
	BeforeEnqueue []func(ctx context.Context, job *NewJob) error
}

// Server is a connection to a CouchDB server (Apache CouchDB, a cluster of
// it, or PouchDB Server).
type Server struct {
	s *protocol.Server
}

// Connect dials the CouchDB server at rawURL and asks it what it is.
// Credentials may be in the URL or given as user and password; they are
// sent as basic auth and never appear in errors. rawURL may list several
// nodes of one cluster, comma-separated: requests then fail over between
// them.
func Connect(ctx context.Context, rawURL, user, password string) (*Server, error) {
	s, err := protocol.Connect(ctx, rawURL, user, password)
	if err != nil {
		return nil, err
	}
	return &Server{s: s}, nil
}

// ConnectHTTP is Connect over the given HTTP client, for TLS settings,
// proxies or instrumentation.
func ConnectHTTP(ctx context.Context, rawURL, user, password string, hc *http.Client) (*Server, error) {
	s, err := protocol.ConnectHTTP(ctx, rawURL, user, password, hc)
	if err != nil {
		return nil, err
	}
	return &Server{s: s}, nil
}

// Init creates the database when it does not exist and installs or
// upgrades couchq's design documents in it. It is safe to run from many
// processes at once, and at every start. Design documents of this
// couchq's schema written by another couchq build are kept as they are,
// as a worker keeps them, so that the builds of a rolling deploy or a
// rollback do not put back their own at every start; `couchq init`
// installs this build's, and so does Init when opts choose a Validation
// or a Language.
func (s *Server) Init(ctx context.Context, db string, opts InitOptions) error {
	_, err := protocol.InitAtStart(ctx, s.s.Client, db, opts, zerolog.Nop())
	return err
}

// Open returns a Client for the named database, which Init prepared.
func (s *Server) Open(ctx context.Context, db string, cfg Config) (*Client, error) {
	if cfg.MaxAttempts > math.MaxInt32 {
		return nil, fmt.Errorf("opening database %s: %w: Config.MaxAttempts must be at most %d, got %d", db, ErrInvalidJob, math.MaxInt32, cfg.MaxAttempts)
	}
	q, err := s.s.Open(ctx, db, protocol.Config{
		Logger:      cfg.Logger,
		Actor:       cfg.Actor,
		MaxAttempts: cfg.MaxAttempts,
		// Set by the application: the jobs it enqueues carry it.
		EnqueueMaxAttempts: max(cfg.MaxAttempts, 0),
		HistoryLimit:       cfg.HistoryLimit,
		ReadYourWrites:     cfg.ReadYourWrites,
		Site:               cfg.Site,
		BeforeEnqueue:      cfg.BeforeEnqueue,
	})
	if err != nil {
		return nil, fmt.Errorf("opening database %s: %w", db, err)
	}
	return (*Client)(q), nil
}

// Client enqueues, inspects and acts on the jobs of one database. It is
// safe for concurrent use; one per database and process is enough. Workers
// (package worker) take one too.
type Client protocol.Client

// p is the protocol's client that c is.
func (c *Client) p() *protocol.Client { return (*protocol.Client)(c) }

// actor names who writes: the Config's Actor.
func (c *Client) actor() string { return c.p().Config().Actor }

// DB is the database the client works on, for reads and writes of your
// own.
func (c *Client) DB() *kivik.DB { return c.p().DB() }

// Enqueue stores a job and returns it as stored. A job with Unique set
// whose key is held returns the holder and ErrDuplicate; a job that cannot
// be stored returns an error wrapping ErrInvalidJob that says why.
func (c *Client) Enqueue(ctx context.Context, j NewJob) (*WorkItem, error) {
	return c.p().Enqueue(ctx, j)
}

// EnqueueMany stores many jobs in bulk, giving each job's outcome in the
// order given. The error is for the request as a whole; a job's own
// refusal is in its EnqueueResult.
func (c *Client) EnqueueMany(ctx context.Context, jobs []NewJob) ([]EnqueueResult, error) {
	return c.p().EnqueueMany(ctx, jobs)
}

// EnqueueBatch enqueues jobs as one batch and callback as the job that
// runs once after every one of them has finished, with a summary in its
// payload under "batch" (id, done, failed, cancelled, failed_ids). It
// returns the batch's id (see Batch, CancelBatch).
func (c *Client) EnqueueBatch(ctx context.Context, jobs []NewJob, callback NewJob) (string, error) {
	return c.p().EnqueueBatch(ctx, jobs, callback)
}

// Batch reads a batch's progress and its callback job.
func (c *Client) Batch(ctx context.Context, id string) (*BatchStatus, error) {
	return c.p().Batch(ctx, id)
}

// CancelBatch cancels the jobs of a batch that have not finished and
// returns how many; the callback then runs with them counted cancelled.
func (c *Client) CancelBatch(ctx context.Context, id, reason string) (int, error) {
	return c.p().CancelBatch(ctx, id, c.actor(), reason)
}

// Get reads a job. A job whose document holds a conflict (two claims
// through different nodes of a cluster) reads as the sweeper will settle
// it. A job that does not exist returns ErrNotFound.
func (c *Client) Get(ctx context.Context, id string) (*WorkItem, error) {
	return c.p().Get(ctx, id)
}

// List returns jobs by type and status. With a Status they come by time,
// earliest first: the due date of an unfinished job, the finish of a
// finished one. With only a Worker they come grouped by status (in the
// order cancelled, done, failed, queued, running, waiting), in id order
// within one, which for the ids couchq makes is enqueue order. Documents
// that are not valid jobs are left out (couchq show and the sweeper report
// them).
func (c *Client) List(ctx context.Context, opts ListOptions) ([]*WorkItem, error) {
	b, err := c.p().List(ctx, opts)
	if err != nil {
		return nil, err
	}
	return b.Items, nil
}

// Retry makes a failed or cancelled job due now, with its attempts
// counted afresh. Any other status returns ErrWrongState. Another site's
// job is retried by its owner: the call returns ErrForwarded.
func (c *Client) Retry(ctx context.Context, id string) (*WorkItem, error) {
	return c.p().Retry(ctx, id, c.actor())
}

// RetryFailed retries every failed job of a type (every type when worker
// is empty) and returns how many.
func (c *Client) RetryFailed(ctx context.Context, worker string) (int, error) {
	return c.p().RetryFailed(ctx, worker, c.actor(), nil)
}

// Cancel cancels a queued or running job: it will not run again, and a
// worker running it learns so at its next lease renewal. A finished job
// returns ErrWrongState. Another site's job is cancelled by its owner: the
// call returns ErrForwarded.
func (c *Client) Cancel(ctx context.Context, id, reason string) (*WorkItem, error) {
	return c.p().CancelJob(ctx, id, c.actor(), reason)
}

// Requeue returns a running job to the queue at once, without waiting for
// its lease to run out: for a job whose worker is gone. The attempt it was
// running stays counted. Unless force is set it is refused, with
// ErrWrongState saying why, while someone may still be running it: its
// worker's heartbeat is fresh, or its claimant has no heartbeat of its own
// (an agent) and its lease runs on. Any other status is ErrWrongState too,
// and so is another site's job: whether its claimant is gone is known at
// its owner (the worker registry stays at each site), so requeue it there.
func (c *Client) Requeue(ctx context.Context, id string, force bool) (*WorkItem, error) {
	if !force {
		it, err := c.p().Get(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("requeueing job %s: %w", id, err)
		}
		if err := c.p().ClaimantGone(ctx, it); err != nil {
			return nil, fmt.Errorf("requeueing job %s: %w", id, err)
		}
	}
	return c.p().Requeue(ctx, id, c.actor())
}

// Purge deletes finished jobs and returns how many.
func (c *Client) Purge(ctx context.Context, opts PurgeOptions) (int, error) {
	return c.p().Purge(ctx, opts)
}

// Pause stops every worker of a job type from claiming it, within a
// second, wherever they run; what they hold runs to the end.
func (c *Client) Pause(ctx context.Context, typ, reason string) error {
	return c.p().Pause(ctx, typ, c.actor(), reason)
}

// Resume lets the workers of a paused job type claim it again.
func (c *Client) Resume(ctx context.Context, typ string) error {
	return c.p().Resume(ctx, typ, c.actor())
}

// PauseAt pauses a job type at one site of a queue of several: at once
// when site is the client's own (Config.Site), else through a request
// that site's workers apply when the links bring it (the call returns
// ErrForwarded). A pause or resume made at that site after the request
// was made wins over it.
func (c *Client) PauseAt(ctx context.Context, site, typ, reason string) error {
	return c.p().PauseAt(ctx, site, typ, c.actor(), reason)
}

// ResumeAt resumes a job type at one site, as PauseAt pauses it.
func (c *Client) ResumeAt(ctx context.Context, site, typ string) error {
	return c.p().ResumeAt(ctx, site, typ, c.actor())
}

// Stats reports the queue per job type: jobs by status, the due backlog,
// and the finished jobs' figures over a window.
func (c *Client) Stats(ctx context.Context, opts StatsOptions) (*Stats, error) {
	return c.p().Stats(ctx, opts)
}

// Queues returns every job type's queue as it stands.
func (c *Client) Queues(ctx context.Context) ([]TypeQueue, error) {
	return c.p().Queues(ctx)
}

// Workers returns the worker processes that registered in the database,
// alive or not (WorkerInfo.Liveness tells).
func (c *Client) Workers(ctx context.Context) ([]*WorkerInfo, error) {
	return c.p().Workers(ctx)
}

// Sweep does once what workers do in the background: requeues the jobs of
// claims whose lease ran out, settles conflicted jobs and quarantines
// malformed documents.
func (c *Client) Sweep(ctx context.Context) (SweepResult, error) {
	return c.p().Sweep(ctx, c.actor(), 0)
}

// ClaimForAgent claims up to count due jobs of a type for an agent: a
// program that is not a couchq worker, in any language, which then
// finishes each job with Complete or Fail (over HTTP, couchq serve offers
// the same). Jobs the agent already holds come back first, so an agent
// that restarts gets its work back. Each claim's lease lasts lease; Extend
// renews it.
func (c *Client) ClaimForAgent(ctx context.Context, worker string, count int, agent string, lease time.Duration) (*AgentClaim, error) {
	return c.p().ClaimForAgent(ctx, worker, count, agent, lease)
}

// HeldJob reads a job that agent holds, for Complete, Fail, Extend or
// Release; a job held by another or by no one returns ErrNotHeld.
func (c *Client) HeldJob(ctx context.Context, id, agent string) (*WorkItem, error) {
	return c.p().HeldJob(ctx, id, agent)
}

// Complete finishes a held job as done, recording result (nil for none).
// A claim that was lost meanwhile returns ErrClaimLost and writes nothing.
// An item that is not claimed (read with Get, or already finished through
// this item) returns ErrNotHeld and writes nothing: Complete, Fail,
// Extend, ReportProgress and Release act only on jobs a claim returned.
func (c *Client) Complete(ctx context.Context, item *WorkItem, result json.RawMessage) error {
	if err := c.p().Complete(ctx, item, result); err != nil {
		return err
	}
	c.p().AfterFinish(ctx, item, c.actor())
	return nil
}

// Fail records a held job's failed attempt: it is retried after a backoff
// while attempts remain, else it stays failed.
func (c *Client) Fail(ctx context.Context, item *WorkItem, cause string, opts FailOptions) error {
	if err := c.p().Fail(ctx, item, cause, opts); err != nil {
		return err
	}
	c.p().AfterFinish(ctx, item, c.actor())
	return nil
}

// Extend renews a held job's lease to lease from now; a lease that is not
// positive is ErrInvalidJob.
func (c *Client) Extend(ctx context.Context, item *WorkItem, lease time.Duration) error {
	return c.p().Extend(ctx, item, lease)
}

// ReportProgress records how far a job the agent holds got: done out of
// total (0 when unknown), with a short note, shown by couchq show and ls
// and the dashboard. It writes at once (one write per call; a worker's
// handler reports with Job.Progress instead, which is throttled) and
// leaves the lease as it is. A 409 is ErrClaimLost.
func (c *Client) ReportProgress(ctx context.Context, item *WorkItem, done, total int, note string) error {
	return c.p().ReportProgress(ctx, item, done, total, note)
}

// Release gives a held job back to the queue without charging the
// attempt, so that another claimant runs it.
func (c *Client) Release(ctx context.Context, item *WorkItem, reason string) error {
	return c.p().Release(ctx, item, reason)
}

// Reserve reserves the next free slot of seq for holder: a slot abandoned
// or whose reservation ran out, else the first after the last used one.
// The holder then marks it used (ReleaseSlot) or frees it (AbandonSlot).
func (c *Client) Reserve(ctx context.Context, seq Sequence, holder string) (*Reservation, error) {
	return c.p().Reserve(ctx, seq, holder)
}

// ReleaseSlot marks a reserved slot used, for good: the work that took it
// succeeded.
func (c *Client) ReleaseSlot(ctx context.Context, r *Reservation) error {
	return c.p().ReleaseSlot(ctx, r)
}

// AbandonSlot frees a reserved slot, which the next Reserve takes: the
// work that took it failed.
func (c *Client) AbandonSlot(ctx context.Context, r *Reservation) error {
	return c.p().AbandonSlot(ctx, r)
}

// GetReservation reads the reservation of one slot of a sequence; a slot
// never reserved returns ErrNotFound.
func (c *Client) GetReservation(ctx context.Context, seq, slot string) (*Reservation, error) {
	return c.p().GetReservation(ctx, seq, slot)
}

// Reservations lists a sequence's reservations, at most limit of them.
func (c *Client) Reservations(ctx context.Context, seq string, limit int) ([]Reservation, error) {
	return c.p().Reservations(ctx, seq, limit)
}
