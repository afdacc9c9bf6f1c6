package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/protocol"
)

// Section 8 starts each index with BacklogSmall due jobs and times Claims
// claim rounds against it (the sizes of section 5's small backlog).
const (
	claimIndexLimit  = 10 // rows a claim round reads, as a worker's due query
	claimIndexWorker = "claimindex"
)

// claimIndex is one way of finding due jobs that section 8 compares.
type claimIndex struct {
	name string
	// partitioned puts the jobs in a partitioned database, one partition
	// per job type ("worker:id").
	partitioned bool
	// install creates the index in db; due returns the ids and revisions
	// of up to claimIndexLimit due jobs, oldest first.
	install func(ctx context.Context, w *docWriter) error
	due     func(ctx context.Context, w *docWriter, now float64) ([]dueJob, error)
}

type dueJob struct{ ID, Rev string }

// runClaimIndex measures, for each way of indexing due jobs, what the
// server pays to build the index over a backlog and then, round after
// round, to bring it up to date and answer a worker's due query after a
// claim: couchq's claim design document (validation off, so that only the
// index is measured), its due view alone in a design document, a Mango
// (JSON) index, which CouchDB builds in Erlang without the JavaScript
// server, and the due view in a partitioned database, queried in the job
// type's partition. A server that lacks one says so in its row.
func (b *run) runClaimIndex(ctx context.Context, s *Section) error {
	docs, err := designdocs.Defaults()
	if err != nil {
		return err
	}
	var dueMap string
	for _, d := range docs {
		if v, ok := d.Views["due"]; ok {
			dueMap = v.Map
		}
	}
	if dueMap == "" {
		return fmt.Errorf("no design document has the due view")
	}
	lang := b.t.designLanguage()
	viewDesign := func(partitioned bool) map[string]any {
		doc := map[string]any{
			"_id":      "_design/claimindex",
			"language": lang, // the engine couchq's own documents get
			"views":    map[string]any{"due": map[string]string{"map": dueMap}},
		}
		if partitioned {
			doc["options"] = map[string]bool{"partitioned": true}
		}
		return doc
	}
	putDesign := func(partitioned bool) func(context.Context, *docWriter) error {
		return func(ctx context.Context, w *docWriter) error {
			body, err := json.Marshal(viewDesign(partitioned))
			if err != nil {
				return err
			}
			return w.do(ctx, http.MethodPut, w.docURL("_design/claimindex"), body, nil)
		}
	}
	claim := docs[0]
	kinds := []claimIndex{
		{name: fmt.Sprintf("couchq's claim design document (%s; validation off)", strings.Join(slices.Sorted(maps.Keys(claim.Views)), ", ")),
			due: func(ctx context.Context, w *docWriter, now float64) ([]dueJob, error) {
				// What workers read: the due_priority view, here the default
				// priority's range (the backlog has no other).
				return w.viewDue(ctx, "/_design/"+designdocs.Name+"/_view/due_priority", now, protocol.PriorityDefault)
			}},
		{name: "the due view alone (JavaScript)", install: putDesign(false),
			due: func(ctx context.Context, w *docWriter, now float64) ([]dueJob, error) {
				return w.viewDue(ctx, "/_design/claimindex/_view/due", now, 0)
			}},
		{name: "a Mango index on [worker, date]", install: installMangoDue, due: mangoDue},
		{name: "the due view in a partitioned database (partition per job type)", partitioned: true, install: putDesign(true),
			due: func(ctx context.Context, w *docWriter, now float64) ([]dueJob, error) {
				return w.viewDue(ctx, "/_partition/"+claimIndexWorker+"/_design/claimindex/_view/due", now, 0)
			}},
	}
	for _, k := range kinds {
		if err := b.measureClaimIndex(ctx, s, k); err != nil {
			var skip errSkipped
			if errors.As(err, &skip) {
				s.add(textRow(k.name, "not measured (see the notes)"))
				b.notes = append(b.notes, fmt.Sprintf("Section 8 did not measure %s: %s", k.name, skip.why))
				continue
			}
			return fmt.Errorf("%s: %w", k.name, err)
		}
	}
	return nil
}

// errSkipped is a kind of index the server cannot run.
type errSkipped struct{ why string }

func (e errSkipped) Error() string { return e.why }

func (b *run) measureClaimIndex(ctx context.Context, s *Section, k claimIndex) error {
	var db string
	var err error
	switch {
	case k.install == nil:
		db, err = b.newDBValidation(ctx, s, "claimindex", designdocs.ValidationOff)
	case k.partitioned:
		db, err = b.newPartitionedDB(ctx, s)
	default:
		db, err = b.newBareDB(ctx, s, "claimindex")
	}
	if err != nil {
		return err
	}
	w := &docWriter{t: b.t, db: db}
	if k.install != nil {
		if err := k.install(ctx, w); err != nil {
			if st := httpStatusOf(err); st >= 400 && st < 500 {
				return errSkipped{why: "creating the index: " + answerOf(err)}
			}
			return fmt.Errorf("installing the index: %w", err)
		}
	}
	jobs, rounds := b.cfg.BacklogSmall, min(b.cfg.Claims, b.cfg.BacklogSmall)
	now := float64(time.Now().Unix())
	if err := w.dueBacklog(ctx, jobs, now); err != nil {
		return err
	}
	cpu0, start := b.t.cpu(), time.Now()
	if _, err := k.due(ctx, w, now); err != nil {
		if st := httpStatusOf(err); st >= 400 && st < 500 && k.install != nil {
			return errSkipped{why: "querying it: " + answerOf(err)}
		}
		return fmt.Errorf("first due query (index build): %w", err)
	}
	build, cpu1 := time.Since(start), b.t.cpu()
	s.add(durRow(k.name+": index build over "+groupThousands(fmt.Sprint(jobs))+" due jobs, per job", build/time.Duration(jobs)))
	if cpu0.serverOK && cpu1.serverOK {
		s.add(durRow("  server CPU per job indexed", (cpu1.server-cpu0.server)/time.Duration(jobs)))
	}
	// On a cluster a row can still list a job just claimed (the copy that
	// answered for its range had not received the claim yet): the claim
	// gets a 409 and the round tries the next row, as a worker would.
	claimed := make(map[string]bool, rounds)
	conflicts := 0
	cpu0, start = b.t.cpu(), time.Now()
	for i := range rounds {
		due, err := k.due(ctx, w, now)
		if err != nil {
			return fmt.Errorf("claim round %d: %w", i, err)
		}
		won := false
		for _, job := range due {
			if claimed[job.ID] {
				continue
			}
			err := w.claimDue(ctx, job, now)
			if httpStatusOf(err) == http.StatusConflict {
				conflicts++
				continue
			}
			if err != nil {
				return fmt.Errorf("claim round %d: %w", i, err)
			}
			claimed[job.ID], won = true, true
			break
		}
		if !won && len(due) == 0 {
			return fmt.Errorf("claim round %d: the index lists no due job, %d left", i, jobs-len(claimed))
		}
	}
	took, cpu1 := time.Since(start), b.t.cpu()
	s.add(durRow(fmt.Sprintf("  claim round (due query, %d rows, then one claim), time each", claimIndexLimit), took/time.Duration(rounds)))
	if conflicts > 0 {
		s.add(numRow("  409s per claim round (rows listing a job already claimed)", float64(conflicts)/float64(rounds), "", 2))
	}
	if cpu0.serverOK && cpu1.serverOK {
		s.add(durRow("  server CPU per claim round", (cpu1.server-cpu0.server)/time.Duration(rounds)))
		if len(cpu1.js) > 0 {
			s.add(durRow("    of which couchjs", cpu1.jsSince(cpu0)/time.Duration(rounds)))
		}
	}
	return nil
}

// newPartitionedDB creates a partitioned database for section 8, or says
// why the server has none.
func (b *run) newPartitionedDB(ctx context.Context, s *Section) (string, error) {
	name := "couchq_bench_claimindexp_" + randomHex(4)
	w := &docWriter{t: b.t, db: name}
	err := w.do(ctx, http.MethodPut, w.t.base+"/"+url.PathEscape(name)+"?partitioned=true", nil, nil)
	if err != nil {
		if st := httpStatusOf(err); st >= 400 && st < 500 {
			return "", errSkipped{why: "no partitioned databases: " + answerOf(err)}
		}
		return "", fmt.Errorf("creating partitioned database %s: %w", name, err)
	}
	s.Databases = append(s.Databases, name)
	// PouchDB Server creates the database and ignores the flag.
	var info struct {
		Props struct {
			Partitioned bool `json:"partitioned"`
		} `json:"props"`
	}
	if err := w.do(ctx, http.MethodGet, w.t.base+"/"+url.PathEscape(name), nil, &info); err != nil {
		return "", err
	}
	if !info.Props.Partitioned {
		return "", errSkipped{why: "the server created the database unpartitioned"}
	}
	return name, nil
}

// dueBacklog writes n queued jobs of claimIndexWorker, due one
// millisecond apart before now, in batches of bulkBatch.
func (w *docWriter) dueBacklog(ctx context.Context, n int, now float64) error {
	u := w.t.base + "/" + url.PathEscape(w.db) + "/_bulk_docs"
	for done := 0; done < n; done += bulkBatch {
		docs := make([]map[string]any, 0, bulkBatch)
		for i := done; i < min(n, done+bulkBatch); i++ {
			docs = append(docs, map[string]any{
				"_id":  fmt.Sprintf("%s:%08d", claimIndexWorker, i),
				"type": "WorkItem", "worker": claimIndexWorker, "date": now - float64(n-i)/1000,
				"status": "queued", "attempts": 0, "created_at": now,
			})
		}
		body, err := json.Marshal(map[string]any{"docs": docs})
		if err != nil {
			return err
		}
		var res []struct {
			Error, Reason string
		}
		if err := w.do(ctx, http.MethodPost, u, body, &res); err != nil {
			return fmt.Errorf("writing the backlog: %w", err)
		}
		for _, r := range res {
			if r.Error != "" {
				return fmt.Errorf("writing the backlog: %s: %s", r.Error, r.Reason)
			}
		}
	}
	return nil
}

// viewDue reads due jobs from the due view (path under the database), or
// with priority > 0 that priority's range of the due_priority view, as a
// worker does: include_docs, oldest first.
func (w *docWriter) viewDue(ctx context.Context, path string, now float64, priority int) ([]dueJob, error) {
	start, end := fmt.Sprintf(`[%q,0]`, claimIndexWorker), fmt.Sprintf(`[%q,%f]`, claimIndexWorker, now)
	if priority > 0 {
		start, end = fmt.Sprintf(`[%q,%d,0]`, claimIndexWorker, priority), fmt.Sprintf(`[%q,%d,%f]`, claimIndexWorker, priority, now)
	}
	q := url.Values{
		"startkey":     {start},
		"endkey":       {end},
		"limit":        {fmt.Sprint(claimIndexLimit)},
		"include_docs": {"true"},
		"reduce":       {"false"},
	}
	var res viewRowsWithRevs
	if err := w.do(ctx, http.MethodGet, w.t.base+"/"+url.PathEscape(w.db)+path+"?"+q.Encode(), nil, &res); err != nil {
		return nil, err
	}
	out := make([]dueJob, len(res.Rows))
	for i, r := range res.Rows {
		out[i] = dueJob{ID: r.ID, Rev: r.Doc.Rev}
	}
	return out, nil
}

// mangoDueSelector is what the due view's map function keeps, as far as a
// selector can say it (the view also lists jobs whose date is not a
// number, at 0, which a JSON index on date cannot).
func mangoDueSelector() map[string]any {
	// A field a document lacks matches no operator but $exists: false, and
	// a job without "claimed" or "status" is an unclaimed queued one.
	missingOr := func(field string, cond any) map[string]any {
		return map[string]any{"$or": []map[string]any{
			{field: map[string]bool{"$exists": false}}, {field: cond},
		}}
	}
	return map[string]any{
		"type": "WorkItem",
		"$and": []map[string]any{
			missingOr("claimed", map[string]any{"$ne": true}),
			missingOr("status", map[string]any{"$nin": []string{"running", "done", "failed", "cancelled"}}),
		},
	}
}

// installMangoDue creates a partial JSON index on [worker, date] over the
// jobs the due view lists.
func installMangoDue(ctx context.Context, w *docWriter) error {
	body, err := json.Marshal(map[string]any{
		"index": map[string]any{"fields": []string{"worker", "date"}, "partial_filter_selector": mangoDueSelector()},
		"ddoc":  "claimindex", "name": "due", "type": "json",
	})
	if err != nil {
		return err
	}
	if err := w.do(ctx, http.MethodPost, w.t.base+"/"+url.PathEscape(w.db)+"/_index", body, nil); err != nil {
		return err
	}
	return waitForMangoDue(ctx, w)
}

// mangoIndexWait bounds waitForMangoDue: a design document not listed by
// then is a fault, not replication between copies.
const mangoIndexWait = 30 * time.Second

// waitForMangoDue returns once a query can use the index installMangoDue
// created. On a cluster the index's design document is written to a
// majority of its copies, and the node answering the next _find may
// list the design documents from a copy it has not reached yet: that
// query is refused with no_usable_index for a moment.
func waitForMangoDue(ctx context.Context, w *docWriter) error {
	deadline := time.Now().Add(mangoIndexWait)
	for {
		_, err := mangoDueOf(ctx, w, claimIndexWorker, 0, 1)
		if err == nil || httpStatusOf(err) != http.StatusBadRequest ||
			!strings.Contains(answerOf(err), "no_usable_index") || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// mangoDue reads due jobs through the Mango index.
func mangoDue(ctx context.Context, w *docWriter, now float64) ([]dueJob, error) {
	return mangoDueOf(ctx, w, claimIndexWorker, now, claimIndexLimit)
}

// mangoDueOf reads up to limit due jobs of type worker, oldest first,
// through the Mango index installMangoDue creates.
func mangoDueOf(ctx context.Context, w *docWriter, worker string, now float64, limit int) ([]dueJob, error) {
	sel := mangoDueSelector()
	sel["worker"] = worker
	sel["date"] = map[string]any{"$lte": now}
	body, err := json.Marshal(map[string]any{
		"selector":  sel,
		"sort":      []map[string]string{{"worker": "asc"}, {"date": "asc"}},
		"limit":     limit,
		"use_index": []string{"claimindex", "due"},
		"fields":    []string{"_id", "_rev"},
	})
	if err != nil {
		return nil, err
	}
	var res struct {
		Docs []struct {
			ID  string `json:"_id"`
			Rev string `json:"_rev"`
		} `json:"docs"`
		Warning string `json:"warning"`
	}
	if err := w.do(ctx, http.MethodPost, w.t.base+"/"+url.PathEscape(w.db)+"/_find", body, &res); err != nil {
		return nil, err
	}
	if res.Warning != "" && len(res.Docs) == 0 {
		return nil, fmt.Errorf("_find: %s", res.Warning)
	}
	out := make([]dueJob, len(res.Docs))
	for i, d := range res.Docs {
		out[i] = dueJob{ID: d.ID, Rev: d.Rev}
	}
	return out, nil
}

// claimDue writes job as claimed over the revision the query returned.
func (w *docWriter) claimDue(ctx context.Context, job dueJob, now float64) error {
	body, err := json.Marshal(map[string]any{
		"_id": job.ID, "_rev": job.Rev,
		"type": "WorkItem", "worker": claimIndexWorker, "date": now,
		"status": "running", "claimed": true, "claimed_by": "bench/1/w1", "claimed_at": now,
		"lease_until": now + 30, "attempts": 1, "created_at": now, "started_at": now,
	})
	if err != nil {
		return err
	}
	if err := w.do(ctx, http.MethodPut, w.docURL(job.ID), body, nil); err != nil {
		return fmt.Errorf("claiming %s: %w", job.ID, err)
	}
	return nil
}

// viewRowsWithRevs is a view's answer read with include_docs, down to what
// a claim needs: each row's id and its document's revision.
type viewRowsWithRevs struct {
	Rows []struct {
		ID  string `json:"id"`
		Doc struct {
			Rev string `json:"_rev"`
		} `json:"doc"`
	} `json:"rows"`
}
