// Package forms holds the forms of the ops API's answers and parameters,
// shared by its front ends so that they print the same thing: couchq stats
// --json, ls --json and sites --json print what opshttp's /api/stats,
// /api/jobs and /api/sites serve, byte for byte, and couchq stats takes the
// parameters as flags.
package forms

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/couchq/couchq/internal/protocol"
)

// WriteJSON writes v as every JSON answer of the handler is written:
// indented by two spaces, with <, > and & left as they are (payloads are
// read by people and scripts, not embedded in HTML), and a final newline.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// Stats is q.Stats as /api/stats serves it: with the types, the workers
// and each worker's types as empty lists rather than nil, so that the JSON
// has [] where scripts iterate, never null.
func Stats(ctx context.Context, q *protocol.Client, opts protocol.StatsOptions) (*protocol.Stats, error) {
	st, err := q.Stats(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("computing stats: %w", err)
	}
	if st.Types == nil {
		st.Types = []protocol.TypeStats{}
	}
	if st.Workers == nil {
		st.Workers = []protocol.WorkerStats{}
	}
	for i := range st.Workers {
		if st.Workers[i].Types == nil {
			st.Workers[i].Types = []string{}
		}
	}
	return st, nil
}

// Jobs is batch as /api/jobs serves it: the stored documents, the jobs in
// the batch's order and then the malformed documents as they are stored,
// since they do not decode as jobs and are what an operator must see to
// fix them.
func Jobs(batch *protocol.Batch) []any {
	docs := make([]any, 0, len(batch.Items)+len(batch.Malformed))
	for _, it := range batch.Items {
		docs = append(docs, it)
	}
	for _, bad := range batch.Malformed {
		docs = append(docs, bad.Raw)
	}
	return docs
}

// A ParamError is a parameter whose value cannot be used. Param is its
// name as the API knows it; a command line that takes the same value as a
// flag can name the flag instead.
type ParamError struct {
	Param string // since, until or status
	Value string // as given
	Err   error  // why
}

func (e *ParamError) Error() string { return fmt.Sprintf("invalid %s %q: %v", e.Param, e.Value, e.Err) }

func (e *ParamError) Unwrap() error { return e.Err }

// A WindowError is a stats window that ends before it starts.
type WindowError struct {
	Since, Until time.Time
}

func (e *WindowError) Error() string {
	return fmt.Sprintf("since %s is not before until %s", e.Since.UTC().Format(time.RFC3339), e.Until.UTC().Format(time.RFC3339))
}

// StatsOptions turns the parameters of /api/stats (the flags of couchq
// stats) into protocol.StatsOptions as of now. since and until are each an
// age before now (24h, 7d; see protocol.ParseAge) or an RFC 3339 time; an
// empty since means 24h and an empty until now. The errors are a
// *ParamError or a *WindowError.
func StatsOptions(typ, since, until string, now time.Time) (protocol.StatsOptions, error) {
	opts := protocol.StatsOptions{Worker: typ, Until: now}
	var err error
	if until != "" {
		if opts.Until, err = parseWhen(until, now); err != nil {
			return opts, &ParamError{Param: "until", Value: until, Err: err}
		}
	}
	if since == "" {
		since = "24h"
	}
	if opts.Since, err = parseWhen(since, now); err != nil {
		return opts, &ParamError{Param: "since", Value: since, Err: err}
	}
	if !opts.Since.Before(opts.Until) {
		return opts, &WindowError{Since: opts.Since, Until: opts.Until}
	}
	return opts, nil
}

// parseWhen parses a point in time given as an age before now (24h, 7d)
// or as an RFC 3339 time.
func parseWhen(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := protocol.ParseAge(s)
	if err != nil {
		if strings.HasPrefix(s, "-") {
			return time.Time{}, errors.New("must not be negative (an age counts back from now)")
		}
		return time.Time{}, errors.New("want an age such as 1h, 24h or 7d, or an RFC 3339 time such as 2030-01-02T15:04:05Z")
	}
	return now.Add(-d), nil
}

// ParseStatus parses the status parameter of /api/jobs (the --status flag
// of couchq ls): one of protocol.Statuses, or empty for any. The error is a
// *ParamError.
func ParseStatus(s string) (protocol.Status, error) {
	st := protocol.Status(s)
	if s == "" || st.Valid() {
		return st, nil
	}
	names := make([]string, 0, len(protocol.Statuses()))
	for _, v := range protocol.Statuses() {
		names = append(names, string(v))
	}
	return "", &ParamError{Param: "status", Value: s, Err: fmt.Errorf("want one of %s", strings.Join(names, ", "))}
}
