package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/httpserve"
	"github.com/converge-csi/converge/pkg/metrics"
	"github.com/converge-csi/converge/pkg/reconciler"
	"github.com/converge-csi/converge/pkg/volstatus"
)

// newHTTPHandler serves /metrics, /healthz (the process serves), /livez
// (the plugin answers Identity.Probe on its CSI socket: live) and /readyz
// (start-up reconstruction is done): what a probe or a scraper on the pod
// network needs, and no volume's paths, errors or state (the metrics name
// only the IDs of restores under way).
func newHTTPHandler(m *metrics.Metrics, rec *reconciler.Reconciler, live func(context.Context) error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, r *http.Request) {
		if err := live(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !rec.Ready() {
			http.Error(w, "start-up reconstruction is not finished", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	// Where the status is not served (newStatusHandler overrides these),
	// say where it is.
	notHere := func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "the status is served on the status socket in the state directory (csi-node status reads it there); csi-node --http-status serves it on this address too", http.StatusNotFound)
	}
	mux.HandleFunc("GET /status", notHere)
	mux.HandleFunc("GET /status/", notHere)
	return mux
}

// newStatusHandler serves, besides what public serves, /status (the
// volumes as of the last pass, as JSON), /status/pools (every storage
// pool's space) and /status/pool (the default pool's). They name volume
// IDs, paths and error text, so they are served on the status socket and
// on the TCP address only when the operator asks (Config.HTTPStatus).
// None of them waits for an operation.
func newStatusHandler(public http.Handler, rec *reconciler.Reconciler, pools func() []volstatus.PoolStatus) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", public)
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(rec.Status())
	})
	// A pool whose space cannot be read is listed with its error.
	mux.HandleFunc("GET /status/pools", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(pools())
	})
	mux.HandleFunc("GET /status/pool", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(pools()[0]) // the default pool comes first
	})
	return mux
}

// collector finds, and may delete, what nothing in the cluster references
// (controller.Collect).
type collector func(ctx context.Context, req volstatus.GCRequest) ([]volstatus.Orphan, error)

// newLocalHandler serves, besides what status serves, POST /gc (csi-node
// gc): only on the status socket, which root alone may open, as it
// deletes. It answers once start-up reconstruction is done.
func newLocalHandler(status http.Handler, rec *reconciler.Reconciler, collect collector) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", status)
	mux.HandleFunc("POST /gc", func(w http.ResponseWriter, r *http.Request) {
		if !rec.Ready() {
			http.Error(w, "start-up reconstruction is not finished", http.StatusServiceUnavailable)
			return
		}
		var req volstatus.GCRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<20)).Decode(&req); err != nil {
			http.Error(w, "reading the request: "+err.Error(), http.StatusBadRequest)
			return
		}
		if req.MinAge < 0 {
			http.Error(w, "minAge must not be negative", http.StatusBadRequest)
			return
		}
		orphans, err := collect(r.Context(), req)
		if err != nil {
			// A listing refused for what it says (FAILED_PRECONDITION)
			// is the caller's to fix, not the plugin's failure.
			code := http.StatusInternalServerError
			if classified.AsError(err).Kind == classified.KindFailedPrecondition {
				code = http.StatusConflict
			}
			http.Error(w, err.Error(), code)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(orphans)
	})
	return mux
}

// httpServer is an HTTP server with its listener.
type httpServer struct {
	srv *http.Server
	lis net.Listener
}

// serve serves until shutdown. A server that stops by itself is the
// group's failure: without its status socket or its probes' address the
// plugin could not be looked at, and its liveness probe would restart it
// anyway, later and with a less clear reason.
func (h httpServer) serve(failed chan<- error) {
	if err := httpserve.Serve(h.srv, h.lis); err != nil {
		klog.Background().Error(err, "HTTP server failed; stopping")
		select {
		case failed <- err:
		default: // the group fails already
		}
	}
}

// listenHTTP listens for local on the status socket in the state
// directory (0600), replacing a stale one, and, when configured, for tcp
// on cfg.HTTPAddress.
func listenHTTP(cfg Config, tcp, local http.Handler) ([]httpServer, error) {
	sock := StatusSocket(cfg.StateDir)
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing stale status socket: %w", err)
	}
	old := unix.Umask(0o177)
	unixLis, err := net.Listen("unix", sock)
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", sock, err)
	}
	// The status socket's POST /gc may take long to answer; root alone
	// reaches it.
	servers := []httpServer{{httpserve.NewServer(local, 0), unixLis}}
	if cfg.HTTPAddress != "" {
		tcpLis, err := net.Listen("tcp", cfg.HTTPAddress)
		if err != nil {
			unixLis.Close()
			return nil, fmt.Errorf("listening on %s: %w", cfg.HTTPAddress, err)
		}
		servers = append(servers, httpServer{httpserve.NewServer(tcp, httpserve.WriteTimeout), tcpLis})
	}
	return servers, nil
}

// stopHTTP shuts servers down, giving each open request a second, and
// removes the status socket.
func stopHTTP(cfg Config, servers []httpServer) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, h := range servers {
		h.srv.Shutdown(ctx)
	}
	os.Remove(StatusSocket(cfg.StateDir))
}
