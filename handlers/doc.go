// Package handlers holds couchq's built-in job handlers, so that common
// jobs can be run from the command line without writing Go:
//
//   - http-check GETs a URL and fails the attempt on a 4xx/5xx status or a
//     network error (see HTTPCheck).
//   - webhook POSTs a JSON body to a URL and fails the attempt on any
//     non-2xx status (see Webhook).
//   - exec runs a command fixed when the worker starts, with the job on
//     its stdin (see Exec).
//   - noop succeeds at once and does nothing, for measuring the queue
//     itself (see Noop).
//
// New builds a handler by name for the CLI; the handler types can also be
// used directly.
//
// Security: http-check and webhook fetch whatever URL the payload names,
// so anyone who can write job documents can make the worker send requests
// from its network position (including to internal addresses). Run such
// workers where that is acceptable, or restrict writes to the database.
// exec never takes its command from the payload, for the same reason.
package handlers
