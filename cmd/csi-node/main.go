// Command csi-node is the converge CSI node plugin. It parses flags into a
// driver.Config and runs the driver until SIGTERM or SIGINT; mounts stay in
// place when it stops. "csi-node status" and "csi-node gc" ask a running
// plugin, over its status socket, what it holds and what is left over.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/buildinfo"
	"github.com/converge-csi/converge/pkg/driver"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// poolFlag collects --pool flags, each parsed as it is given.
type poolFlag []driver.PoolSpec

func (p *poolFlag) String() string {
	names := make([]string, len(*p))
	for i, s := range *p {
		names[i] = s.Name + "=" + s.Dir
	}
	return strings.Join(names, ",")
}

func (p *poolFlag) Set(v string) error {
	s, err := driver.ParsePoolSpec(v)
	if err != nil {
		return err
	}
	*p = append(*p, s)
	return nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "status" {
		os.Exit(statusCommand(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "gc" {
		os.Exit(gcCommand(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	host, _ := os.Hostname()
	var cfg driver.Config
	var prefixes listFlag
	fs := flag.CommandLine
	fs.StringVar(&cfg.Endpoint, "endpoint", "unix:///var/lib/kubelet/plugins/converge.csi.dev/csi.sock", "CSI endpoint (unix:///path/csi.sock)")
	fs.StringVar(&cfg.NodeID, "node-id", host, "node name reported to Kubernetes")
	fs.StringVar(&cfg.DriverName, "driver-name", driver.DefaultDriverName, "CSI driver name")
	fs.StringVar(&cfg.StateDir, "state-dir", driver.DefaultStateDir, "directory of the state store (state.db and its log state.db-wal)")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "directory of the volume images of the default storage pool (default <state-dir>/volumes)")
	var pools poolFlag
	fs.Var(&pools, "pool", "a storage pool besides the default one, NAME=DIR[,guard=G][,ratio=R]: DIR on a filesystem of its own, guard and ratio overriding --pool-guard and --thin-overprovisioning-ratio for it (repeatable); a StorageClass chooses it with converge.csi.dev/pool: NAME")
	fs.StringVar(&cfg.KubeletDir, "kubelet-dir", driver.DefaultKubeletDir, "kubelet root; staging and target paths must lie inside it")
	fs.StringVar(&cfg.CgroupRoot, "cgroup-root", driver.DefaultCgroupRoot, "where the cgroup filesystems are mounted (blkio/ below it on cgroup v1, the unified hierarchy at it on v2); volumes' IO limits are set in the cgroups of the pods that publish them there")
	fs.Var(&prefixes, "allowed-path-prefix", "extra directory staging and target paths may lie in (repeatable)")
	var devicePrefixes listFlag
	fs.Var(&devicePrefixes, "allowed-device-prefix", "directory of stable device paths (e.g. /dev/disk/by-id) that static volumes may name (repeatable; none: static volumes are off)")
	fs.DurationVar(&cfg.ResyncPeriod, "resync-period", driver.DefaultResyncPeriod, "time between reconcile passes when nothing changes")
	fs.DurationVar(&cfg.MaxWait, "max-wait", driver.DefaultMaxWait, "longest an RPC waits when its context has no deadline")
	fs.Int64Var(&cfg.MaxVolumes, "max-volumes", 0, "volumes per node reported by NodeGetInfo (0: no limit)")
	fs.StringVar(&cfg.HTTPAddress, "http-address", "", "host:port serving /metrics, /healthz, /livez and /readyz (empty: only on <state-dir>/status.sock, which serves /status too)")
	fs.BoolVar(&cfg.HTTPStatus, "http-status", false, "serve /status, /status/pools and /status/pool on --http-address too (they name volumes, paths and errors: anyone who reaches the address reads them)")
	fs.IntVar(&cfg.MaxRequests, "max-requests", driver.DefaultMaxRequests, "node requests waiting for the reconciler at once; more get RESOURCE_EXHAUSTED")
	fs.Float64Var(&cfg.OverprovisioningRatio, "thin-overprovisioning-ratio", 1, "how many times the space that backs them thin volumes may be promised (at least 1; 1 never promises more than exists)")
	fs.StringVar(&cfg.PoolGuard, "pool-guard", "", "free space of each pool's filesystem that no volume is promised, below which thin volumes report PoolNearlyFull: a percentage of the filesystem (5%) or a size (2Gi) (default "+driver.KubeletPoolGuard+" on the filesystem of --kubelet-dir, where the kubelet evicts pods below "+strconv.Itoa(driver.KubeletEvictionPercent)+"%, and "+driver.DefaultPoolGuard+" elsewhere)")
	fs.Var(&cfg.Features, "feature-gates", "parts of CSI to turn on or off, Name=true or Name=false pairs separated by commas; each is off by default but ModifyVolume. Known: "+driver.FeatureNames())
	showVersion := fs.Bool("version", false, "print the version and exit")
	klog.InitFlags(fs)
	flag.Parse()

	cfg.Version = buildinfo.Version(version)
	if *showVersion {
		fmt.Println(cfg.Version)
		return
	}
	cfg.AllowedPathPrefixes = prefixes
	cfg.AllowedDevicePrefixes = devicePrefixes
	cfg.Pools = pools

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := driver.Run(ctx, cfg); err != nil {
		klog.ErrorS(err, "csi-node failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

// statusCommand runs "csi-node status": it asks the running plugin for its
// volumes and prints them. It exits 1 when it cannot, and also, after
// printing everything, when a pool could not be read (unreadable), as a
// script checking its exit status expects of a failing disk.
func statusCommand(args []string) int {
	fs := flag.NewFlagSet("status", flag.ExitOnError)
	stateDir := fs.String("state-dir", driver.DefaultStateDir, "state directory of the running plugin (its status socket is there)")
	addr := fs.String("http-address", "", "ask this host:port instead of the status socket (the plugin serves its status there only with --http-status)")
	output := fs.String("o", "table", "output format: table or json")
	fs.Parse(args)
	if *output != "table" && *output != "json" {
		fmt.Fprintf(os.Stderr, "csi-node status: -o must be table or json, not %q\n", *output)
		return 2
	}
	st, err := FetchStatus(context.Background(), *stateDir, *addr)
	if err == nil {
		err = PrintStatus(os.Stdout, st, *output == "json")
	}
	if err == nil {
		err = unreadable(st.Pools)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "csi-node status: %v\n", err)
		return 1
	}
	return 0
}
