package main

import (
	"context"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
)

const sweepUsage = `Usage: couchq sweep [--limit N] [flags]

Sweeps once: every claim whose lease has run out (its worker died, froze
or lost the server) goes back to the queue for another attempt, or to
failed when its attempts are used up. Each job gets a lease-expired entry
in its history naming the claimant presumed dead. Running workers sweep
by themselves; this is for when none runs, or to see what is stuck now.
Safe to run alongside workers: a claim renewed meanwhile is left alone.

	--limit N   at most N expired leases in this sweep (default 500)

It prints how many jobs were requeued and failed, how many sweeps were
lost to another writer (a worker's sweeper or the claimant itself), and
how many conflicted jobs (two claims through different nodes of a
cluster, or revisions from another site) it settled. When there are any,
it also says how many other sites' requests it applied, how many jobs
naming a site the queue does not have it failed (the default site's
sweep does that), and how many waiting jobs whose dependencies had
finished it released.
`

// sweepClockSkew is how far this machine's clock may be from the server's
// before couchq sweep warns: a quarter of the default lease, as workers
// warn.
const sweepClockSkew = 7500 * time.Millisecond

// sweepResult is what one sweep did, as printed with --json.
type sweepResult struct {
	Requeued  int `json:"requeued"`
	Failed    int `json:"failed"`
	Lost      int `json:"lost"`
	Malformed int `json:"malformed"`
	// Settled counts conflicted jobs made whole; Requests, other sites'
	// cancels and retries applied (or refused) for this site's jobs.
	Settled  int `json:"settled"`
	Requests int `json:"requests"`
	// UnknownSite counts jobs failed because the site they name is not
	// one of the queue's; Released, waiting jobs whose dependencies had
	// finished with no one releasing them.
	UnknownSite int `json:"unknown_site"`
	Released    int `json:"released"`
	// More means the sweep handled --limit claims, so more may be waiting:
	// run it again.
	More bool `json:"more"`
}

func (m *Main) runSweep(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("sweep", sweepUsage)
	conn := addConnFlags(fs)
	var limit int
	fs.IntVar(&limit, "limit", 500, "maximum expired leases")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return cli.Usagef("unexpected argument %q", rest[0])
	}
	if limit < 1 {
		return cli.Usagef("invalid --limit %d: must be at least 1", limit)
	}
	if err := conn.resolve(m); err != nil {
		return err
	}
	log = log.Level(conn.level)
	// Through a Server, unlike most commands: the server's date, which the
	// clock check below reads, comes through that connection (and on a
	// cluster the leaves of conflicted jobs come in one _bulk_get).
	q, closeQueue, err := conn.Open(ctx, cli.CommandConfig(log, m.Now, conn.Site))
	if err != nil {
		return err
	}
	defer closeQueue()
	// The sweep judges leases on this machine's clock: one ahead of the
	// workers' returns their running jobs, which then run twice.
	if skew, ok, _ := q.ClockSkew(ctx); ok && (skew > sweepClockSkew || skew < -sweepClockSkew) {
		way, by := "ahead of", skew
		if skew < 0 {
			way, by = "behind", -skew
		}
		log.Warn().Dur("skew", skew).Msgf("this machine's clock is %s %s the CouchDB server's, and the sweep judges leases on it: a clock ahead of the workers' returns jobs they are still running (which then run twice), one behind them leaves dead workers' jobs longer; keep the clocks in sync (NTP)", by.Round(100*time.Millisecond), way)
	}
	res, err := q.Sweep(ctx, q.Config().Actor, limit)
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	out := sweepResult{
		Requeued: res.Requeued, Failed: res.Failed, Lost: res.Lost, Malformed: res.Malformed, Settled: res.Settled, Requests: res.Requests,
		UnknownSite: res.UnknownSite, Released: res.Released,
		More: res.Requeued+res.Failed+res.Lost+res.Malformed >= limit,
	}
	if conn.json {
		return cli.WriteJSON(m.Stdout, out)
	}
	line := fmt.Sprintf("requeued %d, failed %d, lost %d, settled %d", out.Requeued, out.Failed, out.Lost, out.Settled)
	if out.Requests > 0 {
		line += fmt.Sprintf(", %d %s applied or refused", out.Requests, cli.Plural(out.Requests, "other site's request", "other sites' requests"))
	}
	if out.UnknownSite > 0 {
		line += fmt.Sprintf(", %d %s of unknown sites failed", out.UnknownSite, cli.Plural(out.UnknownSite, "job", "jobs"))
	}
	if out.Released > 0 {
		line += fmt.Sprintf(", %d waiting %s settled (released, or ended by a dependency)", out.Released, cli.Plural(out.Released, "job", "jobs"))
	}
	if out.Malformed > 0 {
		line += fmt.Sprintf(", malformed %d (see the log)", out.Malformed)
	}
	if out.More {
		line += fmt.Sprintf("; stopped at --limit %d: run it again for the rest", limit)
	}
	_, err = fmt.Fprintln(m.Stdout, line)
	return err
}
