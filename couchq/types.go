package couchq

import (
	"time"

	"github.com/couchq/couchq/internal/protocol"
)

// WorkItem is a job document as stored. Its JSON field names are a public
// contract, since applications write these documents straight into
// CouchDB: type ("WorkItem"), worker (the job type), date (when it is due,
// Unix seconds), payload, status, claimed, claimed_by, lease_until,
// attempts, max_attempts, priority, last_error, result, created_at,
// started_at, finished_at, history, unique_key, site, trace (the W3C trace
// context of the enqueue: {"traceparent": ..., "tracestate": ...}) and
// progress ({done, total, note, at}). Fields couchq does not know are kept
// on every write couchq makes. The README's WorkItem table gives each
// field's type and meaning.
//
// Useful methods: DueAt (when it is due), EffectivePriority (1 runs first,
// 5 last), Extra (a field couchq does not know) and Clone.
type WorkItem = protocol.WorkItem

// Progress is how far a job got, as its handler (worker.Job.Progress) or
// agent (Client.ReportProgress) last reported it (WorkItem.Progress, stored
// as {done, total, note, at}): Done out of Total (0 when unknown), a short
// Note, and when (At, Unix seconds). String reads "40/120 (33%) page 40".
type Progress = protocol.Progress

// Event is one entry of a job's activity log (WorkItem.History): when (At),
// what (Event: enqueued, claimed, done, failed, retry-scheduled, snoozed,
// lease-expired, released, cancelled, requeued …), by whom (By) and at
// which attempt, with the error that caused it.
type Event = protocol.Event

// Status is a job's state: StatusWaiting, StatusQueued, StatusRunning,
// StatusDone, StatusFailed or StatusCancelled. Done, failed and cancelled
// are terminal (Status.Terminal).
type Status = protocol.Status

// The statuses of a job.
const (
	StatusQueued    = protocol.StatusQueued
	StatusRunning   = protocol.StatusRunning
	StatusDone      = protocol.StatusDone
	StatusFailed    = protocol.StatusFailed
	StatusCancelled = protocol.StatusCancelled
	// StatusWaiting: the job waits for other jobs (NewJob.After, a
	// batch's callback, a handler's children) and no worker claims it
	// until they have finished.
	StatusWaiting = protocol.StatusWaiting
)

// What a waiting job does when a job it waits for fails for good or is
// cancelled (NewJob.OnDependencyFailure).
const (
	// DependencyCancel cancels it (the default).
	DependencyCancel = protocol.DependencyCancel
	// DependencyRun runs it anyway once every dependency has finished.
	DependencyRun = protocol.DependencyRun
)

// DependencyError is an enqueue refused because of a job named in After
// (one that does not exist, or the job itself); HTTPStatus gives the
// status an HTTP API answers with. It matches ErrInvalidJob.
type DependencyError = protocol.DependencyError

// BatchStatus is a batch's progress (Client.Batch): its jobs done,
// failed, cancelled and pending, the failed ones' ids, and its callback.
type BatchStatus = protocol.BatchStatus

// Priorities: a job's priority runs from PriorityHighest (runs first) to
// PriorityLowest; one without a priority has PriorityDefault.
const (
	PriorityHighest = protocol.PriorityHighest
	PriorityDefault = protocol.PriorityDefault
	PriorityLowest  = protocol.PriorityLowest
)

// DocType is the value of a job document's type field.
const DocType = protocol.DocType

// NewJob describes a job to enqueue. Its fields:
//
//   - Worker: the job type (required).
//   - Payload: handed to the handler; any value encoding/json accepts, or a
//     json.RawMessage (which must be valid JSON).
//   - At: when the job is due; the zero time means now.
//   - MaxAttempts: overrides the queue's default for this job; 0 keeps it.
//   - Priority: PriorityHighest (1) to PriorityLowest (5); 0 is the default.
//   - ID: the document id; empty picks a time-ordered one.
//   - Unique: makes the enqueue idempotent (see UniqueOpts); ID must then
//     be empty.
//   - Site: the job's owner in a queue of several sites; empty means the
//     client's Config.Site, else the default site.
//   - Trace: the W3C trace context ("traceparent", "tracestate") the job's
//     run continues; set by an enqueue hook such as otelcouchq's.
//   - Extra: fields of your own (a tenant, say) stored at the top level of
//     the document, read back with WorkItem.Extra; couchq's own names and
//     names starting with '_' are refused.
//   - After: jobs this one waits for (it is enqueued StatusWaiting and runs
//     once they have finished); each must exist already.
//   - OnDependencyFailure: DependencyCancel (the default) or DependencyRun,
//     what a job of After failing for good does to this one.
type NewJob = protocol.NewJob

// UniqueOpts make an enqueue idempotent: at most one job of a type holds a
// Key at a time (optionally per period For, aligned to the Unix epoch, so
// "daily" keys repeat each day). A second enqueue of a held key writes
// nothing and returns the job that holds it with ErrDuplicate.
type UniqueOpts = protocol.UniqueOpts

// EnqueueResult is the outcome of one job of Client.EnqueueMany: the job as
// stored (Item), whether a unique key was already held (Duplicate, with
// Item the holder), or why it was refused (Err).
type EnqueueResult = protocol.EnqueueResult

// ListOptions select jobs for Client.List: a job type (Worker) and a
// Status, each empty for all, and at most Limit jobs (0 for 100).
type ListOptions = protocol.ListOptions

// PurgeOptions select finished jobs for Client.Purge: a terminal Status,
// finished longer ago than OlderThan, of one job type (Worker, empty for
// all); Progress, when set, is called with the running total.
type PurgeOptions = protocol.PurgeOptions

// StatsOptions select what Client.Stats reports: a job type (empty for
// all) and a time window for the finished jobs' figures.
type StatsOptions = protocol.StatsOptions

// Stats is the queue's report: per job type, the jobs in each status, the
// due backlog and its oldest age, and over the window the jobs finished,
// failed and their wait and run time percentiles; the worker processes.
type Stats = protocol.Stats

// TypeQueue is one job type's queue now (Client.Queues): due, scheduled,
// running and failed counts, the oldest due job's age, and whether the type
// is paused.
type TypeQueue = protocol.TypeQueue

// WorkerInfo is a worker process as it registered itself (Client.Workers):
// host, pid, job types, jobs running and its last heartbeat.
type WorkerInfo = protocol.WorkerInfo

// SweepResult counts what a Client.Sweep did: expired claims requeued or
// failed, conflicted jobs settled, malformed documents quarantined.
type SweepResult = protocol.SweepResult

// Periodic is a job enqueued on a cron schedule (Name, Schedule in cron
// syntax, Location, the Job to enqueue at each tick, and what to do with
// ticks missed while no worker ran). Workers run the schedules given in
// worker.Config.Periodic; every tick yields exactly one job, however many
// processes run the schedule.
type Periodic = protocol.Periodic

// RateLimit lets at most N jobs of a type start per window of length Per,
// across every worker process (worker.Config.RateLimits).
type RateLimit = protocol.RateLimit

// AgentClaim is what Client.ClaimForAgent returns: the jobs the agent
// already held (Held, returned again after a restart), those claimed now
// (Claimed), and whether the type is paused. Jobs lists both.
type AgentClaim = protocol.AgentClaim

// FailOptions shape Client.Fail: how long to wait before the next attempt
// (RetryAfter) and whether to fail the job for good now (Final).
type FailOptions = protocol.FailOptions

// Sequence names a set of slots that Client.Reserve hands out one at a
// time, each to one holder, such as invoice numbers or seats (see
// NumberedSequence).
type Sequence = protocol.Sequence

// Reservation is a slot of a Sequence held by a holder until it is
// released, or until its time to live runs out.
type Reservation = protocol.Reservation

// InitOptions are what Server.Init is asked to choose: how CouchDB
// validates every write (Validation: on, mango where the server runs a
// Mango validate_doc_update, off, or auto; the zero value keeps the
// database's choice, on for a new one; see designdocs.Validation), whether
// the database has couchq's roles, which only validation on enforces
// (Roles, for auto), and the JavaScript engine of the design documents'
// functions (Language; the zero value keeps the stored choice, else the
// fastest the server has), and the number of shards of a database it
// creates (Shards; the zero value is one on a cluster, the server's own
// default on a single node; another number for a database that exists is
// an error). Validation mango on a server without it fails
// with designdocs.ErrNoMangoValidation and changes nothing.
type InitOptions = protocol.InitOptions

// MalformedError describes a stored document couchq cannot run: its id and
// which field is wrong and why.
type MalformedError = protocol.MalformedError

// NumberedSequence is a Sequence of numbered slots: format (a fmt verb for
// an int, say "INV-%06d") applied to first, first+1, …; a reservation not
// released within ttl (0: SlotTTLDefault) goes back to the pool.
func NumberedSequence(name, format string, first int, ttl time.Duration) Sequence {
	return protocol.NumberedSequence(name, format, first, ttl)
}

// SlotTTLDefault is how long a reservation lasts when its Sequence names
// no time to live.
const SlotTTLDefault = protocol.SlotTTLDefault

// Errors a Client's calls return; test them with errors.Is.
var (
	// ErrNotFound: the job does not exist (or the batch, site or
	// reserved slot a call names). A database that does not exist is not
	// ErrNotFound: the error carries CouchDB's 404.
	ErrNotFound = protocol.ErrNotFound
	// ErrInvalidJob: a job given to Enqueue cannot be stored; the error
	// says which field and why.
	ErrInvalidJob = protocol.ErrInvalidJob
	// ErrDuplicate: a unique job's key is held by another job, which is
	// returned beside the error.
	ErrDuplicate = protocol.ErrDuplicate
	// ErrWrongState: the job is not in a state the action applies to, such
	// as a retry of a job that is running.
	ErrWrongState = protocol.ErrWrongState
	// ErrClaimLost: a claim the caller held is gone (the job was swept
	// after its lease ran out, cancelled or requeued); the write was not
	// applied.
	ErrClaimLost = protocol.ErrClaimLost
	// ErrNotHeld: the job is not held by the agent that names it.
	ErrNotHeld = protocol.ErrNotHeld
	// ErrInvalidSequence: a Sequence cannot hand out slots; the error says
	// why.
	ErrInvalidSequence = protocol.ErrInvalidSequence
	// ErrReservationLost: a reservation expired and its slot went to
	// another holder.
	ErrReservationLost = protocol.ErrReservationLost
	// ErrForwarded: a cancel or retry of another site's job was not
	// applied here; a request for it went to the job's owner site, which
	// applies it once, when the request reaches it.
	ErrForwarded = protocol.ErrForwarded
)

// CatchUp is a Periodic schedule's policy for ticks missed while no
// process ran it: CatchUpOnce (the default) enqueues one job for the
// latest, CatchUpAll one per missed tick, up to a thousand.
type CatchUp = protocol.CatchUp

// The catch-up policies.
const (
	CatchUpOnce = protocol.CatchUpOnce
	CatchUpAll  = protocol.CatchUpAll
)
