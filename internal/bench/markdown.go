package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// measured says whether the report has figures: its server was neither
// skipped nor failed to start.
func (r *Report) measured() bool { return r.Skipped == "" && r.Error == "" }

// Title is the server as a heading names it: "Apache CouchDB 3.5.0,
// single node", "PouchDB Server 4.2.0"; a server not reached is named by
// its kind.
func (r *Report) Title() string {
	sv := r.Server
	name := sv.Name()
	if sv.Vendor == "" {
		name = map[string]string{ServerCouchDB: "Apache CouchDB", ServerCluster: "Apache CouchDB", ServerPouchDB: "PouchDB Server"}[sv.Kind]
		if name == "" {
			name = "the server of " + sv.Kind
		}
	}
	if t := topologyName(sv.Kind); t != "" {
		name += ", " + t
	}
	return name
}

// WriteMarkdown writes the report as Markdown: a heading naming the
// server, what it is and the sizes it ran with, one table of every
// figure, the sections that failed and the notes.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	r.markdown(&b, nil)
	_, err := io.WriteString(w, b.String())
	return wrapWrite(err)
}

// markdown is WriteMarkdown into b, leaving out the notes in shared
// (written once for every server).
func (r *Report) markdown(b *strings.Builder, shared []string) {
	sv := r.Server
	fmt.Fprintf(b, "### %s\n\n", r.Title())
	switch {
	case r.Skipped != "":
		fmt.Fprintf(b, "Not measured: %s\n", r.Skipped)
		return
	case r.Error != "":
		fmt.Fprintf(b, "The run could not start: %s\n", r.Error)
		return
	}
	what := sv.Name()
	if sv.Topology != "" {
		what += ", " + sv.Topology
	}
	fmt.Fprintf(b, "- Server: %s; %s.\n", what, sv.Origin)
	// Where the clients went says something only on a cluster; on one
	// server it is that server's URL, whose port changes every run.
	if sv.Clients != "" && len(sv.Nodes) > 1 {
		fmt.Fprintf(b, "- Clients: %s.\n", sv.Clients)
	}
	if sv.CPU != "" {
		fmt.Fprintf(b, "- Server CPU: %s.\n", sv.CPU)
	}
	if sizes := sizesLine(r.Settings); sizes != "" {
		fmt.Fprintf(b, "- Sizes: %s.\n", sizes)
	}
	fmt.Fprintf(b, "- Wall time %s", formatWall(r.WallSeconds))
	if r.Host.LoadStart != "" {
		fmt.Fprintf(b, "; load average %s at start, %s at end (1, 5, 15 min)", r.Host.LoadStart, r.Host.LoadEnd)
	}
	b.WriteString(".\n\n")
	b.WriteString("| section | metric | value | target | met |\n|---|---|--:|---|---|\n")
	for _, s := range r.Sections {
		name := fmt.Sprintf("%d %s", s.ID, s.Name)
		for _, row := range s.Rows {
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", mdCell(name), mdMetric(row.Metric), mdCell(row.Text), mdCell(row.Target), mdMet(row.Met))
			name = ""
		}
		if s.Error != "" {
			fmt.Fprintf(b, "| %s | **the section stopped early** (below) | | | |\n", mdCell(name))
		}
	}
	for _, s := range r.Sections {
		if s.Error != "" {
			fmt.Fprintf(b, "\nSection %d (%s) failed: %s\n", s.ID, s.Name, s.Error)
		}
	}
	var notes []string
	for _, n := range r.Notes {
		if !slices.Contains(shared, n) {
			notes = append(notes, n)
		}
	}
	writeNotes(b, notes)
}

func writeNotes(b *strings.Builder, notes []string) {
	if len(notes) == 0 {
		return
	}
	b.WriteString("\n")
	for _, n := range notes {
		b.WriteString("- " + oneLine(n) + "\n")
	}
}

// mdCell makes text fit in a table cell: one line, its pipes escaped.
func mdCell(s string) string {
	return strings.ReplaceAll(oneLine(s), "|", `\|`)
}

// mdMetric is a metric in a cell. The plain-text table indents a row that
// details the one above; Markdown drops leading blanks, so the indent is
// shown with arrows.
func mdMetric(m string) string {
	body := strings.TrimLeft(m, " ")
	if level := (len(m) - len(body)) / 2; level > 0 {
		return strings.Repeat("&emsp;", level-1) + "↳ " + mdCell(body)
	}
	return mdCell(m)
}

// mdMet is metText for Markdown: a miss in bold, for the eye to find.
func mdMet(met *bool) string {
	if met != nil && !*met {
		return "**not met**"
	}
	return metText(met)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// formatWall is a run's wall time as people say it: "3 min 57 s".
func formatWall(seconds float64) string {
	d := time.Duration(seconds * float64(time.Second)).Round(time.Second)
	if d < time.Minute {
		return fmt.Sprintf("%d s", int(d.Seconds()))
	}
	return fmt.Sprintf("%d min %d s", int(d.Minutes()), int(d.Seconds())%60)
}
