package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-kivik/kivik/v4"
	"github.com/go-kivik/kivik/v4/mockdb"
)

// statusError is an error carrying an HTTP status, as kivik's are.
type statusError int

func (e statusError) Error() string   { return http.StatusText(int(e)) }
func (e statusError) HTTPStatus() int { return int(e) }

// mockClient returns a Client on a mock database, for error paths only:
// queue semantics are tested against a real server in integration/.
func mockClient(t *testing.T) (*Client, *mockdb.DB) {
	t.Helper()
	client, mock, err := mockdb.New()
	if err != nil {
		t.Fatal(err)
	}
	db := mock.NewDB()
	mock.ExpectDB().WithName("q").WillReturn(db)
	c, err := New(context.Background(), client.DB("q"), Config{Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	return c, db
}

func claimedItem() *WorkItem {
	return &WorkItem{ID: "j1", Rev: "2-a", Worker: "w", Status: StatusRunning, Claimed: true, ClaimedBy: "h/1/w", Attempts: 1}
}

func TestHeldWriteConflictIsClaimLostWithStatus(t *testing.T) {
	c, db := mockClient(t)
	db.ExpectPut().WillReturnError(statusError(http.StatusConflict))
	it := claimedItem()
	err := c.Complete(context.Background(), it, nil)
	if !errors.Is(err, ErrClaimLost) || kivik.HTTPStatus(err) != http.StatusConflict {
		t.Fatalf("want ErrClaimLost carrying 409, got %v (status %d)", err, kivik.HTTPStatus(err))
	}
	if it.Rev != "2-a" || it.Status != StatusRunning {
		t.Fatalf("a refused write must leave the held copy unchanged: %+v", it)
	}
}

func TestServerErrorsAreNotMistakenForConflicts(t *testing.T) {
	c, db := mockClient(t)
	db.ExpectPut().WillReturnError(statusError(http.StatusInternalServerError))
	_, err := c.Claim(context.Background(), &WorkItem{ID: "j1", Rev: "1-a", Worker: "w", Status: StatusQueued}, "h/1/w", time.Minute)
	if errors.Is(err, ErrClaimConflict) || kivik.HTTPStatus(err) != http.StatusInternalServerError {
		t.Fatalf("a 500 is a failure, not a lost race: %v", err)
	}
	if !strings.Contains(err.Error(), "claiming j1") {
		t.Fatalf("error should say what was being done: %v", err)
	}
}

func TestValidationRejectionSurfacesAsForbidden(t *testing.T) {
	c, db := mockClient(t)
	db.ExpectPut().WillReturnError(statusError(http.StatusForbidden))
	_, err := c.Enqueue(context.Background(), NewJob{Worker: "w"})
	if kivik.HTTPStatus(err) != http.StatusForbidden || !strings.Contains(err.Error(), "enqueueing w job") {
		t.Fatalf("got %v", err)
	}
	// A 403 for a missing role is no fault of the job.
	if errors.Is(err, ErrInvalidJob) {
		t.Fatalf("a plain 403 is not an invalid job: %v", err)
	}
}

// reasonError is a kivik-like error with the server's reason.
type reasonError struct {
	status int
	reason string
}

func (e reasonError) Error() string   { return http.StatusText(e.status) + ": " + e.reason }
func (e reasonError) HTTPStatus() int { return e.status }

// What the server refuses for the job itself is ErrInvalidJob, with the
// server's status and reason kept.
func TestServerRefusalOfTheJobIsInvalidJob(t *testing.T) {
	for _, refusal := range []reasonError{
		{http.StatusForbidden, "invalid WorkItem: max_attempts must be a whole number from 0 to 2147483647"},
		{http.StatusRequestEntityTooLarge, "Document exceeds the maximum document size"},
	} {
		c, db := mockClient(t)
		db.ExpectPut().WillReturnError(refusal)
		_, err := c.Enqueue(context.Background(), NewJob{Worker: "w"})
		if !errors.Is(err, ErrInvalidJob) || kivik.HTTPStatus(err) != refusal.status || !strings.Contains(err.Error(), refusal.reason) {
			t.Errorf("%d %s: got %v (status %d)", refusal.status, refusal.reason, err, kivik.HTTPStatus(err))
		}
	}
}

func TestEnqueueRejectsBadJobsBeforeAnyRequest(t *testing.T) {
	c, _ := mockClient(t) // no expectation: any request would fail the call
	bad := []NewJob{{}, {Worker: "w", MaxAttempts: -1}, {Worker: "w", Payload: func() {}},
		{Worker: "w", Payload: json.RawMessage("not json")},
		{Worker: "w", MaxAttempts: 1 << 31}, {Worker: "w\xff"},
		{Worker: "w", At: time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{Worker: "w", At: time.Date(-5, 1, 1, 0, 0, 0, 0, time.UTC)},
		{Worker: "w", ID: "_design/w"}, {Worker: "w", ID: "_local/w"}, {Worker: "w", ID: "job:\xff"}}
	// No job may take the id of a document of couchq's own: it would be
	// read (and written over) as that document.
	for _, id := range []string{ControlID("w"), RateSlotID("w", 1), RunSlotID("w", 1), SlotReservationID("s", "1"),
		SequenceID("s"), SiteHeartbeatID("a"), WorkerDocID("h", 1, "w"), PeriodicStateID("p"), SitesDocID,
		requestPrefix + "x"} {
		bad = append(bad, NewJob{Worker: "w", ID: id})
	}
	for _, j := range bad {
		if _, err := c.Enqueue(context.Background(), j); !errors.Is(err, ErrInvalidJob) {
			t.Errorf("%+v: want ErrInvalidJob, got %v", j, err)
		}
	}
}

func TestConnectionErrorsNeverCarryThePassword(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	for _, dial := range []func() (*kivik.Client, error){
		func() (*kivik.Client, error) { return Dial("http://admin:hunter2@"+addr, "", "") },
		func() (*kivik.Client, error) { return Dial("http://"+addr, "admin", "hunter2") },
	} {
		client, err := dial()
		if err != nil {
			t.Fatal(err)
		}
		_, err = New(context.Background(), client.DB("q"), Config{})
		if err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("want a redacted connection error, got %v", err)
		}
	}
}
