package driver

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/nodeserver"
	"github.com/converge-csi/converge/pkg/pool"
	"github.com/converge-csi/converge/pkg/reconciler"
)

// Defaults of Config.
const (
	DefaultStateDir   = "/var/lib/converge"
	DefaultKubeletDir = "/var/lib/kubelet"
	// DefaultCgroupRoot is where the cgroup filesystems are mounted: the
	// blkio hierarchy (v1) below it, or the unified one (v2) at it.
	DefaultCgroupRoot = "/sys/fs/cgroup"
	// DefaultDriverName is the published driver name, for the flags.
	DefaultDriverName = contract.DefaultDriverName

	// The defaults of the packages the plugin wires, for the flags.
	DefaultResyncPeriod = reconciler.DefaultResyncPeriod
	DefaultMaxWait      = nodeserver.DefaultMaxWait
	DefaultMaxRequests  = nodeserver.DefaultMaxRequests
	// DefaultPoolGuard and KubeletPoolGuard are a pool's guard elsewhere
	// and on the kubelet's filesystem, where the kubelet evicts pods below
	// KubeletEvictionPercent free.
	DefaultPoolGuard       = capacity.DefaultGuard
	KubeletPoolGuard       = capacity.KubeletGuard
	KubeletEvictionPercent = capacity.KubeletEvictionPercent
)

// Config is everything the plugin is configured with; cmd/csi-node fills it
// from flags.
type Config struct {
	// Endpoint is the CSI endpoint, unix:///path/to/csi.sock.
	Endpoint string
	// DriverName is the CSI driver name.
	DriverName string
	// NodeID is this node's name.
	NodeID string
	// Version is reported by GetPluginInfo.
	Version string
	// StateDir holds the store (state.db).
	StateDir string
	// DataDir holds the volume images of the default storage pool;
	// defaults to <StateDir>/volumes.
	DataDir string
	// Pools are the storage pools besides the default one.
	Pools []PoolSpec
	// pools are all the pools, the default first, resolved.
	pools []pool.Options
	// KubeletDir is the kubelet's root; staging and target paths lie in it.
	KubeletDir string
	// CgroupRoot holds the cgroup hierarchies in which pods' IO is held
	// to their volumes' IO limits (devices.DetectCgroupIO); found once at
	// start. Without an io controller there, csi-node runs all the same
	// and reports the volumes that ask for limits.
	CgroupRoot string
	// AllowedPathPrefixes are extra roots for staging and target paths.
	AllowedPathPrefixes []string
	// AllowedDevicePrefixes are the directories whose entries a static
	// volume may name as its device; none disables static volumes.
	AllowedDevicePrefixes []string
	// ResyncPeriod is the time between reconcile passes without a kick.
	ResyncPeriod time.Duration
	// MaxWait is the longest an RPC waits when its context has no deadline.
	MaxWait time.Duration
	// MaxVolumes is reported by NodeGetInfo; 0 means no limit.
	MaxVolumes int64
	// MaxRequests bounds the node requests waiting for the reconciler at
	// once; more are refused with RESOURCE_EXHAUSTED. 0 takes the default.
	MaxRequests int
	// HTTPAddress serves /metrics, /healthz and /readyz over TCP
	// (host:port); empty for none. They are always served on StatusSocket,
	// with /status.
	HTTPAddress string
	// HTTPStatus serves /status, /status/pools and /status/pool on
	// HTTPAddress too. Off by default: they name volume IDs, paths and
	// errors, and HTTPAddress is usually open to every pod of the cluster.
	HTTPStatus bool
	// OverprovisioningRatio is how many times the space that backs them
	// thin volumes may be promised; 1 (the default) never promises more
	// than exists.
	OverprovisioningRatio float64
	// PoolGuard is the free space of a pool's filesystem that no volume
	// is promised, and below which thin volumes are reported ("5%",
	// "2Gi"); a pool's own guard overrides it. Empty: each pool's default
	// for its filesystem (capacity.DefaultGuardFor), which keeps the
	// kubelet's filesystem above its eviction threshold.
	PoolGuard string
	// guard is PoolGuard, parsed; nil when it is empty.
	guard *capacity.Guard
	// Features are the parts of CSI turned on or off; each is off by
	// default but ModifyVolume.
	Features FeatureGates
}

// StatusSocket is the unix socket, in the state directory, on which a
// running plugin serves its status (and metrics), for csi-node status.
func StatusSocket(stateDir string) string { return filepath.Join(stateDir, "status.sock") }

// defaultDirs fills the names and directories not given.
func (c *Config) defaultDirs() {
	c.DriverName = cmp.Or(c.DriverName, DefaultDriverName)
	c.StateDir = cmp.Or(c.StateDir, DefaultStateDir)
	c.DataDir = cmp.Or(c.DataDir, filepath.Join(c.StateDir, "volumes"))
	c.KubeletDir = cmp.Or(c.KubeletDir, DefaultKubeletDir)
	c.CgroupRoot = cmp.Or(c.CgroupRoot, DefaultCgroupRoot)
}

// withDefaults fills defaults and validates.
func (c Config) withDefaults() (Config, error) {
	c.defaultDirs()
	if c.NodeID == "" {
		return c, errors.New("node ID is required")
	}
	if c.MaxVolumes < 0 {
		return c, errors.New("max volumes must not be negative")
	}
	if c.HTTPStatus && c.HTTPAddress == "" {
		return c, errors.New("--http-status serves the status on --http-address, which is not set")
	}
	if c.OverprovisioningRatio == 0 {
		c.OverprovisioningRatio = 1
	}
	if err := capacity.CheckRatio(c.OverprovisioningRatio); err != nil {
		return c, fmt.Errorf("--thin-overprovisioning-ratio %w", err)
	}
	if c.PoolGuard != "" {
		g, err := capacity.ParseGuard(c.PoolGuard)
		if err != nil {
			return c, fmt.Errorf("--pool-guard %w", err)
		}
		c.guard = &g
	}
	var err error
	dirs := append([]string{c.StateDir, c.DataDir, c.KubeletDir}, c.AllowedPathPrefixes...)
	if c.pools, err = c.resolvePools(); err != nil {
		return c, err
	}
	for _, d := range append(dirs, c.AllowedDevicePrefixes...) {
		if !filepath.IsAbs(d) || filepath.Clean(d) != d || d == "/" {
			return c, fmt.Errorf("directory %q must be an absolute, clean path other than /", d)
		}
	}
	if _, err := socketPath(c.Endpoint); err != nil {
		return c, err
	}
	// The mount table names mounts by their real path: a root reached
	// through a symlink would never match what the kubelet asks for, and the
	// reconciler would mount again on every pass.
	for _, r := range c.roots() {
		if real, err := filepath.EvalSymlinks(r); err == nil && real != r {
			return c, fmt.Errorf("root %s is reached through a symlink (it is %s); pass the real path", r, real)
		}
	}
	return c, nil
}

// roots returns the directories staging and target paths may lie in.
func (c Config) roots() []string {
	return append([]string{c.KubeletDir}, c.AllowedPathPrefixes...)
}

// socketPath returns the file of a unix:// endpoint.
func socketPath(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "unix" {
		return "", fmt.Errorf("endpoint %q must be unix:///absolute/path", endpoint)
	}
	p := u.Path
	if u.Host != "" {
		p = u.Host + p // unix://relative/path
	}
	if !strings.HasPrefix(p, "/") || filepath.Clean(p) != p {
		return "", fmt.Errorf("endpoint %q must name an absolute, clean socket path", endpoint)
	}
	return p, nil
}
