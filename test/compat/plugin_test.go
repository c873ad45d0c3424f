package compat

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// binary is csi-node built from this repository by TestMain.
var binary string

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		// Staging and publishing mount; the plugin needs root.
		println("compat: skipped: needs root")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "converge-compat-bin-")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "csi-node")
	_, self, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "build", "-tags", "lockorder", "-o", binary, "./cmd/csi-node")
	cmd.Dir = filepath.Join(filepath.Dir(self), "..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		println("compat: go build csi-node:", err.Error(), string(out))
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// plugin is a running csi-node in a directory of its own, its staging and
// target paths under root.
type plugin struct {
	dir, root string
	cmd       *exec.Cmd
	conn      *grpc.ClientConn
}

// start runs csi-node with args after the ones every test needs, waits
// until Probe reports ready, and registers the clean-up, which fails the
// test for a mount or loop device left under the directory.
func start(t *testing.T, args ...string) *plugin {
	t.Helper()
	dir, err := os.MkdirTemp("", "converge-compat-")
	if err != nil {
		t.Fatal(err)
	}
	p := &plugin{dir: dir, root: filepath.Join(dir, "pods")}
	if err := os.MkdirAll(p.root, 0o750); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "plugin.log"))
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "csi.sock")
	p.cmd = exec.Command(binary, append([]string{
		"--endpoint=unix://" + sock, "--node-id=compat-node",
		"--state-dir=" + filepath.Join(dir, "state"), "--kubelet-dir=" + filepath.Join(dir, "kubelet"),
		"--allowed-path-prefix=" + p.root, "-v=4",
		// The one flag not left at its default: the default guard (20%
		// of the filesystem the test kubelet directory shares) would
		// refuse every volume whenever the machine's disk is more than
		// four-fifths full of other things; what the guard is changes
		// nothing on the wire.
		"--pool-guard=5%",
	}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		p.cmd.Wait()
		log.Close()
		if p.conn != nil {
			p.conn.Close()
		}
		for _, left := range p.leftovers() {
			t.Errorf("left behind: %s", left)
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "plugin.log"))
			t.Logf("plugin log (tail):\n%s", tail(string(b), 40))
		}
		os.RemoveAll(dir)
	})
	p.conn, err = grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := csi.NewIdentityClient(p.conn).Probe(ctx, &csi.ProbeRequest{})
		cancel()
		if err == nil && resp.GetReady().GetValue() {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("csi-node not ready after 30 s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// leftovers unmounts every mount under the plugin's directory and detaches
// every loop device backed by a file in it, and names each.
func (p *plugin) leftovers() []string {
	var left []string
	f, err := os.Open("/proc/self/mountinfo")
	if err == nil {
		var mounts []string
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fields := strings.Fields(sc.Text()); len(fields) > 4 && strings.HasPrefix(fields[4], p.dir+"/") {
				mounts = append(mounts, fields[4])
			}
		}
		f.Close()
		for i := len(mounts) - 1; i >= 0; i-- {
			left = append(left, "mount "+mounts[i])
			unix.Unmount(mounts[i], unix.MNT_DETACH)
		}
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, bf := range loops {
		b, err := os.ReadFile(bf)
		if err != nil || !strings.HasPrefix(string(b), p.dir+"/") {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(bf)))
		left = append(left, "loop device "+dev)
		exec.Command("losetup", "-d", dev).Run()
	}
	return left
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
