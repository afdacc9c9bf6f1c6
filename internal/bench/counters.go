package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// serverCounters are some of Apache CouchDB's own counters (GET
// /_node/_local/_stats), summed over the nodes: what the server did, where
// its CPU per job says only how much. They tell a queue's costs apart
// (indexing, reading documents, validation, committing writes), which is
// how section 2 shows where couchq spends what a minimal queue does not.
type serverCounters struct {
	// mapped is documents the views' map functions were given (one call
	// a document per design document and copy; a revision indexed before
	// the next one is written counts again).
	mapped float64
	// read is documents opened from disk or cache: for a request, a
	// changes feed's selector, a view's include_docs.
	read float64
	// validated is validate_doc_update calls.
	validated float64
	// commits is shard files' commits (one per shard copy a write request
	// touched).
	commits float64
	ok      bool
	// err is why a server that has the counters did not give them.
	err error
}

// counterReads is how many times a node's counters are asked for before
// the reading fails, counterRetry how long apart.
const (
	counterReads = 3
	counterRetry = 250 * time.Millisecond
)

// counterRowMetric is the text row of a queue's counters per job.
const counterRowMetric = "  server's counters per job: documents mapped by views / read / validated; shard commits"

// counters reads every node's counters. ok is false when a node does not
// answer them, with err saying why, and on PouchDB Server, which has no
// such endpoint (no err there).
func (t *target) counters(ctx context.Context) serverCounters {
	if t.info.Vendor != "couchdb" {
		return serverCounters{}
	}
	type counter struct {
		Value float64 `json:"value"`
	}
	var sum serverCounters
	for _, node := range t.nodes {
		var stats struct {
			CouchDB struct {
				Mrview struct {
					MapDoc counter `json:"map_doc"`
				} `json:"mrview"`
				DatabaseReads counter `json:"database_reads"`
				QueryServer   struct {
					Calls struct {
						VDU counter `json:"ddoc_vdu"`
					} `json:"calls"`
				} `json:"query_server"`
				Commits counter `json:"commits"`
			} `json:"couchdb"`
		}
		// Read again after a failure: once in a full test run, with
		// other suites loading the machine, a reading of the cluster's
		// failed (why was not kept).
		var err error
		for try := 1; ; try++ {
			err = t.getJSON(ctx, node+"/_node/_local/_stats", &stats)
			if err == nil || try == counterReads || !sleepCtx(ctx, counterRetry) {
				break
			}
		}
		if err != nil {
			return serverCounters{err: fmt.Errorf("reading the server's counters: %w", err)}
		}
		c := stats.CouchDB
		sum.mapped += c.Mrview.MapDoc.Value
		sum.read += c.DatabaseReads.Value
		sum.validated += c.QueryServer.Calls.VDU.Value
		sum.commits += c.Commits.Value
	}
	sum.ok = len(t.nodes) > 0
	return sum
}

// counterRow adds what the server counted between two readings, per job,
// or why it could not.
func counterRow(s *Section, before, after serverCounters, jobs int64) {
	if err := errors.Join(before.err, after.err); err != nil {
		s.add(textRow(counterRowMetric, "not read: "+err.Error()))
		return
	}
	if !before.ok || !after.ok || jobs <= 0 {
		return
	}
	per := func(a, b float64) float64 { return (b - a) / float64(jobs) }
	s.add(textRow(counterRowMetric, fmt.Sprintf("%.2f / %.2f / %.2f; %.3f",
		per(before.mapped, after.mapped), per(before.read, after.read),
		per(before.validated, after.validated), per(before.commits, after.commits))))
}

// getJSON GETs u as the admin and decodes the answer into out.
func (t *target) getJSON(ctx context.Context, u string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if t.user != "" {
		req.SetBasicAuth(t.user, t.password)
	}
	resp, err := t.raw.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("GET %s: decoding answer: %w", u, err)
	}
	return nil
}
