// Package cli is the machinery of the couchq command that is more than
// parsing its flags: the connection settings every command shares
// (resolved from flags, the environment and a worker configuration file,
// then dialled), the errors and how they read, and the job output and
// input shared by the commands and couchq demo.
//
// Its messages speak the command's language (--url, --db): package fleet,
// which offers the worker command's machinery to programs, reuses them.
package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/go-kivik/kivik/v4"
)

// UsageError marks a mistake on the command line or in its input (flags,
// JSON, times, a configuration file): the command exits 2.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef is a UsageError with a formatted message.
func Usagef(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...)}
}

// ServerError adds where the server is to errors that mean it could not be
// reached at all.
func ServerError(where string, err error) error {
	if IsNetError(err) && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("cannot reach CouchDB at %s (is it running? set --url or COUCHDB_URL): %w", where, err)
	}
	return err
}

// IsNetError reports whether err is a transport failure rather than an
// answer from the server (kivik reports those as HTTP 502).
func IsNetError(err error) bool {
	var ue *url.Error
	var ne net.Error
	return errors.As(err, &ue) || errors.As(err, &ne)
}

// IsNotFound reports whether err is the server's 404.
func IsNotFound(err error) bool {
	return err != nil && !IsNetError(err) && kivik.HTTPStatus(err) == http.StatusNotFound
}

// statusCoder is how kivik errors carry the server's HTTP status.
type statusCoder interface{ HTTPStatus() int }

// DescribeError renders a failure for the one-line message: interrupted
// runs say so, and answers from the server end with their HTTP status.
func DescribeError(err error) string {
	if errors.Is(err, context.Canceled) {
		return "interrupted"
	}
	msg := err.Error()
	var sc statusCoder
	if errors.As(err, &sc) && !IsNetError(err) {
		if status := sc.HTTPStatus(); status != 0 {
			msg += fmt.Sprintf(" (HTTP %d %s)", status, http.StatusText(status))
		}
		if strings.Contains(msg, "could not be processed in a reasonable amount of time") {
			// CouchDB's answer when a view read waits too long: most often
			// for its index to take a large change, which goes on behind.
			msg += "; CouchDB may still be indexing a large change (a bulk enqueue, a new database): try again in a while"
		}
	}
	return msg
}
