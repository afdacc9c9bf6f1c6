// Command couchq-bench measures couchq against one CouchDB-compatible
// server on this machine and prints one table (or JSON with --json). With
// neither --url nor COUCHDB_URL it starts a PouchDB Server of its own in a
// temporary directory and stops it at the end. See internal/bench.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command, with its environment passed in for tests.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, opts, err := bench.ParseArgs(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "couchq-bench: %v\n", err)
		return 2
	}
	level := zerolog.WarnLevel
	if opts.Verbose {
		level = zerolog.InfoLevel
	}
	cfg.Logger = zerolog.New(zerolog.ConsoleWriter{Out: stderr, TimeFormat: "15:04:05.000"}).
		Level(level).With().Timestamp().Logger()
	rep, runErr := bench.Run(ctx, cfg)
	if rep != nil {
		var werr error
		if opts.JSON {
			werr = rep.WriteJSON(stdout)
		} else {
			werr = rep.WriteTable(stdout)
		}
		if werr != nil {
			fmt.Fprintf(stderr, "couchq-bench: %v\n", werr)
			return 1
		}
	}
	if runErr != nil {
		fmt.Fprintf(stderr, "couchq-bench: %v\n", runErr)
		return 1
	}
	return 0
}
