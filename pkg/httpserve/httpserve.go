package httpserve

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"

	"k8s.io/klog/v2"
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
// The server's own errors (an accept retried, a connection's failure) go
// to klog.
func NewServer(h http.Handler, write time.Duration) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: ReadHeaderTimeout, ReadTimeout: ReadTimeout,
		WriteTimeout: write, IdleTimeout: IdleTimeout, MaxHeaderBytes: MaxHeaderBytes,
		ErrorLog: klog.NewStandardLogger("ERROR")}
}

// Serve serves srv on lis until srv is shut down or closed, then returns
// nil. An accept error is retried, with the server's own backoff (5 ms
// doubling to 1 s, logged), unless it says the listening socket itself is
// broken (EBADF, EINVAL, ENOTSOCK, EOPNOTSUPP): Go's server retries only those
// it deems temporary, and Linux's accept(2) passes on a new connection's
// pending network errors (EPROTO, ENETDOWN, EHOSTUNREACH...), which a
// peer could cause, and which its man page says to retry. Only the
// listener closed or broken under it ends Serve before a shutdown: that end is
// returned, naming the address, for the caller to stop on, as a process
// whose probes' or status address is gone would be restarted by its
// liveness probe anyway, later and with a less clear reason.
func Serve(srv *http.Server, lis net.Listener) error {
	err := srv.Serve(patientListener{lis})
	if err == nil || errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serving HTTP on %s: %w", lis.Addr(), err)
}

// patientListener makes every accept error but the listener's closing one
// that http.Server retries (a net.Error whose Temporary is true: it asserts
// the type, so the wrapper must be one).
type patientListener struct{ net.Listener }

func (l patientListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil && !errors.Is(err, net.ErrClosed) && !listenerBroken(err) {
		return nil, retried{err}
	}
	return c, err
}

// listenerBroken reports whether err says the listening socket itself is
// unusable, which no retry mends: the server ends, and its process with it.
func listenerBroken(err error) bool {
	return errors.Is(err, syscall.EBADF) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOTSOCK) || errors.Is(err, syscall.EOPNOTSUPP)
}

// retried is an accept error to retry.
type retried struct{ err error }

func (r retried) Error() string   { return r.err.Error() }
func (r retried) Unwrap() error   { return r.err }
func (r retried) Timeout() bool   { return false }
func (r retried) Temporary() bool { return true }
