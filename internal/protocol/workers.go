package protocol

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/go-kivik/kivik/v4"
)

// WorkerDocType is the "type" of worker registry documents.
const WorkerDocType = "Worker"

// workerIDPrefix starts every registry document's id, so that one
// _all_docs range lists them all.
const workerIDPrefix = "worker:"

// WorkerInfo is a worker process's registry document, updated on every
// heartbeat and removed when the process exits cleanly. A document whose
// last heartbeat is old belongs to a dead (or frozen) process.
type WorkerInfo struct {
	ID  string `json:"_id"`
	Rev string `json:"_rev,omitempty"`
	// Type is always WorkerDocType.
	Type string `json:"type"`
	// Claimant is how the process signs its claims: host/pid/worker-id.
	Claimant    string   `json:"claimant"`
	Host        string   `json:"host"`
	PID         int      `json:"pid"`
	Types       []string `json:"types"`
	Concurrency int      `json:"concurrency"`
	// Site is the site the process works for; empty without sites.
	Site string `json:"site,omitempty"`
	// Running lists the ids of the jobs in flight at the last heartbeat.
	Running []string `json:"running"`
	// StartedAt and LastHeartbeat are Unix seconds.
	StartedAt     float64 `json:"started_at"`
	LastHeartbeat float64 `json:"last_heartbeat"`
	// HeartbeatInterval is how often (seconds) the process reports.
	HeartbeatInterval float64 `json:"heartbeat_interval"`
	// Joined is true in the write that registers the process, and only
	// there: the changes feed passes that write to the workers of the same
	// types (FeedChanges.Joined), so they count the newcomer among their
	// peers at once instead of at their next heartbeat.
	Joined bool `json:"joined,omitempty"`
	// BusySeconds sums the run time of finished jobs: utilization is
	// BusySeconds / (uptime × concurrency × len(Types)).
	BusySeconds float64 `json:"busy_seconds"`
	// Counters since the process started.
	Claimed   int64 `json:"claimed"`
	Completed int64 `json:"completed"`
	Failed    int64 `json:"failed"`
	Conflicts int64 `json:"conflicts"`
}

// WorkerDocID is the registry document id for a claimant.
func WorkerDocID(host string, pid int, workerID string) string {
	return fmt.Sprintf("%s%s:%d:%s", workerIDPrefix, host, pid, workerID)
}

// PutWorker writes a registry document, taking over its current revision
// if someone else (an operator, a restarted process) wrote it meanwhile.
func (c *Client) PutWorker(ctx context.Context, info *WorkerInfo) error {
	info.Type = WorkerDocType
	for range 3 {
		rev, err := c.db.Put(ctx, info.ID, info)
		if err == nil {
			info.Rev = rev
			return nil
		}
		if !isStatus(err, http.StatusConflict) {
			return fmt.Errorf("writing worker document %s: %w", info.ID, err)
		}
		current, err := currentRev(ctx, c.db, info.ID)
		if err != nil && !isStatus(err, http.StatusNotFound) {
			return fmt.Errorf("reading worker document %s: %w", info.ID, err)
		}
		info.Rev = current
	}
	return fmt.Errorf("writing worker document %s: still conflicting", info.ID)
}

// DeleteWorker removes a registry document.
func (c *Client) DeleteWorker(ctx context.Context, info *WorkerInfo) error {
	if info.Rev == "" {
		return nil
	}
	if _, err := c.db.Delete(ctx, info.ID, info.Rev); err != nil && !isStatus(err, http.StatusNotFound) {
		return fmt.Errorf("removing worker document %s: %w", info.ID, err)
	}
	return nil
}

// Workers lists the registry documents.
func (c *Client) Workers(ctx context.Context) ([]*WorkerInfo, error) {
	rows := c.db.AllDocs(ctx, kivik.Params(map[string]any{
		"startkey":     workerIDPrefix,
		"endkey":       workerIDPrefix + "\ufff0",
		"include_docs": true,
	}))
	defer rows.Close()
	var out []*WorkerInfo
	for rows.Next() {
		var raw json.RawMessage
		if err := rows.ScanDoc(&raw); err != nil {
			return nil, fmt.Errorf("listing workers: %w", err)
		}
		var info WorkerInfo
		if err := json.Unmarshal(raw, &info); err != nil || info.Type != WorkerDocType {
			continue
		}
		out = append(out, &info)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing workers: %w", err)
	}
	return out, nil
}

// heartbeatIntervalAssumed is the interval assumed for a registry document
// that does not say (one written by hand): the default lease's heartbeat.
const heartbeatIntervalAssumed = 10.0

// deadAfterBeats is how many heartbeat intervals may pass before a worker
// process counts as dead (or frozen).
const deadAfterBeats = 3

// Liveness reports whether the process still heartbeats — its last
// heartbeat is at most three intervals old — and that heartbeat's age in
// seconds.
func (w *WorkerInfo) Liveness(now time.Time) (alive bool, age float64) {
	age = math.Max(ToUnix(now)-w.LastHeartbeat, 0)
	interval := w.HeartbeatInterval
	if interval <= 0 {
		interval = heartbeatIntervalAssumed
	}
	return age <= deadAfterBeats*interval, age
}
