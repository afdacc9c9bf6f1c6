package main

import (
	"bytes"
	"encoding/json"
	stdlog "log"
	"os"
	"testing"
)

// Lines of the standard logger (net/http's) come out as the log's own
// lines. Not parallel: it sets the process's standard logger.
func TestStdlogLinesInTheLogsForm(t *testing.T) {
	var buf bytes.Buffer
	routeStdlog(&buf, false)
	t.Cleanup(func() {
		stdlog.SetOutput(os.Stderr)
		stdlog.SetFlags(stdlog.LstdFlags)
	})
	stdlog.Print("http: superfluous response.WriteHeader call")
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("not a JSON log line: %q: %v", buf.String(), err)
	}
	if line["from"] != "go" || line["message"] != "http: superfluous response.WriteHeader call" || line["time"] == nil {
		t.Errorf("standard logger's line: %v", line)
	}
}
