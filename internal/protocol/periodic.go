package protocol

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/robfig/cron/v3"
)

// Periodic is a schedule that enqueues a job at each tick. Every worker
// process that knows the schedule may enqueue each tick: the job's id is
// derived from the schedule's name and the tick's time (PeriodicJobID), so
// CouchDB keeps one job per tick and the others get a conflict. What the
// schedule enqueued last is kept in a state document ("periodic:<name>",
// PeriodicState), which is how ticks missed while no process ran are found.
type Periodic struct {
	// Name identifies the schedule; every process running it must use the
	// same name (and schedule). No ':' or '@'.
	Name string
	// Schedule is a cron expression ("0 7 * * 1-5", "@daily", with an
	// optional "CRON_TZ=Europe/Berlin " prefix) or "@every 5m". @every ticks
	// at multiples of the interval since the Unix epoch, so every process
	// sees the same ticks.
	Schedule string
	// Location is the time zone of a cron expression without CRON_TZ; nil
	// means UTC (not the machine's zone: processes on several machines must
	// agree).
	Location *time.Location
	// Job is what each tick enqueues; its At is set to the tick. ID and
	// Unique must be empty (the tick's id takes their place).
	Job NewJob
	// CatchUp says what happens to ticks missed while no process ran the
	// schedule: CatchUpOnce (the default) enqueues one job for them, the
	// latest tick; CatchUpAll one per missed tick (at most MaxCatchUp).
	CatchUp CatchUp
}

// CatchUp is the policy for ticks missed while no process ran a schedule.
type CatchUp int

const (
	// CatchUpOnce enqueues one job for all the missed ticks: the latest.
	CatchUpOnce CatchUp = iota
	// CatchUpAll enqueues one job per missed tick, up to MaxCatchUp.
	CatchUpAll
)

// MaxCatchUp bounds the jobs CatchUpAll enqueues after a downtime.
const MaxCatchUp = 1000

// PeriodicState is a schedule's state document: the last tick enqueued and
// the next one, for `couchq periodic ls` and for catching up.
type PeriodicState struct {
	ID       string `json:"_id"`
	Rev      string `json:"_rev,omitempty"`
	Type     string `json:"type"`
	Name     string `json:"name"`
	Schedule string `json:"schedule"`
	Worker   string `json:"worker"`
	// LastTick and NextTick are Unix seconds; LastTick is when the state
	// was created if no tick was enqueued yet.
	LastTick  float64 `json:"last_tick"`
	NextTick  float64 `json:"next_tick"`
	LastJob   string  `json:"last_job,omitempty"`
	UpdatedBy string  `json:"updated_by,omitempty"`
}

// PeriodicStateType is the type of a schedule's state document.
const PeriodicStateType = "PeriodicSchedule"

const periodicPrefix = "periodic:"

// PeriodicStateID is the id of a schedule's state document.
func PeriodicStateID(name string) string { return periodicPrefix + name }

// periodicJobID is PeriodicJobID at this client's site: in a queue of
// several sites each site runs the schedules it is given, and the same
// schedule at two sites must not make one id twice (the two jobs would
// meet as a conflict when the links carry them).
func (c *Client) periodicJobID(name string, tick time.Time) string {
	if c.cfg.Site != "" {
		return PeriodicJobID(c.cfg.Site+":"+name, tick)
	}
	return PeriodicJobID(name, tick)
}

// PeriodicJobID is the id of the job a schedule enqueues for a tick.
func PeriodicJobID(name string, tick time.Time) string {
	return "job:periodic:" + name + "@" + tick.UTC().Format(time.RFC3339)
}

// Ticks is a parsed schedule: when its ticks fall.
type Ticks struct {
	spec  string
	every time.Duration
	cron  cron.Schedule
}

// ParseSchedule parses a Periodic's Schedule in loc (nil: UTC).
func ParseSchedule(spec string, loc *time.Location) (Ticks, error) {
	spec = strings.TrimSpace(spec)
	if d, ok := strings.CutPrefix(spec, "@every "); ok {
		every, err := time.ParseDuration(strings.TrimSpace(d))
		if err != nil || every < time.Second {
			return Ticks{}, fmt.Errorf("schedule %q: @every wants a duration of at least 1s, such as 5m", spec)
		}
		return Ticks{spec: spec, every: every}, nil
	}
	full := spec
	if !strings.HasPrefix(spec, "CRON_TZ=") && !strings.HasPrefix(spec, "TZ=") {
		if loc == nil {
			loc = time.UTC
		}
		full = "CRON_TZ=" + loc.String() + " " + spec
	}
	s, err := cron.ParseStandard(full)
	if err != nil {
		return Ticks{}, fmt.Errorf("schedule %q: %w (want a cron expression such as \"0 7 * * 1-5\", \"@daily\", or \"@every 5m\")", spec, err)
	}
	// The parser takes a date that never comes (the 30th of February);
	// its Next then finds no tick within five years and says so with the
	// zero time.
	if s.Next(time.Now()).IsZero() {
		return Ticks{}, fmt.Errorf("schedule %q never fires: no time matches it (a day that the month never has?)", spec)
	}
	return Ticks{spec: spec, cron: s}, nil
}

// Next is the first tick strictly after t.
func (s Ticks) Next(t time.Time) time.Time {
	if s.every > 0 {
		n := t.UnixNano() / int64(s.every)
		return time.Unix(0, (n+1)*int64(s.every)).UTC()
	}
	return s.cron.Next(t)
}

func (p Periodic) validate() error {
	switch {
	case p.Name == "":
		return errors.New("periodic schedule: a name is required")
	case strings.ContainsAny(p.Name, ":@"):
		return fmt.Errorf("periodic schedule %q: the name cannot contain ':' or '@'", p.Name)
	case p.Job.Worker == "":
		return fmt.Errorf("periodic schedule %q: the job's type (Job.Worker) is required", p.Name)
	case p.Job.ID != "" || p.Job.Unique.Key != "":
		return fmt.Errorf("periodic schedule %q: the job's id comes from the tick: leave Job.ID and Job.Unique empty", p.Name)
	case p.CatchUp != CatchUpOnce && p.CatchUp != CatchUpAll:
		return fmt.Errorf("periodic schedule %q: unknown catch-up policy %d", p.Name, p.CatchUp)
	}
	return nil
}

// CheckPeriodic validates a schedule and parses its ticks.
func CheckPeriodic(p Periodic) (Ticks, error) {
	if err := p.validate(); err != nil {
		return Ticks{}, err
	}
	return ParseSchedule(p.Schedule, p.Location)
}

// stateRounds bounds the retries of a state update that races another.
const stateRounds = 5

// TickPeriodic enqueues the jobs of the schedule's ticks that fell due
// since its last tick (see Periodic.CatchUp) and returns when the next
// tick falls. A schedule seen for the first time starts from now: nothing
// before it is enqueued. Any number of processes may call it at once.
func (c *Client) TickPeriodic(ctx context.Context, p Periodic, ticks Ticks, by string) (next time.Time, enqueued []string, err error) {
	now := c.now()
	st, err := c.periodicState(ctx, p.Name)
	if err != nil {
		return time.Time{}, nil, err
	}
	if st == nil {
		st = &PeriodicState{ID: PeriodicStateID(p.Name), Type: PeriodicStateType, Name: p.Name, LastTick: ToUnix(now)}
	} else if st.UpdatedBy != by && (st.Schedule != ticks.spec || st.Worker != p.Job.Worker) {
		// The ticks' ids are made of the name and the time alone: two
		// processes running one name with different schedules enqueue the
		// ticks of both, and nothing else would say so.
		if _, warned := c.warnedSchedules.LoadOrStore(p.Name, true); !warned {
			c.log.Warn().Str("schedule", p.Name).Str("theirs", st.Schedule).Str("their_type", st.Worker).Str("by", st.UpdatedBy).
				Str("ours", ticks.spec).Str("our_type", p.Job.Worker).
				Msg("periodic schedule last ticked by another process with another schedule or job type: while both run, the ticks of both are enqueued under this name; after a change of schedule, the other is the process it replaced")
		}
	}
	var due []time.Time
	t := ticks.Next(FromUnix(st.LastTick))
	for ; !t.IsZero() && !t.After(now); t = ticks.Next(t) {
		due = append(due, t)
		if len(due) > MaxCatchUp {
			due = due[1:]
		}
	}
	next = t
	if p.CatchUp == CatchUpOnce && len(due) > 1 {
		due = c.collapseMissed(p.Name, due, now)
	}
	for _, tick := range due {
		job := p.Job
		job.ID, job.At = c.periodicJobID(p.Name, tick), tick
		it, err := c.Enqueue(ctx, job)
		switch {
		case err == nil:
			enqueued = append(enqueued, it.ID)
		case isStatus(err, http.StatusConflict):
			// Another process enqueued this tick.
		default:
			return time.Time{}, enqueued, fmt.Errorf("periodic schedule %s: enqueueing the tick of %s: %w", p.Name, tick.Format(time.RFC3339), err)
		}
	}
	var last time.Time
	if len(due) > 0 {
		last = due[len(due)-1]
	}
	return next, enqueued, c.advancePeriodic(ctx, st, p, ticks, last, by)
}

// lateGrace tells a late tick from a missed one: a process that wakes a
// little late (a loaded machine, a slow server) still enqueues every tick
// of the last lateGrace; older ones were missed while nothing ran.
const lateGrace = 10 * time.Second

// collapseMissed applies CatchUpOnce to the due ticks (two or more): the
// recent ones (within lateGrace, or within one tick's interval when the
// ticks come more often) all stay; missed ones become one job, the
// latest, unless a recent tick already covers them. Without the interval
// a schedule of every 5 s ran the two or three ticks of its last 10 s at
// once after every outage, and at every run of a --drain worker from cron.
func (c *Client) collapseMissed(name string, due []time.Time, now time.Time) []time.Time {
	grace := min(lateGrace, due[len(due)-1].Sub(due[len(due)-2]))
	first := len(due)
	for first > 0 && now.Sub(due[first-1]) <= grace {
		first--
	}
	missed, recent := due[:first], due[first:]
	if len(missed) <= 1 && len(recent) == 0 {
		return due
	}
	c.log.Info().Str("schedule", name).Int("missed", len(missed)).Msg("periodic schedule missed ticks; enqueueing them once")
	if len(recent) > 0 {
		return recent
	}
	return missed[len(missed)-1:]
}

// advancePeriodic records a schedule's state: its last tick moves forward
// to last (never back; zero: no tick now) and its next tick follows.
func (c *Client) advancePeriodic(ctx context.Context, st *PeriodicState, p Periodic, ticks Ticks, last time.Time, by string) error {
	for range stateRounds {
		lastTick, lastJob := st.LastTick, st.LastJob
		if !last.IsZero() && ToUnix(last) > st.LastTick {
			lastTick, lastJob = ToUnix(last), c.periodicJobID(p.Name, last)
		}
		nextTick := ToUnix(ticks.Next(FromUnix(lastTick)))
		if st.Rev != "" && lastTick == st.LastTick && nextTick == st.NextTick && lastJob == st.LastJob &&
			st.Schedule == ticks.spec && st.Worker == p.Job.Worker {
			return nil // nothing new to record
		}
		st.LastTick, st.NextTick, st.LastJob = lastTick, nextTick, lastJob
		st.Schedule, st.Worker, st.UpdatedBy = ticks.spec, p.Job.Worker, by
		_, err := c.db.Put(ctx, st.ID, st, c.writeOpts()...)
		if err == nil {
			return nil
		}
		if !isStatus(err, http.StatusConflict) {
			return fmt.Errorf("periodic schedule %s: recording its last tick: %w", p.Name, err)
		}
		fresh, err := c.periodicState(ctx, p.Name)
		if err != nil {
			return err
		}
		if fresh != nil {
			st = fresh
		} else {
			st.Rev = ""
		}
	}
	return fmt.Errorf("periodic schedule %s: its state changed %d times under us", p.Name, stateRounds)
}

func (c *Client) periodicState(ctx context.Context, name string) (*PeriodicState, error) {
	var st PeriodicState
	err := c.db.Get(ctx, PeriodicStateID(name), c.readOpts()...).ScanDoc(&st)
	switch {
	case isStatus(err, http.StatusNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("periodic schedule %s: reading its state: %w", name, err)
	}
	return &st, nil
}

// RemovePeriodic deletes the state document of a schedule no process runs
// any more, so that it is no longer listed. A process that still runs
// the schedule writes it again, starting from its next tick: the ticks
// before it are not caught up.
func (c *Client) RemovePeriodic(ctx context.Context, name string) error {
	for range stateRounds {
		st, err := c.periodicState(ctx, name)
		if err != nil {
			return err
		}
		if st == nil || st.Type != PeriodicStateType {
			return fmt.Errorf("no periodic schedule %q (no state document %s): 'couchq periodic ls' lists them", name, PeriodicStateID(name))
		}
		_, err = c.db.Delete(ctx, st.ID, st.Rev, c.writeOpts()...)
		switch {
		case err == nil:
			return nil
		case !isStatus(err, http.StatusConflict):
			return fmt.Errorf("periodic schedule %s: deleting its state: %w", name, err)
		}
	}
	return fmt.Errorf("periodic schedule %s: its state changed %d times under us", name, stateRounds)
}

// PeriodicStates lists every schedule's state document, by name.
func (c *Client) PeriodicStates(ctx context.Context) ([]PeriodicState, error) {
	rows := c.db.AllDocs(ctx, kivik.Params(map[string]any{
		"include_docs": true, "startkey": periodicPrefix, "endkey": periodicPrefix + "\ufff0",
	}))
	defer rows.Close()
	var out []PeriodicState
	for rows.Next() {
		var st PeriodicState
		if err := rows.ScanDoc(&st); err != nil || st.Type != PeriodicStateType {
			continue
		}
		out = append(out, st)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing periodic schedules: %w", err)
	}
	return out, nil
}
