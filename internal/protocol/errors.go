package protocol

import (
	"errors"
	"fmt"
)

// ErrClaimConflict means the claimant must not run the job: CouchDB
// answered 409 to the claim, or on a cluster the claim reached fewer than a
// majority of the copies, or the job has another live revision branch.
// It is the normal outcome of a race; the caller moves on to other work.
var ErrClaimConflict = errors.New("claim conflict: another worker claimed the job")

// ErrClaimLost means a claim this worker held is gone: the job was swept
// after its lease ran out, cancelled, or requeued by an operator. The
// write that found out was not applied; the job's new state stands.
var ErrClaimLost = errors.New("claim lost: the job was swept, cancelled or requeued")

// ErrNotFound means what a call names does not exist: a job (most
// calls), or a batch, a site or a reserved slot (the calls that name
// those). A database that does not exist is not ErrNotFound.
var ErrNotFound = errors.New("job not found")

// ErrInvalidJob means a job given to Enqueue cannot be stored; the error
// says which field and why.
var ErrInvalidJob = errors.New("invalid job")

// describedError is an error of a kind (a sentinel above, for errors.Is)
// whose message says all, without the sentinel's own words: "job not
// found" would mislead about a site that is not found.
type describedError struct {
	msg  string
	kind error
}

func (e *describedError) Error() string { return e.msg }
func (e *describedError) Unwrap() error { return e.kind }

// MalformedError describes a stored WorkItem that couchq cannot run,
// typically one written before validate_doc_update existed.
type MalformedError struct {
	ID     string
	Field  string
	Reason string
}

func (e *MalformedError) Error() string {
	if e.ID == "" {
		return fmt.Sprintf("malformed WorkItem: %s %s", e.Field, e.Reason)
	}
	return fmt.Sprintf("malformed WorkItem %s: %s %s", e.ID, e.Field, e.Reason)
}
