package cli

import (
	"context"
	"fmt"
	stdlog "log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// HTTP server limits of couchq serve and of a worker's --health-addr:
// reading a request is quick or hostile; how long writing may take is the
// server's own (NewHTTPServer).
const (
	ServeReadHeaderTimeout = 5 * time.Second
	ServeReadTimeout       = 10 * time.Second
	ServeIdleTimeout       = 2 * time.Minute
	// ServeShutdownTimeout bounds a graceful stop: the requests in flight
	// get this long to finish.
	ServeShutdownTimeout = 10 * time.Second
)

// CheckListenAddr validates a HOST:PORT flag before anything listens and
// returns its host.
func CheckListenAddr(flagName, addr, example string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", Usagef("invalid --%s %q: want HOST:PORT, e.g. %s", flagName, addr, example)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return "", Usagef("invalid --%s %q: port %q is not a number from 0 to 65535", flagName, addr, port)
	}
	return host, nil
}

// NewHTTPServer is the HTTP server of serve and of worker --health-addr:
// reading a request is quick or hostile, writing takes up to writeTimeout,
// and requests run on ctx, which outlives an interrupt until Shutdown's
// grace period ends, so that a scrape in flight is answered.
func NewHTTPServer(ctx context.Context, h http.Handler, writeTimeout time.Duration, log zerolog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ServeReadHeaderTimeout,
		ReadTimeout:       ServeReadTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       ServeIdleTimeout,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ErrorLog:          stdlog.New(log.With().Str("component", "http").Logger(), "", 0),
	}
}

// IsLoopback reports whether a listen host reaches only this machine. An
// empty host listens on every interface.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// LoopbackNamesOnly answers only requests addressed to a loopback name
// (localhost, 127.0.0.1, [::1], at any port), and 421 to the rest. A
// server on loopback whose reads need no login trusts that whoever
// reaches it is on this machine; but a web page a person on this machine
// opens can point a name of its own at 127.0.0.1 (DNS rebinding) and have
// the browser read the server as that name's origin. Its requests carry
// that name in Host.
func LoopbackNamesOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if hh, _, err := net.SplitHostPort(host); err == nil {
			host = hh
		}
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
		if !IsLoopback(host) && !strings.HasSuffix(host, ".localhost") {
			http.Error(w, fmt.Sprintf("this server listens on loopback, with reads open, and answers requests addressed to localhost, 127.0.0.1 or [::1] only, not %.100q", r.Host), http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
}
