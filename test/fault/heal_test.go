package fault

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-csi/converge/test/testenv"
	"github.com/converge-csi/converge/test/testenv/poll"
)

// resync is short so that healing tests wait little; healing must happen
// within one resync period of the change.
const resync = 200 * time.Millisecond

// eventually polls cond until it holds or a generous bound (many resync
// periods) passes. It waits for a state, it does not time anything.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 50*resync, resync/4, what, func() error {
		if !cond() {
			return errors.New("not healed")
		}
		return nil
	})
}

// passes is how many passes p has made (its metrics say).
func passes(t *testing.T, p *testenv.Plugin) int {
	t.Helper()
	_, raw := p.StatusGet("/metrics")
	n := -1
	for _, line := range strings.Split(raw, "\n") {
		fmt.Sscanf(line, "converge_reconcile_pass_duration_seconds_count %d", &n)
	}
	if n < 0 {
		t.Fatal("the metrics do not count passes")
	}
	return n
}

// afterPasses returns once p has made n passes more than now: for a check
// that something does not happen, as many chances as it needs to.
func afterPasses(t *testing.T, p *testenv.Plugin, n int) {
	t.Helper()
	seen := passes(t, p)
	eventually(t, fmt.Sprintf("%d passes", n), func() bool { return passes(t, p) >= seen+n })
}

// setUp creates a volume named name, stages and publishes it and writes a
// file to it.
func setUp(t *testing.T, p *testenv.Plugin, name string) *vol {
	t.Helper()
	return setUpAs(t, p, name, "")
}

// setUpAs is setUp of a volume of filesystem fsType ("" for the default).
func setUpAs(t *testing.T, p *testenv.Plugin, name, fsType string) *vol {
	t.Helper()
	e := &env{t: t, p: p}
	v := &vol{name: name, id: vid(name), staging: filepath.Join(p.Root, "staging", name), target: filepath.Join(p.Root, "pods", name, "mount"), want: published, fsType: fsType}
	for _, d := range []string{v.staging, filepath.Dir(v.target)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.drive(ctx, v, absent); err != nil {
		t.Fatalf("setting up %s: %v", name, err)
	}
	v.files = map[string]string{"data": "payload of " + name}
	if err := writeSynced(filepath.Join(v.target, "data"), v.files["data"]); err != nil {
		t.Fatal(err)
	}
	return v
}

func readBack(t *testing.T, v *vol) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(v.target, "data"))
	if err != nil || string(b) != v.files["data"] {
		t.Fatalf("%s: read back %q, %v; want %q", v.id, b, err, v.files["data"])
	}
}

func tearDown(t *testing.T, p *testenv.Plugin, v *vol) {
	t.Helper()
	v.want = absent
	(&env{t: t, p: p}).replay(v)
}

func TestSelfHealing(t *testing.T) {
	p := testenv.New(t, "--resync-period", resync.String())
	p.Start()
	v := setUp(t, p, "heal")

	t.Run("publish unmounted from outside", func(t *testing.T) {
		if err := syscall.Unmount(v.target, 0); err != nil {
			t.Fatal(err)
		}
		eventually(t, "publish", func() bool { return mounted(v.target) })
		readBack(t, v)
	})
	t.Run("staging unmounted from outside", func(t *testing.T) {
		if err := syscall.Unmount(v.staging, 0); err != nil {
			t.Fatal(err)
		}
		eventually(t, "staging mount", func() bool { return mounted(v.staging) })
		readBack(t, v)
	})
	t.Run("mount moved to a path no record names", func(t *testing.T) {
		// A rename inside the kubelet's directory carries the plugin's
		// mount along: the pod directory is swapped with an empty one.
		moved := filepath.Join(p.Root, "pods", "moved")
		if err := os.MkdirAll(moved, 0o750); err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(moved)
		if err := unix.Renameat2(unix.AT_FDCWD, filepath.Dir(v.target), unix.AT_FDCWD, moved, unix.RENAME_EXCHANGE); err != nil {
			t.Fatal(err)
		}
		if !mounted(filepath.Join(moved, "mount")) {
			t.Fatalf("the rename did not carry the mount to %s", moved)
		}
		eventually(t, "moved mount", func() bool { return !mounted(filepath.Join(moved, "mount")) })
		eventually(t, "publish", func() bool { return mounted(v.target) })
		readBack(t, v)
	})
	t.Run("the kubelet's mounts of the volume are left alone", func(t *testing.T) {
		// The kubelet prepares a subPath by bind mounting a directory of
		// the published volume under pods/<uid>/volume-subpaths/, then
		// remounting it; someone may also bind the whole volume elsewhere.
		if err := os.MkdirAll(filepath.Join(v.target, "sub"), 0o750); err != nil {
			t.Fatal(err)
		}
		subPath := filepath.Join(p.Root, "pods", "uid-1", "volume-subpaths", "pv", "c", "0")
		whole := filepath.Join(p.Root, "pods", "uid-1", "whole")
		for _, d := range []string{subPath, whole} {
			if err := os.MkdirAll(d, 0o750); err != nil {
				t.Fatal(err)
			}
		}
		defer os.RemoveAll(filepath.Join(p.Root, "pods", "uid-1"))
		if err := syscall.Mount(filepath.Join(v.target, "sub"), subPath, "", syscall.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		defer syscall.Unmount(subPath, syscall.MNT_DETACH)
		if err := syscall.Mount("", subPath, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_NOSUID, ""); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount(v.target, whole, "", syscall.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		defer syscall.Unmount(whole, syscall.MNT_DETACH)
		// Nothing to wait for: the plugin must do nothing for five passes.
		afterPasses(t, p, 5)
		for _, m := range []string{subPath, whole} {
			if !mounted(m) {
				t.Errorf("%s was unmounted; only the plugin's own mounts are its to remove", m)
			}
		}
		if err := syscall.Unmount(subPath, 0); err != nil {
			t.Error(err)
		}
		if err := syscall.Unmount(whole, 0); err != nil {
			t.Error(err)
		}
		readBack(t, v)
	})
	t.Run("staging lazily unmounted under a live publish", func(t *testing.T) {
		if err := syscall.Unmount(v.staging, syscall.MNT_DETACH); err != nil {
			t.Fatal(err)
		}
		eventually(t, "staging mount", func() bool { return mounted(v.staging) })
		readBack(t, v)
		// Both mounts show the same filesystem: a file made through one is
		// seen through the other.
		if err := writeSynced(filepath.Join(v.staging, "via-staging"), "x"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(v.target, "via-staging")); err != nil {
			t.Fatalf("staging and target are different filesystems after healing: %v", err)
		}
	})
	tearDown(t, p, v)
}

// TestReboot simulates a node reboot: the store keeps its intents while no
// mount or loop device survives. Volumes whose directories still exist come
// back with their data; a publish whose pod directory is gone is dropped.
func TestReboot(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	kept := setUp(t, p, "kept")
	gone := setUp(t, p, "gone")
	p.Stop()
	testenv.ForceClean(p.Dir, p.DataDir) // the reboot
	if left := testenv.Leftovers(p.Dir, p.DataDir); len(left) > 0 {
		t.Fatalf("reboot left %v", left)
	}
	if err := os.RemoveAll(filepath.Dir(gone.target)); err != nil { // the kubelet removed the pod
		t.Fatal(err)
	}
	p.Start() // ready only once every volume is restored or dropped
	if !mounted(kept.staging) || !mounted(kept.target) {
		t.Fatal("the kept volume was not restored before Probe reported ready")
	}
	readBack(t, kept)
	if !mounted(gone.staging) {
		t.Error("the staging mount of the volume whose pod is gone was not restored")
	}
	if mounted(gone.target) {
		t.Error("the publish whose pod directory is gone was restored")
	}
	if _, err := os.Stat(filepath.Dir(gone.target)); err == nil {
		t.Error("the plugin recreated a removed pod directory")
	}
	// The dropped publish is forgotten: unpublishing it is a no-op.
	gone.want = staged
	(&env{t: t, p: p}).replay(gone)
	tearDown(t, p, kept)
	tearDown(t, p, gone)
}

// TestUnstageRefusedUnderForeignBindMount checks that unstaging a volume
// whose staging mount someone else bind mounted outside the plugin's roots
// fails with FAILED_PRECONDITION naming the mount, and touches nothing.
func TestUnstageRefusedUnderForeignBindMount(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	v := setUp(t, p, "shared")
	foreign := filepath.Join(p.Dir, "someone-else")
	if err := os.MkdirAll(foreign, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(v.staging, foreign, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	v.want = staged
	(&env{t: t, p: p}).replay(v)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := p.Node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("unstage under a foreign bind mount: got %v, want FailedPrecondition", err)
	}
	if msg := status.Convert(err).Message(); !strings.Contains(msg, foreign) {
		t.Errorf("message %q does not name %s", msg, foreign)
	}
	if !mounted(foreign) || !mounted(v.staging) {
		t.Fatal("the refusal touched a mount")
	}
	if err := syscall.Unmount(foreign, 0); err != nil {
		t.Fatal(err)
	}
	tearDown(t, p, v)
}

// TestExternalUnmountHealsAtOnce runs with a resync period of an hour: an
// unmount from outside is seen through the mount table's change
// notification and repaired at once, not at the next resync.
func TestExternalUnmountHealsAtOnce(t *testing.T) {
	p := testenv.New(t, "--resync-period", "1h")
	p.Start()
	v := setUp(t, p, "watched")
	if err := syscall.Unmount(v.target, 0); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, 20*time.Millisecond, "the external unmount repaired (the next resync is an hour away)", func() error {
		if !mounted(v.target) {
			return errors.New("the target is not mounted")
		}
		return nil
	})
	readBack(t, v)
	tearDown(t, p, v)
}

// TestUnstageSeesAHeldDeviceGo runs with a resync period of an hour. A
// volume's loop device is held open by someone else (a process, the
// kubelet's own loop device over a block volume) when it is unstaged: the
// detach only marks it, and the kernel clears it at its last close. The
// unstage must not answer while the device is attached, and must answer
// once it is gone without waiting for the next resync.
func TestUnstageSeesAHeldDeviceGo(t *testing.T) {
	p := testenv.New(t, "--resync-period", "1h")
	p.Start()
	v := setUp(t, p, "held")
	dev := sourceAt(t, v.staging)
	if _, err := p.Node().NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.target}); err != nil {
		t.Fatal(err)
	}
	holder, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	answered := make(chan error, 1)
	go func() {
		_, err := p.Node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging})
		answered <- err
	}()
	attached := func() bool {
		b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
		return err == nil && strings.Contains(string(b), v.id)
	}
	autoclear := func() bool {
		b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "autoclear"))
		return err == nil && strings.TrimSpace(string(b)) == "1"
	}
	eventually(t, "the device detached, which only marks it", autoclear)
	// Two passes that saw it held, after the detach, leave the request
	// waiting.
	afterPasses(t, p, 2)
	select {
	case err := <-answered:
		t.Fatalf("NodeUnstageVolume answered (%v) while %s was held open, still attached: %v", err, dev, attached())
	default:
	}
	if !attached() {
		t.Fatalf("%s was detached while held open", dev)
	}
	holder.Close()
	if err := <-answered; err != nil {
		t.Fatalf("NodeUnstageVolume after the device's last user closed it: %v (the next resync is an hour away)", err)
	}
	if attached() {
		t.Errorf("NodeUnstageVolume answered OK with %s still attached", dev)
	}
	tearDown(t, p, v)
}
