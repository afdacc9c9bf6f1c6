package fleet_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"

	"github.com/rs/zerolog"

	"github.com/couchq/couchq/fleet"
	"github.com/couchq/couchq/worker"
)

// Load reads a worker configuration file: the file's types with their
// settings, [defaults] and the built-in defaults applied.
func Example() {
	dir, err := os.MkdirTemp("", "fleet-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "workers.toml")
	err = os.WriteFile(path, []byte(`
[defaults]
concurrency = 2

[types.email]       # no handler: the program gives Run a Go one
concurrency = 8

[types.thumbnail]
handler = "exec"
exec = "/usr/local/bin/make-thumbnail --width 128"
lease = "5m"
`), 0o600)
	if err != nil {
		log.Fatal(err)
	}

	cfg, err := fleet.Load(path)
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range cfg.Types {
		handler := t.Handler
		if handler == "" {
			handler = "(Go)"
		}
		fmt.Printf("%s: handler %s, concurrency %d, lease %s\n", t.Name, handler, t.Concurrency, t.Lease)
	}
	// Output:
	// email: handler (Go), concurrency 8, lease 30s
	// thumbnail: handler exec, concurrency 2, lease 5m0s
}

// A program runs a file's fleet as couchq worker --config would, with Go
// handlers for the types whose table names no built-in one, until it is
// interrupted.
func ExampleRun() {
	cfg, err := fleet.Load("workers.toml")
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	sendEmail := worker.HandlerFunc(func(ctx context.Context, job *worker.Job) error {
		fmt.Printf("sending %s\n", job.Payload)
		return nil
	})
	err = fleet.Run(ctx, cfg, fleet.Options{
		Handlers: map[string]worker.Handler{"email": sendEmail},
		Logger:   zerolog.New(os.Stderr).With().Timestamp().Logger(),
	})
	if err != nil {
		log.Fatal(err)
	}
}

// A program that enqueues reaches the queue as its workers do.
func ExampleConnection_Open() {
	conn := fleet.ConnectionFromEnv()
	ctx := context.Background()
	q, closeQueue, err := conn.Open(ctx, zerolog.Nop())
	if err != nil {
		log.Fatal(err)
	}
	defer closeQueue()
	fmt.Println("connected to", conn) // the URL without its password
	_ = q                             // enqueue with q
}
