package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/jobrun"
)

func TestRetryBackoffGrowsAndIsCapped(t *testing.T) {
	prev := time.Duration(0)
	for attempt := 1; attempt <= 6; attempt++ {
		d := RetryBackoff(attempt, time.Second, time.Hour)
		base := time.Duration(attempt*attempt*attempt*attempt) * time.Second
		if d < base || d > base+base/10 {
			t.Fatalf("attempt %d: %s not within [%s, %s]", attempt, d, base, base+base/10)
		}
		if d <= prev {
			t.Fatalf("attempt %d: %s does not grow past %s", attempt, d, prev)
		}
		prev = d
	}
	if d := RetryBackoff(100, time.Second, time.Hour); d != time.Hour {
		t.Fatalf("cap: %s", d)
	}
	if d := DefaultRetry(25); d != RetryCapDefault {
		t.Fatalf("default cap: %s", d)
	}
}

func TestConfigValidation(t *testing.T) {
	ok := HandlerFunc(func(context.Context, *Job) error { return nil })
	cases := map[string]Config{
		"no handlers":  {},
		"empty type":   {Handlers: map[string]Handler{"": ok}},
		"nil handler":  {Handlers: map[string]Handler{"a": nil}},
		"slow beating": {Handlers: map[string]Handler{"a": ok}, LeaseDuration: time.Second, HeartbeatInterval: time.Second},
	}
	for name, cfg := range cases {
		if err := cfg.WithDefaults().validate(); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
	cfg := Config{Handlers: map[string]Handler{"a": ok}}.WithDefaults()
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.HeartbeatInterval != LeaseDurationDefault/3 || cfg.SweepInterval != LeaseDurationDefault/2 {
		t.Fatalf("derived defaults: heartbeat %s sweep %s", cfg.HeartbeatInterval, cfg.SweepInterval)
	}
}

// A negative value where it means nothing is refused by New, not taken
// for the default.
func TestNewRefusesNegativeSettings(t *testing.T) {
	ok := HandlerFunc(func(context.Context, *Job) error { return nil })
	for name, cfg := range map[string]Config{
		"ShutdownTimeout": {ShutdownTimeout: -1},
		"Concurrency":     {Concurrency: -1},
		"LeaseDuration":   {LeaseDuration: -time.Second},
	} {
		cfg.Handlers = map[string]Handler{"a": ok}
		if _, err := New(nil, cfg); err == nil || err.Error() != "worker config: "+name+" is negative: leave it 0 for its default" {
			t.Errorf("%s negative: %v", name, err)
		}
	}
	if _, err := New(nil, Config{Handlers: map[string]Handler{"a": ok}, SweepInterval: -1}); err != nil {
		t.Errorf("a negative SweepInterval (no sweeps) refused: %v", err)
	}
}

func TestSteeringErrorsSurviveWrapping(t *testing.T) {
	out := jobrun.Decide(errors.Join(errors.New("ctx"), JobSnooze(time.Minute)), 1, 5)
	if out.Kind != jobrun.Snoozed || out.Delay != time.Minute {
		t.Fatalf("wrapped snooze not recognised: %+v", out)
	}
	out = jobrun.Decide(fmt.Errorf("wrapped: %w", JobCancel(errors.New("gone"))), 1, 5)
	if out.Kind != jobrun.Cancelled || out.Err.Error() != "cancelled: gone" {
		t.Fatalf("cancel not recognised: %+v", out)
	}
	out = jobrun.Decide(JobFail(errors.New("bad")), 1, 5)
	if out.Kind != jobrun.Failed || out.Err.Error() != "bad" {
		t.Fatalf("fail not recognised: %+v", out)
	}
	if out := jobrun.Decide(errors.New("boom"), 1, 5); out.Kind != jobrun.Retry {
		t.Fatalf("plain error: %+v, want a retry", out)
	}
	if out := jobrun.Decide(errors.New("boom"), 5, 5); out.Kind != jobrun.Failed {
		t.Fatalf("plain error on the last attempt: %+v, want failed", out)
	}
}

func TestTypedDecodesOrFailsWithoutRetry(t *testing.T) {
	type args struct {
		To string `json:"to"`
	}
	var got string
	h := Typed(func(ctx context.Context, job *Job, a args) error {
		got = a.To
		return nil
	})
	if err := h.Handle(context.Background(), &Job{Payload: json.RawMessage(`{"to":"x@y"}`)}); err != nil || got != "x@y" {
		t.Fatalf("decode: %v %q", err, got)
	}
	err := h.Handle(context.Background(), &Job{ID: "j1", Payload: json.RawMessage(`{"to":5}`)})
	var fail *FailError
	if !errors.As(err, &fail) || !strings.Contains(err.Error(), "j1") {
		t.Fatalf("bad payload must fail without retry, naming the job: %v", err)
	}
}

func TestSetResult(t *testing.T) {
	j := &Job{ID: "j"}
	if err := j.SetResult(json.RawMessage(`{bad`)); err == nil {
		t.Fatal("invalid raw JSON accepted")
	}
	if err := j.SetResult(map[string]int{"n": 1}); err != nil || string(j.Result()) != `{"n":1}` {
		t.Fatalf("%v %s", err, j.Result())
	}
	if err := j.SetResult(func() {}); err == nil {
		t.Fatal("unencodable result accepted")
	}
}

type httpError int

func (e httpError) Error() string   { return "status" }
func (e httpError) HTTPStatus() int { return int(e) }

// refusal is a 403 with CouchDB's reason.
type refusal string

func (e refusal) Error() string   { return "Forbidden: " + string(e) }
func (e refusal) HTTPStatus() int { return http.StatusForbidden }

func TestOutcomeWritesRetryOnlyWhatARetryCanFix(t *testing.T) {
	for status, want := range map[int]bool{400: true, 403: true, 409: true, 408: false, 429: false, 500: false, 502: false, 503: false} {
		if got := permanent(httpError(status)); got != want {
			t.Errorf("status %d: permanent %v, want %v", status, got, want)
		}
	}
	if permanent(errors.New("connection reset")) {
		t.Error("an error without a status is a transport failure: retry it")
	}
	// The worker's user refused (a password or role changed) is retried
	// until an operator puts it right; the document refused is not.
	for msg, want := range map[string]bool{
		"You are not allowed to access this db.": false,
		"user w is neither a couchq worker nor a producer of this database (couchq init --workers/--producers)": false,
		"user w is a couchq producer: producers may create jobs":                                                false,
		"invalid WorkItem: result nests objects and arrays more than 1000 levels deep":                          true,
	} {
		if got := permanent(refusal(msg)); got != want {
			t.Errorf("403 %q: permanent %v, want %v", msg, got, want)
		}
	}
	if permanent(httpError(http.StatusUnauthorized)) {
		t.Error("401 (a password changed): retry it")
	}
	for rev, gen := range map[string]int{"1-abc": 1, "12-f": 12, "": 0, "x": 0} {
		if got := revGeneration(rev); got != gen {
			t.Errorf("revGeneration(%q) = %d, want %d", rev, got, gen)
		}
	}
}
