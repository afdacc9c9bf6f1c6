package bench

import (
	"bytes"
	"context"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/localserver"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

func TestSitesJudging(t *testing.T) {
	for _, c := range []struct {
		linked, alone float64
		met           bool
	}{{90, 100, true}, {89.9, 100, false}, {130, 100, true}, {10, 0, false}} {
		if got := sitesShareMet(c.linked, c.alone); got != c.met {
			t.Errorf("sitesShareMet(%g, %g) = %v, want %v", c.linked, c.alone, got, c.met)
		}
	}
	ms := time.Millisecond
	ratios, worst, met := cpuGrowth(10*ms, []time.Duration{12 * ms, 12500 * time.Microsecond})
	if !slices.EqualFunc(ratios, []float64{1.2, 1.25}, func(a, b float64) bool { return near(a, b) }) || !near(worst, 1.25) || !met {
		t.Errorf("1.2 and 1.25 times: %v, worst %g, met %v; want met at the tolerance", ratios, worst, met)
	}
	if _, worst, met := cpuGrowth(10*ms, []time.Duration{13 * ms, 11 * ms}); !near(worst, 1.3) || met {
		t.Errorf("1.3 and 1.1 times: worst %g, met %v; want not met", worst, met)
	}
	if _, _, met := cpuGrowth(0, []time.Duration{ms}); met {
		t.Error("no figure alone: want not met")
	}
}

func TestSitesLagsAndThroughputFromTheFeed(t *testing.T) {
	base := time.Date(2026, 11, 26, 1, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	item := func(site string, started, finished time.Duration) *protocol.WorkItem {
		return &protocol.WorkItem{Site: site, Status: protocol.StatusDone, Attempts: 1, CreatedAt: protocol.ToUnix(base),
			StartedAt: protocol.ToUnix(base.Add(started)), FinishedAt: protocol.ToUnix(base.Add(finished))}
	}
	seen := map[string]seenDone{
		"job:a1": {at: base.Add(150 * ms), item: item("A", 10*ms, 100*ms)},
		"job:a2": {at: base.Add(time.Second), item: item("A", 500*ms, 700*ms)},
		"job:b1": {at: base.Add(2 * time.Second), item: item("B", 0, 50*ms)},
	}
	lags := lagsOf(seen, "A")
	slices.Sort(lags)
	if !slices.Equal(lags, []time.Duration{50 * ms, 300 * ms}) {
		t.Errorf("A's lags %v, want [50ms 300ms]: B's job left out", lags)
	}
	if sum := Summarize(lags); sum.P50 != 50*ms || sum.P99 != 300*ms {
		t.Errorf("p50 %s, p99 %s", sum.P50, sum.P99)
	}
	jt := ownJobTimes(seen, "A")
	if jt.done != 2 || jt.span() != 690*ms || jt.reruns != 0 {
		t.Errorf("A's jobs: %d done, span %s, %d reruns; want 2, 690ms (first claim -> last done), 0", jt.done, jt.span(), jt.reruns)
	}
}

func TestSiteRunsCountsJobsNotRunOnceAtTheirOwner(t *testing.T) {
	var r siteRuns
	r.add("job:1", "A", "A")
	r.add("job:2", "B", "A") // at a site that does not own it
	r.add("job:3", "A", "A")
	r.add("job:3", "A", "A") // twice
	r.add("job:4", "B", "B")
	h := r.handler("C", worker.HandlerFunc(func(context.Context, *worker.Job) error { return nil }))
	if err := h.Handle(context.Background(), &worker.Job{ID: "job:5", Item: &couchq.WorkItem{Site: "C"}}); err != nil {
		t.Fatal(err)
	}
	if got := r.wrong(); got != 2 {
		t.Errorf("%d jobs not run once at their owner, want 2", got)
	}
}

func TestSitesSkipSaysWhy(t *testing.T) {
	if why := sitesSkip(plannedServer{kind: ServerCouchDB, home: "/opt/couchdb"}); why != "" {
		t.Errorf("the single node with a release: skipped: %s", why)
	}
	for _, ps := range []plannedServer{{kind: ServerCouchDB}, {kind: ServerCluster, home: "/opt/couchdb"}, {kind: ServerPouchDB}, {kind: serverURL}} {
		if why := sitesSkip(ps); why == "" {
			t.Errorf("%s: not skipped", ps.kind)
		}
	}
}

func TestParseArgsSitesJobs(t *testing.T) {
	c, o, err := ParseArgs([]string{"--sites-jobs", "50"}, env(nil), io.Discard)
	if err != nil || c.SitesJobs != 50 || !slices.Contains(o.Changed, "--sites-jobs 50") {
		t.Fatalf("--sites-jobs 50: %v, %d, changed %q", err, c.SitesJobs, o.Changed)
	}
	if c, _, _ := ParseArgs(nil, env(nil), io.Discard); c.SitesJobs != SitesJobsDefault {
		t.Errorf("default --sites-jobs %d, want %d", c.SitesJobs, SitesJobsDefault)
	}
	if _, _, err := ParseArgs([]string{"--sites-jobs", "0"}, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), "--sites-jobs 0") {
		t.Errorf("--sites-jobs 0: %v", err)
	}
}

// The rows of the four runs, as runSites adds them after each: the keyed
// figures, the judged ones, and the targets region's cells.
func TestSitesRows(t *testing.T) {
	ms := time.Millisecond
	cpu := func(perJob time.Duration) (cpuUse, cpuUse) {
		return cpuUse{serverOK: true, js: map[int]time.Duration{}},
			cpuUse{serverOK: true, server: perJob * 100, js: map[int]time.Duration{7: perJob * 10}}
	}
	outcome := func(sc sitesScenario, perJob time.Duration, tput ...float64) sitesOutcome {
		o := sitesOutcome{sc: sc, jobs: 100, tput: tput}
		o.cpu0, o.cpu1 = cpu(perJob)
		if sc.linked {
			o.lag = []time.Duration{80 * ms, 100 * ms, 400 * ms}
			o.floor = []time.Duration{5 * ms, 6 * ms}
		}
		return o
	}
	s := &Section{ID: SectionSites, Name: sectionNames[SectionSites]}
	cfg := Config{SitesJobs: 100, Workers: 16}
	var outs []sitesOutcome
	alone := outcome(sitesScenario{1, false}, 10*ms, 200)
	alone.oneCopy = 2 * ms
	for _, o := range []sitesOutcome{
		alone,
		outcome(sitesScenario{2, false}, 10*ms, 110, 105),
		outcome(sitesScenario{2, true}, 14*ms, 90, 88),
		outcome(sitesScenario{3, true}, 19*ms, 60, 59, 58),
	} {
		outs = append(outs, o)
		sitesRows(s, outs, cfg)
	}
	rep := &Report{Sections: []*Section{s}}
	for key, want := range map[string]string{
		keySitesAlone:     "200 jobs/s",
		keySitesLinked:    "90 jobs/s",
		keySitesShare:     "45.0 %",
		keySitesLagP50:    "100 ms",
		keySitesLagP99:    "400 ms",
		keySitesCPU1:      "10.0 ms",
		keySitesCPU2:      "14.0 ms",
		keySitesCPU3:      "19.0 ms",
		keySitesCPUGrowth: "1.40 x / 1.90 x",
		// One copy at 2 ms against 10 ms alone: 1 + 0.2 with two sites,
		// 1 + 0.4 with three, over 1.25.
		keySitesReach: "no: 1.20 x / 1.40 x",
		// Side by side 110 of 200 jobs/s alone, over 1.2: 45.8 %.
		keySitesShareReach: "no: 45.8 %",
	} {
		if row, ok := rep.headline(key); !ok || row.Text != want {
			t.Errorf("row %s: %+v, want %q", key, row, want)
		}
	}
	if row, _ := rep.headline(keySitesShare); row.Met == nil || *row.Met {
		t.Errorf("45 %% of alone: %+v, want judged not met", row)
	}
	if row, _ := rep.headline(keySitesCPUGrowth); row.Met == nil || *row.Met || !near(row.Value, 1.9) {
		t.Errorf("CPU growth 1.9 x: %+v, want judged not met, the worst the value", row)
	}
	var table strings.Builder
	for _, r := range s.Rows {
		table.WriteString(r.Metric + " | " + r.Text + "\n")
	}
	for _, want := range []string{
		"2 sites side by side, not linked (the machine shared): throughput of A / B | 110 / 105 jobs/s\n",
		"site A linked / side by side, not linked (what the links cost) | 81.8 %\n",
		"  the same read at A itself (the measure's floor): p50 / p99 | 5.00 ms / 6.00 ms\n",
		"3 sites, every pair linked both ways: throughput of A / B / C | 60 / 59 / 58 jobs/s\n",
		"  of which couchjs (validate_doc_update, views) | 1.00 ms\n",
		"  site A side by side, not linked / alone (the machine's share) | 55.0 %\n",
		"  per job it stores (its own and the 2 other sites') | 6.33 ms\n",
		"the least a job of another site can cost A: one finished copy served and stored, in full batches, indexed (per job) | 2.00 ms\n",
		"  as a share of A's own job alone | 20.0 %\n",
		"site A's server CPU per job it stores, 2 / 3 sites linked vs alone | 0.70 x / 0.63 x\n",
	} {
		wantIn(t, "section 9's rows", table.String(), want)
	}
	targets := DocRun{Reports: []*Report{rep}}.targetsRegion()
	for _, want := range []string{
		"| sites: a site's throughput linked to another ≥ 90 % of alone | **not met**: 45.0 % (90 jobs/s linked) |\n",
		"| sites: a site's server CPU per job does not grow with other sites' jobs (2 / 3 sites linked ≤ 1.25× of alone) | **not met**: 1.40 x / 1.90 x |\n",
		"| … within reach of a site that stores every other site's jobs? (the least growth: one finished copy of each, served and stored in full batches) | no: 1.20 x / 1.40 x |\n",
	} {
		wantIn(t, "targets region", targets, want)
	}
}

// With a server URL there are no sites to start: the section says why.
func TestRunSitesSkippedWithAServerURL(t *testing.T) {
	cfg := tiny()
	cfg.Sections = []int{SectionSites}
	reps, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	s := reps[0].Sections[0]
	if s.ID != SectionSites || s.Error != "" || len(s.Rows) != 1 || s.Rows[0].Text != "not measured (see the notes)" {
		t.Fatalf("section 9 with a URL: %+v", s)
	}
	if !slices.ContainsFunc(reps[0].Notes, func(n string) bool { return strings.HasPrefix(n, "Section 9 (sites) did not run: ") }) {
		t.Errorf("no note says why: %q", reps[0].Notes)
	}
}

// Section 9 on the single node the bench starts, with two more started as
// sites B and C, at a tiny size: every run's rows, keyed and judged.
func TestRunSitesOnLocalNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three Apache CouchDB nodes")
	}
	if _, err := localserver.FindCouchDB(os.Getenv); err != nil {
		couchtest.Skip(t, "section 9 starts its sites from a local Apache CouchDB release: "+err.Error())
	}
	cfg := tiny()
	cfg.URL, cfg.User, cfg.Password, cfg.URLOrigin = "", "", "", ""
	cfg.Servers, cfg.Sections = []string{ServerCouchDB}, []int{SectionSites}
	cfg.SitesJobs, cfg.Workers, cfg.Instances = 30, 4, 1
	cfg.CouchDBHome = os.Getenv(localserver.CouchDBHomeEnv)
	reps, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	rep := reps[0]
	var table bytes.Buffer
	_ = rep.WriteTable(&table)
	t.Logf("\n%s", table.String())
	if len(rep.Sections) != 1 || rep.Sections[0].Error != "" {
		t.Fatalf("sections: %+v", rep.Sections)
	}
	keys := []string{keySitesAlone, keySitesLinked, keySitesShare, keySitesLagP50, keySitesLagP99}
	if runtime.GOOS == "linux" { // the server's CPU is read from /proc
		keys = append(keys, keySitesCPU1, keySitesCPU2, keySitesCPU3, keySitesCPUGrowth, keySitesReach, keySitesShareReach)
	}
	for _, k := range keys {
		if row, ok := rep.headline(k); !ok || row.Value <= 0 {
			t.Errorf("row %s: %+v", k, row)
		}
	}
	for _, k := range []string{keySitesShare, keySitesCPUGrowth} {
		if row, ok := rep.headline(k); ok && row.Met == nil {
			t.Errorf("row %s is not judged: %+v", k, row)
		}
	}
	rows := rowsByMetric(rep)
	if r, ok := rows["9/jobs not run exactly once, at their owner (every run)"]; !ok || r.Value != 0 {
		t.Errorf("jobs not run once at their owner: %+v", r)
	}
	if r := rows["9/3 sites, every pair linked both ways: throughput of A / B / C"]; len(strings.Split(r.Text, " / ")) != 3 || r.Value <= 0 {
		t.Errorf("three sites' throughput: %+v", r)
	}
	checkMarkdown(t, DocRun{Reports: reps, Command: "go run ./cmd/couchq-bench"})
}
