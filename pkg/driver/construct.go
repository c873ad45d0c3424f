package driver

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
	"k8s.io/utils/clock"
	utilexec "k8s.io/utils/exec"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/controller"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/metrics"
	"github.com/converge-csi/converge/pkg/nodeserver"
	"github.com/converge-csi/converge/pkg/reconciler"
	"github.com/converge-csi/converge/pkg/state"
	"github.com/converge-csi/converge/pkg/volstatus"
)

// construct builds the plugin from cfg, once: the configuration checked,
// the kernel probed (devices.CheckKernel), the store opened, this node's
// pools found, one Paths for every part that resolves paths beneath the
// roots, and the reconciler, the CSI services and the HTTP handlers wired
// to them. It repairs nothing and
// serves nothing; on failure it releases what it opened.
func construct(ctx context.Context, cfg Config) (_ *plugin, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	// Before anything is opened or mounted: a kernel that lacks a call
	// converge makes refuses the start, naming it.
	if err := devices.CheckKernel(klog.FromContext(ctx)); err != nil {
		return nil, err
	}
	p := &plugin{cfg: cfg}
	if p.store, err = openStore(ctx, cfg); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	// Each pool promises what CreateVolume, snapshots, restores
	// and the reconciler's growth of images for NodeExpandVolume take of
	// it, under its own lock.
	if p.pools, err = openPools(p.store, cfg); err != nil {
		return nil, err
	}
	if p.sock, err = socketPath(cfg.Endpoint); err != nil {
		return nil, err
	}
	paths := devices.NewPaths(cfg.roots())
	m := metrics.New()
	p.removals = devices.NewRemovals(clock.RealClock{})
	p.observer = &devices.Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block", Paths: paths, Pools: p.pools.Dirs()}
	topology := map[string]string{contract.TopologyKey: cfg.NodeID}
	// The controller kicks the reconciler built just below: limits a
	// modification records are held at once.
	ctrl := controller.New(p.pools, p.store, topology, controller.Options{SnapshotTopology: cfg.Features.Enabled(SnapshotAccessibility), ModifyVolume: cfg.Features.Enabled(ModifyVolume),
		Kick: func() { p.rec.Kick() }})
	if p.rec, err = p.newReconciler(m, paths); err != nil {
		return nil, err
	}
	node, err := p.newNodeServer(topology)
	if err != nil {
		return nil, err
	}
	// Snapshots are intents of the node's records: the node server asks
	// the reconciler for them and waits, on the controller's behalf.
	ctrl.ServeSnapshots(node)
	// A deletion withdraws a stage the kubelet forgot, through
	// the node server, and waits for its unstage.
	ctrl.WithdrawStagesBy(node)
	p.grpc = newGRPCServer(cfg, m, p.rec, ctrl, node)
	p.maxConns = node.MaxRequests() + reservedConnections

	p.serveHTTP(m, node, ctrl)
	return p, nil
}

// serveHTTP wires the metrics to what they watch, and the HTTP handlers
// of the pod network (p.tcp) and of the status socket (p.local).
func (p *plugin) serveHTTP(m *metrics.Metrics, node *nodeserver.Server, ctrl *controller.Controller) {
	statuses := func() []volstatus.PoolStatus { return p.pools.Statuses(p.cfg.NodeID) }
	// What the pod network reaches reads the pools at most every
	// poolMetricsAge; the status socket, root's alone, reads them fresh.
	recentStatuses := recent(statuses, poolMetricsAge, clock.RealClock{})
	m.WatchPools(recentStatuses)
	m.WatchReady(p.rec.Ready)
	m.WatchRequests(node.Waiting, node.MaxRequests())
	public := newHTTPHandler(m, p.rec, shareCheck(probeSelf(p.sock), sharedCheckAge, clock.RealClock{}))
	status := newStatusHandler(public, p.rec, statuses)
	p.tcp, p.local = public, newLocalHandler(status, p.rec, ctrl.Collect)
	if p.cfg.HTTPStatus {
		p.tcp = newStatusHandler(public, p.rec, recentStatuses)
	}
}

// openStore opens the store in the state directory, made when missing.
// Opening replays the log of a run that ended without a checkpoint
// (killed or crashed): the first of the repairs of a start.
func openStore(ctx context.Context, cfg Config) (*state.Store, error) {
	// The store decides what is mounted where: its directory, as a pool's,
	// is root's alone, with no symlink on its path.
	if err := devices.MakeTrustedDir(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	store, err := state.OpenWith(filepath.Join(cfg.StateDir, "state.db"), state.Options{Release: cfg.Version})
	if err != nil {
		return nil, err
	}
	if n := store.Replayed(); n > 0 {
		klog.FromContext(ctx).Info("Replayed the state log", "records", n)
	}
	return store, nil
}

// newReconciler builds the reconciler of the plugin's store, observer and
// pools, recording into m.
func (p *plugin) newReconciler(m *metrics.Metrics, paths *devices.Paths) (*reconciler.Reconciler, error) {
	var static reconciler.Static
	if len(p.cfg.AllowedDevicePrefixes) > 0 {
		static = devices.StaticDevices{Prefixes: p.cfg.AllowedDevicePrefixes, SysDevBlock: "/sys/dev/block"}
	}
	pools := map[string]reconciler.Pool{}
	for _, pl := range p.pools.All() {
		pools[pl.Name()] = pl
	}
	throttler, noThrottler := detectThrottler(p.cfg.CgroupRoot)
	return reconciler.New(reconciler.Config{
		Recorder:    m,
		Static:      static,
		Throttler:   throttler,
		NoThrottler: noThrottler,
		KubeletDir:  p.cfg.KubeletDir,
		Store:       p.store,
		Observer:    p.observer,
		Loops:       devices.NewLoopDevices(p.removals, p.observer),
		// mount(8) only for what is not ext4, xfs or btrfs: those mount
		// through the kernel's mount API, after mount-utils' decisions.
		Filesystems: devices.NewMounter(devices.NewFsMounter(mount.NewWithoutSystemd(""), paths, devices.SELinuxEnabled()),
			utilexec.New(), maxFormats, paths),
		Paths:        paths,
		Pools:        pools,
		Roots:        p.cfg.roots(),
		Clock:        clock.RealClock{},
		ResyncPeriod: p.cfg.ResyncPeriod,
	})
}

// detectThrottler finds the io controller below root, once: the
// reconciler's Throttler, or nil and why there is none. A node without one
// runs all the same (the volumes that ask for IO limits say why they are
// not held); this is logged once, at start.
func detectThrottler(root string) (reconciler.Throttler, string) {
	c, err := devices.DetectCgroupIO(root)
	if err != nil {
		klog.InfoS("IO limits cannot be applied on this node; volumes that ask for them report IOLimitsNotApplied", "cgroupRoot", root, "err", err)
		return nil, err.Error()
	}
	klog.V(2).InfoS("IO limits are applied through cgroups", "cgroupRoot", root, "version", c.Version, "hierarchy", c.Root)
	if c.Problem != "" {
		// Not fatal: the controller may be enabled later, and until then
		// each volume that asks for limits reports IOLimitsNotApplied.
		klog.InfoS("IO limits may not be applied to pods: the io controller is not enabled below the cgroup root", "cgroupRoot", root, "problem", c.Problem)
	}
	return c, ""
}

// newNodeServer builds the CSI Node service of the plugin's store, which
// kicks its reconciler.
func (p *plugin) newNodeServer(topology map[string]string) (*nodeserver.Server, error) {
	cfg, store := p.cfg, p.store
	return nodeserver.New(nodeserver.Config{
		Store:           store,
		Kicker:          p.rec,
		Stat:            devices.Statfs,
		Capacity:        p.pools.ImageSize,
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
}

// newGRPCServer returns the gRPC server of the CSI Identity, Controller and
// Node services, bounded and intercepted; serve gives it its listener.
func newGRPCServer(cfg Config, m *metrics.Metrics, rec *reconciler.Reconciler, ctrl *controller.Controller, node *nodeserver.Server) *grpc.Server {
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(recoverPanics, observeCalls(m), logCalls),
		grpc.MaxConcurrentStreams(maxStreams), grpc.MaxRecvMsgSize(maxMessage))
	csi.RegisterIdentityServer(srv, &identity{name: cfg.DriverName, version: cfg.Version, ready: rec.Ready,
		snapshotAccessibility: cfg.Features.Enabled(SnapshotAccessibility)})
	csi.RegisterControllerServer(srv, ctrl)
	csi.RegisterGroupControllerServer(srv, ctrl.Groups())
	csi.RegisterNodeServer(srv, node)
	return srv
}
