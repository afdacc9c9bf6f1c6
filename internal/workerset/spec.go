// Package workerset runs the workers of one process, one per job type or
// one for several, as couchq worker and package fleet run them: their
// settings from the command line or a worker configuration file (TOML),
// checked before anything connects, and the process that runs them with
// its probes and metrics.
//
// Its messages speak the command's language (--lease): package fleet
// words them for programs.
package workerset

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/handlers"
	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// minLease is the shortest --lease: below it the heartbeat (lease/3) and
// the sweep (lease/2) would round to nothing, and no server answers fast
// enough to renew such a lease anyway.
const minLease = 100 * time.Millisecond

// Spec is one worker's settings: couchq worker's flags, or one job type's
// table of a configuration file. Check validates it and derives the rest.
type Spec struct {
	// Types is the job types, comma-separated.
	Types string
	// Handler is the built-in handler's name (handlers.New); empty when
	// Handlers gives Go ones.
	Handler string
	// Exec is the exec handler's command line.
	Exec            string
	HTTPTimeout     time.Duration
	Concurrency     int
	Lease           time.Duration
	Drain           bool
	DeleteDone      bool
	MaxAttempts     int
	ShutdownTimeout time.Duration
	// JobTimeout is --job-timeout: how long one attempt may run (0: no
	// bound).
	JobTimeout    time.Duration
	Heartbeat     time.Duration
	SweepInterval time.Duration
	FeedTimeout   time.Duration
	QueryTimeout  time.Duration
	FallbackPoll  time.Duration
	RetryDelay    time.Duration
	// Periodic, Rates and Fleet are --periodic, --rate and
	// --fleet-concurrency as given: TYPE=VALUE each.
	Periodic   Repeated
	Rates      Repeated
	Fleet      Repeated
	PeriodicTZ string
	CatchUp    string
	// TakeOver and TakeOverAfter are --take-over and --take-over-after:
	// the sites this one takes over when their heartbeat stops.
	TakeOver      Repeated
	TakeOverAfter time.Duration
	// AwaitSites is --await-sites: how long a worker starting after its
	// site was down waits to hear from the other sites (0: not at all).
	AwaitSites time.Duration
	// HealthAddr is where the process serves its probes and metrics.
	HealthAddr string
	// Handlers are Go handlers by job type (package fleet), run instead of
	// a built-in one.
	Handlers map[string]worker.Handler
	// Middleware and BeforeEnqueue are package fleet's options: the
	// workers' middleware, and the hooks of the client that enqueues the
	// periodic jobs.
	Middleware    []worker.Middleware
	BeforeEnqueue []func(context.Context, *protocol.NewJob) error

	// Set records which flags were given, for those whose zero value is
	// meaningful (--retry-delay 0 retries at once).
	Set map[string]bool

	// FleetLimits is Fleet parsed, by Check.
	FleetLimits map[string]int
	// RateLimits is Rates parsed, by Check.
	RateLimits map[string]protocol.RateLimit
	// Schedules is Periodic parsed, by Check; a configuration file's
	// [[periodic]] tables join the first spec's.
	Schedules []protocol.Periodic

	// healthHost is HealthAddr's host, checked.
	healthHost string
	// typeList is Types split and checked.
	typeList []string
	// argv is Exec split into words.
	argv []string
}

// NewSpec returns a spec with every setting at its default, none given.
func NewSpec() *Spec {
	return &Spec{
		HTTPTimeout: handlers.DefaultHTTPTimeout, Concurrency: worker.ConcurrencyDefault,
		Lease: worker.LeaseDurationDefault, MaxAttempts: protocol.MaxAttemptsDefault,
		ShutdownTimeout: worker.ShutdownTimeoutDefault, FeedTimeout: worker.FeedTimeoutDefault,
		QueryTimeout: worker.QueryTimeoutDefault, FallbackPoll: worker.FallbackPollDefault,
		AwaitSites: worker.AwaitSitesDefault,
		PeriodicTZ: "UTC", CatchUp: "once", Set: map[string]bool{},
	}
}

// Check validates the settings before anything connects, and derives
// FleetLimits, RateLimits and Schedules.
func (f *Spec) Check() error { return f.check(true) }

// check is Check; a file's type table may leave the handler to Go
// (package fleet) unless requireHandler.
func (f *Spec) check(requireHandler bool) error {
	if f.Types == "" {
		return cli.Usagef("--type is required: name the job types to run, e.g. --type email,sms")
	}
	seen := map[string]bool{}
	for _, t := range strings.Split(f.Types, ",") {
		t = strings.TrimSpace(t)
		if t == "" {
			return cli.Usagef("invalid --type %q: empty job type", f.Types)
		}
		if !seen[t] {
			seen[t] = true
			f.typeList = append(f.typeList, t)
		}
	}
	if (len(f.TakeOver) > 0) != (f.TakeOverAfter > 0) {
		return cli.Usagef("--take-over SITE and --take-over-after D go together")
	}
	for _, site := range f.TakeOver {
		if !protocol.ValidSiteName(site) {
			return cli.Usagef("invalid --take-over %q: not a site name", site)
		}
	}
	if f.Handler == "" && len(f.Handlers) == 0 && requireHandler {
		return cli.Usagef("--handler is required: one of %s", strings.Join(handlers.Names(), ", "))
	}
	if f.Handler == handlers.NameExec && strings.TrimSpace(f.Exec) == "" {
		return cli.Usagef("no command given: --handler exec needs --exec, the command to run for each job")
	}
	if f.Exec != "" {
		if f.Handler != handlers.NameExec {
			return cli.Usagef("--exec is only for --handler %s", handlers.NameExec)
		}
		argv, err := SplitWords(f.Exec)
		if err != nil {
			return cli.Usagef("invalid --exec %q: %v", f.Exec, err)
		}
		f.argv = argv
	}
	switch {
	case f.Concurrency < 1:
		return cli.Usagef("invalid --concurrency %d: must be at least 1", f.Concurrency)
	case f.Lease < minLease:
		return cli.Usagef("invalid --lease %s: must be at least %s", f.Lease, minLease)
	case f.MaxAttempts < 1 || f.MaxAttempts > math.MaxInt32:
		return cli.Usagef("invalid --max-attempts %d: must be from 1 to %d", f.MaxAttempts, math.MaxInt32)
	case f.ShutdownTimeout <= 0:
		return cli.Usagef("invalid --shutdown-timeout %s: must be positive", f.ShutdownTimeout)
	case f.HTTPTimeout <= 0:
		return cli.Usagef("invalid --http-timeout %s: must be positive", f.HTTPTimeout)
	case f.FeedTimeout <= 0:
		return cli.Usagef("invalid --feed-timeout %s: must be positive", f.FeedTimeout)
	case f.QueryTimeout <= 0:
		return cli.Usagef("invalid --query-timeout %s: must be positive", f.QueryTimeout)
	case f.FallbackPoll <= 0:
		return cli.Usagef("invalid --fallback-poll %s: must be positive", f.FallbackPoll)
	case f.RetryDelay < 0:
		return cli.Usagef("invalid --retry-delay %s: must not be negative", f.RetryDelay)
	case f.JobTimeout < 0:
		return cli.Usagef("invalid --job-timeout %s: must not be negative (0 sets no bound)", f.JobTimeout)
	case f.AwaitSites < 0:
		return cli.Usagef("invalid --await-sites %s: must not be negative (0 does not wait)", f.AwaitSites)
	case f.Set["heartbeat"] && f.Heartbeat <= 0:
		return cli.Usagef("invalid --heartbeat %s: must be positive", f.Heartbeat)
	case f.Set["sweep-interval"] && f.SweepInterval == 0:
		return cli.Usagef("invalid --sweep-interval 0: leave it out for lease/2, or make it negative to disable sweeping")
	}
	if hb := f.HeartbeatInterval(); hb >= f.Lease {
		return cli.Usagef("invalid --heartbeat %s: must be shorter than the lease %s, which it renews", hb, f.Lease)
	}
	if f.HealthAddr != "" {
		host, err := cli.CheckListenAddr("health-addr", f.HealthAddr, "127.0.0.1:8081")
		if err != nil {
			return err
		}
		f.healthHost = host
	}
	if err := f.checkRates(); err != nil {
		return err
	}
	if err := f.checkFleet(); err != nil {
		return err
	}
	return f.checkPeriodic()
}

// checkFleet parses --fleet-concurrency.
func (f *Spec) checkFleet() error {
	for _, v := range f.Fleet {
		typ, k, ok := strings.Cut(v, "=")
		typ = strings.TrimSpace(typ)
		n, err := strconv.Atoi(strings.TrimSpace(k))
		switch {
		case !ok || typ == "" || err != nil:
			return cli.Usagef("invalid --fleet-concurrency %q: want TYPE=K, e.g. 'webhook=10'", v)
		case !slices.Contains(f.typeList, typ):
			return cli.Usagef("invalid --fleet-concurrency %q: %s is not one of --type %s", v, typ, f.Types)
		case n < 1 || n > protocol.MaxRateSlots:
			return cli.Usagef("invalid --fleet-concurrency %q: K must be from 1 to %d", v, protocol.MaxRateSlots)
		}
		if _, dup := f.FleetLimits[typ]; dup {
			return cli.Usagef("invalid --fleet-concurrency %q: a limit for %s is already given", v, typ)
		}
		if f.FleetLimits == nil {
			f.FleetLimits = map[string]int{}
		}
		f.FleetLimits[typ] = n
	}
	return nil
}

// checkRates parses --rate.
func (f *Spec) checkRates() error {
	for _, v := range f.Rates {
		typ, spec, ok := strings.Cut(v, "=")
		typ = strings.TrimSpace(typ)
		if !ok || typ == "" {
			return cli.Usagef("invalid --rate %q: want TYPE=N/PER, e.g. 'webhook=10/s'", v)
		}
		if !slices.Contains(f.typeList, typ) {
			return cli.Usagef("invalid --rate %q: %s is not one of --type %s", v, typ, f.Types)
		}
		rl, err := protocol.ParseRate(spec)
		if err != nil {
			return cli.Usagef("invalid --rate %q: %v", v, err)
		}
		if _, dup := f.RateLimits[typ]; dup {
			return cli.Usagef("invalid --rate %q: a limit for %s is already given", v, typ)
		}
		if f.RateLimits == nil {
			f.RateLimits = map[string]protocol.RateLimit{}
		}
		f.RateLimits[typ] = rl
	}
	return nil
}

// checkPeriodic parses --periodic, --periodic-tz and --catch-up.
func (f *Spec) checkPeriodic() error {
	for _, name := range []string{"periodic-tz", "catch-up"} {
		if f.Set[name] && len(f.Periodic) == 0 {
			return cli.Usagef("--%s applies to the schedules of --periodic, and none is given", name)
		}
	}
	loc, err := time.LoadLocation(f.PeriodicTZ)
	if err != nil {
		return cli.Usagef("invalid --periodic-tz %q: %v", f.PeriodicTZ, err)
	}
	var catchUp protocol.CatchUp
	switch f.CatchUp {
	case "once":
		catchUp = protocol.CatchUpOnce
	case "all":
		catchUp = protocol.CatchUpAll
	default:
		return cli.Usagef("invalid --catch-up %q: want once or all", f.CatchUp)
	}
	seen := map[string]bool{}
	for _, v := range f.Periodic {
		typ, spec, ok := strings.Cut(v, "=")
		typ, spec = strings.TrimSpace(typ), strings.TrimSpace(spec)
		if !ok || typ == "" || spec == "" {
			return cli.Usagef("invalid --periodic %q: want TYPE=SPEC, e.g. 'report=0 7 * * *' or 'ping=@every 5m'", v)
		}
		if seen[typ] {
			return cli.Usagef("invalid --periodic %q: a schedule for %s is already given", v, typ)
		}
		seen[typ] = true
		p := protocol.Periodic{Name: typ, Schedule: spec, Location: loc, Job: protocol.NewJob{Worker: typ}, CatchUp: catchUp}
		if _, err := protocol.CheckPeriodic(p); err != nil {
			return cli.Usagef("invalid --periodic %q: %v", v, err)
		}
		f.Schedules = append(f.Schedules, p)
	}
	return nil
}

// Repeated collects every value of a flag given more than once.
type Repeated []string

// String is the values given, for package flag.
func (r *Repeated) String() string { return strings.Join(*r, ", ") }

// Set adds a value, for package flag.
func (r *Repeated) Set(v string) error {
	*r = append(*r, v)
	return nil
}

// HeartbeatInterval is --heartbeat or the worker's default for the lease.
func (f *Spec) HeartbeatInterval() time.Duration {
	if f.Heartbeat > 0 {
		return f.Heartbeat
	}
	return f.Lease / worker.HeartbeatFractionDefault
}

// config is the worker configuration the settings describe, with hs
// running its types.
func (f *Spec) config(hs map[string]worker.Handler, log zerolog.Logger) worker.Config {
	cfg := worker.Config{
		Handlers:          map[string]worker.Handler{},
		Concurrency:       f.Concurrency,
		LeaseDuration:     f.Lease,
		HeartbeatInterval: f.Heartbeat,
		SweepInterval:     f.SweepInterval,
		ShutdownTimeout:   f.ShutdownTimeout,
		JobTimeout:        f.JobTimeout,
		FeedTimeout:       f.FeedTimeout,
		QueryTimeout:      f.QueryTimeout,
		FallbackPoll:      f.FallbackPoll,
		Drain:             f.Drain,
		Periodic:          f.Schedules,
		RateLimits:        f.RateLimits,
		FleetConcurrency:  f.FleetLimits,
		TakeOver:          f.TakeOver,
		TakeOverAfter:     f.TakeOverAfter,
		AwaitSites:        f.AwaitSites,
		Middleware:        f.Middleware,
		Logger:            log,
	}
	if f.AwaitSites == 0 {
		cfg.AwaitSites = -1 // the worker's 0 is its default
	}
	for _, t := range f.typeList {
		cfg.Handlers[t] = loggingHandler{next: hs[t], log: log}
	}
	if f.DeleteDone {
		cfg.DeleteDone = map[string]bool{}
		for _, t := range f.typeList {
			cfg.DeleteDone[t] = true
		}
	}
	if f.Set["retry-delay"] {
		d := f.RetryDelay
		cfg.Retry = func(int) time.Duration { return d }
	}
	return cfg
}

// SplitWords splits s into words the way a POSIX shell does, without any
// expansion: whitespace separates words, single quotes keep everything
// literally, double quotes keep everything but backslash escapes of " \ $
// and `, and a backslash outside quotes escapes the next character.
func SplitWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	const (
		none = iota
		single
		double
	)
	quote := none
	runes := []rune(s)
	for i := 0; i < len(runes); i++ {
		r := runes[i]
		switch quote {
		case single:
			if r == '\'' {
				quote = none
			} else {
				cur.WriteRune(r)
			}
			continue
		case double:
			switch {
			case r == '"':
				quote = none
			case r == '\\' && i+1 < len(runes) && strings.ContainsRune(`"\$`+"`", runes[i+1]):
				i++
				cur.WriteRune(runes[i])
			default:
				cur.WriteRune(r)
			}
			continue
		}
		switch {
		case unicode.IsSpace(r):
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case r == '\'':
			quote, inWord = single, true
		case r == '"':
			quote, inWord = double, true
		case r == '\\':
			if i+1 == len(runes) {
				return nil, errors.New("trailing backslash")
			}
			i++
			cur.WriteRune(runes[i])
			inWord = true
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != none {
		return nil, errors.New("unterminated quote")
	}
	if inWord {
		words = append(words, cur.String())
	}
	if len(words) == 0 {
		return nil, errors.New("no command")
	}
	return words, nil
}
