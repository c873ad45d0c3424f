package driver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/net/netutil"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/reconciler"
)

// serve creates the CSI socket, then the status socket (and listens on
// the HTTP address), and runs the reconciler, the mount watcher, gRPC and
// HTTP as one group until ctx ends or a server fails; then it stops the
// group (group.stop) and returns the failure, or nil.
func (p *plugin) serve(ctx context.Context) error {
	lis, err := listen(p.sock)
	if err != nil {
		return err
	}
	defer os.Remove(p.sock)
	https, err := listenHTTP(p.cfg, p.tcp, p.local)
	if err != nil {
		lis.Close()
		return err
	}
	g := startGroup(ctx, p.rec, p.grpc, lis, p.maxConns, https)
	logger := klog.FromContext(ctx)
	logger.Info("Serving", "endpoint", p.cfg.Endpoint, "driver", p.cfg.DriverName, "nodeID", p.cfg.NodeID,
		"stateDir", p.cfg.StateDir, "dataDir", p.cfg.DataDir, "roots", p.cfg.roots())
	var failed error
	select {
	case <-ctx.Done():
	case failed = <-g.failed:
	}
	logger.Info("Stopping; mounts stay in place")
	return cmp.Or(failed, g.stop(p.cfg, p.pools))
}

// group is what serve runs: the loops (the reconciler and the mount
// watcher), which run until the group stops, and the servers (gRPC and
// HTTP). A server's Serve returning by itself is the group's failure.
type group struct {
	grpc  *grpc.Server
	https []httpServer
	// cancel ends the loops' context, and loops waits for them.
	cancel context.CancelFunc
	loops  sync.WaitGroup
	// servers waits for the servers' Serve. failed has room for a value
	// from each server, so that none blocks: gRPC's Serve sends even its
	// nil, at the group's stop, and an HTTP server only its failure.
	servers sync.WaitGroup
	failed  chan error
}

// newGroup returns the group of srv and https, with nothing started.
func newGroup(srv *grpc.Server, https []httpServer) *group {
	return &group{grpc: srv, https: https, failed: make(chan error, 1+len(https)), cancel: func() {}}
}

// startGroup starts the loops of rec and the servers: srv on lis, with at
// most maxConns connections open, and https.
func startGroup(ctx context.Context, rec *reconciler.Reconciler, srv *grpc.Server, lis net.Listener, maxConns int, https []httpServer) *group {
	g := newGroup(srv, https)
	var loopCtx context.Context
	loopCtx, g.cancel = context.WithCancel(ctx)
	g.loops.Go(func() { rec.Run(loopCtx) })
	g.loops.Go(func() {
		// A mount made or removed by anyone kicks a pass within a
		// millisecond (KickSoon: the plugin's own mounts need no pass of
		// their own), so an external unmount heals at once rather than at
		// the next resync.
		if err := devices.WatchMounts(loopCtx, "/proc/self/mountinfo", rec.KickSoon); err != nil {
			klog.FromContext(ctx).Error(err, "Cannot watch the mount table; changes are seen at each resync")
		}
	})
	g.startServers(lis, maxConns)
	return g
}

// startServers starts the HTTP servers, and gRPC on lis with at most
// maxConns connections open (reservedConnections says why as many).
func (g *group) startServers(lis net.Listener, maxConns int) {
	for _, h := range g.https {
		g.servers.Go(func() { h.serve(g.failed) })
	}
	// A bound on connections bounds file descriptors, a bound on streams
	// (newGRPCServer) the goroutines of one connection.
	lis = netutil.LimitListener(lis, maxConns)
	g.servers.Go(func() {
		err := g.grpc.Serve(lis)
		if errors.Is(err, grpc.ErrServerStopped) {
			err = nil // stopped before it served: the group's stop
		}
		g.failed <- err
	})
}

// stop is the group's one shutdown, each part stopped once what calls it
// has: gRPC first, its calls in flight given stopGrace to finish; then
// the loops; then the restores' copies of pools, which leave no image
// (the provisioner's retry makes each anew); then HTTP, and the status
// socket removed. Mounts and devices stay in place. It returns a server's
// failure that serve did not take: one that came as ctx ended, or after
// the first.
func (g *group) stop(cfg Config, pools *pool.Pools) error {
	stopped := make(chan struct{})
	go func() { g.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(stopGrace):
		g.grpc.Stop()
	}
	g.cancel()
	g.loops.Wait()
	pools.Close()
	stopHTTP(cfg, g.https)
	g.servers.Wait()
	for {
		select {
		case err := <-g.failed:
			if err != nil {
				return err
			}
		default:
			return nil
		}
	}
}

// listen creates the socket with mode 0600. A live socket of another
// instance is never taken over; a stale one is replaced.
func listen(sock string) (net.Listener, error) {
	dir := filepath.Dir(sock)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("creating socket directory: %w", err)
	}
	if st, err := os.Stat(dir); err != nil {
		return nil, err
	} else if st.Mode().Perm()&0o002 != 0 {
		return nil, fmt.Errorf("socket directory %s is writable by others, who could replace the socket; make it 0750 or stricter", dir)
	}
	if st, err := os.Lstat(sock); err == nil {
		if st.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket; refusing to replace it", sock)
		}
		conn, derr := net.DialTimeout("unix", sock, time.Second)
		if derr == nil {
			conn.Close()
			return nil, fmt.Errorf("another instance is serving on %s", sock)
		}
		if err := os.Remove(sock); err != nil {
			return nil, fmt.Errorf("removing stale socket: %w", err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	old := unix.Umask(0o177)
	lis, err := net.Listen("unix", sock)
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", sock, err)
	}
	return lis, nil
}
