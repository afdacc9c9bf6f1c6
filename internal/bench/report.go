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

// Report is the outcome of one bench run.
type Report struct {
	Started     time.Time      `json:"started"`
	WallSeconds float64        `json:"wall_seconds"`
	Server      ServerInfo     `json:"server"`
	Host        HostInfo       `json:"host"`
	Settings    map[string]any `json:"settings"`
	Sections    []*Section     `json:"sections"`
	// Notes explain what the figures mean and what was left out.
	Notes []string `json:"notes,omitempty"`
}

// ServerInfo says what was measured.
type ServerInfo struct {
	URL     string `json:"url"` // credentials redacted
	Vendor  string `json:"vendor"`
	Version string `json:"version"`
	// Origin is "--url", "COUCHDB_URL" or "local PouchDB Server started by the bench".
	Origin string `json:"origin"`
}

// HostInfo describes the machine the bench (and a local server) ran on.
type HostInfo struct {
	CPUs      int    `json:"cpus"`
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

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("writing JSON report: %w", err)
	}
	return nil
}

// WriteTable writes the report as one aligned plain-text table, with a
// header naming the server and host and the notes below.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "couchq-bench  %s\n", r.Started.Format(time.RFC3339))
	fmt.Fprintf(&b, "server: %s %s at %s (%s)\n", r.Server.Vendor, r.Server.Version, r.Server.URL, r.Server.Origin)
	fmt.Fprintf(&b, "host:   %d CPUs, %s, %s; wall time %.1f s\n", r.Host.CPUs, r.Host.OS, r.Host.GoVersion, r.WallSeconds)
	if r.Host.LoadStart != "" {
		fmt.Fprintf(&b, "load:   %s at start, %s at end (1, 5, 15 min; other work skews every figure)\n", r.Host.LoadStart, r.Host.LoadEnd)
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
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("writing report: %w", err)
	}
	return nil
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
