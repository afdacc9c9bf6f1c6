package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/designdocs"
	"github.com/couchq/couchq/internal/couchtest"
	"github.com/couchq/couchq/internal/protocol"
)

// rolesBundle is a queue database with couchq's roles set: a producer (by
// name), a worker (by role) and an outsider, each with a Client of their own.
type rolesBundle struct {
	ctx      context.Context
	srv      *couchtest.Server
	dbName   string
	log      zerolog.Logger
	admin    *protocol.Client
	producer *protocol.Client
	worker   *protocol.Client
	// reader is a member with no couchq role, added by hand.
	reader   *protocol.Client
	users    map[string]string // role in the test -> "name:password"
	adminSrv *protocol.Server
}

func setupRoles(t *testing.T, srv *couchtest.Server) *rolesBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	rb := &rolesBundle{ctx: ctx, srv: srv, dbName: srv.UniqueDBName(t), users: map[string]string{},
		log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel).With().Timestamp().Logger()}
	if _, err := protocol.Init(ctx, srv.Client(t), rb.dbName, rb.log); err != nil {
		t.Fatal(err)
	}
	sfx := fmt.Sprintf("%08x", rand.Uint32())
	workerRole := "couchq-workers-" + sfx
	for name, roles := range map[string][]string{"producer-" + sfx: nil, "worker-" + sfx: {workerRole}, "outsider-" + sfx: nil, "reader-" + sfx: nil} {
		password := fmt.Sprintf("pw-%016x", rand.Uint64())
		if err := srv.AddUser(ctx, name, password, roles...); err != nil {
			if errors.Is(err, couchtest.ErrNoUsers) {
				couchtest.Skip(t, fmt.Sprintf("%s does not authenticate CouchDB users, so it cannot enforce _security or couchq's roles (%v)", srv.Caps().Vendor, err))
			}
			t.Fatal(err)
		}
		rb.users[strings.TrimSuffix(name, "-"+sfx)] = name + ":" + password
	}
	user, password := srv.Credentials()
	rb.adminSrv = rb.connect(t, user+":"+password)
	// Members added by hand stay when couchq's roles are set.
	if err := rb.adminSrv.Client.DB(rb.dbName).SetSecurity(ctx, &kivik.Security{Members: kivik.Members{Names: []string{"reader-" + sfx}}}); err != nil {
		t.Fatal(err)
	}
	sec, err := rb.adminSrv.SetRoles(ctx, rb.dbName, protocol.Roles{
		Workers:   protocol.Access{Roles: []string{workerRole}},
		Producers: protocol.Access{Names: []string{"producer-" + sfx}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(sec.Members.Names, "producer-"+sfx) || !slices.Contains(sec.Members.Roles, workerRole) {
		t.Fatalf("members after SetRoles: %+v", sec.Members)
	}
	rb.admin = rb.open(t, user+":"+password, true)
	rb.producer = rb.open(t, rb.as("producer"), true)
	// On a cluster each copy takes the _security just written on its own:
	// the reader, named first, may be let in a moment later.
	rb.reader = rb.openWhenLetIn(t, rb.as("reader"))
	// The worker writes as workers do, to a majority of the copies: a
	// holder's write answered 202 (a slow copy) is read back, and that
	// needs a server admin on a cluster.
	rb.worker = rb.open(t, rb.as("worker"), false)
	return rb
}

// openWhenLetIn is open (reading its writes) for a user _security names,
// waiting up to 30 s (a loaded machine) for every copy of a cluster's database to let them in.
func (rb *rolesBundle) openWhenLetIn(t *testing.T, userPassword string) *protocol.Client {
	t.Helper()
	user, _, _ := strings.Cut(userPassword, ":")
	srv := rb.connect(t, userPassword)
	for deadline := time.Now().Add(30 * time.Second); ; {
		c, err := srv.Open(rb.ctx, rb.dbName, protocol.Config{Logger: rb.log, Actor: user, ReadYourWrites: true})
		if err == nil {
			return c
		}
		if !deniedAccess(err) || rb.srv.Caps().ClusterN <= 1 || time.Now().After(deadline) {
			t.Fatalf("opening %s as %s: %v", rb.dbName, user, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cred is a test user's name and password.
func (rb *rolesBundle) cred(who string) (string, string) {
	name, password, _ := strings.Cut(rb.users[who], ":")
	return name, password
}

// as is a test user's "name:password".
func (rb *rolesBundle) as(who string) string { return rb.users[who] }

// connect connects as user ("name:password").
func (rb *rolesBundle) connect(t *testing.T, userPassword string) *protocol.Server {
	t.Helper()
	user, password, _ := strings.Cut(userPassword, ":")
	srv, err := protocol.Connect(rb.ctx, rb.srv.URL(), user, password)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Client.Close() })
	return srv
}

// open connects as user ("name:password") and opens the database. With
// readYourWrites every write waits for all copies, so that on a cluster
// each step reads what the one before wrote.
func (rb *rolesBundle) open(t *testing.T, userPassword string, readYourWrites bool) *protocol.Client {
	t.Helper()
	user, _, _ := strings.Cut(userPassword, ":")
	c, err := rb.connect(t, userPassword).Open(rb.ctx, rb.dbName, protocol.Config{Logger: rb.log, Actor: user, ReadYourWrites: readYourWrites})
	if err != nil {
		t.Fatalf("opening %s as %s: %v", rb.dbName, user, err)
	}
	return c
}

// refused checks that err is CouchDB's 403 with a message containing want.
// On a cluster a refused write may come back 409 instead: a copy that has
// not yet stored the revision written over answers conflict while the
// others answer forbidden, and the coordinator reports the conflict. Either
// way nothing is stored, which the worker's own later writes on the same
// revision prove.
func (rb *rolesBundle) refused(t *testing.T, what string, err error, want string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: allowed, want refused", what)
		return
	}
	status := kivik.HTTPStatus(err)
	if rb.srv.Caps().ClusterN > 1 && status == http.StatusConflict {
		t.Logf("%s: refused with 409 (copies of the job still differ): %v", what, err)
		return
	}
	if status != http.StatusForbidden || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: %v (HTTP %d), want 403 mentioning %q", what, err, status, want)
	}
}

func TestRolesEnforced(t *testing.T) {
	t.Run("single", func(t *testing.T) { testRolesEnforced(t, server) })
	t.Run("cluster", func(t *testing.T) { testRolesEnforced(t, server.Cluster(t).Server) })
}

func testRolesEnforced(t *testing.T, srv *couchtest.Server) {
	rb := setupRoles(t, srv)
	ctx := rb.ctx
	const producerOnly = "is a couchq producer"

	// A producer enqueues, and may edit a job nobody holds.
	job, err := rb.producer.Enqueue(ctx, protocol.NewJob{Worker: "mail", Payload: map[string]any{"to": "a@example.com"}})
	if err != nil {
		t.Fatalf("producer enqueue: %v", err)
	}
	edited := rawDoc(t, rb.producer, job.ID)
	edited["payload"] = map[string]any{"to": "b@example.com"}
	if _, err := rb.producer.DB().Put(ctx, job.ID, edited); err != nil {
		t.Fatalf("producer editing a queued job nobody holds: %v", err)
	}
	if job, err = rb.producer.Get(ctx, job.ID); err != nil {
		t.Fatal(err)
	}

	// ...but not claim it.
	_, err = rb.producer.Claim(ctx, job, "producer", time.Minute)
	rb.refused(t, "producer claiming", err, producerOnly)

	// A worker claims it; the producer may not finish, fail, cancel,
	// extend, edit or delete the claim.
	held, err := rb.worker.Claim(ctx, job, "worker", time.Minute)
	if err != nil {
		t.Fatalf("worker claiming: %v", err)
	}
	rb.refused(t, "producer completing", rb.producer.Complete(ctx, held, nil), producerOnly)
	rb.refused(t, "producer failing", rb.producer.Fail(ctx, held, "no", protocol.FailOptions{Final: true}), producerOnly)
	rb.refused(t, "producer cancelling", rb.producer.Cancel(ctx, held, "no"), producerOnly)
	claim := rawDoc(t, rb.producer, held.ID)
	claim["lease_until"] = claim["lease_until"].(float64) + 3600
	_, err = rb.producer.DB().Put(ctx, held.ID, claim)
	rb.refused(t, "producer extending the lease", err, producerOnly)
	claim = rawDoc(t, rb.producer, held.ID)
	delete(claim, "claimed_by")
	claim["claimed"] = false
	_, err = rb.producer.DB().Put(ctx, held.ID, claim)
	rb.refused(t, "producer taking the claim away", err, producerOnly)
	_, err = rb.producer.DB().Delete(ctx, held.ID, held.Rev)
	rb.refused(t, "producer deleting a job", err, producerOnly)
	// ...nor destroy it by writing a document of no couchq type over it.
	_, err = rb.producer.DB().Put(ctx, held.ID, map[string]any{"_rev": held.Rev, "note": "gone"})
	rb.refused(t, "producer writing a plain document over a running job", err, producerOnly)
	rb.refused(t, "producer pausing a type", rb.producer.Pause(ctx, "mail", "producer", ""), producerOnly)
	// ...nor by replicating a revision over it (a replication, or
	// new_edits=false), which CouchDB judges against the stored revision
	// it names as its ancestor, or none: of a later generation, it would
	// stand over the claim, and the job would run again.
	revIDs := rawDocRevs(t, rb.worker, held.ID)["_revisions"].(map[string]any)["ids"].([]any)
	firstRev := revIDs[len(revIDs)-1].(string) // the job's first revision, the enqueue's
	path := []any{"ffff"}
	for g := 99; g > 1; g-- {
		path = append(path, fmt.Sprintf("%04x", g))
	}
	path = append(path, firstRev)
	for _, who := range []struct {
		name string
		c    *protocol.Client
	}{{"producer", rb.producer}, {"reader", rb.reader}} {
		queued := map[string]any{"_id": held.ID, "type": "WorkItem", "worker": "mail", "status": "queued"}
		queued["_rev"] = "100-eeee"
		rb.replicationRefused(t, who.name+" replicating a revision of its own over a running job", who.c, queued)
		queued["_rev"], queued["_revisions"] = "100-ffff", map[string]any{"start": 100, "ids": path}
		rb.replicationRefused(t, who.name+" replicating a revision that descends from the job's first over its claim", who.c, queued)
		rb.replicationRefused(t, who.name+" replicating a plain document over a running job", who.c, map[string]any{"_id": held.ID, "_rev": "100-dddd", "type": "Junk"})
	}
	// A producer's new job, made elsewhere (an application's PouchDB) and
	// replicated in, is let in: it stands over nothing.
	if res, err := rb.producer.DB().BulkDocs(ctx, []any{map[string]any{"_id": "job:from-an-app", "_rev": "1-abcd", "type": "WorkItem", "worker": "mail"}},
		kivik.Param("new_edits", false)); err != nil || len(res) > 0 && res[0].Error != nil {
		t.Errorf("producer replicating a new job in: %v %+v", err, res)
	}
	// couchq's own ids hold couchq's documents: a member may not take one
	// ahead of couchq with a document of its own, nor a producer with a job.
	const readerOnly = "is neither a couchq worker nor a producer"
	for _, w := range []struct {
		what string
		c    *protocol.Client
		id   string
		doc  map[string]any
		want string
	}{
		{"reader writing a plain document at a pause's id", rb.reader, protocol.ControlID("mail"), map[string]any{"type": "Junk"}, readerOnly},
		{"producer writing a plain document at a pause's id", rb.producer, protocol.ControlID("mail"), map[string]any{"type": "Junk"}, producerOnly},
		{"producer writing a job at a pause's id", rb.producer, protocol.ControlID("mail"), map[string]any{"type": "WorkItem", "worker": "mail"}, "ids starting so are couchq's TypeControl"},
		{"producer writing a job at a periodic tick's id", rb.producer, protocol.PeriodicJobID("report", time.Date(2026, 11, 29, 1, 0, 0, 0, time.UTC)), map[string]any{"type": "WorkItem", "worker": "report", "date": 32503680000}, "ids starting so are the ticks of periodic schedules"},
		{"reader writing a plain document at a unique key's id", rb.reader, "job:unique:mail:invoice-42", map[string]any{"type": "Junk"}, readerOnly},
		{"producer writing a plain document at a slot's id", rb.producer, protocol.SlotReservationID("invoices", "T-0001"), map[string]any{"type": "Junk"}, producerOnly},
	} {
		_, err := w.c.DB().Put(ctx, w.id, w.doc)
		rb.refused(t, w.what, err, w.want)
	}
	// Nor may a producer's new job tell of work in its history.
	_, err = rb.producer.DB().Put(ctx, "job:forged-history", map[string]any{"type": "WorkItem", "worker": "mail",
		"history": []any{map[string]any{"at": "2026-01-01T00:00:00Z", "event": "claimed", "by": "admin"}}})
	rb.refused(t, "producer writing a new job whose history tells of a claim", err, producerOnly)
	// Nor pass a job off as the child a running handler enqueued: the
	// parent would wait for it and take its result for its child's.
	_, err = rb.producer.DB().Put(ctx, "job:someones-parent:0", map[string]any{"type": "WorkItem", "worker": "mail", "child_of": "job:someones-parent"})
	rb.refused(t, "producer writing a job as another job's child", err, producerOnly)
	// Writing a finished job from scratch is refused too.
	_, err = rb.producer.DB().Put(ctx, "forged", map[string]any{"type": "WorkItem", "worker": "mail", "status": "done", "finished_at": 1})
	rb.refused(t, "producer creating a finished job", err, producerOnly)
	// Documents that are not couchq's are the application's business.
	if _, err := rb.producer.DB().Put(ctx, "app-note", map[string]any{"type": "Note"}); err != nil {
		t.Errorf("producer writing an application document: %v", err)
	}

	// The worker finishes it; pausing is a worker's (and an admin's) right.
	if err := rb.worker.Complete(ctx, held, nil); err != nil {
		t.Fatalf("worker completing: %v", err)
	}
	// A producer's purge deletes nothing, and says why rather than
	// reporting that it found nothing to delete.
	// (On a cluster the view may list the job done a moment later.)
	n, err := rb.producer.Purge(ctx, protocol.PurgeOptions{Status: protocol.StatusDone, Worker: "mail"})
	for deadline := time.Now().Add(10 * time.Second); n == 0 && err == nil && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		n, err = rb.producer.Purge(ctx, protocol.PurgeOptions{Status: protocol.StatusDone, Worker: "mail"})
	}
	switch {
	case rb.srv.Caps().Vendor == "pouchdb-server" && n == 1 && err == nil:
		t.Logf("%s lets a producer's deletions in _bulk_docs through (a purge deleted 1 done job; see security.md)", rb.srv.Caps().Vendor)
	case n != 0 || err == nil || !strings.Contains(err.Error(), producerOnly) || !strings.Contains(err.Error(), "1 refused"):
		t.Errorf("producer purging done jobs: deleted %d, %v; want none, an error saying 1 was refused and why", n, err)
	}
	if err := rb.worker.Pause(ctx, "mail", "worker", "maintenance"); err != nil {
		t.Errorf("worker pausing: %v", err)
	}
	ctl := rawDoc(t, rb.producer, protocol.ControlID("mail"))
	_, err = rb.producer.DB().Put(ctx, protocol.ControlID("mail"), map[string]any{"_rev": ctl["_rev"], "hello": 1})
	rb.refused(t, "producer writing a plain document over a pause", err, producerOnly)
	if err := rb.admin.Resume(ctx, "mail", "admin"); err != nil {
		t.Errorf("admin resuming: %v", err)
	}

	// A unique key whose job finished is enqueued again by a producer: the
	// old job is archived and its id reused.
	u := protocol.NewJob{Worker: "mail", Unique: protocol.UniqueOpts{Key: "digest"}}
	first, err := rb.producer.Enqueue(ctx, u)
	if err != nil {
		t.Fatalf("producer unique enqueue: %v", err)
	}
	if first, err = rb.worker.Claim(ctx, first, "worker", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := rb.worker.Complete(ctx, first, nil); err != nil {
		t.Fatal(err)
	}
	// The worker's write may have reached only some copies yet (202): on a
	// cluster a read of a majority can still answer the claimed revision
	// for a moment, and the key is then still held.
	var again *protocol.WorkItem
	deadline := time.Now().Add(30 * time.Second)
	for tries := 1; ; tries++ {
		again, err = rb.producer.Enqueue(ctx, u)
		if err == nil || !errors.Is(err, protocol.ErrDuplicate) || rb.srv.Caps().ClusterN <= 1 || time.Now().After(deadline) {
			if err != nil {
				t.Fatalf("producer enqueueing a finished unique key again: %v", err)
			}
			if tries > 1 {
				t.Logf("the key was free on try %d: every copy had the job done by then", tries)
			}
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if again.ID != first.ID || again.Status != protocol.StatusQueued {
		t.Errorf("re-enqueued unique job: %s %s, want %s queued", again.ID, again.Status, first.ID)
	}

	// An outsider cannot even open the database.
	outsider, password := rb.cred("outsider")
	osrv, err := protocol.Connect(ctx, srv.URL(), outsider, password)
	if err != nil {
		t.Fatal(err)
	}
	defer osrv.Client.Close()
	// CouchDB answers 403, PouchDB Server 401.
	if _, err := osrv.Open(ctx, rb.dbName, protocol.Config{Logger: rb.log}); !deniedAccess(err) {
		t.Errorf("outsider opening the database: %v (HTTP %d), want 403", err, kivik.HTTPStatus(err))
	}
	// Roles set again replace the old: the worker role, no longer named,
	// is no longer a member either.
	if _, err := rb.adminSrv.SetRoles(ctx, rb.dbName, protocol.Roles{Producers: protocol.Access{Names: []string{outsider}}}); err != nil {
		t.Fatal(err)
	}
	// The server refuses from the headers and closes the connection
	// unread; the refusal must still be what the client reports, for a
	// small document and for one of a megabyte.
	// On a cluster each shard copy takes the new security object on its
	// own, and a write through a node whose copy still has the old one is
	// let in for a moment (seen once in CI).
	for _, payload := range []string{"", strings.Repeat("p", 1<<20)} {
		deadline := time.Now().Add(10 * time.Second)
		for tries := 1; ; tries++ {
			_, err := rb.worker.Enqueue(ctx, protocol.NewJob{Worker: "mail", Payload: payload})
			if deniedAccess(err) {
				if tries > 1 {
					t.Logf("a worker no longer named was refused on try %d: every copy had the new security object by then", tries)
				}
				break
			}
			if err != nil || rb.srv.Caps().ClusterN <= 1 || time.Now().After(deadline) {
				t.Errorf("a worker no longer named enqueueing %d bytes: %v, want 403", len(payload), err)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// replicationRefused writes doc as c's user with new_edits=false (as a
// replication does) and checks that CouchDB refuses it.
// (PouchDB Server answers that it stored the revision, and drops it:
// there the check is that it is not stored.)
func (rb *rolesBundle) replicationRefused(t *testing.T, what string, c *protocol.Client, doc map[string]any) {
	t.Helper()
	res, err := c.DB().BulkDocs(rb.ctx, []any{doc}, kivik.Param("new_edits", false))
	if err == nil && len(res) > 0 {
		err = res[0].Error
	}
	switch {
	case err == nil && !rb.srv.Caps().NewEditsWithValidation:
		var stored map[string]any
		id, rev := doc["_id"].(string), doc["_rev"].(string)
		if e := c.DB().Get(rb.ctx, id, kivik.Param("rev", rev)).ScanDoc(&stored); e == nil {
			t.Errorf("%s: stored as %s, want refused or dropped", what, rev)
		}
	case err == nil:
		t.Errorf("%s: allowed, want refused", what)
	case !strings.Contains(err.Error(), "may not write replicated revisions"):
		t.Errorf("%s: %v, want refused as a replicated revision", what, err)
	}
}

// rawDocRevs reads a document with its revision history (_revisions).
func rawDocRevs(t *testing.T, c *protocol.Client, id string) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := c.DB().Get(context.Background(), id, kivik.Param("revs", true)).ScanDoc(&doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// deniedAccess reports a refusal to let the user into the database: 403
// from CouchDB, 401 from PouchDB Server.
func deniedAccess(err error) bool {
	s := kivik.HTTPStatus(err)
	return s == http.StatusForbidden || s == http.StatusUnauthorized
}

// rawDoc reads a document as the client's user sees it.
func rawDoc(t *testing.T, c *protocol.Client, id string) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := c.DB().Get(context.Background(), id).ScanDoc(&doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// ddocRev is the design document's revision, read from the document
// (PouchDB Server's HEAD answers an ETag that is not a plain revision).
func ddocRev(t *testing.T, c *protocol.Client) string {
	t.Helper()
	var d struct {
		Rev string `json:"_rev"`
	}
	if err := c.DB().Get(context.Background(), designdocs.ID).ScanDoc(&d); err != nil {
		t.Fatal(err)
	}
	return d.Rev
}

// A member whose database lacks the design document, or holds an older
// one, is told to run couchq init as an admin instead of getting a bare 403.
func TestMemberInitNeedsAdmin(t *testing.T) {
	rb := setupRoles(t, server)
	ctx := rb.ctx
	name, password := rb.cred("worker")
	srv, err := protocol.Connect(ctx, server.URL(), name, password)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Client.Close()

	if o, err := protocol.Init(ctx, srv.Client, rb.dbName, rb.log); err != nil || o != designdocs.Unchanged {
		t.Fatalf("member init with the design document in place: %v, %v", o, err)
	}
	rev := ddocRev(t, rb.admin)
	// An older schema: a member may not upgrade it.
	old, err := designdocs.Default()
	if err != nil {
		t.Fatal(err)
	}
	old.Rev, old.Couchq.Schema = rev, old.Couchq.Schema-1
	if _, err := rb.admin.DB().Put(ctx, designdocs.ID, old); err != nil {
		t.Fatal(err)
	}
	_, err = protocol.Init(ctx, srv.Client, rb.dbName, rb.log)
	if !errors.Is(err, designdocs.ErrNeedsAdmin) || !strings.Contains(err.Error(), "out of date") {
		t.Errorf("member init over an older design document: %v", err)
	}
	// None at all.
	rev = ddocRev(t, rb.admin)
	if _, err := rb.admin.DB().Delete(ctx, designdocs.ID, rev); err != nil {
		t.Fatal(err)
	}
	_, err = protocol.Init(ctx, srv.Client, rb.dbName, rb.log)
	if !errors.Is(err, designdocs.ErrNeedsAdmin) || !strings.Contains(err.Error(), "no couchq design document") {
		t.Errorf("member init without a design document: %v", err)
	}
	// The admin installs it; the member carries on.
	if o, err := protocol.Init(ctx, rb.srv.Client(t), rb.dbName, rb.log); err != nil || o != designdocs.Created {
		t.Fatalf("admin init: %v, %v", o, err)
	}
	if _, err := protocol.Init(ctx, srv.Client, rb.dbName, rb.log); err != nil {
		t.Errorf("member init after the admin's: %v", err)
	}
}

// A producer may replicate a new job in (it stands over nothing), and so
// it can plant a first revision beside a job that already exists, then
// edit that branch (a fresh job, as far as any one write shows) until it
// outgrows the job's own and CouchDB picks it. Settling keeps the job's
// own history, the one that was worked, however long the planted branch:
// the job keeps its payload, attempts and history.
func TestRolesPlantedBranchLosesToTheJobsOwn(t *testing.T) {
	t.Run("single", func(t *testing.T) { testPlantedBranchLoses(t, server) })
	t.Run("cluster", func(t *testing.T) { testPlantedBranchLoses(t, server.Cluster(t).Server) })
}

func testPlantedBranchLoses(t *testing.T, srv *couchtest.Server) {
	rb := setupRoles(t, srv)
	ctx := rb.ctx
	if !srv.Caps().NewEditsWithValidation {
		couchtest.Skip(t, srv.Caps().Vendor+" drops replicated revisions it validates: no branch can be planted")
	}
	job, err := rb.worker.Enqueue(ctx, protocol.NewJob{Worker: "mail", Payload: map[string]any{"to": "a@example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	held, err := rb.worker.Claim(ctx, job, "worker", time.Second)
	if err != nil {
		t.Fatalf("worker claiming: %v", err)
	}
	// The producer's branch: a first revision of its own, then edits of it
	// until it is two generations ahead of the claim.
	planted := map[string]any{"_id": held.ID, "_rev": "1-0000000000000000000000000000000a", "type": "WorkItem", "worker": "mail",
		"status": "queued", "payload": map[string]any{"hijacked": 0}}
	res, err := rb.producer.DB().BulkDocs(ctx, []any{planted}, kivik.Param("new_edits", false))
	if err != nil || len(res) > 0 && res[0].Error != nil {
		t.Fatalf("producer replicating a first revision in: %v %+v", err, res)
	}
	claimGen, _ := strconv.Atoi(strings.SplitN(held.Rev, "-", 2)[0])
	rev := planted["_rev"].(string)
	for g := 1; g <= claimGen+1; g++ {
		planted["_rev"], planted["payload"] = rev, map[string]any{"hijacked": g}
		if rev, err = rb.producer.DB().Put(ctx, held.ID, planted); err != nil {
			t.Fatalf("producer editing its branch (generation %d): %v", g+1, err)
		}
	}
	if got := rawDoc(t, rb.admin, held.ID); got["_rev"] != rev {
		t.Fatalf("CouchDB picks %v, not the planted branch %s: the test proves nothing", got["_rev"], rev)
	}
	time.Sleep(1500 * time.Millisecond) // the claim's lease runs out: its worker died
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := rb.worker.Sweep(ctx, "sweeper", 100); err != nil {
			t.Fatal(err)
		}
		live := len(liveLeaves(t, ctx, rb.admin, held.ID))
		it, err := rb.admin.Get(ctx, held.ID)
		if err != nil {
			t.Fatal(err)
		}
		if live == 1 && !it.Claimed {
			if !strings.Contains(string(it.Payload), "a@example.com") || it.Attempts != 1 || !strings.Contains(events(it), "claimed") {
				t.Fatalf("settled to payload %s, attempts %d, history %s: want the job's own (its address, one attempt, its claim)", it.Payload, it.Attempts, events(it))
			}
			checkPurgeLeavesConflicted(t, rb, it)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not settled within 30 s: %d live leaves, %s", live, it.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkPurgeLeavesConflicted finishes it, plants a branch beside it, and
// checks that a purge leaves the conflicted job to the sweeper (deleting
// the revision CouchDB picks would bring the other branch up in its
// place), and deletes it once it is settled.
func checkPurgeLeavesConflicted(t *testing.T, rb *rolesBundle, it *protocol.WorkItem) {
	t.Helper()
	ctx := rb.ctx
	held, err := rb.worker.Claim(ctx, it, "worker", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := rb.worker.Complete(ctx, held, nil); err != nil {
		t.Fatal(err)
	}
	planted := map[string]any{"_id": it.ID, "_rev": "1-0000000000000000000000000000000b", "type": "WorkItem", "worker": "mail", "payload": map[string]any{"hijacked": true}}
	if res, err := rb.producer.DB().BulkDocs(ctx, []any{planted}, kivik.Param("new_edits", false)); err != nil || len(res) > 0 && res[0].Error != nil {
		t.Fatalf("producer replicating a first revision in: %v %+v", err, res)
	}
	purge := func() int {
		n, err := rb.worker.Purge(ctx, protocol.PurgeOptions{Status: protocol.StatusDone, Worker: "mail"})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := purge(); n != 0 {
		t.Fatalf("purge deleted %d jobs, want the conflicted one left for the sweeper", n)
	}
	if _, err := rb.worker.Sweep(ctx, "sweeper", 100); err != nil {
		t.Fatal(err)
	}
	if n := purge(); n != 1 {
		t.Fatalf("purge after the sweep settled the job deleted %d jobs, want 1", n)
	}
	if _, err := rb.admin.Get(ctx, it.ID); !errors.Is(err, protocol.ErrNotFound) {
		t.Fatalf("after the purge the job reads %v, want not found", err)
	}
}
