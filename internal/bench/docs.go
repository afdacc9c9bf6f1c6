package bench

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The files a run with --write-docs rewrites, relative to the repository
// root, and their regions (see ReplaceRegions).
const (
	// GuidePath is the performance guide: every region is required.
	GuidePath = "docs/performance.md"
	// ReadmePath is the front page: its summary region is rewritten if
	// it has one.
	ReadmePath = "README.md"

	// RegionRun holds the run's dated header and every server's table.
	RegionRun = "bench"
	// RegionTargets holds where each target stands on each server.
	RegionTargets = "bench:targets"
	// RegionSummary is the front page's table of headline figures.
	RegionSummary = "bench:summary"
)

// DocRun is one bench run as the docs show it.
type DocRun struct {
	Reports []*Report
	// Command is the command line as a reader would type it in the
	// repository: "go run ./cmd/couchq-bench --write-docs .".
	Command string
	// Changed are the flags given that change what is measured, as typed
	// ("--jobs 500"): the targets are set for the defaults.
	Changed []string
}

// CheckDocs checks, before a run, that the files under dir a run will
// rewrite have their markers: the guide every region's, the README its
// summary's or none.
func CheckDocs(dir string) error {
	if err := CheckRegions(filepath.Join(dir, GuidePath), RegionRun, RegionTargets); err != nil {
		return err
	}
	if err := CheckRegions(filepath.Join(dir, ReadmePath), RegionSummary); err != nil && !errors.Is(err, ErrNoMarkers) {
		return err
	}
	return nil
}

// WriteDocs rewrites the generated regions of the guide under dir with
// the run's tables, and the README's summary region when the README has
// one (else it says so on notes). Nothing outside the markers changes.
func WriteDocs(dir string, run DocRun, notes io.Writer) error {
	guide := filepath.Join(dir, GuidePath)
	if err := RewriteRegions(guide, map[string]string{
		RegionRun:     run.runRegion(),
		RegionTargets: run.targetsRegion(),
	}); err != nil {
		return err
	}
	readme := filepath.Join(dir, ReadmePath)
	err := RewriteRegions(readme, map[string]string{RegionSummary: run.summaryRegion()})
	if errors.Is(err, ErrNoMarkers) {
		begin, end := regionMarkers(RegionSummary)
		_, werr := fmt.Fprintf(notes, "couchq-bench: %s has no summary region (%s … %s): left as it is\n", readme, begin, end)
		return wrapWrite(werr)
	}
	return err
}

// started is when the run began: its first server's start.
func (d DocRun) started() (at, day string) {
	for _, r := range d.Reports {
		if !r.Started.IsZero() {
			u := r.Started.UTC()
			return u.Format("15:04 UTC"), u.Format("2006-01-02")
		}
	}
	return "", "an unknown day"
}

// host is the machine the run measured on, from its first measured server.
func (d DocRun) host() HostInfo {
	for _, r := range d.Reports {
		if r.measured() {
			return r.Host
		}
	}
	return HostInfo{}
}

// machine describes the host: "2 cores (AMD EPYC), 23.4 GiB of memory,
// linux/amd64, go1.26.0".
func (h HostInfo) machine() string {
	s := fmt.Sprintf("%d cores", h.CPUs)
	if h.CPUModel != "" {
		s += " (" + h.CPUModel + ")"
	}
	if h.Memory > 0 {
		s += fmt.Sprintf(", %.1f GiB of memory", float64(h.Memory)/(1<<30))
	}
	return s + ", " + h.OS + ", " + h.GoVersion
}

// caveats are what a reader must know before comparing the run's figures
// with the targets: flags that changed the sizes, servers not measured.
func (d DocRun) caveats() []string {
	var c []string
	if len(d.Changed) > 0 {
		c = append(c, fmt.Sprintf("**Not the default run**: `%s` changed what was measured; the targets are set for the defaults, which `make bench` runs.",
			strings.Join(d.Changed, " ")))
	}
	for _, r := range d.Reports {
		switch {
		case r.Skipped != "":
			c = append(c, fmt.Sprintf("**Not measured**: %s (%s).", r.Title(), r.Skipped))
		case r.Error != "":
			c = append(c, fmt.Sprintf("**Not measured**: %s (the run could not start: %s).", r.Title(), r.Error))
		}
	}
	return c
}

// runRegion is the guide's run region: the dated header (when, how, on
// what), then one table per server and the notes every server shares.
func (d DocRun) runRegion() string {
	var b strings.Builder
	at, day := d.started()
	var wall float64
	var servers []string
	for _, r := range d.Reports {
		wall += r.WallSeconds
		if r.measured() {
			servers = append(servers, r.Title())
		}
	}
	fmt.Fprintf(&b, "Measured on %s (from %s, %s in all) by `%s`, on %s.", day, at, formatWall(wall), d.Command, d.host().machine())
	if len(servers) > 0 {
		fmt.Fprintf(&b, " Servers: %s.", strings.Join(servers, "; "))
	}
	b.WriteString("\n")
	for _, c := range d.caveats() {
		b.WriteString("\n" + c + "\n")
	}
	shared := d.sharedNotes()
	for _, r := range d.Reports {
		b.WriteString("\n")
		r.markdown(&b, shared)
	}
	if len(shared) > 0 {
		b.WriteString("\n### Notes on every server\n")
		writeNotes(&b, shared)
	}
	return b.String()
}

// sharedNotes are the notes every measured server has, when more than one
// was measured: written once, after the tables.
func (d DocRun) sharedNotes() []string {
	var measured []*Report
	for _, r := range d.Reports {
		if r.measured() {
			measured = append(measured, r)
		}
	}
	if len(measured) < 2 {
		return nil
	}
	var shared []string
	for _, n := range measured[0].Notes {
		if !slices.ContainsFunc(measured[1:], func(r *Report) bool { return !slices.Contains(r.Notes, n) }) {
			shared = append(shared, n)
		}
	}
	return shared
}

// targetRows are the targets the guide's targets region judges, each with
// how a server's cell reads (cell).
var targetRows = []struct {
	what string
	cell func(r *Report) string
}{
	{fmt.Sprintf("end to end, no-op jobs, validation on: ≥ %.0f %% of bulk with couchq's design doc / 3 (the cluster: ≥ %.0f jobs/s, twice its %.0f when the target was set)",
		TargetThroughputShare*100, TargetClusterThroughput, ClusterThroughputBaseline),
		headlineCell(keyThroughput, keyThroughputShare, func(s Row) string { return " (" + s.Text + " of bulk with the design doc / 3)" })},
	{"… within reach of any queue keeping couchq's views? (the fastest minimal queue, share of the same limit)", headlineCell(keyReach, "", nil)},
	{"… within reach of a queue that finds its jobs in the claim view, as couchq does? (the minimal one)", headlineCell(keyReachView, "", nil)},
	{fmt.Sprintf("end to end, validation off: ≥ %.0f %% of bare bulk/3", TargetNoValidationShare*100),
		headlineCell(keyNoValidation, keyNoValidationShare, func(s Row) string { return " (" + s.Text + " of bare bulk/3)" })},
	{fmt.Sprintf("the cluster's server CPU per job ≤ %.1f× the node's", TargetClusterCPU), headlineCell(keyClusterCPU, "", nil)},
	{fmt.Sprintf("a fleet of %d `couchq worker` processes × %d ≥ %.0f %% of the in-process figure", FleetDefault, FleetConcurrencyDefault, TargetFleetShare*100),
		headlineCell(keyFleetShare, keyFleet, func(s Row) string { return " (" + s.Text + ")" })},
	{fmt.Sprintf("… within reach of workers of %d slots? (the fleet's shape, %d × %d, in one process, share of the in-process figure)", FleetConcurrencyDefault, FleetDefault, FleetConcurrencyDefault),
		headlineCell(keyFleetReach, "", nil)},
	{fmt.Sprintf("idle wake-up, enqueue → handler start p99 < %d ms", TargetWakeupP99.Milliseconds()), headlineCell(keyWakeupP99, "", nil)},
	{fmt.Sprintf("409s per claimed job at %d claimants < %.1f", targetConflictWorkers, TargetConflicts), headlineCell(keyConflicts, "", nil)},
	{fmt.Sprintf("claim round, large backlog (%s jobs, the cluster %s) vs small (%s) ≤ %.1f× (view brought up to date / as it stands)",
		groupThousands(strconv.Itoa(BacklogLargeDefault)), groupThousands(strconv.Itoa(int(BacklogLargeDefault*ClusterScaleDefault))),
		groupThousands(strconv.Itoa(BacklogSmallDefault)), TargetBacklogRatio), func(r *Report) string {
		var cells []string
		for _, k := range []string{keyBacklogRatio, keyBacklogRatioStale} {
			if row, ok := r.headline(k); ok {
				cells = append(cells, verdictCell(row))
			}
		}
		return strings.Join(cells, " / ")
	}},
	{fmt.Sprintf("enqueue of the large backlog ≥ %.0f %% of the bare bulk ceiling", TargetEnqueueShare*100),
		headlineCell(keyEnqueue, keyEnqueueShare, func(s Row) string { return fmt.Sprintf(" (%.1f %%)", s.Value) })},
	{"peak RSS of the process the workers ran in (no target the bench judges)", headlineCell(keyWorkerRSS, "", nil)},
	{fmt.Sprintf("peak RSS of a `couchq worker` process running %d jobs at once < %d MiB", WorkerRSSConcurrency, TargetWorkerRSS100>>20),
		headlineCell(keyWorkerRSS100, "", nil)},
	{fmt.Sprintf("sites: a site's throughput linked to another ≥ %.0f %% of alone", TargetSitesShare*100),
		headlineCell(keySitesShare, keySitesLinked, func(s Row) string { return " (" + s.Text + " linked)" })},
	{"… within reach of two sites on one machine? (the machine's share, side by side / alone, over the least growth with 2 sites)",
		headlineCell(keySitesShareReach, "", nil)},
	{fmt.Sprintf("sites: a site's server CPU per job does not grow with other sites' jobs (2 / 3 sites linked ≤ %.2f× of alone)", TargetSitesCPUGrowth),
		headlineCell(keySitesCPUGrowth, "", nil)},
	{"… within reach of a site that stores every other site's jobs? (the least growth: one finished copy of each, served and stored in full batches)",
		headlineCell(keySitesReach, "", nil)},
}

// headlineCell is a target's cell: the verdict and figure of the row of
// key, then what share makes of the row of shareKey when there is one.
func headlineCell(key, shareKey string, share func(Row) string) func(r *Report) string {
	return func(r *Report) string {
		row, ok := r.headline(key)
		if !ok {
			return ""
		}
		cell := verdictCell(row)
		if s, ok := r.headline(shareKey); ok && share != nil {
			cell += share(s)
		}
		return cell
	}
}

// verdictCell is "met: 25.2 ms", "**not met**: 301 jobs/s", or the figure
// alone for a row without a target.
func verdictCell(row Row) string {
	if row.Met == nil {
		return row.Text
	}
	return mdMet(row.Met) + ": " + row.Text
}

// targetsRegion is the guide's targets region: a table of each target
// (rows) on each server (columns), dated.
func (d DocRun) targetsRegion() string {
	var b strings.Builder
	_, day := d.started()
	b.WriteString("| target |")
	for _, r := range d.Reports {
		b.WriteString(" " + mdCell(r.Title()) + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(d.Reports)) + "\n")
	for _, t := range targetRows {
		b.WriteString("| " + mdCell(t.what) + " |")
		for _, r := range d.Reports {
			cell := "not measured"
			if r.measured() {
				if cell = t.cell(r); cell == "" {
					cell = "—"
				}
			}
			b.WriteString(" " + mdCell(cell) + " |")
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "\nFrom the bench run of %s; every figure is in that run's tables.\n", day)
	for _, c := range d.caveats() {
		b.WriteString("\n" + c + "\n")
	}
	return b.String()
}

// summaryColumns are the README summary's figures, one column each.
var summaryColumns = []struct{ what, key string }{
	{"end to end", keyThroughput},
	{"enqueue", keyEnqueue},
	{"wake-up p99", keyWakeupP99},
	{fmt.Sprintf("409s per claimed job (%d claimants)", targetConflictWorkers), keyConflicts},
	{"peak RSS of the workers' process", keyWorkerRSS},
}

// summaryRegion is the README's summary: one row of headline figures per
// server, dated, with a link to the guide.
func (d DocRun) summaryRegion() string {
	var b strings.Builder
	b.WriteString("| server |")
	for _, c := range summaryColumns {
		b.WriteString(" " + c.what + " |")
	}
	b.WriteString("\n|---|" + strings.Repeat("--:|", len(summaryColumns)) + "\n")
	for _, r := range d.Reports {
		b.WriteString("| " + mdCell(r.Title()) + " |")
		if !r.measured() {
			b.WriteString(" not measured |" + strings.Repeat(" — |", len(summaryColumns)-1) + "\n")
			continue
		}
		for _, c := range summaryColumns {
			cell := "—"
			if row, ok := r.headline(c.key); ok {
				cell = row.Text
			}
			b.WriteString(" " + mdCell(cell) + " |")
		}
		b.WriteString("\n")
	}
	_, day := d.started()
	fmt.Fprintf(&b, "\n`%s` on %s, %s. What each figure measures, the targets and every table: [docs/performance.md](%s).",
		d.Command, day, d.host().machine(), GuidePath)
	if len(d.Changed) > 0 {
		fmt.Fprintf(&b, " Not the default run: `%s`.", strings.Join(d.Changed, " "))
	}
	b.WriteString("\n")
	return b.String()
}
