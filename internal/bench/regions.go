package bench

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// A generated region of a Markdown file is the lines between two marker
// lines, "<!-- NAME:begin -->" and "<!-- NAME:end -->", each alone on its
// line (blanks around it allowed). Rewriting a region replaces those lines
// and nothing else, so that the prose around the bench's tables stays
// what people wrote. Marker lines inside fenced code blocks are text, not
// markers: a guide can show its own markers.

// ErrNoMarkers is the error when a file has neither marker of a region.
var ErrNoMarkers = errors.New("no markers")

// regionMarkers are the begin and end marker lines of the named region.
func regionMarkers(name string) (begin, end string) {
	return "<!-- " + name + ":begin -->", "<!-- " + name + ":end -->"
}

// markerLine is where a marker line is.
type markerLine struct {
	line  int // index into the file's lines
	name  string
	begin bool
}

// findMarkers lists the lines of lines that are a marker of one of the
// names' regions, in file order, skipping fenced code blocks.
func findMarkers(lines []string, names []string) []markerLine {
	want := map[string]markerLine{}
	for _, n := range names {
		b, e := regionMarkers(n)
		want[b] = markerLine{name: n, begin: true}
		want[e] = markerLine{name: n}
	}
	var found []markerLine
	fence := ""
	for i, l := range lines {
		t := strings.TrimSpace(l)
		if fence != "" {
			if strings.HasPrefix(t, fence) && strings.Trim(t, fence[:1]) == "" {
				fence = ""
			}
			continue
		}
		if f := fenceOpening(t); f != "" {
			fence = f
			continue
		}
		if m, ok := want[t]; ok {
			m.line = i
			found = append(found, m)
		}
	}
	return found
}

// fenceOpening is the fence a line opens ("```", "~~~~"), or "".
func fenceOpening(t string) string {
	for _, c := range []string{"`", "~"} {
		n := len(t) - len(strings.TrimLeft(t, c))
		if n >= 3 {
			return strings.Repeat(c, n)
		}
	}
	return ""
}

// ReplaceRegions returns text with the lines between each region's
// markers replaced by its content (a newline added if it lacks one). The
// marker lines themselves and everything outside them are kept byte for
// byte, so applying the same contents again changes nothing. Every region
// must appear once, its begin marker before its end marker, regions
// neither nested nor overlapping; otherwise the error names the region and
// the marker at fault, and wraps ErrNoMarkers when the file has neither of
// a region's markers.
func ReplaceRegions(text string, contents map[string]string) (string, error) {
	names := slices.Sorted(maps.Keys(contents))
	lines := strings.SplitAfter(text, "\n")
	found := findMarkers(lines, names)
	var errs []error
	for _, n := range names {
		errs = append(errs, checkRegion(found, n))
	}
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	// Each region's markers are a begin then an end: the regions must
	// follow one another, pairs of the same name. At the first pair that
	// is not, the second marker is another region's begin.
	for i := 0; i < len(found); i += 2 {
		if b, e := found[i], found[i+1]; e.name != b.name {
			return "", fmt.Errorf("region %s begins (line %d) inside region %s (line %d): each region must end before another begins",
				e.name, e.line+1, b.name, b.line+1)
		}
	}
	var b strings.Builder
	next := 0
	for i := 0; i < len(found); i += 2 {
		begin, end := found[i], found[i+1]
		for _, l := range lines[next : begin.line+1] {
			b.WriteString(l)
		}
		c := contents[begin.name]
		b.WriteString(c)
		if c != "" && !strings.HasSuffix(c, "\n") {
			b.WriteString("\n")
		}
		next = end.line
	}
	for _, l := range lines[next:] {
		b.WriteString(l)
	}
	return b.String(), nil
}

// checkRegion says what is wrong with the markers of region name, if
// anything: missing, repeated, or the end before the begin.
func checkRegion(found []markerLine, name string) error {
	begin, end := regionMarkers(name)
	var begins, ends []int
	for _, m := range found {
		switch {
		case m.name != name:
		case m.begin:
			begins = append(begins, m.line+1)
		default:
			ends = append(ends, m.line+1)
		}
	}
	switch {
	case len(begins) == 0 && len(ends) == 0:
		return fmt.Errorf("region %s: %w %s and %s", name, ErrNoMarkers, begin, end)
	case len(begins) == 0:
		return fmt.Errorf("region %s: no %s (%s is on line %d)", name, begin, end, ends[0])
	case len(ends) == 0:
		return fmt.Errorf("region %s: no %s (%s is on line %d)", name, end, begin, begins[0])
	case len(begins) > 1:
		return fmt.Errorf("region %s: %s is on %d lines (%s), want one", name, begin, len(begins), joinInts(begins))
	case len(ends) > 1:
		return fmt.Errorf("region %s: %s is on %d lines (%s), want one", name, end, len(ends), joinInts(ends))
	case ends[0] < begins[0]:
		return fmt.Errorf("region %s: %s (line %d) comes before %s (line %d)", name, end, ends[0], begin, begins[0])
	}
	return nil
}

// RewriteRegions replaces the regions of the file at path (ReplaceRegions)
// and writes it back if that changed it: through a temporary file renamed
// over it, so that an interrupted write leaves the old file whole. It
// keeps the file's permissions. Errors name the file.
func RewriteRegions(path string, contents map[string]string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("rewriting the bench's regions: %w", err)
	}
	text, err := ReplaceRegions(string(old), contents)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if text == string(old) {
		return nil
	}
	info, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("rewriting %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("rewriting %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // after the rename, there is nothing by that name
	_, err = tmp.WriteString(text)
	err = errors.Join(err, tmp.Chmod(info.Mode().Perm()), tmp.Close())
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("rewriting %s: %w", path, err)
	}
	return nil
}

// CheckRegions says whether the file at path has every named region's
// markers in order, without changing it: a run that takes minutes checks
// the files it will rewrite before it starts.
func CheckRegions(path string, names ...string) error {
	text, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("checking the bench's regions: %w", err)
	}
	contents := map[string]string{}
	for _, n := range names {
		contents[n] = ""
	}
	if _, err := ReplaceRegions(string(text), contents); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ", ")
}
