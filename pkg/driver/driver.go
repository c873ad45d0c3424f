package driver

import (
	"context"
	"net/http"
	"time"

	"google.golang.org/grpc"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/metrics"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/reconciler"
	"github.com/converge-csi/converge/pkg/state"
)

const (
	// maxFormats bounds concurrent mkfs runs; they are I/O bound. As many
	// as the reconciler's slow operations (reconciler.DefaultSlowWorkers,
	// which says what was measured).
	maxFormats = 16
	// stopGrace is how long in-flight RPCs may finish after SIGTERM.
	stopGrace = 10 * time.Second
	// reservedConnections is how many connections the CSI socket accepts
	// beyond the node requests that may wait at once (Config.MaxRequests):
	// the kubelet opens a connection for every call and holds it while
	// the call waits (k8s.io/kubernetes pkg/volume/csi, newV1NodeClient),
	// so each waiting request may hold one, and the headroom keeps the
	// calls that do not wait (the liveness check's, the registrar's, the
	// sidecars', the kubelet's stats and the capabilities it asks before
	// each stage) accepted however many do: a call past --max-requests is
	// refused at once and its connection closed. The bound is one count
	// for every caller, first come first served, not a reserve. Past it,
	// connections wait to be accepted. Each open one costs a descriptor
	// and some memory with its call waiting (docs/performance.md, Figures
	// behind the code's choices): at the default bound, well under
	// deploy/'s 512 MiB beside the container's mkfs and fsck; a node short
	// of memory lowers --max-requests.
	reservedConnections = 64
	// maxStreams bounds concurrent calls on one connection; above the node
	// server's own bound on waiting requests.
	maxStreams = 4096
	// maxMessage bounds a request's size; CSI requests are a few KiB.
	maxMessage = 1 << 20
)

// The metrics are the reconciler's recorder (each storage pool is a pool
// of the reconciler's: pkg/reconciler/pools.go holds it so).
var _ reconciler.Recorder = (*metrics.Metrics)(nil)

// Run builds the plugin from cfg, repairs what the last run left behind,
// and serves until ctx ends. On return every mount and device is left in
// place: they belong to pods, not to the plugin process.
func Run(ctx context.Context, cfg Config) error {
	p, err := construct(ctx, cfg)
	if err != nil {
		return err
	}
	defer p.close()
	if err := p.recover(); err != nil {
		return err
	}
	return p.serve(ctx)
}

// plugin is converge built from its configuration: construct makes it,
// recover repairs what it finds on disk, serve runs it, close releases it.
type plugin struct {
	cfg   Config
	store *state.Store
	// pools are the configured pools this node has. Their filesystems
	// are probed by recover, once what a crash left in them is gone.
	pools    *pool.Pools
	observer *devices.Observer
	// removals removes thick devices' numbers after their detach.
	removals *devices.Removals
	rec      *reconciler.Reconciler
	// sock is the CSI socket, which serve creates, and grpc the server
	// of the CSI services on it.
	sock string
	grpc *grpc.Server
	// maxConns bounds the CSI socket's open connections.
	maxConns int
	// tcp is served on Config.HTTPAddress, local on the status socket.
	tcp, local http.Handler
}

// close releases what construct opened: the device numbers still to
// remove, the observer's files and the store. Each that construct did not
// reach is skipped.
func (p *plugin) close() {
	if p.removals != nil {
		p.removals.Close()
	}
	if p.observer != nil {
		p.observer.Close()
	}
	if p.store != nil {
		p.store.Close()
	}
}
