package couchqtest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/couchq/couchq/couchq"
	"github.com/couchq/couchq/couchqtest"
)

// NewQueue gives a test a queue of its own, deleted when the test ends.
func TestNewQueueIsTheTestsAlone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	user, password := srv.Credentials()
	s, err := couchq.Connect(ctx, srv.URL(), user, password)
	if err != nil {
		t.Fatal(err)
	}
	var name string
	t.Run("inner", func(t *testing.T) {
		q := couchqtest.NewQueue(ctx, t, s, couchq.Config{MaxAttempts: 3})
		name = q.DB().Name()
		if !strings.HasPrefix(name, "couchqtest_testnewqueueisthetestsalone_inner_") {
			t.Errorf("the test database is named %s", name)
		}
		it, err := q.Enqueue(ctx, couchq.NewJob{Worker: "w"})
		if err != nil || it.MaxAttempts != 3 {
			t.Errorf("enqueueing with the config given: %+v %v", it, err)
		}
	})
	other := couchqtest.NewQueue(ctx, t, s, couchq.Config{})
	if exists, err := other.DB().Client().DBExists(ctx, name); err != nil || exists {
		t.Errorf("the test database %s after its test: exists %v, %v", name, exists, err)
	}
	f := &fakeTB{TB: t}
	couchqtest.NewQueue(ctx, f, nil, couchq.Config{})
	f.failed(t, "srv is nil")
}
