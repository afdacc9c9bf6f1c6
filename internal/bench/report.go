package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Report is the outcome of one server's bench run.
type Report struct {
	Started     time.Time  `json:"started"`
	WallSeconds float64    `json:"wall_seconds"`
	Server      ServerInfo `json:"server"`
	// Skipped says why the server was not measured (no local Apache
	// CouchDB release); Error why its run could not start. Either leaves
	// the rest empty.
	Skipped  string         `json:"skipped,omitempty"`
	Error    string         `json:"error,omitempty"`
	Host     HostInfo       `json:"host"`
	Settings map[string]any `json:"settings,omitempty"`
	Sections []*Section     `json:"sections"`
	// Notes explain what the figures mean and what was left out.
	Notes []string `json:"notes,omitempty"`
}

// ServerInfo says what was measured.
type ServerInfo struct {
	// Kind is ServerCouchDB, ServerCluster or ServerPouchDB for a server
	// the bench started, "url" for --url or COUCHDB_URL.
	Kind    string   `json:"kind"`
	URL     string   `json:"url"`             // node 1's; no credentials
	Nodes   []string `json:"nodes,omitempty"` // every node's, for a cluster
	Vendor  string   `json:"vendor"`
	Version string   `json:"version"`
	// Origin says why and how: "--url", "COUCHDB_URL", or how the bench
	// started the server ("single node started by the bench from /opt/couchdb (...)").
	Origin string `json:"origin"`
	// Topology is the shape of an Apache CouchDB the bench started
	// ("3-node cluster, q=2, n=3").
	Topology string `json:"topology,omitempty"`
	// Clients says where the queue clients and the ceiling's writers send
	// their requests.
	Clients string `json:"clients,omitempty"`
	// CPU says which processes the server's CPU figures add up; empty when
	// there are none (a server the bench did not start).
	CPU string `json:"cpu,omitempty"`
}

// Name is the server as a reader knows it: "Apache CouchDB 3.5.0".
func (s ServerInfo) Name() string { return serverName(s.Vendor, s.Version) }

// HostInfo describes the machine the bench (and a local server) ran on.
type HostInfo struct {
	CPUs int `json:"cpus"`
	// CPUModel is the processor's name and Memory the machine's memory in
	// bytes, where the system says (Linux).
	CPUModel  string `json:"cpu_model,omitempty"`
	Memory    uint64 `json:"memory,omitempty"`
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
	// LoadStart and LoadEnd are the load averages (1, 5, 15 min) when the
	// run began and ended; empty where unknown.
	LoadStart string `json:"load_start,omitempty"`
	LoadEnd   string `json:"load_end,omitempty"`
}

// Section is one numbered part of the bench.
type Section struct {
	ID        int      `json:"id"`
	Name      string   `json:"name"`
	Seconds   float64  `json:"seconds"`
	Databases []string `json:"databases,omitempty"`
	Rows      []Row    `json:"rows"`
	// Error is why the section stopped early; its rows are what it got to.
	Error string `json:"error,omitempty"`
}

// Row is one figure.
type Row struct {
	Metric string  `json:"metric"`
	Value  float64 `json:"value"`
	Unit   string  `json:"unit,omitempty"`
	// Text is Value as the table prints it (or a value that is no number).
	Text   string `json:"text"`
	Target string `json:"target,omitempty"`
	// Met is set on rows that have a target.
	Met *bool `json:"met,omitempty"`
	// Key names the figure when it is one of the headline figures the
	// docs' summaries pick (the key* constants), so that rewording a
	// row's metric does not lose it.
	Key string `json:"key,omitempty"`
}

// The headline figures (Row.Key): what the docs' summaries pick from each
// server's report.
const (
	keyThroughput      = "throughput"       // section 2: couchq's jobs/s, judged against bulk/3
	keyThroughputShare = "throughput_share" // section 2: that as a share of bulk/3
	keyReach           = "reach"            // section 2: the fastest minimal queue's share of the target's limit
	keyReachView       = "reach_view"       // section 2: the claim-view minimal queue's share of it
	keyWakeupP99       = "wakeup_p99"       // section 3
	keyConflicts       = "conflicts"        // section 4, at targetConflictWorkers claimants
	keyEnqueue         = "enqueue"          // section 5: the large backlog's enqueue, judged
	keyEnqueueShare    = "enqueue_share"    // section 5: that as a share of the bare bulk ceiling
	keyBacklogRatio    = "backlog_ratio"    // section 5: round, large vs small backlog, view brought up to date
	// keyBacklogRatioStale is the same reading the view as it stands
	// (Apache CouchDB only).
	keyBacklogRatioStale = "backlog_ratio_stale"
	keyWorkerRSS         = "worker_rss" // section 6: peak RSS of the process the workers ran in
	// keyWorkerRSS100 is section 6's judged figure: a `couchq worker`
	// process's peak RSS at WorkerRSSConcurrency jobs at once.
	keyWorkerRSS100 = "worker_rss_100"
	// Section 9: site A's throughput alone and linked to B, that as a
	// share (judged), the replication lag of A's results at B, and A's
	// server CPU per job with 1, 2 and 3 sites, the growth judged.
	keySitesAlone     = "sites_alone"
	keySitesLinked    = "sites_linked"
	keySitesShare     = "sites_share"
	keySitesLagP50    = "sites_lag_p50"
	keySitesLagP99    = "sites_lag_p99"
	keySitesCPU1      = "sites_cpu_1"
	keySitesCPU2      = "sites_cpu_2"
	keySitesCPU3      = "sites_cpu_3"
	keySitesCPUGrowth = "sites_cpu_growth"
	// keySitesReach is the least growth any site holding every other
	// site's jobs has: whether the growth target is within reach.
	keySitesReach = "sites_reach"
	// keySitesShareReach is the most a site linked to another on this
	// machine can run of its rate alone, from the least growth.
	keySitesShareReach = "sites_share_reach"
	// Section 2: couchq in a database with validation off, its share of
	// the bare bulk/3 (judged), the in-process run's server CPU per job,
	// and on the cluster that as a multiple of the node's (judged).
	keyNoValidation      = "no_validation"
	keyNoValidationShare = "no_validation_share"
	keyServerCPU         = "server_cpu"
	keyClusterCPU        = "cluster_cpu"
	keyFleet             = "fleet"       // section 2: Fleet worker processes' jobs/s
	keyFleetShare        = "fleet_share" // the same, of the in-process figure
	// keyFleetReach is the fleet's shape run in one process, as a share
	// of the in-process figure: whether the fleet target is within reach.
	keyFleetReach = "fleet_reach"
)

// headline is the report's row of that key.
func (r *Report) headline(key string) (Row, bool) {
	for _, s := range r.Sections {
		for _, row := range s.Rows {
			if row.Key == key {
				return row, true
			}
		}
	}
	return Row{}, false
}

func (s *Section) add(r Row) *Row {
	s.Rows = append(s.Rows, r)
	return &s.Rows[len(s.Rows)-1]
}

// target marks r against a target described by what; met says whether
// the figure reaches it.
func (r *Row) target(what string, met bool) {
	r.Target = what
	r.Met = &met
}

// numRow is a plain number with unit, printed with the given decimals.
func numRow(metric string, v float64, unit string, decimals int) Row {
	text := strconv.FormatFloat(v, 'f', decimals, 64)
	if decimals == 0 {
		text = groupThousands(text)
	}
	if unit != "" {
		text += " " + unit
	}
	return Row{Metric: metric, Value: v, Unit: unit, Text: text}
}

// durRow is a duration, stored in milliseconds.
func durRow(metric string, d time.Duration) Row {
	ms := float64(d) / float64(time.Millisecond)
	return Row{Metric: metric, Value: ms, Unit: "ms", Text: formatMillis(ms)}
}

// formatDuration prints d as durRow does, for rows that hold several.
func formatDuration(d time.Duration) string {
	return formatMillis(float64(d) / float64(time.Millisecond))
}

// textRow is a figure that is not a number (a note, "n/a").
func textRow(metric, text string) Row { return Row{Metric: metric, Text: text} }

func formatMillis(ms float64) string {
	switch {
	case ms >= 100:
		return strconv.FormatFloat(ms, 'f', 0, 64) + " ms"
	case ms >= 10:
		return strconv.FormatFloat(ms, 'f', 1, 64) + " ms"
	default:
		return strconv.FormatFloat(ms, 'f', 2, 64) + " ms"
	}
}

// groupThousands puts commas into the integer part of a formatted number.
func groupThousands(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	intPart, frac, hasFrac := strings.Cut(s, ".")
	var b strings.Builder
	for i, c := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	out := b.String()
	if hasFrac {
		out += "." + frac
	}
	if neg {
		out = "-" + out
	}
	return out
}

// WriteJSON writes reports as an indented JSON array, one report per
// server, in the order they ran (an array of one for --url).
func WriteJSON(w io.Writer, reports []*Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if reports == nil {
		reports = []*Report{}
	}
	if err := enc.Encode(reports); err != nil {
		return fmt.Errorf("writing JSON report: %w", err)
	}
	return nil
}

// WriteTables writes one table per report (WriteTable), a blank line
// between them.
func WriteTables(w io.Writer, reports []*Report) error {
	for i, r := range reports {
		if i > 0 {
			if _, err := io.WriteString(w, "\n"); err != nil {
				return fmt.Errorf("writing report: %w", err)
			}
		}
		if err := r.WriteTable(w); err != nil {
			return err
		}
	}
	return nil
}

// WriteTable writes the report as one aligned plain-text table, with a
// header naming the server (what it is, why it was measured, where the
// clients went), the sizes and the host, and the notes below.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	sv := r.Server
	fmt.Fprintf(&b, "couchq-bench  %s  [%s]\n", r.Started.Format(time.RFC3339), sv.Kind)
	switch {
	case r.Skipped != "":
		fmt.Fprintf(&b, "server:  %s: skipped: %s\n", sv.Kind, r.Skipped)
	case sv.Vendor == "" && sv.URL == "":
		fmt.Fprintf(&b, "server:  %s\n", sv.Kind)
	default:
		what := sv.Name()
		if sv.Topology != "" {
			what += ", " + sv.Topology
		}
		fmt.Fprintf(&b, "server:  %s; %s\n", what, sv.Origin)
		if len(sv.Nodes) > 0 {
			fmt.Fprintf(&b, "nodes:   %s\n", strings.Join(sv.Nodes, " "))
		} else {
			fmt.Fprintf(&b, "url:     %s\n", sv.URL)
		}
	}
	if sv.Clients != "" {
		fmt.Fprintf(&b, "clients: %s\n", sv.Clients)
	}
	if sv.CPU != "" {
		fmt.Fprintf(&b, "server CPU: %s\n", sv.CPU)
	}
	if sizes := sizesLine(r.Settings); sizes != "" {
		fmt.Fprintf(&b, "sizes:   %s\n", sizes)
	}
	if r.Skipped != "" {
		_, err := io.WriteString(w, b.String())
		return wrapWrite(err)
	}
	fmt.Fprintf(&b, "host:    %d CPUs, %s, %s; wall time %.1f s\n", r.Host.CPUs, r.Host.OS, r.Host.GoVersion, r.WallSeconds)
	if r.Host.LoadStart != "" {
		fmt.Fprintf(&b, "load:    %s at start, %s at end (1, 5, 15 min; other work skews every figure)\n", r.Host.LoadStart, r.Host.LoadEnd)
	}
	if r.Error != "" {
		fmt.Fprintf(&b, "\nthe run could not start: %s\n", r.Error)
		_, err := io.WriteString(w, b.String())
		return wrapWrite(err)
	}
	b.WriteString("\n")
	header := []string{"SECTION", "METRIC", "VALUE", "TARGET", "MET"}
	rows := [][]string{header}
	for _, s := range r.Sections {
		name := fmt.Sprintf("%d %s", s.ID, s.Name)
		for _, row := range s.Rows {
			rows = append(rows, []string{name, row.Metric, row.Text, row.Target, metText(row.Met)})
			name = ""
		}
		if s.Error != "" {
			rows = append(rows, []string{name, "ERROR: the section stopped early", "see below", "", ""})
		}
	}
	renderTable(&b, rows, map[int]bool{2: true})
	for _, s := range r.Sections {
		if s.Error != "" {
			fmt.Fprintf(&b, "\nsection %d (%s) failed: %s\n", s.ID, s.Name, s.Error)
		}
	}
	if len(r.Notes) > 0 {
		b.WriteString("\n")
		for _, n := range r.Notes {
			b.WriteString("* " + n + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return wrapWrite(err)
}

func wrapWrite(err error) error {
	if err != nil {
		return fmt.Errorf("writing report: %w", err)
	}
	return nil
}

// sizesLine is the settings that size the sections, as the table's header
// shows them; the cluster's are scaled (Config.ClusterScale).
func sizesLine(set map[string]any) string {
	if set == nil {
		return ""
	}
	line := fmt.Sprintf("--jobs %v, --workers %v, --contention-jobs %v, --backlog-small %v, --backlog-large %v",
		set["jobs"], set["workers"], set["contention_jobs"], set["backlog_small"], set["backlog_large"])
	if v, ok := set["validation"].(string); ok && v != "" {
		line += ", --validation " + v
	}
	if l, ok := set["language"].(string); ok && l != "" {
		line += ", --language " + l
	}
	if n, ok := set["sites_jobs"]; ok {
		line += fmt.Sprintf(", --sites-jobs %v", n)
	}
	if note, ok := set["scaled"].(string); ok && note != "" {
		line += " (" + note + ")"
	}
	return line
}

func metText(met *bool) string {
	switch {
	case met == nil:
		return ""
	case *met:
		return "met"
	default:
		return "NOT MET"
	}
}

// renderTable aligns cells in columns two spaces apart; columns in
// rightAlign are right-aligned (numbers). Trailing blanks are trimmed.
func renderTable(b *strings.Builder, rows [][]string, rightAlign map[int]bool) {
	var widths []int
	for _, row := range rows {
		for i, cell := range row {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(cell))
		}
	}
	for _, row := range rows {
		var line strings.Builder
		for i, cell := range row {
			if i > 0 {
				line.WriteString("  ")
			}
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(cell))
			if rightAlign[i] {
				line.WriteString(pad + cell)
			} else {
				line.WriteString(cell + pad)
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " ") + "\n")
	}
}
