// Command couchq is the command-line interface to a couchq job queue: it
// creates the database, enqueues and inspects jobs, and runs the demo.
package main

import (
	"context"
	"fmt"
	"io"
	stdlog "log"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// SIGHUP (a closed terminal or SSH session) stops as SIGTERM does: by
	// default it ended the process at once, a worker's claims left to
	// their leases and its commands' children running.
	stopSignals := []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP}
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals...)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, stopSignals...) // before any signal can arrive unseen
	go exitOnSecondSignal(sigs)
	routeStdlog(os.Stderr, isTerminal(os.Stderr))
	code := NewMain(os.Stdin, os.Stdout, os.Stderr).Run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

// routeStdlog sends the standard logger's lines to w in the log's own
// form: net/http reports a few things through it (a server answering on an
// idle connection), which would otherwise be bare text among them.
func routeStdlog(w io.Writer, terminal bool) {
	stdlog.SetFlags(0)
	stdlog.SetOutput(newLogger(w, terminal).With().Str("from", "go").Logger())
}

// exitOnSecondSignal exits at once with status 1 on the second SIGINT,
// SIGTERM or SIGHUP: the first one cancels the command's context and lets it stop
// gracefully (a worker finishes or releases its jobs), which an operator
// may not want to wait for. It counts on its own channel, which the signal
// package feeds alongside NotifyContext's, so no signal is missed between
// the two.
func exitOnSecondSignal(sigs <-chan os.Signal) {
	<-sigs
	sig := <-sigs
	fmt.Fprintf(os.Stderr, "couchq: %v again: exiting now\n", sig)
	os.Exit(exitFailure)
}
