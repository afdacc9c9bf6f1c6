package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/localserver"
)

var srv *couchtest.Server

func TestMain(m *testing.M) { couchtest.Main(m, func(s *couchtest.Server) { srv = s }) }

// tiny is every section at a size that runs in seconds.
func tiny() Config {
	user, password := srv.Credentials()
	return Config{
		URL: srv.URL(), User: user, Password: password, URLOrigin: "test harness",
		Clients: 2, CeilingTime: 200 * time.Millisecond,
		Jobs: 40, Workers: 4, Instances: 2,
		Rate: 20, Duration: time.Second,
		ContentionJobs: 24, ContentionWorkers: []int{1, 3}, ContentionConcurrency: 2,
		Fleet: 2, FleetConcurrency: 2,
		BacklogSmall: 20, BacklogLarge: 60, Claims: 8,
		// Generous: the whole run, on a machine that may be busy with other tests.
		Instrument: true, Timeout: 6 * time.Minute,
	}
}

func TestRunEverySectionAgainstARealServer(t *testing.T) {
	u, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	if err := checkLoopback(context.Background(), u.Hostname()); err != nil {
		couchtest.Skip(t, "the bench only runs against loopback servers: "+err.Error())
	}
	reps, err := Run(context.Background(), tiny())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(reps) != 1 || reps[0].Server.Kind != serverURL || reps[0].Server.Origin != "test harness" {
		t.Fatalf("want one report, of the URL's server: %+v", reps)
	}
	rep := reps[0]
	// A run without --language says which engine init picked.
	if got, want := rep.Settings["language"], string(designdocs.LanguageFor(rep.Server.Vendor, rep.Server.Version)); got != want {
		t.Errorf("settings' language %v, want %q (what init picks on %s %s)", got, want, rep.Server.Vendor, rep.Server.Version)
	}
	var ids []int
	for _, s := range rep.Sections {
		ids = append(ids, s.ID)
		if s.Error != "" || len(s.Rows) == 0 {
			t.Errorf("section %d: error %q, %d rows", s.ID, s.Error, len(s.Rows))
		}
	}
	if !slices.Equal(ids, AllSections()) {
		t.Fatalf("sections %v, want %v", ids, AllSections())
	}
	// The figures that carry the targets are there and judged.
	want := map[string]bool{"throughput": false, "p99": false}
	for _, s := range rep.Sections {
		for _, r := range s.Rows {
			for key := range want {
				if strings.Contains(r.Metric, key) && r.Met != nil {
					want[key] = true
				}
			}
			if strings.Contains(r.Metric, "throughput, ") && r.Value <= 0 {
				t.Errorf("throughput row %+v", r)
			}
		}
	}
	for key, found := range want {
		if !found {
			t.Errorf("no judged %q row", key)
		}
	}
	checkCeilingAndThroughputRows(t, rep, true)
	checkBacklogRows(t, rep)
	checkClaimIndexRows(t, rep)
	checkFleetRows(t, rep)
	// Every database the bench made is gone.
	dbs, err := srv.Client(t).AllDBs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Sections {
		for _, db := range s.Databases {
			if slices.Contains(dbs, db) {
				t.Errorf("database %s was left behind", db)
			}
		}
	}
	var table, js bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSON(&js, reps); err != nil || !json.Valid(js.Bytes()) {
		t.Fatalf("JSON report: %v", err)
	}
	t.Logf("\n%s", table.String())
	// The headline figures the docs' summaries pick are keyed; section 2's
	// minimal queues and section 5's stale reads run on Apache CouchDB
	// only, and tiny has no 16 claimants to judge 409s at.
	keys := []string{keyThroughput, keyThroughputShare, keyWakeupP99, keyEnqueue, keyEnqueueShare, keyBacklogRatio, keyWorkerRSS, keyWorkerRSS100}
	if srv.Caps().Vendor == "couchdb" {
		keys = append(keys, keyReach, keyBacklogRatioStale)
	}
	for _, k := range keys {
		if row, ok := rep.headline(k); !ok || row.Text == "" {
			t.Errorf("no headline row %q (%+v)", k, row)
		}
	}
	checkMarkdown(t, DocRun{Reports: reps, Command: "go run ./cmd/couchq-bench"})
}

// checkMarkdown checks the docs' Markdown of a run: each measured
// server's table holds every row of its report, in order; the targets and
// summary tables have a column or row per server.
func checkMarkdown(t *testing.T, d DocRun) {
	t.Helper()
	run := d.runRegion()
	for _, rep := range d.Reports {
		if !rep.measured() {
			continue
		}
		_, after, ok := strings.Cut(run, "\n### "+rep.Title()+"\n")
		if !ok {
			t.Errorf("no heading for %s:\n%s", rep.Title(), run)
			continue
		}
		_, table, ok := strings.Cut(after, "| section | metric | value | target | met |\n|---|---|--:|---|---|\n")
		if !ok {
			t.Errorf("%s: no table:\n%s", rep.Title(), after)
			continue
		}
		table, _, _ = strings.Cut(table, "\n\n")
		lines := strings.Split(strings.TrimSuffix(table, "\n"), "\n")
		var rows []Row
		for _, s := range rep.Sections {
			rows = append(rows, s.Rows...)
		}
		if len(lines) != len(rows) {
			t.Errorf("%s: %d table lines, want %d rows:\n%s", rep.Title(), len(lines), len(rows), table)
			continue
		}
		for i, r := range rows {
			if !strings.Contains(lines[i], "| "+mdCell(r.Text)+" |") || strings.Count(lines[i], " | ") != 4 {
				t.Errorf("%s: line %q is not row %+v", rep.Title(), lines[i], r)
			}
		}
	}
	targets, summary := d.targetsRegion(), d.summaryRegion()
	for _, rep := range d.Reports {
		if !strings.Contains(targets, " "+rep.Title()+" |") || !strings.Contains(summary, "\n| "+rep.Title()+" | ") {
			t.Errorf("%s is not in the targets or summary tables:\n%s\n%s", rep.Title(), targets, summary)
		}
	}
	t.Logf("\n%s\n%s\n%s", targets, run, summary)
}

// checkBacklogRows checks section 5: the round is timed as it stands
// (update=lazy) only on Apache CouchDB, whoever started the server, and
// the large backlog's enqueue is judged against section 1's ceiling.
func checkBacklogRows(t *testing.T, rep *Report) {
	t.Helper()
	lazy := srv.Caps().Vendor == "couchdb"
	asItStands, enqueueJudged := false, false
	var rounds, ratios int
	for _, s := range rep.Sections {
		if s.ID != SectionBacklog {
			continue
		}
		for _, r := range s.Rows {
			asItStands = asItStands || strings.Contains(r.Metric, "as it stands")
			enqueueJudged = enqueueJudged || (strings.Contains(r.Metric, "enqueue rate") && r.Met != nil)
			if strings.Contains(r.Metric, "claim round mean") {
				rounds++
			}
			if strings.HasPrefix(r.Metric, "ratio ") && r.Met != nil {
				ratios++
			}
		}
	}
	// Both backlogs' rounds, timed in turn, for each kind of read, and a
	// judged ratio for each kind.
	kinds := 1
	if lazy {
		kinds = 2
	}
	if rounds != 2*kinds || ratios != kinds {
		t.Errorf("section 5: %d timed round rows and %d judged ratios, want %d and %d", rounds, ratios, 2*kinds, kinds)
	}
	if asItStands != lazy {
		t.Errorf("section 5 times the view as it stands: %v, want %v (server %s)", asItStands, lazy, srv.Caps().Vendor)
	}
	if !enqueueJudged {
		t.Error("section 5 does not judge the enqueue rate against the bulk ceiling")
	}
}

// checkClaimIndexRows checks section 8: every kind of index is measured
// where the server has it (Apache CouchDB has Mango and partitioned
// databases), and one it lacks says why instead of failing the section.
func checkClaimIndexRows(t *testing.T, rep *Report) {
	t.Helper()
	caps := srv.Caps()
	has := map[string]bool{
		"couchq's claim design document": true,
		"the due view alone":             true,
		"a Mango index":                  caps.Vendor == "couchdb",
		"partitioned database":           slices.Contains(caps.Features, "partitioned"),
	}
	var claimIndex *Section
	for i := range rep.Sections {
		if rep.Sections[i].ID == 8 {
			claimIndex = rep.Sections[i]
		}
	}
	if claimIndex == nil {
		t.Fatal("the report has no section 8")
	}
	for kind, must := range has {
		measured, skipped := false, ""
		for _, r := range claimIndex.Rows {
			if !strings.Contains(r.Metric, kind) {
				continue
			}
			if strings.HasPrefix(r.Text, "not measured") {
				skipped = r.Text
			} else if strings.Contains(r.Metric, "index build") && r.Value > 0 {
				measured = true
			}
		}
		switch {
		case must && !measured:
			t.Errorf("section 8: %s not measured (%q)", kind, skipped)
		case !measured && skipped == "":
			t.Errorf("section 8: %s neither measured nor skipped with a reason", kind)
		}
	}
}

// rowsByMetric indexes a report's rows by "section/metric".
func rowsByMetric(rep *Report) map[string]Row {
	m := map[string]Row{}
	for _, s := range rep.Sections {
		for _, r := range s.Rows {
			m[fmt.Sprintf("%d/%s", s.ID, r.Metric)] = r
		}
	}
	return m
}

// checkCeilingAndThroughputRows checks sections 1 and 2's yardsticks: the
// bare and design-doc bulk rates, the limits derived from them, and the
// throughput's shares of both limits, traffic and queue waits.
func checkCeilingAndThroughputRows(t *testing.T, rep *Report, instrumented bool) {
	t.Helper()
	rows := rowsByMetric(rep)
	get := func(metric string) Row {
		t.Helper()
		r, ok := rows[metric]
		if !ok {
			t.Errorf("%s: no row %q", rep.Server.Kind, metric)
		}
		return r
	}
	put1 := get("1/single-doc writes/s, 1 client (with couchq's design doc)").Value
	putC := get("1/single-doc writes/s, 2 clients (with couchq's design doc)").Value
	bare := get("1/_bulk_docs docs/s, batch 100, bare database (no design doc)").Value
	design := get("1/_bulk_docs docs/s, batch 100, with couchq's design doc").Value
	lost := get("1/  bulk rate lost to the design doc (validate_doc_update, views)").Value
	oneLine := get("1/_bulk_docs docs/s, batch 100, a one-line validate_doc_update alone").Value
	oneLineLost := get("1/  bulk rate lost to calling validate_doc_update at all").Value
	if oneLine <= 0 || !near(oneLineLost, 100*(1-oneLine/bare)) {
		t.Errorf("%s: one-line validation: bulk %g docs/s, lost %g%% (bulk bare %g)", rep.Server.Kind, oneLine, oneLineLost, bare)
	}
	// Each bulk rate is the better of one writer and C (2 here).
	for what, best := range map[string]float64{"bare database (no design doc)": bare, "with couchq's design doc": design, "a one-line validate_doc_update alone": oneLine} {
		text := get("1/  " + what + ": 1 client / 2 clients").Text
		var one, many float64
		if _, err := fmt.Sscanf(strings.ReplaceAll(text, ",", ""), "%g / %g docs/s", &one, &many); err != nil || one <= 0 || many <= 0 ||
			math.Abs(best-max(one, many)) > 1 {
			t.Errorf("%s: %s: bulk %g docs/s, from %q (%v)", rep.Server.Kind, what, best, text, err)
		}
	}
	limit := get("1/physical limit: bulk (bare) / 3").Value
	putLimit := get("1/single-doc limit: best single-doc rate / 3").Value
	if bare <= 0 || design <= 0 || put1 <= 0 || putC <= 0 {
		t.Errorf("%s: ceiling rates: bulk bare %g, bulk design %g, put %g / %g", rep.Server.Kind, bare, design, put1, putC)
	}
	if !near(limit, bare/3) || !near(putLimit, max(put1, putC)/3) || !near(lost, 100*(1-design/bare)) {
		t.Errorf("%s: limits %g (want bulk bare %g / 3), %g (want best put %g / 3), lost %g%% (bulk design %g)",
			rep.Server.Kind, limit, bare, putLimit, max(put1, putC), lost, design)
	}
	var tput Row
	for _, r := range rep.Sections[1].Rows {
		if strings.HasPrefix(r.Metric, "throughput, ") {
			tput = r
		}
	}
	// With validation on (the tests' databases), the node and PouchDB
	// Server are judged against the bulk rate with couchq's design
	// document; the cluster against twice its figure of when the target
	// was set.
	designLimit := design / 3
	wantTarget := fmt.Sprintf("of %.0f jobs/s (bulk with couchq's design doc / 3)", designLimit)
	if rep.Server.Kind == ServerCluster {
		wantTarget = fmt.Sprintf(">= %.0f jobs/s", TargetClusterThroughput)
	}
	wantMet := tput.Value >= TargetThroughputShare*designLimit
	if rep.Server.Kind == ServerCluster {
		wantMet = tput.Value >= TargetClusterThroughput
	}
	if tput.Met == nil || !strings.Contains(tput.Target, wantTarget) || *tput.Met != wantMet {
		t.Errorf("%s: throughput row (%g jobs/s) judged against %q (met %v), want %q", rep.Server.Kind, tput.Value, tput.Target, tput.Met, wantTarget)
	}
	if share := get("2/share of the limit with couchq's design doc (bulk with its validation and views / 3)").Value; !near(share, 100*tput.Value/designLimit) {
		t.Errorf("%s: share of bulk with the design doc / 3 %g%%, want %g / %g", rep.Server.Kind, share, tput.Value, designLimit)
	}
	if share := get("2/share of the physical limit (bulk, bare / 3)").Value; !near(share, 100*tput.Value/limit) {
		t.Errorf("%s: share of bulk/3 %g%%, want %g / %g", rep.Server.Kind, share, tput.Value, limit)
	}
	checkNoValidationRows(t, rep, get, limit)
	checkClusterCPURow(t, rep, get)
	if share := get("2/share of the single-doc limit (best single-doc rate / 3)").Value; !near(share, 100*tput.Value/putLimit) {
		t.Errorf("%s: share of single-doc/3 %g%%, want %g / %g", rep.Server.Kind, share, tput.Value, putLimit)
	}
	p50 := get("2/enqueue -> handler start p50 (backlog enqueued before the workers started)").Value
	p99 := get("2/enqueue -> handler start p99").Value
	if p50 <= 0 || p99 < p50 {
		t.Errorf("%s: enqueue -> start p50 %g ms, p99 %g ms", rep.Server.Kind, p50, p99)
	}
	checkMinimalQueueRows(t, rep, tput.Value, designLimit)
	if instrumented {
		for _, m := range []string{"2/bytes sent per job (on the wire: HTTP headers and bodies)",
			"2/bytes received per job (on the wire: HTTP headers and bodies)", "2/HTTP requests per job"} {
			// A job's claim and outcome at least are written: some bytes each way.
			if v := get(m).Value; v <= 0 {
				t.Errorf("%s: %s = %g", rep.Server.Kind, m, v)
			}
		}
	}
}

// checkMinimalQueueRows checks section 2's yardstick: the minimal queues
// ran every job, those in a database with couchq's design documents are
// given again with their views' catch-up counted in (slower, or as fast),
// couchq's throughput tput is given as a share of the one that reads the
// claim view, and couchq and each minimal queue have the server's counters
// per job (checkCounterRows); and whether the end-to-end target is within
// reach of a queue keeping couchq's views follows from the fastest of them
// against limit, bulk with couchq's design document / 3.
func checkMinimalQueueRows(t *testing.T, rep *Report, tput, limit float64) {
	t.Helper()
	rows := rep.Sections[1].Rows
	queues := map[string]float64{}
	var order []string
	var catchUps []float64
	var share, skipped, reach, reachMango *Row
	counters := map[string]string{} // by queue: couchq's before the first minimal queue
	for i, r := range rows {
		switch {
		case r.Metric == counterRowMetric:
			q := "couchq"
			if len(order) > 0 {
				q = order[len(order)-1]
			}
			if _, twice := counters[q]; twice {
				t.Errorf("%s: two counter rows for %s", rep.Server.Kind, q)
			}
			counters[q] = r.Text
		case r.Metric == "minimal queue (yardstick)":
			skipped = &rows[i]
		case strings.HasPrefix(r.Metric, "minimal queue: "):
			queues[r.Metric] = r.Value
			order = append(order, r.Metric)
		case r.Metric == "  counting the views' catch-up":
			if len(order) == 0 || r.Value <= 0 || r.Value > queues[order[len(order)-1]]*1.0001 {
				t.Errorf("%s: %q = %g after %v", rep.Server.Kind, r.Metric, r.Value, order)
			}
			catchUps = append(catchUps, r.Value)
		case r.Metric == "couchq's throughput as a share of the minimal queue in the claim view":
			share = &rows[i]
		case r.Metric == reachRowMetric:
			reach = &rows[i]
		case r.Metric == reachMangoRowMetric:
			reachMango = &rows[i]
		}
	}
	if rep.Server.Vendor != "couchdb" {
		// Not run there, and said so.
		if skipped == nil || !strings.HasPrefix(skipped.Text, "not run: ") || len(queues) != 0 {
			t.Errorf("%s: the minimal queue is for Apache CouchDB only: skipped %v, queues %v", rep.Server.Kind, skipped, queues)
		}
		if len(counters) != 0 {
			t.Errorf("%s: server counters given where the server has none: %v", rep.Server.Kind, counters)
		}
		if reach != nil {
			t.Errorf("%s: %q judged without a minimal queue: %q", rep.Server.Kind, reach.Metric, reach.Text)
		}
		return
	}
	want := []string{
		"minimal queue: jobs found by id, bare database",
		"minimal queue: jobs found by id, database with couchq's design documents",
		"minimal queue: jobs found in the claim view",
		"minimal queue: jobs found in the changes feed, database with couchq's design documents",
		"minimal queue: first revisions found in the unfiltered changes feed, database with couchq's design documents",
		"minimal queue: jobs found in a partial Mango index on [worker, date], database with couchq's design documents",
	}
	if !slices.Equal(order, want) || share == nil || len(catchUps) != len(want)-1 {
		t.Fatalf("%s: minimal queue rows %q, %d with the catch-up, share %v; want %q", rep.Server.Kind, order, len(catchUps), share, want)
	}
	for _, q := range want {
		if queues[q] <= 0 {
			t.Errorf("%s: %s: %g jobs/s", rep.Server.Kind, q, queues[q])
		}
	}
	if inView := queues[want[2]]; !near(share.Value, 100*tput/inView) {
		t.Errorf("%s: couchq's share %g%% of the minimal queue in the view, want 100 × %g / %g", rep.Server.Kind, share.Value, tput, inView)
	}
	checkCounterRows(t, rep.Server.Kind, counters, want[0])
	checkReachRow(t, rep.Server.Kind, reach, slices.Max(catchUps), limit)
	// The same of the queue in the claim view (the second with the
	// catch-up: the first is the one finding its jobs by id).
	if view, ok := rep.headline(keyReachView); !ok || view.Metric != reachViewRowMetric || !near(view.Value, 100*catchUps[1]/limit) {
		t.Errorf("%s: claim-view reach row %+v, want %g%% (%.0f jobs/s of %.0f)", rep.Server.Kind, view, 100*catchUps[1]/limit, catchUps[1], limit)
	}
	// And of the one in the Mango index (the last).
	if reachMango == nil || !near(reachMango.Value, 100*catchUps[len(catchUps)-1]/limit) {
		t.Errorf("%s: Mango-index reach row %+v, want %g%%", rep.Server.Kind, reachMango, 100*catchUps[len(catchUps)-1]/limit)
	}
}

// checkReachRow checks the row that says whether the end-to-end target is
// within reach of a queue keeping couchq's views: its value is the fastest
// such minimal queue's share of limit (bulk with couchq's design document
// / 3: the tests' databases have validation on), and it says yes exactly
// when that share reaches the target's.
func checkReachRow(t *testing.T, kind string, reach *Row, fastest, limit float64) {
	t.Helper()
	if reach == nil {
		t.Errorf("%s: no row %q", kind, reachRowMetric)
		return
	}
	share := 100 * fastest / limit
	verdict := "no: "
	if share >= 100*TargetThroughputShare {
		verdict = "yes: "
	}
	if !near(reach.Value, share) || reach.Text != fmt.Sprintf("%s%.1f %% of bulk with couchq's design doc / 3", verdict, share) {
		t.Errorf("%s: %q = %g (%q); want %g%% (%.0f jobs/s of %.0f), %q", kind, reach.Metric, reach.Value, reach.Text, share, fastest, limit, verdict)
	}
}

// checkCounterRows checks the server's counters per job of couchq and the
// minimal queues (by queue; bare is the one in a bare database), which the
// bench reads from every node after the views caught up with the last
// job: the bare database's queue has no view to map its jobs nor a
// validate_doc_update to call, while in a database with couchq's design
// documents each job's last revision at least is mapped by both
// self-updating design documents, and validated as it is written (the
// test's databases keep validation on), twice at least: claimed, finished.
func checkCounterRows(t *testing.T, kind string, counters map[string]string, bare string) {
	t.Helper()
	if len(counters) != 7 {
		t.Errorf("%s: server counter rows for %d queues, want couchq and the six minimal ones: %v", kind, len(counters), counters)
	}
	for q, text := range counters {
		var mapped, read, validated, commits float64
		if _, err := fmt.Sscanf(text, "%f / %f / %f; %f", &mapped, &read, &validated, &commits); err != nil {
			t.Errorf("%s: %s: counters %q: %v", kind, q, text, err)
			continue
		}
		if q == bare {
			if mapped != 0 || validated != 0 {
				t.Errorf("%s: %s: %g documents mapped and %g validated per job, want none", kind, q, mapped, validated)
			}
		} else if mapped < 2 || validated < 2 {
			t.Errorf("%s: %s: %g documents mapped and %g validated per job, want 2 at least", kind, q, mapped, validated)
		}
		if read <= 0 || commits <= 0 {
			t.Errorf("%s: %s: %g documents read and %g commits per job", kind, q, read, commits)
		}
	}
}

// near is a == b within rounding of the printed figures' inputs.
func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*max(math.Abs(a), math.Abs(b), 1) }

func TestRunRefusesRemoteServers(t *testing.T) {
	cfg := tiny()
	cfg.URL = "http://192.0.2.1:5984" // TEST-NET-1: never reached
	_, err := Run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("Run against a remote server: err = %v, want a loopback refusal", err)
	}
	// Every node of a list is checked, not the first alone.
	cfg.URL = "http://127.0.0.1:1,http://192.0.2.1:5984"
	reps, err := Run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "192.0.2.1 is not a loopback address") || reps != nil {
		t.Fatalf("Run against a node list with a remote node: %v, %v", reps, err)
	}
}

func TestRunWithWorkerProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the couchq CLI")
	}
	u, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	if err := checkLoopback(context.Background(), u.Hostname()); err != nil {
		couchtest.Skip(t, "the bench only runs against loopback servers: "+err.Error())
	}
	cfg := tiny()
	cfg.Sections = []int{SectionThroughput, SectionMemory}
	cfg.Jobs, cfg.Instances, cfg.Procs = 30, 1, 2
	reps, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	rep := reps[0]
	var found []string
	for _, s := range rep.Sections {
		for _, r := range s.Rows {
			if strings.Contains(r.Metric, "process") && r.Value > 0 {
				found = append(found, r.Metric)
			}
		}
	}
	for _, want := range []string{"throughput, 4 goroutines over 2 processes", "peak RSS of a worker process"} {
		if !slices.ContainsFunc(found, func(m string) bool { return strings.Contains(m, want) }) {
			t.Errorf("no %q row among %q", want, found)
		}
	}
	var table bytes.Buffer
	_ = rep.WriteTable(&table)
	t.Logf("\n%s", table.String())
}

// The servers the bench starts itself, each measured in turn: what each
// report says about its server, and the figures only a local server has
// (its CPU, couchjs's share on Apache CouchDB, its memory).
func TestRunOnLocalServers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a CouchDB node, a 3-node cluster and PouchDB Server")
	}
	cfg := tiny()
	cfg.URL, cfg.User, cfg.Password, cfg.URLOrigin = "", "", "", ""
	cfg.Sections = []int{SectionCeiling, SectionThroughput, SectionMemory}
	cfg.Jobs, cfg.ClusterScale = 40, 0.5
	cfg.Servers = LocalServers()
	if _, err := localserver.FindCouchDB(os.Getenv); err != nil {
		t.Logf("only PouchDB Server: %v", err)
		cfg.Servers = []string{ServerPouchDB}
	}
	cfg.CouchDBHome = os.Getenv(localserver.CouchDBHomeEnv)
	reps, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	var kinds []string
	for _, rep := range reps {
		kinds = append(kinds, rep.Server.Kind)
	}
	if !slices.Equal(kinds, cfg.Servers) {
		t.Fatalf("reports for %v, want %v", kinds, cfg.Servers)
	}
	for _, rep := range reps {
		sv := rep.Server
		var table bytes.Buffer
		_ = rep.WriteTable(&table)
		t.Logf("\n%s", table.String())
		if rep.Skipped != "" || rep.Error != "" || len(rep.Sections) != 3 {
			t.Errorf("%s: skipped %q, error %q, %d sections", sv.Kind, rep.Skipped, rep.Error, len(rep.Sections))
			continue
		}
		for _, s := range rep.Sections {
			if s.Error != "" {
				t.Errorf("%s: section %d: %s", sv.Kind, s.ID, s.Error)
			}
		}
		checkCeilingAndThroughputRows(t, rep, true)
		rows := rowsByMetric(rep)
		if r := rows["2/CPU per job, server processes"]; r.Value <= 0 {
			t.Errorf("%s: no server CPU per job (%+v); server CPU: %q", sv.Kind, r, sv.CPU)
		}
		if r := rows["1/server CPU per document in _bulk_docs: bare / couchq's design doc / validation off / one-line validation"]; len(strings.Split(r.Text, " / ")) != 4 {
			t.Errorf("%s: server CPU per bulk document: %+v", sv.Kind, r)
		}
		jobs := "40"
		switch sv.Kind {
		case ServerCouchDB:
			if sv.Vendor != "couchdb" || sv.Topology != "single node, q=2, n=1" || !strings.Contains(sv.Origin, "started by the bench from") {
				t.Errorf("couchdb: %+v", sv)
			}
		case ServerCluster:
			if sv.Vendor != "couchdb" || sv.Topology != "3-node cluster, q=2, n=3" || len(sv.Nodes) != 3 ||
				!strings.Contains(sv.Clients, "failover") || !strings.Contains(sv.CPU, "3 nodes summed") {
				t.Errorf("cluster: %+v", sv)
			}
			if r := rows["6/peak RSS of the local server (VmHWM, the 3 nodes' summed)"]; r.Value <= 0 {
				t.Errorf("cluster: no summed peak RSS: %+v", r)
			}
			jobs = "20" // 40 scaled by 0.5
			if !strings.Contains(table.String(), "--cluster-scale 0.5") {
				t.Errorf("cluster: the table does not say its sizes are scaled")
			}
		case ServerPouchDB:
			if sv.Vendor != "pouchdb" || sv.Topology != "" {
				t.Errorf("pouchdb: %+v", sv)
			}
		}
		if _, ok := rows["2/throughput, 4 goroutines over 2 workers, first claim -> last done"]; !ok {
			t.Errorf("%s: no throughput row", sv.Kind)
		}
		if !strings.Contains(table.String(), "--jobs "+jobs+",") {
			t.Errorf("%s: sizes are not --jobs %s", sv.Kind, jobs)
		}
		if r, ok := rep.headline(keyThroughput); !ok || r.Value <= 0 {
			t.Errorf("%s: no headline throughput: %+v", sv.Kind, r)
		}
		// validate_doc_update runs in couchjs on Apache CouchDB: its CPU is
		// part of the server's, and shown.
		if sv.Vendor == "couchdb" {
			if r := rows["2/  of which couchjs (JavaScript: validate_doc_update, views)"]; r.Value <= 0 {
				t.Errorf("%s: no couchjs CPU: %+v", sv.Kind, r)
			}
		}
	}
	// The docs have each server's table.
	checkMarkdown(t, DocRun{Reports: reps, Command: "go run ./cmd/couchq-bench"})
}

// checkFleetRows checks section 2's fleet rows: the processes' throughput,
// and its share of the in-process figure, judged against TargetFleetShare.
func checkFleetRows(t *testing.T, rep *Report) {
	t.Helper()
	if rep.Server.Vendor != "couchdb" {
		// The fleet runs on the reference server only; elsewhere its row
		// says so.
		if fleet, ok := rep.headline(keyFleet); ok {
			t.Errorf("%s: a fleet row %+v, want none", rep.Server.Vendor, fleet)
		}
		if !slices.ContainsFunc(rep.Sections, func(s *Section) bool {
			return slices.ContainsFunc(s.Rows, func(r Row) bool {
				return strings.HasPrefix(r.Metric, "fleet of `couchq worker` processes") && strings.HasPrefix(r.Text, "not run: ")
			})
		}) {
			t.Errorf("%s: no row saying the fleet was not run", rep.Server.Vendor)
		}
		return
	}
	fleet, ok := rep.headline(keyFleet)
	if !ok || fleet.Value <= 0 {
		t.Fatalf("fleet row: %+v", fleet)
	}
	inProcess, _ := rep.headline(keyThroughput)
	share, ok := rep.headline(keyFleetShare)
	if !ok || share.Met == nil || !near(share.Value, 100*fleet.Value/inProcess.Value) ||
		*share.Met != (fleet.Value >= TargetFleetShare*inProcess.Value) {
		t.Errorf("fleet share row %+v (fleet %v, in-process %v)", share, fleet.Value, inProcess.Value)
	}
	// The fleet's shape run in this process, as a share of the in-process
	// figure, says whether the target is within reach of such workers.
	reach, ok := rep.headline(keyFleetReach)
	wantVerdict := "no: "
	if reach.Value >= 100*TargetFleetShare {
		wantVerdict = "yes: "
	}
	if !ok || reach.Value <= 0 || !strings.HasPrefix(reach.Text, wantVerdict) {
		t.Errorf("fleet reach row %+v", reach)
	}
}

// checkNoValidationRows checks section 2's run with validation off: its
// throughput is given with its share of bulk/3 (limit), judged against
// TargetNoValidationShare everywhere but on the cluster, whose targets are
// its own.
func checkNoValidationRows(t *testing.T, rep *Report, get func(string) Row, limit float64) {
	t.Helper()
	row, ok := rep.headline(keyNoValidation)
	if !ok || row.Value <= 0 {
		t.Errorf("%s: no validation-off throughput (%v)", rep.Server.Kind, row)
		return
	}
	if share, _ := rep.headline(keyNoValidationShare); !near(share.Value, 100*row.Value/limit) {
		t.Errorf("%s: validation off: share of bulk/3 %g%%, want %g / %g", rep.Server.Kind, share.Value, row.Value, limit)
	}
	if reruns := get("2/  validation off: jobs run more than once"); reruns.Value != 0 {
		t.Errorf("%s: validation off: %g jobs ran more than once", rep.Server.Kind, reruns.Value)
	}
	judged := row.Met != nil
	if judged == (rep.Server.Kind == ServerCluster) {
		t.Errorf("%s: validation-off row judged %v (%q)", rep.Server.Kind, judged, row.Target)
	}
	if judged && *row.Met != (row.Value >= TargetNoValidationShare*limit) {
		t.Errorf("%s: validation off: %g jobs/s judged %v against %g%% of %g", rep.Server.Kind, row.Value, *row.Met, TargetNoValidationShare*100, limit)
	}
}

// checkClusterCPURow checks that the cluster's server CPU per job is
// given as a multiple of the node's, measured before it in the same run,
// and judged against TargetClusterCPU; other servers have no such row.
func checkClusterCPURow(t *testing.T, rep *Report, get func(string) Row) {
	t.Helper()
	row, ok := rep.headline(keyClusterCPU)
	if rep.Server.Kind != ServerCluster {
		if ok {
			t.Errorf("%s: a cluster CPU row: %v", rep.Server.Kind, row)
		}
		return
	}
	if !ok {
		t.Errorf("cluster: no CPU-per-job row of the node's")
		return
	}
	own, _ := rep.headline(keyServerCPU)
	if row.Value <= 0 || own.Value <= 0 || row.Met == nil || *row.Met != (row.Value <= TargetClusterCPU) {
		t.Errorf("cluster: CPU per job %v of the node's, own %v", row, own)
	}
}
