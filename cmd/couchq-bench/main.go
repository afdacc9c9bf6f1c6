// Command couchq-bench measures couchq against CouchDB-compatible servers
// on this machine and prints one table per server (or, with --json, a JSON
// array of one report per server). With --url or COUCHDB_URL it measures
// that server alone. Without, it starts every local server available in
// turn, each in a temporary directory stopped at its end: a single Apache
// CouchDB node and a 3-node cluster from the local release
// (COUCHQ_COUCHDB_HOME, else /opt/couchdb), and PouchDB Server; --servers
// picks some. With --write-docs DIR, a full run rewrites the generated
// regions of DIR/docs/performance.md and DIR/README.md with its tables.
// See internal/bench.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"unicode"

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
	if opts.WriteDocs != "" {
		// Checked before a run of minutes, not after it.
		if err := bench.CheckDocs(opts.WriteDocs); err != nil {
			fmt.Fprintf(stderr, "couchq-bench: --write-docs: %v\n", err)
			return 2
		}
	}
	level := zerolog.WarnLevel
	if opts.Verbose {
		level = zerolog.InfoLevel
	}
	cfg.Logger = zerolog.New(zerolog.ConsoleWriter{Out: stderr, TimeFormat: "15:04:05.000"}).
		Level(level).With().Timestamp().Logger()
	reps, runErr := bench.Run(ctx, cfg)
	if reps != nil {
		var werr error
		if opts.JSON {
			werr = bench.WriteJSON(stdout, reps)
		} else {
			werr = bench.WriteTables(stdout, reps)
		}
		if werr != nil {
			fmt.Fprintf(stderr, "couchq-bench: %v\n", werr)
			return 1
		}
	}
	if runErr != nil {
		fmt.Fprintf(stderr, "couchq-bench: %v\n", runErr)
		if opts.WriteDocs != "" {
			// Tables with failed sections would replace a good run's.
			fmt.Fprintf(stderr, "couchq-bench: the docs in %s were not rewritten: the run had errors\n", opts.WriteDocs)
		}
		return 1
	}
	if opts.WriteDocs != "" {
		run := bench.DocRun{Reports: reps, Command: commandLine(args), Changed: opts.Changed}
		if err := bench.WriteDocs(opts.WriteDocs, run, stderr); err != nil {
			fmt.Fprintf(stderr, "couchq-bench: --write-docs: %v\n", err)
			return 1
		}
	}
	return 0
}

// commandLine is the run's command line as a reader would type it in the
// repository (how it was started, go run or a built binary, does not
// matter to the figures).
func commandLine(args []string) string {
	out := []string{"go run ./cmd/couchq-bench"}
	for _, a := range args {
		if a == "" || strings.ContainsFunc(a, func(r rune) bool {
			return !unicode.IsLetter(r) && !unicode.IsDigit(r) && !strings.ContainsRune("-_./:=,@%+", r)
		}) {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}
