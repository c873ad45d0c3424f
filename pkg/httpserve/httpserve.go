package httpserve

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// An address on the pod network is reachable by every pod that no
// NetworkPolicy stops: a peer there may open connections and leave them
// idle, or send headers slowly and large, to fill the process's memory.
// Each connection is bounded in time and its headers in size; a probe or a
// scrape needs far less of either.
const (
	// ReadHeaderTimeout bounds reading a request's headers.
	ReadHeaderTimeout = 5 * time.Second
	// ReadTimeout bounds reading a whole request.
	ReadTimeout = 10 * time.Second
	// WriteTimeout bounds writing an answer on the pod network: a scrape
	// of csi-node's metrics, the largest, takes milliseconds.
	WriteTimeout = 30 * time.Second
	// IdleTimeout is how long a kept-alive connection waits for its next
	// request: the kubelet's probes open one connection each, Prometheus
	// keeps one and scrapes it every 15-60 s.
	IdleTimeout = 60 * time.Second
	// MaxHeaderBytes bounds a request's headers (Go reads up to 4 KiB
	// more before it refuses with 431).
	MaxHeaderBytes = 8 << 10
)

// NewServer returns a server of h with those bounds; write bounds writing
// an answer, none when 0 (for a local socket whose answers may take
// long).
func NewServer(h http.Handler, write time.Duration) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: ReadHeaderTimeout, ReadTimeout: ReadTimeout,
		WriteTimeout: write, IdleTimeout: IdleTimeout, MaxHeaderBytes: MaxHeaderBytes}
}

// Serve serves srv on lis until srv is shut down or closed, then returns
// nil; any other end (an accept error Go does not retry, such as the
// listener closed under it) is returned, naming the address, for the
// caller to stop on: a process whose probes' or status address is gone
// would be restarted by its liveness probe anyway, later and with a less
// clear reason.
func Serve(srv *http.Server, lis net.Listener) error {
	err := srv.Serve(lis)
	if err == nil || errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serving HTTP on %s: %w", lis.Addr(), err)
}
