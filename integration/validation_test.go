package integration

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/protocol"
	"github.com/couchq/couchq/worker"
)

// validationTarget is a database and the ways in of TestValidationSwitch:
// on a cluster each goes through a different node.
type validationTarget struct {
	ctx      context.Context
	admin    *kivik.Client     // installs the design document
	db       string            // the database
	byHand   *couchtest.Server // where an application writes raw documents
	producer *protocol.Client  // enqueues
	worker   *protocol.Client  // runs the worker
	lease    time.Duration
	log      zerolog.Logger
}

// With validation switched off at init, CouchDB stores a malformed job (it
// refused it before) and a worker quarantines it while good jobs run; an
// install that keeps the choice (every worker's) leaves it off; switching
// it on again brings the refusals back.
func TestValidationSwitch(t *testing.T) {
	onValidationTargets(t, testValidationSwitch)
}

// onValidationTargets runs test on a single node and on the cluster, where
// an application writes through another node than the admin installs
// through, and the producer and the worker use different nodes again.
func onValidationTargets(t *testing.T, test func(*testing.T, validationTarget)) {
	t.Run("single", func(t *testing.T) {
		tb := setupWithout(t, protocol.Config{})
		test(t, validationTarget{ctx: tb.ctx, admin: tb.kivik, db: tb.db.Name(), byHand: server,
			producer: tb.client, worker: tb.client, lease: tb.lease, log: tb.log})
	})
	t.Run("cluster", func(t *testing.T) {
		cb := setupCluster(t, protocol.Config{})
		test(t, validationTarget{ctx: cb.ctx, admin: cb.cl.Node(1).Client(t), db: cb.dbName, byHand: cb.cl.Node(2),
			producer: cb.clients[0], worker: cb.clients[2], lease: 15 * time.Second, log: cb.log})
	})
}

func testValidationSwitch(t *testing.T, vt validationTarget) {
	initWith := func(v designdocs.Validation) designdocs.Outcome {
		t.Helper()
		o, err := protocol.InitWith(vt.ctx, vt.admin, vt.db, protocol.InitOptions{Validation: v}, vt.log)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	stored := func() *designdocs.Doc {
		t.Helper()
		d, err := designdocs.Stored(vt.ctx, vt.admin.DB(vt.db))
		if err != nil || d == nil {
			t.Fatalf("stored design document: %v %v", d, err)
		}
		return d
	}
	// putByHand writes a malformed job under a new id until the server
	// answers want: on a cluster the design document reaches every copy
	// of every shard a moment after it was written.
	n := 0
	putByHand := func(want int) (id, body string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			n++
			id = "bad-" + string(rune('a'+n))
			code, body := vt.rawPut(t, id, `{"type":"WorkItem","worker":"mail","date":"tomorrow"}`)
			if code == want || want == http.StatusCreated && code == http.StatusAccepted {
				return id, body
			}
			if time.Now().After(deadline) {
				t.Fatalf("malformed job by hand: %d %s, want %d", code, body, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	if o := initWith(designdocs.ValidationOff); o != designdocs.Upgraded && o != designdocs.Created {
		t.Fatalf("init --validation off: %s", o)
	}
	if d := stored(); d.ValidateDocUpdate != "" || d.ValidationOf() != designdocs.ValidationOff || d.Couchq.Validation != designdocs.ValidationOff {
		t.Fatalf("design document still validates: %+v", d.Couchq)
	}
	bad, _ := putByHand(http.StatusCreated)
	// A worker starting (or couchq init without the flag) keeps it off.
	if o := initWith(designdocs.ValidationKept); o != designdocs.Unchanged {
		t.Fatalf("install keeping the choice: %s, want unchanged", o)
	}
	if stored().ValidationOf() != designdocs.ValidationOff {
		t.Fatal("an install keeping the choice turned validation back on")
	}

	ran := make(chan string, 4)
	w, err := worker.New((*couchq.Client)(vt.worker), worker.Config{
		Handlers: map[string]worker.Handler{"mail": worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
			ran <- job.ID
			return nil
		})},
		LeaseDuration: vt.lease, SweepInterval: 200 * time.Millisecond, FeedTimeout: 2 * time.Second,
		FallbackPoll: time.Minute, ShutdownTimeout: 5 * time.Second, Logger: vt.log,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(vt.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	good, err := vt.producer.Enqueue(vt.ctx, protocol.NewJob{Worker: "mail"})
	if err != nil {
		t.Fatal(err)
	}
	waitStored(t, vt.producer, good.ID, func(it *protocol.WorkItem) bool { return it.Status == protocol.StatusDone })
	q := waitStored(t, vt.producer, bad, func(it *protocol.WorkItem) bool { return it.Status == protocol.StatusFailed })
	if !strings.Contains(q.LastError, "date") {
		t.Errorf("quarantined job's error %q does not name the bad field", q.LastError)
	}
	if got := <-ran; got != good.ID || len(ran) != 0 {
		t.Errorf("handler ran for %s (and %d more), want only %s", got, len(ran), good.ID)
	}

	if o := initWith(designdocs.ValidationOn); o != designdocs.Upgraded {
		t.Fatalf("init --validation on: %s, want upgraded", o)
	}
	if d := stored(); d.ValidationOf() == designdocs.ValidationOff || d.ValidateDocUpdate == "" {
		t.Fatalf("validation not back on: %+v", d.Couchq)
	}
	if _, body := putByHand(http.StatusForbidden); !strings.Contains(body, "date must be a number") {
		t.Fatalf("malformed job with validation on: %s", body)
	}
}

// rawPut writes a document as an application would, with no couchq code.
func (vt validationTarget) rawPut(t *testing.T, id, body string) (int, string) {
	t.Helper()
	return rawRequest(vt.ctx, t, vt.byHand, vt.db, http.MethodPut, "/"+id, body)
}

// A database installed by an older couchq is upgraded to the three
// documents: schema 1 had one design document with every view, schema 2
// the claim document with the sweep views beside the ops document. After
// the upgrade the claim document holds the due views only, the sweep
// document the sweeper's and agents' views, the ops document (indexed only
// when read) the rest, and each is read there: counts through the ops
// views, a claim that ran out through the sweep views.
func TestUpgradeSplitsTheDesignDocument(t *testing.T) {
	for _, schema := range []int{1, 2} {
		t.Run(fmt.Sprintf("schema %d", schema), func(t *testing.T) {
			tb := setupWithout(t, protocol.Config{})
			docs, err := designdocs.Defaults()
			if err != nil {
				t.Fatal(err)
			}
			old := *docs[0]
			old.Views = maps.Clone(old.Views)
			maps.Copy(old.Views, docs[1].Views) // the sweep views
			old.Couchq.Schema = schema
			if schema == 1 {
				maps.Copy(old.Views, docs[2].Views) // the ops views
				old.Couchq.Validation = ""
			} else if _, err := tb.db.Put(tb.ctx, designdocs.OpsID, docs[2]); err != nil {
				t.Fatal(err)
			}
			if _, err := tb.db.Put(tb.ctx, designdocs.ID, old); err != nil {
				t.Fatal(err)
			}
			if _, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "mail"}); err != nil {
				t.Fatal(err)
			}
			held, err := tb.client.Enqueue(tb.ctx, protocol.NewJob{Worker: "held"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tb.client.Claim(tb.ctx, held, "gone/1", time.Millisecond); err != nil {
				t.Fatal(err)
			}
			if o, err := protocol.Init(tb.ctx, tb.kivik, tb.db.Name(), tb.log); err != nil || o != designdocs.Upgraded {
				t.Fatalf("init over schema %d: %v %v", schema, o, err)
			}
			claim, err := designdocs.Stored(tb.ctx, tb.db)
			if err != nil {
				t.Fatal(err)
			}
			if len(claim.Views) != len(docs[0].Views) || claim.Couchq.Schema != designdocs.SchemaVersion || claim.ValidationOf() == designdocs.ValidationOff {
				t.Errorf("claim document after the upgrade: %d views, meta %+v", len(claim.Views), claim.Couchq)
			}
			for id, view := range map[string]string{designdocs.OpsID: "status", designdocs.SweepID: "leases"} {
				var stored map[string]any
				if err := tb.db.Get(tb.ctx, id).ScanDoc(&stored); err != nil {
					t.Fatal(err)
				}
				if stored["views"].(map[string]any)[view] == nil {
					t.Errorf("%s has no view %s: %v", id, view, stored["views"])
				}
				if (stored["autoupdate"] == false) != (id == designdocs.OpsID) {
					t.Errorf("%s: autoupdate %v", id, stored["autoupdate"])
				}
			}
			counts, err := tb.client.Counts(tb.ctx)
			if err != nil || counts["mail"][protocol.StatusQueued] != 1 {
				t.Errorf("counts through the ops document: %v %v", counts, err)
			}
			waitFor(t, 10*time.Second, "the sweep views find the claim whose lease ran out", func() bool {
				res, err := tb.client.Sweep(tb.ctx, "sweeper", 10)
				if err != nil {
					t.Fatalf("sweep through the sweep document: %v", err)
				}
				return res.Requeued+res.Failed > 0
			})
		})
	}
}
