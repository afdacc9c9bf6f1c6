package handlers_test

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/couchq/couchq/handlers"
	"github.com/couchq/couchq/worker"
)

func newJob(t *testing.T, payload string) *worker.Job {
	t.Helper()
	job := &worker.Job{ID: "job-" + strings.ReplaceAll(t.Name(), "/", "-"), Type: "test", Attempt: 2, MaxAttempts: 5}
	if payload != "" {
		job.Payload = json.RawMessage(payload)
	}
	return job
}

// isPermanent reports whether err fails the job without retries.
func isPermanent(err error) bool {
	var fe *worker.FailError
	return errors.As(err, &fe)
}

func decodeResult[T any](t *testing.T, job *worker.Job) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(job.Result(), &v); err != nil {
		t.Fatalf("decoding result %s: %v", job.Result(), err)
	}
	return v
}

func TestNames(t *testing.T) {
	got := handlers.Names()
	want := []string{"exec", "http-check", "noop", "webhook"}
	if !slices.Equal(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	got[0] = "changed"
	if handlers.Names()[0] != "exec" {
		t.Fatal("Names returns shared state")
	}
}

func TestNewBuildsEachName(t *testing.T) {
	for _, name := range handlers.Names() {
		opts := handlers.Options{}
		if name == handlers.NameExec {
			opts.Exec = []string{"sh", "-c", "true"}
		}
		h, err := handlers.New(name, opts)
		if err != nil {
			t.Fatalf("New(%q): %v", name, err)
		}
		if h == nil {
			t.Fatalf("New(%q) returned a nil handler", name)
		}
	}
}

func TestNewUnknownNameListsNames(t *testing.T) {
	_, err := handlers.New("http-chek", handlers.Options{})
	if err == nil {
		t.Fatal("New accepted an unknown name")
	}
	for _, want := range append(handlers.Names(), "http-chek") {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestNewExecNeedsCommand(t *testing.T) {
	_, err := handlers.New("exec", handlers.Options{})
	if err == nil || !strings.Contains(err.Error(), "no command") {
		t.Fatalf("New(exec) without a command: err = %v, want a 'no command' error", err)
	}
	_, err = handlers.New("exec", handlers.Options{Exec: []string{"couchq-no-such-program-xyz"}})
	if err == nil || !strings.Contains(err.Error(), "couchq-no-such-program-xyz") {
		t.Fatalf("New(exec) with a missing program: err = %v, want an error naming it", err)
	}
	_, err = handlers.New("exec", handlers.Options{Exec: []string{"true"}, ExecDir: "/couchq/no/such/dir"})
	if err == nil || !strings.Contains(err.Error(), `working directory "/couchq/no/such/dir"`) {
		t.Fatalf("New(exec) in a missing directory: err = %v, want an error naming it", err)
	}
}

func TestNewRejectsNegativeTimeout(t *testing.T) {
	if _, err := handlers.New("http-check", handlers.Options{HTTPTimeout: -1}); err == nil {
		t.Fatal("New accepted a negative HTTP timeout")
	}
}
