// Package testenv runs the real csi-node binary for integration tests: on a
// unix socket in a temporary directory, with real loop devices and mounts,
// and with a cleanup that fails the test if anything of the plugin's is left
// mounted or attached, and then removes it anyway so the machine stays clean.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/test/testenv/poll"
)

// build is csi-node built once per test process with some tags.
type build struct {
	once sync.Once
	path string
	err  error
}

// builds holds a build for each set of tags: the tests' and the
// benchmarks'.
var builds = map[string]*build{BuildTags: {}, "": {}}

// BuildTags are the tags of the csi-node the tests run: lockorder makes
// its mutexes go-deadlock's (pkg/locks), so that a plugin that takes two
// locks in both orders exits, and the test that drove it fails. A
// benchmark runs the binary nodes run, built without them: the check's
// bookkeeping would be measured too.
const BuildTags = "lockorder"

// Binary builds csi-node once per test process (with BuildTags for a
// test, without for a benchmark) and returns its path (or returns
// $CONVERGE_BINARY's, when set). The binary lives in converge-bin-<pid>
// in the temporary directory; the directories of test processes that have
// ended are removed first, since a test process has no hook to remove its
// own at exit.
func Binary(t testing.TB) string {
	t.Helper()
	tags := BuildTags
	if _, bench := t.(*testing.B); bench {
		tags = ""
	}
	b := builds[tags]
	b.once.Do(func() {
		if env := os.Getenv(BinaryEnv); env != "" {
			// Another build (an earlier commit's), to measure it beside
			// this one in the same machine state.
			b.path = env
			return
		}
		_, self, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(self), "..", "..")
		removeStaleBinaries()
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("converge-bin-%d", os.Getpid()))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, "csi-node")
		if tags != "" {
			b.path += "-" + tags
		}
		cmd := exec.Command("go", "build", "-tags", tags, "-o", b.path, "./cmd/csi-node")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("building csi-node: %v\n%s", err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// BinaryEnv names the environment variable that, when set, is the path of
// the csi-node binary the tests run instead of one built from this tree.
const BinaryEnv = "CONVERGE_BINARY"

// NodeID is the node name every test plugin runs with; the IDs of the
// volumes and snapshots it makes end with it.
const NodeID = "test-node"

// removeStaleBinaries removes the converge-bin-<pid> directories whose
// process is gone.
func removeStaleBinaries() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "converge-bin-*"))
	for _, d := range dirs {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), "converge-bin-"))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			os.RemoveAll(d)
		}
	}
}

// RequireRoot skips t unless it runs as root with loop devices available.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices and mounts")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("needs /dev/loop-control")
	}
}

// Plugin is a running csi-node.
type Plugin struct {
	// Dir is the test's directory; everything the plugin makes is under it.
	Dir string
	// Socket is the CSI socket path.
	Socket string
	// StateDir and DataDir are the plugin's directories.
	StateDir, DataDir string
	// Root is the allowed path prefix for staging and target paths.
	Root string
	// Args are extra flags.
	Args []string
	// Binary is the csi-node binary to run; "" runs Binary's.
	Binary string
	// Env is added to the environment the plugin runs in.
	Env []string

	t   testing.TB
	cmd *exec.Cmd
	log *os.File
	// connMu guards conn, which a test's goroutines use while the main
	// one kills and restarts the plugin.
	connMu sync.Mutex
	conn   *grpc.ClientConn
}

// VolumeHealth is the flag that turns on NodeGetVolumeHealth, by which
// tests read what the reconciler sees of a volume.
const VolumeHealth = "--feature-gates=VolumeHealth=true"

// New prepares a plugin in a fresh directory and registers the cleanup
// that checks and clears every mount and loop device under it. It does not
// start the plugin.
func New(t testing.TB, args ...string) *Plugin {
	t.Helper()
	RequireRoot(t)
	dir, err := os.MkdirTemp("", "converge-test-")
	if err != nil {
		t.Fatal(err)
	}
	p := &Plugin{
		Dir:      dir,
		Socket:   filepath.Join(dir, "csi.sock"),
		StateDir: filepath.Join(dir, "state"),
		DataDir:  filepath.Join(dir, "state", "volumes"),
		Root:     filepath.Join(dir, "pods"),
		Args:     args,
		t:        t,
	}
	if err := os.MkdirAll(p.Root, 0o750); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop()
		left := Leftovers(p.Dir, p.DataDir)
		if len(left) > 0 {
			t.Errorf("left behind after the test: %s", strings.Join(left, "; "))
		}
		ForceClean(p.Dir, p.DataDir)
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "plugin.log")); err == nil {
				t.Logf("plugin log (tail):\n%s", tail(string(b), 60))
			}
		}
		os.RemoveAll(dir)
	})
	return p
}

// Start runs the plugin and waits until Probe reports ready.
func (p *Plugin) Start() {
	p.t.Helper()
	p.Launch()
	p.WaitReady()
}

// hostGuardPercent is the guard a plugin whose data directory is on the
// machine's own filesystem runs with, unless its test names one: the
// default (20% on the kubelet's filesystem, which the test's kubelet
// directory shares) would refuse every volume whenever the machine's disk
// is more than four-fifths full with things of its own, such as build
// caches. A test that puts the data directory on a filesystem of its own
// gets the default, as it may test it.
const hostGuardPercent = "5%"

// hostGuard is --pool-guard=hostGuardPercent for a plugin whose data
// directory is on the filesystem of its test's directory, and whose Args
// name no guard; nothing otherwise.
func (p *Plugin) hostGuard() []string {
	for _, a := range p.Args {
		if a == "--pool-guard" || strings.HasPrefix(a, "--pool-guard=") {
			return nil
		}
	}
	dir := p.DataDir
	for {
		if _, err := os.Stat(dir); err == nil || filepath.Dir(dir) == dir {
			break
		}
		dir = filepath.Dir(dir)
	}
	var data, own syscall.Stat_t
	if syscall.Stat(dir, &data) != nil || syscall.Stat(p.Dir, &own) != nil || data.Dev != own.Dev {
		return nil
	}
	return []string{"--pool-guard=" + hostGuardPercent}
}

// Launch runs the plugin and connects to it, without waiting for it to be
// ready (WaitReady does).
func (p *Plugin) Launch() {
	p.t.Helper()
	log, err := os.OpenFile(filepath.Join(p.Dir, "plugin.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		p.t.Fatal(err)
	}
	args := append([]string{
		"--endpoint", "unix://" + p.Socket,
		"--node-id", NodeID,
		"--state-dir", p.StateDir,
		"--kubelet-dir", filepath.Join(p.Dir, "kubelet"),
		"--allowed-path-prefix", p.Root,
		"-v", "4",
	}, p.hostGuard()...)
	args = append(args, p.Args...)
	bin := p.Binary
	if bin == "" {
		bin = Binary(p.t)
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), p.Env...)
	p.cmd.Stdout, p.cmd.Stderr = log, log
	p.log = log
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+p.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.t.Fatal(err)
	}
	p.connMu.Lock()
	p.conn = conn
	p.connMu.Unlock()
}

// WaitReady waits until the launched plugin's Probe reports ready.
func (p *Plugin) WaitReady() {
	p.t.Helper()
	conn := p.Conn()
	poll.Until(p.t, 30*time.Second, 50*time.Millisecond, "plugin ready", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
		if err == nil && !resp.GetReady().GetValue() {
			err = errors.New("Probe answers not ready")
		}
		return err
	})
}

// PID returns the process ID of the running plugin.
func (p *Plugin) PID() int { return p.cmd.Process.Pid }

// Log returns what the plugin has logged so far.
func (p *Plugin) Log() string {
	p.t.Helper()
	b, err := os.ReadFile(filepath.Join(p.Dir, "plugin.log"))
	if err != nil {
		p.t.Fatal(err)
	}
	return string(b)
}

// Conn returns the client connection to the plugin.
func (p *Plugin) Conn() *grpc.ClientConn {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	return p.conn
}

// Node returns a Node client.
func (p *Plugin) Node() csi.NodeClient { return csi.NewNodeClient(p.Conn()) }

// Controller returns a Controller client.
func (p *Plugin) Controller() csi.ControllerClient { return csi.NewControllerClient(p.Conn()) }

// Groups returns a client of the plugin's GroupController service.
func (p *Plugin) Groups() csi.GroupControllerClient { return csi.NewGroupControllerClient(p.Conn()) }

// Stop sends SIGTERM and waits for the plugin to exit.
func (p *Plugin) Stop() { p.signal(syscall.SIGTERM) }

// Kill sends SIGKILL and waits for the plugin to exit.
func (p *Plugin) Kill() { p.signal(syscall.SIGKILL) }

// Terminate sends SIGTERM and returns at once: the plugin shuts down while
// the test watches (Kill or Stop waits for it).
func (p *Plugin) Terminate() {
	if p.cmd != nil {
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
}

func (p *Plugin) signal(sig syscall.Signal) {
	// The connection is closed but kept: calls racing with the kill fail
	// (Canceled, which the kubelet retries) instead of dereferencing nil.
	p.connMu.Lock()
	if p.conn != nil {
		p.conn.Close()
	}
	p.connMu.Unlock()
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Signal(sig)
	p.cmd.Wait()
	p.cmd = nil
	p.log.Close()
}

// CheckDetached fails t unless no loop device is attached to volume id's
// image: what an answered NodeUnstageVolume promises.
func (p *Plugin) CheckDetached(t testing.TB, id string) {
	t.Helper()
	image := filepath.Join(p.DataDir, id+".img")
	for dev, backing := range loopsIn(p.DataDir) {
		if backing == image {
			t.Errorf("volume %s unstaged, and its image is still attached to %s", id, dev)
		}
	}
}

// Leftovers lists the mounts under dir and the loop devices backed by files
// in dataDir.
func Leftovers(dir, dataDir string) []string {
	var out []string
	for _, m := range mountsUnder(dir) {
		out = append(out, "mount "+m)
	}
	for dev, backing := range loopsIn(dataDir) {
		out = append(out, "loop "+dev+" -> "+backing)
	}
	return out
}

// ForceClean detaches the loop devices backed by files in dataDir (a
// mounted one goes with its last mount) and unmounts everything under dir
// (deepest first): the devices first, while their files are still found
// where dataDir is a mount of its own. It returns once those devices are
// gone, or after ten seconds: a lazily unmounted filesystem lets go of its
// device in the kernel's own time, after the unmount has returned.
func ForceClean(dir, dataDir string) {
	loops := loopsIn(dataDir)
	for dev := range loops {
		exec.Command("losetup", "-d", dev).Run()
	}
	defer waitLoopsGone(loops)
	for range 5 {
		ms := mountsUnder(dir)
		if len(ms) == 0 {
			break
		}
		for i := len(ms) - 1; i >= 0; i-- {
			syscall.Unmount(ms[i], syscall.MNT_DETACH)
		}
	}
	// A target a repair sealed (devices.Seal) would stay in the way of
	// the removal of dir.
	devices.UnsealTree(dir)
}

// waitLoopsGone waits up to ten seconds until none of loops (device to
// backing file) is bound to its file any more.
func waitLoopsGone(loops map[string]string) {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		bound := false
		for dev, backing := range loops {
			b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
			if err == nil && strings.TrimSpace(string(b)) == backing {
				bound = true
			}
		}
		if !bound {
			return
		}
	}
}

func mountsUnder(dir string) []string {
	ms, err := devices.ReadMounts("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, m := range ms {
		if strings.HasPrefix(m.Path, dir+"/") {
			out = append(out, m.Path)
		}
	}
	return out
}

func loopsIn(dataDir string) map[string]string {
	out := map[string]string{}
	entries, _ := os.ReadDir("/sys/block")
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "loop", "backing_file"))
		if err != nil {
			continue
		}
		backing := strings.TrimSpace(string(b))
		if strings.HasPrefix(backing, dataDir+"/") {
			out["/dev/"+e.Name()] = backing
		}
	}
	return out
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// SanityConfig returns the csi-sanity configuration for a started plugin:
// its socket, staging and target paths under its root, volumes of size
// bytes (expanded to twice that), each idempotency spec repeated five
// times. The caller sets the access type.
func (p *Plugin) SanityConfig(size int64) sanity.TestConfig {
	cfg := sanity.NewTestConfig()
	cfg.Address = "unix://" + p.Socket
	cfg.TargetPath = filepath.Join(p.Root, "target")
	cfg.StagingPath = filepath.Join(p.Root, "staging")
	cfg.TestVolumeSize = size
	cfg.TestVolumeExpandSize = 2 * size
	cfg.IdempotentCount = 5
	cfg.TestNodeVolumeAttachLimit = false
	// A VolumeAttributesClass's parameters, for the CreateVolume and
	// ControllerModifyVolume tests csi-sanity runs since the plugin
	// advertises MODIFY_VOLUME: IO limits, which the sanity's publishes
	// (at targets of no pod) hold no pod to.
	cfg.TestVolumeMutableParameters = map[string]string{"maxReadIops": "1000", "maxWriteBps": "100Mi"}
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithUnaryInterceptor(settleSizeCache))
	return cfg
}

// settleSizeCache computes the size of every answer csi-sanity receives,
// which changes no field of it. csi-sanity v5.6.0 compares the topology
// of a snapshot it received with one of NodeGetInfo's that it has since
// sent in two requests, with gomega's Equal: reflect.DeepEqual, which
// also compares protobuf's internal size cache, set on a message when it
// is sent and not on one just received. Equal topologies then differ in
// that cache alone. With every answer's sizes computed, the comparison
// sees the fields, as proto.Equal does (the controller's
// TestSnapshotTopology compares with proto.Equal).
func settleSizeCache(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if m, ok := reply.(proto.Message); ok && err == nil {
		proto.Size(m)
	}
	return err
}

// capSysResource is the bit of CAP_SYS_RESOURCE in a capability set.
const capSysResource = 24

// CanGrowExt4Online reports whether this process may grow a mounted ext4:
// the kernel's online resize needs CAP_SYS_RESOURCE, which root lacks on
// some machines (privileged pods have it). The plugin then answers the
// growth FAILED_PRECONDITION and grows the filesystem unmounted instead.
func CanGrowExt4Online() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			v, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			return err == nil && v&(1<<capSysResource) != 0
		}
	}
	return false
}

// CheckSanityCleanup fails t when csi-sanity left its staging directory.
func CheckSanityCleanup(t testing.TB, cfg sanity.TestConfig) {
	if _, err := os.Stat(cfg.StagingPath); err == nil {
		t.Errorf("csi-sanity left %s behind", cfg.StagingPath)
	}
}

// StatusGet fetches path (e.g. /metrics) from the plugin's status socket
// and returns the HTTP status code and body.
func (p *Plugin) StatusGet(path string) (int, string) {
	p.t.Helper()
	sock := filepath.Join(p.StateDir, "status.sock")
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := client.Get("http://converge" + path)
	if err != nil {
		p.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		p.t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, string(b)
}
