package fault

import (
	"context"
	"errors"
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

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/test/testenv"
)

// goingDown is EXT4_IOC_SHUTDOWN, _IOR('X', 125, __u32), the number of
// xfs's XFS_IOC_GOINGDOWN too; its argument 0 (EXT4_GOING_FLAGS_DEFAULT,
// XFS_FSOP_GOING_FLAGS_DEFAULT) syncs the filesystem before shutting it
// down.
const goingDown = 0x8004587d

// shutDown shuts down the filesystem mounted at path, as a fatal error
// would, and checks that reading file, in it, fails with EIO.
func shutDown(t *testing.T, path, file string) {
	t.Helper()
	// Opened before: the loop may unmount the shut-down filesystem at
	// once, and a read by path would then find nothing there.
	data, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Close()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.IoctlSetPointerInt(int(f.Fd()), goingDown, 0)
	f.Close()
	if err != nil {
		t.Fatalf("shutting down %s: %v", path, err)
	}
	if _, err := data.Read(make([]byte, 1)); !errors.Is(err, syscall.EIO) {
		t.Fatalf("reading a shut-down filesystem: got %v, want EIO", err)
	}
}

// sourceAt returns the source of the top mount at path.
func sourceAt(t *testing.T, path string) string {
	t.Helper()
	ms, err := devices.ReadMounts("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	source := ""
	for _, m := range ms {
		if m.Path == path {
			source = m.Source
		}
	}
	if source == "" {
		t.Fatalf("nothing mounted at %s", path)
	}
	return source
}

// health returns the health entries of a volume, "" when it is healthy.
func health(p *testenv.Plugin, id string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := p.Node().NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: id})
	if err != nil {
		return "", err
	}
	var out []string
	for _, e := range resp.GetVolumeHealth().GetHealthStatuses() {
		out = append(out, e.GetStatus().String()+" "+e.GetReason())
	}
	return strings.Join(out, ", "), nil
}

func stats(p *testenv.Plugin, id, path string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := p.Node().NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: path})
	return err
}

func healthIs(t *testing.T, p *testenv.Plugin, id, want string) func() bool {
	return func() bool {
		got, err := health(p, id)
		if err != nil {
			t.Fatalf("health of %s: %v", id, err)
		}
		return got == want
	}
}

// writable reports whether dir is a mount point in which a new file can be
// written and synced. (Without the mount check, a probe would land in the
// bare directory while the volume is unmounted for repair.)
func writable(dir string) bool {
	return mounted(dir) && writeSynced(filepath.Join(dir, "probe"), "x") == nil
}

// TestDamageIsRepaired damages a published volume the ways the kernel and
// operators do, and checks that the loop repairs (or, where repair is not
// safe, reports) each within a few resync periods, with the data intact.
func TestDamageIsRepaired(t *testing.T) {
	p := testenv.New(t, testenv.VolumeHealth, "--resync-period", resync.String())
	p.Start()
	v := setUp(t, p, "damage")

	t.Run("filesystem shut down", func(t *testing.T) {
		shutDown(t, v.staging, filepath.Join(v.target, "data"))
		eventually(t, "shut-down filesystem", func() bool { return writable(v.target) })
		readBack(t, v)
		eventually(t, "health", healthIs(t, p, v.id, ""))
	})

	t.Run("read-only after errors", func(t *testing.T) {
		dev := sourceAt(t, v.staging)
		trigger := filepath.Join("/sys/fs/ext4", filepath.Base(dev), "trigger_fs_error")
		if err := os.WriteFile(trigger, []byte("converge test"), 0); err != nil {
			t.Skipf("cannot trigger an ext4 error on this kernel: %v", err)
		}
		eventually(t, "read-only reported", healthIs(t, p, v.id, "DEGRADED FilesystemReadOnly"))
		if !mounted(v.target) || writable(v.target) {
			t.Fatal("the target is not mounted read-only after errors=remount-ro fired")
		}
		if err := stats(p, v.id, v.target); err != nil {
			t.Errorf("stats of a read-only filesystem: got %v, want usage", err)
		}
		readBack(t, v)
		// Not remounted while the pod uses it, for five passes...
		afterPasses(t, p, 5)
		if !mounted(v.target) || writable(v.target) {
			t.Fatal("the filesystem was remounted under a live publish")
		}
		// ...but once the pod is gone, checked and mounted again.
		v.want = staged
		(&env{t: t, p: p}).replay(v)
		eventually(t, "remount after fsck", func() bool { return writable(v.staging) })
		eventually(t, "health", healthIs(t, p, v.id, ""))
		v.want = published
		(&env{t: t, p: p}).replay(v)
		readBack(t, v)
	})

	t.Run("loop device detached from outside", func(t *testing.T) {
		dev := sourceAt(t, v.staging)
		if err := devices.DetachLoop(dev); err != nil { // what losetup -d does
			t.Fatal(err)
		}
		autoclear := filepath.Join("/sys/block", filepath.Base(dev), "loop", "autoclear")
		if b, err := os.ReadFile(autoclear); err != nil || strings.TrimSpace(string(b)) != "1" {
			t.Fatalf("after LOOP_CLR_FD on a mounted device: autoclear %q, %v; want 1", b, err)
		}
		eventually(t, "auto-clear flag", func() bool {
			b, err := os.ReadFile(autoclear)
			return err == nil && strings.TrimSpace(string(b)) == "0"
		})
		eventually(t, "health", healthIs(t, p, v.id, ""))
		readBack(t, v)
	})

	t.Run("staging path taken by another mount", func(t *testing.T) {
		if err := syscall.Mount("tmpfs", v.staging, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		eventually(t, "reported", healthIs(t, p, v.id, "DEGRADED StagingPathTaken"))
		err := stats(p, v.id, v.staging)
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "StagingPathTaken") {
			t.Errorf("stats at the taken staging path: got %v, want Unavailable naming StagingPathTaken", err)
		}
		if err := stats(p, v.id, v.target); err != nil {
			t.Errorf("stats at the still-published target: got %v, want usage", err)
		}
		if err := syscall.Unmount(v.staging, 0); err != nil {
			t.Fatal(err)
		}
		eventually(t, "health", healthIs(t, p, v.id, ""))
		if err := stats(p, v.id, v.staging); err != nil {
			t.Errorf("stats after healing: %v", err)
		}
	})
	tearDown(t, p, v)
}

// TestShutDownXfsIsRepaired shuts down the xfs filesystem of a published
// volume. Unlike ext4, xfs does not say so in the mount table's options: a
// pass sees it only in its check of the mount point, whose statx fails
// with EIO. The loop unmounts and mounts it again (the mount replays its
// log), with the synced data intact.
func TestShutDownXfsIsRepaired(t *testing.T) {
	p := testenv.New(t, testenv.VolumeHealth, "--resync-period", resync.String())
	p.Start()
	v := setUpAs(t, p, "damage-xfs", "xfs")
	shutDown(t, v.staging, filepath.Join(v.target, "data"))
	ms, err := devices.ReadMounts("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Path == v.staging {
			if m.FsType != "xfs" {
				t.Fatalf("staging mount: %s, want xfs", m.FsType)
			}
			t.Logf("the mount table marks the shut-down xfs as shut down: %v", m.Shutdown)
		}
	}
	eventually(t, "shut-down xfs", func() bool { return writable(v.target) })
	readBack(t, v)
	eventually(t, "health", healthIs(t, p, v.id, ""))
	tearDown(t, p, v)
}

// TestRepairSealsTheTarget: while a published volume is unmounted for its
// repair, the bare target takes no write. The kubelet restarts a pod's
// containers meanwhile without asking the driver, and the runtime binds
// the bare target into them: without the seal, their writes went to the
// node's disk and later hid under the volume, where the unpublish found
// the target not empty. Here an xfs is shut down while another mount of it
// holds the repair once the target is unmounted; a write in the target
// then gets EPERM, the repair ends once the other mount goes, and the
// unpublish unseals and removes the target.
func TestRepairSealsTheTarget(t *testing.T) {
	p := testenv.New(t, testenv.VolumeHealth, "--resync-period", resync.String())
	p.Start()
	v := setUpAs(t, p, "seal-xfs", "xfs")
	other := filepath.Join(t.TempDir(), "other")
	if err := os.Mkdir(other, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(v.staging, other, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(other, syscall.MNT_DETACH) })
	shutDown(t, v.staging, filepath.Join(v.target, "data"))
	eventually(t, "the target unmounted for its repair", func() bool { return !mounted(v.target) })
	// The other mount keeps the shut-down filesystem: the repair waits.
	afterPasses(t, p, 2)
	if mounted(v.target) {
		t.Fatal("the target was mounted again while another mount held the shut-down filesystem")
	}
	if err := writeSynced(filepath.Join(v.target, "on-node"), "x"); !errors.Is(err, unix.EPERM) {
		t.Fatalf("a write to the target under repair: got %v, want EPERM (the target sealed)", err)
	}
	if err := syscall.Unmount(other, 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the repair", func() bool { return writable(v.target) })
	readBack(t, v)
	tearDown(t, p, v)
	if _, err := os.Lstat(v.target); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the sealed target after the unpublish: got %v, want it removed", err)
	}
}
