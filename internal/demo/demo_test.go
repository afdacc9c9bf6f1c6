package demo

import (
	"bytes"
	"testing"
)

func TestIndentWriter(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	w := &indentWriter{w: &buf, prefix: "  "}
	for _, part := range []string{"a\nb", "c\n\n", "d\n"} {
		_, _ = w.Write([]byte(part))
	}
	if got, want := buf.String(), "  a\n  bc\n\n  d\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
