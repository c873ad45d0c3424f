package driver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/net/netutil"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
	"k8s.io/utils/clock"
	utilexec "k8s.io/utils/exec"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/controller"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/metrics"
	"github.com/converge-csi/converge/pkg/nodeserver"
	"github.com/converge-csi/converge/pkg/reconciler"
	"github.com/converge-csi/converge/pkg/state"
	"github.com/converge-csi/converge/pkg/volstatus"
)

const (
	// maxFormats bounds concurrent mkfs runs; they are I/O bound. As many
	// as the reconciler's slow operations (reconciler.DefaultSlowWorkers,
	// which says what was measured).
	maxFormats = 16
	// stopGrace is how long in-flight RPCs may finish after SIGTERM.
	stopGrace = 10 * time.Second
	// maxConnections bounds open connections (file descriptors): the
	// kubelet, node-driver-registrar, the provisioner, resizer and snapshotter
	// sidecars need a handful.
	maxConnections = 64
	// maxStreams bounds concurrent calls on one connection; above the node
	// server's own bound on waiting requests.
	maxStreams = 4096
	// maxMessage bounds a request's size; CSI requests are a few KiB.
	maxMessage = 1 << 20
)

// The metrics are the reconciler's recorder.
var _ reconciler.Recorder = (*metrics.Metrics)(nil)

// Run builds the plugin from cfg and serves until ctx ends. On return every
// mount and device is left in place: they belong to pods, not to the
// plugin process.
func Run(ctx context.Context, cfg Config) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", cfg.StateDir, err)
	}
	store, err := state.OpenWith(filepath.Join(cfg.StateDir, "state.db"), state.Options{Release: cfg.Version})
	if err != nil {
		return err
	}
	defer store.Close()
	if n := store.Replayed(); n > 0 {
		// The last run ended without a checkpoint: killed or crashed.
		logger.Info("Replayed the state log", "records", n)
	}

	here, opened, err := openPools(cfg.pools, cfg.KubeletDir, store)
	if err != nil {
		return err
	}
	pools := devices.NewPools(opened...)
	var static reconciler.Static
	if len(cfg.AllowedDevicePrefixes) > 0 {
		static = devices.StaticDevices{Prefixes: cfg.AllowedDevicePrefixes, SysDevBlock: "/sys/dev/block"}
	}
	m := metrics.New()
	observer := &devices.Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block",
		Paths: devices.NewPaths(cfg.roots()), Pools: pools}
	defer observer.Close()
	topology := map[string]string{TopologyKey: cfg.NodeID}
	// Each pool's space promises what CreateVolume, snapshots, restores
	// and the reconciler's growth of images for NodeExpandVolume take of
	// it, under its own lock.
	promises := controller.NewPools(store, spaces(here, opened, store)...)
	ctrl := controller.New(promises, store, topology, controller.Options{SnapshotTopology: cfg.Features.Enabled(SnapshotAccessibility)})
	guards := map[string]capacity.Guard{}
	for _, p := range here {
		guards[p.name] = p.guard
	}
	rec, err := reconciler.New(reconciler.Config{
		Recorder: m,
		Static:   static,
		Store:    store,
		Observer: observer,
		Loops:    devices.LoopDevices{},
		// mount(8) only for what is not ext4, xfs or btrfs: those mount
		// through the kernel's mount API, after mount-utils' decisions.
		Filesystems: devices.NewMounter(devices.NewFsMounter(mount.NewWithoutSystemd(""), devices.NewPaths(cfg.roots()), devices.SELinuxEnabled()),
			utilexec.New(), maxFormats, devices.NewPaths(cfg.roots())),
		Paths:        devices.NewPaths(cfg.roots()),
		Images:       pools,
		ImagePromise: promises,
		Snapshots:    pools,
		Roots:        cfg.roots(),
		Clock:        clock.RealClock{},
		ResyncPeriod: cfg.ResyncPeriod,
		PoolGuard:    here[0].guard,
		PoolGuards:   guards,
	})
	if err != nil {
		return err
	}
	node, err := nodeserver.New(nodeserver.Config{
		Store:  store,
		Kicker: rec,
		Stat:   devices.Statfs,
		Capacity: func(id string) (int64, error) {
			v, _ := store.Get(id)
			return pools.Size(state.PoolOf(v), id)
		},
		NodeID:          cfg.NodeID,
		MaxVolumes:      cfg.MaxVolumes,
		Topology:        topology,
		Roots:           cfg.roots(),
		DevicePrefixes:  cfg.AllowedDevicePrefixes,
		MaxWait:         cfg.MaxWait,
		MaxRequests:     cfg.MaxRequests,
		VolumeHealth:    cfg.Features.Enabled(VolumeHealth),
		VolumeCondition: cfg.Features.Enabled(VolumeCondition),
	})
	if err != nil {
		return err
	}

	// Snapshots are intents of the node's records: the node server asks
	// the reconciler for them and waits, on the controller's behalf.
	ctrl.ServeSnapshots(node)

	sock, err := socketPath(cfg.Endpoint)
	if err != nil {
		return err
	}
	lis, err := listen(sock)
	if err != nil {
		return err
	}
	defer os.Remove(sock)

	// The kubelet, the registrar and the probes each hold one connection;
	// a bound on connections bounds file descriptors, a bound on streams
	// the goroutines of one connection.
	lis = netutil.LimitListener(lis, maxConnections)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(recoverPanics, observeCalls(m), logCalls),
		grpc.MaxConcurrentStreams(maxStreams), grpc.MaxRecvMsgSize(maxMessage))
	csi.RegisterIdentityServer(srv, &identity{name: cfg.DriverName, version: cfg.Version, ready: rec.Ready,
		snapshotAccessibility: cfg.Features.Enabled(SnapshotAccessibility)})
	csi.RegisterControllerServer(srv, ctrl)
	csi.RegisterNodeServer(srv, node)

	statuses := func() ([]volstatus.Pool, error) { return poolStatuses(cfg.NodeID, here, promises, pools) }
	m.WatchPools(statuses)
	m.WatchReady(rec.Ready)
	m.WatchRequests(node.Waiting, node.MaxRequests())
	public := newHTTPHandler(m, rec, probeSelf(sock))
	status := newStatusHandler(public, rec, statuses)
	tcp := public
	if cfg.HTTPStatus {
		tcp = status
	}
	stopHTTP, err := serveHTTP(cfg, tcp, newLocalHandler(status, rec, ctrl.Collect))
	if err != nil {
		return err
	}
	defer stopHTTP()

	recCtx, stopRec := context.WithCancel(ctx)
	defer stopRec()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		rec.Run(recCtx)
	}()
	go func() {
		defer wg.Done()
		// A mount made or removed by anyone kicks a pass within a
		// millisecond (KickSoon: the plugin's own mounts need no pass of
		// their own), so an external unmount heals at once rather than at
		// the next resync.
		if err := devices.WatchMounts(recCtx, "/proc/self/mountinfo", rec.KickSoon); err != nil {
			logger.Error(err, "Cannot watch the mount table; changes are seen at each resync")
		}
	}()
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(lis) }()
	logger.Info("Serving", "endpoint", cfg.Endpoint, "driver", cfg.DriverName, "nodeID", cfg.NodeID,
		"stateDir", cfg.StateDir, "dataDir", cfg.DataDir, "roots", cfg.roots())

	select {
	case <-ctx.Done():
		err = nil
	case err = <-serveErr:
	}
	logger.Info("Stopping; mounts stay in place")
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(stopGrace):
		srv.Stop()
	}
	stopRec()
	wg.Wait()
	// The restores' copies end too, leaving no image: the provisioner's
	// retry makes each anew.
	promises.Close()
	return err
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

// openSnapshots prepares the snapshot directory of the data directory
// (made at the first snapshot): cleared of what interrupted copies left,
// and its way of copying found out in the data directory, on the same
// filesystem (reflinks where it shares blocks).
func openSnapshots(dataDir string) (*devices.Snapshots, error) {
	dir := filepath.Join(dataDir, "snapshots")
	if err := devices.RemoveStaleTemps(dir); err != nil {
		return nil, fmt.Errorf("removing interrupted snapshots: %w", err)
	}
	mode, err := devices.ProbeCopyMode(dataDir)
	if err != nil {
		// Never a reason not to start (the volumes' mounts are restored
		// by the start): copies then never share blocks, which is correct
		// anywhere, only slower where reflinks would have worked.
		klog.ErrorS(err, "Cannot tell whether the data directory shares blocks; snapshots are copied without")
		mode = devices.CopySparse
	}
	return &devices.Snapshots{Dir: dir, Mode: mode}, nil
}

// dropTempSnapshotIntents forgets the intents of the snapshots only a clone
// needed (see controller.cloneSource): a restart ended the CreateVolume that
// waited for them, and its retry asks again. With their files, which
// openSnapshots removed, nothing of an interrupted clone outlives a restart.
func dropTempSnapshotIntents(store *state.Store, snapshots *devices.Snapshots) error {
	for _, v := range store.List() {
		var temps []string
		for _, id := range v.SnapshotIDs() {
			if snapshots.IsTemp(id) {
				temps = append(temps, id)
			}
		}
		if len(temps) == 0 {
			continue
		}
		if _, err := store.Update(v.ID, func(cur *state.Volume) error {
			for _, id := range temps {
				if s := cur.Snapshots[id]; s != nil {
					cur.ForgetSnapshot(id, s.Generation)
				}
			}
			return nil
		}); err != nil {
			return fmt.Errorf("forgetting the snapshots of interrupted clones of %s: %w", v.ID, err)
		}
	}
	return nil
}
