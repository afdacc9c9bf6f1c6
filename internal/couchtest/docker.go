package couchtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/ory/dockertest/v3"
	"github.com/rs/zerolog"

	"github.com/couchq/couchq/internal/localserver"
)

const (
	couchImage = "couchdb"
	couchTag   = "3"
	// containerLabel marks containers started by couchtest; one leaked by a killed test binary
	// can be removed with: docker rm -f $(docker ps -aq -f label=couchq.test)
	containerLabel = "couchq.test"
)

// dockerPool connects to the Docker engine from the environment (DOCKER_HOST, ...) and pings it.
func dockerPool(ctx context.Context) (*dockertest.Pool, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second) // an unreachable tcp DOCKER_HOST would hang
	defer cancel()
	if err := pool.Client.PingWithContext(ctx); err != nil {
		return nil, err
	}
	return pool, nil
}

func startDocker(ctx context.Context, pool *dockertest.Pool, logger zerolog.Logger) (*Server, error) {
	user, password := "admin", randomHex(16)
	logger.Info().Str("image", couchImage+":"+couchTag).Msg("starting CouchDB container (first run pulls the image)")
	res, err := pool.RunWithOptions(dockerRunOptions(user, password))
	if err != nil {
		return nil, fmt.Errorf("starting %s:%s container: %w", couchImage, couchTag, err)
	}
	fail := func(err error) (*Server, error) {
		_ = pool.Purge(res)
		return nil, err
	}
	port := res.GetPort("5984/tcp")
	if port == "" {
		return fail(fmt.Errorf("container %s publishes no port for 5984/tcp", res.Container.ID))
	}
	s, err := newServer(KindDocker, "http://"+net.JoinHostPort(dockerHost(pool), port), user, password, logger)
	if err != nil {
		return fail(err)
	}
	s.pool, s.res = pool, res
	if err := waitUp(ctx, s); err != nil {
		return fail(fmt.Errorf("waiting for CouchDB in container %s: %w", res.Container.ID, err))
	}
	// The image does not run single-node setup; without these CouchDB logs errors on every request.
	for _, db := range []string{"_users", "_replicator"} {
		if status, err := s.do(ctx, http.MethodPut, "/"+db, nil, nil); err != nil && status != http.StatusPreconditionFailed {
			return fail(fmt.Errorf("creating %s: %w", db, err))
		}
	}
	// The compaction threshold the local nodes get in their local.ini.
	for section, keys := range localserver.CompactionSettings() {
		for key, value := range keys {
			if _, err := s.do(ctx, http.MethodPut, "/_node/_local/_config/"+section+"/"+key, value, nil); err != nil {
				return fail(fmt.Errorf("setting [%s] %s: %w", section, key, err))
			}
		}
	}
	return s, nil
}

// dockerRunOptions is how the CouchDB container runs: the image's
// defaults, an admin, and the Erlang VM flags the local nodes get
// (localserver.SchedulerFlags) in ERL_FLAGS, which the VM reads, so that
// the container's schedulers sleep when idle rather than take CPU from the
// tests beside it. No AutoRemove: Stop force-removes, and both at once
// race ("removal already in progress").
func dockerRunOptions(user, password string) *dockertest.RunOptions {
	return &dockertest.RunOptions{
		Repository: couchImage,
		Tag:        couchTag,
		Env:        []string{"COUCHDB_USER=" + user, "COUCHDB_PASSWORD=" + password, "ERL_FLAGS=" + localserver.SchedulerFlags},
		Labels:     map[string]string{containerLabel: "true"},
	}
}

// dockerHost is where published ports are reachable: the engine's host for a tcp DOCKER_HOST,
// else loopback.
func dockerHost(pool *dockertest.Pool) string {
	u, err := url.Parse(pool.Client.Endpoint())
	if err == nil && (u.Scheme == "tcp" || u.Scheme == "http" || u.Scheme == "https") && u.Hostname() != "" {
		return u.Hostname()
	}
	return "127.0.0.1"
}

func waitUp(ctx context.Context, s *Server) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last error
	for {
		reqCtx, reqCancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := s.do(reqCtx, http.MethodGet, "/_up", nil, nil)
		reqCancel()
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
