package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/cli"
	"github.com/couchq/couchq/internal/protocol"
)

const purgeUsage = `Usage: couchq purge --status STATUS --older-than AGE [--type TYPE] [flags]

Deletes finished jobs in bulk: those in STATUS (done, failed or cancelled)
that finished more than AGE ago. Jobs in other statuses, and newer ones,
are left alone; so is a job that changes while the purge runs.

	--status STATUS     done, failed or cancelled (required)
	--older-than AGE    how long ago they finished: 90m, 24h, 7d, 0s for all (required)
	--type TYPE         only jobs of this type (default every type)

CouchDB keeps a tombstone (id and revision) for every deleted document, for
replication, and compaction does not remove them: a queue that churns
through millions of jobs grows its tombstones without end. Rotating to a
fresh database and dropping the old one removes them; see
docs/operating.md, "Compaction, purging and rotation".

With --json: {"deleted": N, "tombstones_added": N, "doc_del_count": M, ...}
(doc_del_count only when the server reports it).
`

func (m *Main) runPurge(ctx context.Context, log zerolog.Logger, args []string) error {
	fs := m.newFlagSet("purge", purgeUsage)
	conn := addConnFlags(fs)
	var status, olderThan, typ string
	fs.StringVar(&status, "status", "", "done, failed or cancelled")
	fs.StringVar(&olderThan, "older-than", "", "minimum age since the job finished")
	fs.StringVar(&typ, "type", "", "job type")
	rest, err := m.parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return cli.Usagef("unexpected argument %q (choose jobs with --status, --older-than and --type)", rest[0])
	}
	st := protocol.Status(status)
	switch {
	case status == "":
		return cli.Usagef("--status is required: done, failed or cancelled")
	case !st.Terminal():
		return cli.Usagef("invalid --status %q: only finished jobs are purged (done, failed or cancelled); cancel queued or running jobs first", status)
	case olderThan == "":
		return cli.Usagef("--older-than is required, e.g. 7d (0s purges every %s job)", status)
	}
	age, err := protocol.ParseAge(olderThan)
	if err != nil {
		return cli.Usagef("invalid --older-than %q: %v", olderThan, err)
	}
	q, log, closeQueue, err := m.connect(ctx, conn, log)
	if err != nil {
		return err
	}
	defer closeQueue()

	what := string(st)
	if typ != "" {
		what += " " + typ
	}
	bar := &purgeBar{w: m.Stderr}
	if m.stderrTTY {
		// The bar's scale is every job in that status: one cheap grouped
		// query, where an exact count of the old ones would read them all.
		// The bar may end short when newer jobs are left alone.
		if bar.total, err = countStatus(ctx, q, st, typ); err != nil {
			return cli.ServerError(conn.URL, err)
		}
		bar.on = bar.total > 0
	}
	cutoff := m.Now().Add(-age)
	deleted, err := q.Purge(ctx, protocol.PurgeOptions{Status: st, OlderThan: age, Worker: typ, Progress: bar.set})
	bar.done()
	if err != nil {
		return fmt.Errorf("purging %s jobs (%d deleted before this): %w", what, deleted, cli.ServerError(conn.URL, err))
	}
	delCount, known, err := q.Tombstones(ctx)
	if err != nil {
		log.Warn().Err(err).Msg("could not read the database's deleted-document count")
	}
	if conn.json {
		out := map[string]any{
			"deleted": deleted, "status": st, "type": typ, "older_than": olderThan,
			"finished_before": cutoff.UTC(), "tombstones_added": deleted,
		}
		if known {
			out["doc_del_count"] = delCount
		}
		return cli.WriteJSON(m.Stdout, out)
	}
	jobs := cli.Plural(deleted, "job", "jobs")
	fmt.Fprintf(m.Stdout, "deleted %d %s %s that finished before %s (older than %s)\n",
		deleted, what, jobs, cutoff.UTC().Format("2006-01-02 15:04:05Z"), olderThan)
	if deleted == 0 {
		return nil
	}
	tomb := fmt.Sprintf("left %d %s behind", deleted, cli.Plural(deleted, "tombstone", "tombstones"))
	if known {
		tomb += fmt.Sprintf("; database %s now holds %d deleted documents (doc_del_count)", conn.DB, delCount)
	}
	fmt.Fprintln(m.Stdout, tomb)
	_, err = fmt.Fprintf(m.Stdout, "hint: compact %s to reclaim their space (POST /%s/_compact); tombstones stay until the database is dropped, so rotating a busy queue to a fresh database beats purging it\n", conn.DB, conn.DB)
	return err
}

// countStatus counts the jobs in status st (of type typ, or of every type).
func countStatus(ctx context.Context, q *protocol.Client, st protocol.Status, typ string) (int, error) {
	counts, err := q.Counts(ctx)
	if err != nil {
		return 0, err
	}
	n := int64(0)
	for t, byStatus := range counts {
		if typ == "" || t == typ {
			n += byStatus[st]
		}
	}
	return int(n), nil
}

// purgeBar draws the purge's progress on a terminal's stderr.
type purgeBar struct {
	w     io.Writer
	on    bool
	total int
}

func (b *purgeBar) set(deleted int) {
	if !b.on {
		return
	}
	const width = 30
	filled := min(width*deleted/b.total, width)
	fmt.Fprintf(b.w, "\r[%s%s] %d deleted (of %d in that status)", strings.Repeat("=", filled),
		strings.Repeat(" ", width-filled), deleted, b.total)
}

// done erases the bar.
func (b *purgeBar) done() {
	if b.on {
		fmt.Fprint(b.w, "\r\033[K")
	}
}
