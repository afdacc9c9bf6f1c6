//go:build unix

package handlers_test

import (
	"context"
	"fmt"

	"github.com/couchq/couchq/handlers"
	"github.com/couchq/couchq/worker"
)

// Building a handler by name, as the CLI does.
func ExampleNew() {
	h, err := handlers.New("exec", handlers.Options{Exec: []string{"sh", "-c", `echo '{"sent": true}'`}})
	if err != nil {
		fmt.Println(err)
		return
	}
	job := &worker.Job{ID: "mail-1", Type: "send-mail", Attempt: 1, MaxAttempts: 5}
	if err := h.Handle(context.Background(), job); err != nil {
		fmt.Println("job failed:", err)
		return
	}
	fmt.Println(string(job.Result()))

	_, err = handlers.New("ftp", handlers.Options{})
	fmt.Println(err)
	// Output:
	// {"sent": true}
	// unknown handler "ftp" (built-in handlers: exec, http-check, noop, webhook)
}
