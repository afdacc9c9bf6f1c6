package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/forms"
	"github.com/couchq/couchq/internal/protocol"
)

const statsUsage = `Usage: couchq stats [--type TYPE] [--since WHEN] [--until WHEN] [flags]

Reports each job type's activity over a window (jobs added, started,
finished, failed and retried; throughput; wait, service and execution
times), its queue right now, and the registered workers. With --json it
prints the report as one JSON object, for scripts.

	--type TYPE     only this job type (and the workers that run it)
	--since WHEN    start of the window: an age such as 1h, 6h, 24h or 7d, or an
	                RFC 3339 time such as 2030-01-02T15:04:05Z (default 24h)
	--until WHEN    end of the window, in the same forms (default now; a time
	                after now counts as now)

Times: wait is enqueue to first claim, service is enqueue to done or failed,
execution is each attempt's claim to its outcome's write (a worker that
waits out an outage to write it counts the wait); p50 and p95 are left out ("-") when
the window holds too many jobs to read one by one.
`

func (m *Main) runStats(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("stats", statsUsage)
	conn := addConnFlags(fs)
	var typ, since, until string
	fs.StringVar(&typ, "type", "", "job type")
	fs.StringVar(&since, "since", "24h", "start of the window")
	fs.StringVar(&until, "until", "", "end of the window")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return cli.Usagef("unexpected argument %q (choose a type with --type)", rest[0])
	}
	if err := conn.resolve(m); err != nil {
		return err
	}
	log = log.Level(conn.level)
	opts, err := forms.StatsOptions(typ, since, until, m.Now())
	if err != nil {
		return flagError(err)
	}
	q, closeQueue, err := conn.OpenQueue(ctx, log, m.Now)
	if err != nil {
		return err
	}
	defer closeQueue()
	st, err := forms.Stats(ctx, q, opts)
	if err != nil {
		return cli.ServerError(conn.URL, err)
	}
	if conn.json {
		return cli.WriteJSON(m.Stdout, st)
	}
	return printStats(m.Stdout, st)
}

// flagError words an opshttp parameter error as the flag of the same
// name, for a command that takes the API's parameters as flags.
func flagError(err error) error {
	var pe *forms.ParamError
	var we *forms.WindowError
	switch {
	case errors.As(err, &pe):
		return cli.Usagef("invalid --%s %q: %v", pe.Param, pe.Value, pe.Err)
	case errors.As(err, &we):
		return cli.Usagef("--since %s is not before --until %s",
			we.Since.UTC().Format(time.RFC3339), we.Until.UTC().Format(time.RFC3339))
	}
	return &cli.UsageError{Err: err}
}

// printStats writes the report as tables.
func printStats(w io.Writer, st *protocol.Stats) error {
	window := st.Until.Sub(st.Since)
	fmt.Fprintf(w, "Window: %s to %s (%s)\n\n", st.Since.UTC().Format("2006-01-02 15:04:05Z"),
		st.Until.UTC().Format("2006-01-02 15:04:05Z"), fmtDuration(window))
	if len(st.Types) == 0 {
		fmt.Fprintln(w, "no jobs")
	} else {
		tw := cli.NewTable(w)
		fmt.Fprintln(tw, "TYPE\tADDED\tSTARTED\tFINISHED\tFAILED\tRETRIED\tTHROUGHPUT")
		for _, t := range st.Types {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\n", t.Type, t.Added, t.Started, t.Finished, t.Failed, t.Retried, fmtRate(t.Throughput))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(w)
		tw = cli.NewTable(w)
		fmt.Fprintln(tw, "TYPE\tTIME\tCOUNT\tMIN\tMEAN\tP50\tP95\tMAX")
		for _, t := range st.Types {
			for i, s := range []struct {
				name string
				sum  protocol.Summary
			}{{"wait", t.Wait}, {"service", t.Service}, {"execution", t.Execution}} {
				name := t.Type
				if i > 0 {
					name = ""
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", name, s.name, fmtSummary(s.sum))
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(w)
		tw = cli.NewTable(w)
		anyPaused := false
		for _, t := range st.Types {
			anyPaused = anyPaused || t.Queue.Paused
		}
		header := "QUEUE NOW\tDUE\tSCHEDULED\tWAITING\tRUNNING\tFAILED\tOLDEST DUE"
		if anyPaused {
			header += "\tPAUSED"
		}
		// In a database of sites, whose due jobs these are: each site's
		// workers claim only their own.
		bySite := map[string][]string{}
		for _, sd := range st.DueBySite {
			bySite[sd.Type] = append(bySite[sd.Type], fmt.Sprintf("%s %d", sd.Site, sd.Due))
		}
		if len(bySite) > 0 {
			header += "\tDUE BY SITE"
		}
		fmt.Fprintln(tw, header)
		for _, t := range st.Types {
			oldest := "-"
			if t.Queue.Due > 0 && !t.Queue.Paused { // a paused type's jobs wait on purpose
				oldest = fmtSeconds(t.Queue.OldestDueAge)
			}
			row := fmt.Sprintf("%s\t%d\t%d\t%d\t%d\t%d\t%s", t.Type, t.Queue.Due, t.Queue.Scheduled, t.Queue.Waiting, t.Queue.Running, t.Queue.Failed, oldest)
			if anyPaused {
				row += "\t" + map[bool]string{true: "paused", false: "-"}[t.Queue.Paused]
				if t.Queue.PausedReason != "" {
					row += ": " + t.Queue.PausedReason
				}
			}
			if len(bySite) > 0 {
				row += "\t" + cmp.Or(strings.Join(bySite[t.Type], ", "), "-")
			}
			fmt.Fprintln(tw, row)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	if len(st.Periodic) > 0 {
		tw := cli.NewTable(w)
		fmt.Fprintln(tw, "PERIODIC\tTYPE\tSCHEDULE\tLAST TICK\tNEXT TICK")
		for _, p := range st.Periodic {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Name, p.Worker, p.Schedule,
				cli.TimeAndAgo(protocol.FromUnix(p.LastTick), st.Until), cli.TimeAndAgo(protocol.FromUnix(p.NextTick), st.Until))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}
	if len(st.Workers) == 0 {
		_, err := fmt.Fprintln(w, "no workers registered")
		return err
	}
	tw := cli.NewTable(w)
	fmt.Fprintln(tw, "WORKER\tTYPES\tRUNNING\tTHROUGHPUT\tUTILIZATION\tALIVE")
	for _, wk := range st.Workers {
		alive := "yes"
		if !wk.Alive {
			alive = "no, last heartbeat " + fmtSeconds(wk.HeartbeatAge) + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s\t%.0f%%\t%s\n", wk.Claimant, strings.Join(wk.Types, ","), wk.Running,
			wk.Concurrency*max(len(wk.Types), 1), fmtRate(wk.Throughput), 100*wk.Utilization, alive)
	}
	return tw.Flush()
}

// fmtSummary renders count, min, mean, p50, p95 and max as table cells.
func fmtSummary(s protocol.Summary) string {
	if s.Count == 0 {
		return "0\t-\t-\t-\t-\t-"
	}
	p := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return fmtSeconds(*v)
	}
	return fmt.Sprintf("%d\t%s\t%s\t%s\t%s\t%s", s.Count, fmtSeconds(s.Min), fmtSeconds(s.Mean), p(s.P50), p(s.P95), fmtSeconds(s.Max))
}

// fmtSeconds renders seconds as a duration with a precision that suits
// its size: 340ms, 4.33s, 1m20s, 26h3m0s.
func fmtSeconds(s float64) string {
	if math.IsNaN(s) || math.IsInf(s, 0) {
		return "-"
	}
	return fmtDuration(time.Duration(s * float64(time.Second)))
}

func fmtDuration(d time.Duration) string {
	switch a := d.Abs(); {
	case a == 0:
		return "0s"
	case a < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case a < time.Second:
		return d.Round(time.Millisecond).String()
	case a < time.Minute:
		return d.Round(10 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// fmtRate renders jobs per second in the unit that keeps it readable.
func fmtRate(perSecond float64) string {
	trim := func(v float64) string { return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64) }
	switch {
	case perSecond == 0:
		return "0"
	case perSecond >= 1:
		return trim(perSecond) + "/s"
	case perSecond*60 >= 1:
		return trim(perSecond*60) + "/min"
	default:
		return trim(perSecond*3600) + "/h"
	}
}
