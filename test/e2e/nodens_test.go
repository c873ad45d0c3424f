package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNodeNamespaceHoldsNoForeignMount starts a node's namespaces while a
// loop-backed filesystem of someone else's is mounted on the host, as
// test/fault's are while make test runs it beside the cluster, and checks
// that the node's copy of that mount does not keep the loop device open
// once its owner unmounts and detaches it.
func TestNodeNamespaceHoldsNoForeignMount(t *testing.T) {
	dir := t.TempDir()
	image := filepath.Join(dir, "foreign.img")
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(image, 16<<20); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run("mkfs.ext4", "-q", image)
	dev := run("losetup", "--find", "--show", image)
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	at := filepath.Join(dir, "foreign")
	if err := os.Mkdir(at, 0o755); err != nil {
		t.Fatal(err)
	}
	run("mount", dev, at)
	t.Cleanup(func() { exec.Command("umount", at).Run() })

	var own [4]string
	for i := range own {
		own[i] = filepath.Join(dir, "node", []string{"logs", "kubelet", "state", "pools"}[i])
		if err := os.MkdirAll(own[i], 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ns, err := startNodeNS(own[0], own[1], own[2], own[3])
	if err != nil {
		t.Fatal(err)
	}
	defer ns.init.kill()

	run("umount", at)
	run("losetup", "-d", dev)
	backing := filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file")
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(backing)
		if err != nil || !strings.HasPrefix(string(b), image) {
			return // detached: nothing holds it
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still backs %s 5s after its unmount and detach on the host: the node's namespace holds a copy of its mount (%s)", image, dev, ns.mountinfo())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
