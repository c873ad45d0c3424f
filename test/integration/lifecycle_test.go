// Package integration drives the real csi-node binary over its socket on
// real loop devices, filesystems and mounts.
package integration

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/test/testenv"
)

const volSize = 64 << 20

func mountCap(fsType string, mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

var rwo = mountCap("", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// vid is the ID of the volume that CreateVolume made under name on the test
// plugin's node: the name and the node's.
func vid(name string) string { return name + "_" + testenv.NodeID }

// create makes a volume named name and returns its ID.
func create(t *testing.T, p *testenv.Plugin, name string) string {
	t.Helper()
	return createSized(t, p, name, volSize)
}

// createSized makes a volume named name of size bytes and returns its ID.
func createSized(t *testing.T, p *testenv.Plugin, name string, size int64) string {
	t.Helper()
	resp, err := p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{rwo},
	})
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
	return resp.GetVolume().GetVolumeId()
}

func mkdir(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	return dir
}

func stage(t *testing.T, p *testenv.Plugin, id, path string, c *csi.VolumeCapability) error {
	_, err := p.Node().NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: path, VolumeCapability: c})
	return err
}

func publish(t *testing.T, p *testenv.Plugin, id, staging, target string, ro bool) error {
	_, err := p.Node().NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwo, Readonly: ro,
	})
	return err
}

func unpublish(t *testing.T, p *testenv.Plugin, id, target string) {
	t.Helper()
	if _, err := p.Node().NodeUnpublishVolume(ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatalf("NodeUnpublishVolume: %v", err)
	}
}

func unstage(t *testing.T, p *testenv.Plugin, id, path string) {
	t.Helper()
	if _, err := p.Node().NodeUnstageVolume(ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: path}); err != nil {
		t.Fatalf("NodeUnstageVolume: %v", err)
	}
	p.CheckDetached(t, id)
}

// upPublished creates a volume named name, makes the kubelet's
// directories for it, stages and publishes it read-write, and returns its
// ID and paths.
func upPublished(t *testing.T, p *testenv.Plugin, name string) (id, staging, target string) {
	t.Helper()
	id = create(t, p, name)
	staging = mkdir(t, filepath.Join(p.Root, "staging-"+id))
	target = filepath.Join(mkdir(t, filepath.Join(p.Root, "pod-"+id)), "mount")
	must(t, "stage", stage(t, p, id, staging, rwo))
	must(t, "publish", publish(t, p, id, staging, target, false))
	return id, staging, target
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("%s: got code %s (%v), want %s", what, got, err, want)
	}
}

// mountAt returns the source of the top mount at path.
func mountAt(t *testing.T, path string) (source string, ok bool) {
	t.Helper()
	ms, err := devices.ReadMounts("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Path == path {
			source, ok = m.Source, true
		}
	}
	return source, ok
}

func fsUUID(t *testing.T, dev string) string {
	t.Helper()
	out, err := exec.Command("blkid", "-p", "-s", "UUID", "-o", "value", dev).Output()
	if err != nil {
		t.Fatalf("blkid %s: %v", dev, err)
	}
	return strings.TrimSpace(string(out))
}

// TestLifecycle stages, publishes, writes, tears down, and does it all again:
// the data survives and the device is not reformatted.
func TestLifecycle(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	volA := create(t, p, "vol-a")
	staging := mkdir(t, filepath.Join(p.Root, "plugins", volA, "globalmount"))
	target1 := filepath.Join(mkdir(t, filepath.Join(p.Root, "pod1")), "mount")

	must(t, "stage", stage(t, p, volA, staging, rwo))
	dev, ok := mountAt(t, staging)
	if !ok || !strings.HasPrefix(dev, "/dev/loop") {
		t.Fatalf("staging path: got mount source %q (mounted %v), want a loop device", dev, ok)
	}
	uuid := fsUUID(t, dev)
	must(t, "publish", publish(t, p, volA, staging, target1, false))
	if src, ok := mountAt(t, target1); !ok || src != dev {
		t.Fatalf("target: got mount of %q (mounted %v), want %s", src, ok, dev)
	}
	must(t, "write", os.WriteFile(filepath.Join(target1, "data"), []byte("hello converge"), 0o600))

	// Idempotent repeats answer OK without changing anything.
	must(t, "stage again", stage(t, p, volA, staging, rwo))
	must(t, "publish again", publish(t, p, volA, staging, target1, false))

	unpublish(t, p, volA, target1)
	if _, ok := mountAt(t, target1); ok {
		t.Fatal("target still mounted after unpublish")
	}
	if _, err := os.Stat(target1); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("target not removed after unpublish: %v", err)
	}
	unpublish(t, p, volA, target1) // repeat: OK
	unstage(t, p, volA, staging)
	if _, ok := mountAt(t, staging); ok {
		t.Fatal("staging path still mounted after unstage")
	}
	if left := testenv.Leftovers(p.Dir, p.DataDir); len(left) > 0 {
		t.Fatalf("after unstage: %v", left)
	}
	unstage(t, p, volA, staging) // repeat: OK

	must(t, "restage", stage(t, p, volA, staging, rwo))
	dev2, _ := mountAt(t, staging)
	if got := fsUUID(t, dev2); got != uuid {
		t.Fatalf("filesystem UUID after restage: got %s, want %s (device reformatted)", got, uuid)
	}
	target2 := filepath.Join(mkdir(t, filepath.Join(p.Root, "pod2")), "mount")
	must(t, "republish read-only", publish(t, p, volA, staging, target2, true))
	got, err := os.ReadFile(filepath.Join(target2, "data"))
	if err != nil || string(got) != "hello converge" {
		t.Fatalf("data after restage: got %q, %v; want %q", got, err, "hello converge")
	}
	err = os.WriteFile(filepath.Join(target2, "other"), []byte("x"), 0o600)
	if !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write to read-only publish: got %v, want EROFS", err)
	}

	unpublish(t, p, volA, target2)
	unstage(t, p, volA, staging)
	_, err = p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: volA})
	must(t, "delete", err)
	if _, err := os.Stat(filepath.Join(p.DataDir, "vol-a.img")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("image still there after DeleteVolume: %v", err)
	}
}

// TestRestartKeepsMounts stops the plugin while a volume is published, with
// SIGTERM (a clean stop: the store is checkpointed) and with SIGKILL (its
// last intents are only in the state log): the mounts stay, the restarted
// plugin knows the volume without redoing any work (released as orphans
// the mounts would be), and it replays the log only after the kill.
func TestRestartKeepsMounts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		stop     func(p *testenv.Plugin)
		replayed bool
	}{
		{name: "SIGTERM", stop: (*testenv.Plugin).Stop},
		{name: "SIGKILL", stop: (*testenv.Plugin).Kill, replayed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testenv.New(t)
			p.Start()
			volB, staging, target := upPublished(t, p, "vol-b")
			must(t, "write", os.WriteFile(filepath.Join(target, "data"), []byte("kept"), 0o600))

			tc.stop(p)
			if _, ok := mountAt(t, target); !ok {
				t.Fatalf("%s removed the publish mount", tc.name)
			}
			if _, ok := mountAt(t, staging); !ok {
				t.Fatalf("%s removed the staging mount", tc.name)
			}
			logged := len(p.Log())
			p.Start()
			// A repeat is idempotent and the data is readable.
			must(t, "publish after restart", publish(t, p, volB, staging, target, false))
			if b, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(b) != "kept" {
				t.Fatalf("data after restart: got %q, %v", b, err)
			}
			since := p.Log()[logged:]
			if got := strings.Contains(since, "Replayed the state log"); got != tc.replayed {
				t.Errorf("start after %s replayed the state log: %v, want %v", tc.name, got, tc.replayed)
			}
			// Recording the unique ID of a mount made just before the
			// kill is bookkeeping, not a redone mount.
			for _, line := range strings.Split(since, "\n") {
				if strings.Contains(line, "Starting operation") && !strings.Contains(line, `action="record mount"`) {
					t.Errorf("the restarted plugin redid work that was done:\n%s", since)
					break
				}
			}
			unpublish(t, p, volB, target)
			unstage(t, p, volB, staging)
		})
	}
}

// TestBadRequests walks one volume through requests that conflict with its
// state (the stateless hostile inputs are in TestAttackTable): each fails
// with its exact code and leaves nothing mounted or attached.
func TestBadRequests(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	volC := create(t, p, "vol-c")
	staging := mkdir(t, filepath.Join(p.Root, "staging-c"))
	outside := t.TempDir()
	link := filepath.Join(p.Root, "link")
	must(t, "symlink", os.Symlink(outside, link))
	xfsCap := mountCap("xfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

	target := filepath.Join(mkdir(t, filepath.Join(p.Root, "pod-c")), "mount")
	wantCode(t, "publish before stage", publish(t, p, volC, staging, target, false), codes.FailedPrecondition)
	if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("publish before stage created the target: %v", err)
	}

	must(t, "stage", stage(t, p, volC, staging, rwo))
	wantCode(t, "restage with another fs type", stage(t, p, volC, staging, xfsCap), codes.AlreadyExists)
	other := mkdir(t, filepath.Join(p.Root, "staging-c2"))
	wantCode(t, "restage at another path", stage(t, p, volC, other, rwo), codes.AlreadyExists)
	wantCode(t, "publish with wrong staging path", publish(t, p, volC, other, target, false), codes.FailedPrecondition)
	wantCode(t, "publish at a symlinked target", publish(t, p, volC, staging, filepath.Join(link, "mount"), false), codes.InvalidArgument)
	must(t, "publish", publish(t, p, volC, staging, target, false))
	wantCode(t, "republish read-only at the same target", publish(t, p, volC, staging, target, true), codes.AlreadyExists)
	_, err := p.Node().NodeUnstageVolume(ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: volC, StagingTargetPath: staging})
	wantCode(t, "unstage while published", err, codes.FailedPrecondition)
	_, err = p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: volC})
	wantCode(t, "delete while staged", err, codes.FailedPrecondition)
	_, err = p.Node().NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: volC, VolumePath: other})
	wantCode(t, "stats at a path the volume is not at", err, codes.NotFound)
	st, err := p.Node().NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: volC, VolumePath: target})
	must(t, "stats", err)
	if u := st.GetUsage(); len(u) != 2 || u[0].GetTotal() <= 0 || u[1].GetTotal() <= 0 {
		t.Errorf("stats: got %v, want bytes and inodes totals", u)
	}
	unpublish(t, p, volC, target)
	unstage(t, p, volC, staging)
	if entries, _ := os.ReadDir(outside); len(entries) > 0 {
		t.Errorf("something was created outside the roots: %v", entries)
	}
}

// TestForeignFilesystemRefused stages a volume whose image already holds an
// xfs filesystem as ext4: FAILED_PRECONDITION, the filesystem is untouched,
// and the device is released before the answer.
func TestForeignFilesystemRefused(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	volX := createSized(t, p, "vol-x", 320<<20) // xfs needs 300 MB
	img := filepath.Join(p.DataDir, volX+".img")
	if out, err := exec.Command("mkfs.xfs", "-q", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.xfs: %v %s", err, out)
	}
	before := fsUUID(t, img)
	staging := mkdir(t, filepath.Join(p.Root, "staging-x"))
	wantCode(t, "stage xfs image as ext4", stage(t, p, volX, staging, rwo), codes.FailedPrecondition)
	if left := testenv.Leftovers(p.Dir, p.DataDir); len(left) > 0 {
		t.Errorf("left behind after the refusal: %v", left)
	}
	if after := fsUUID(t, img); after != before {
		t.Fatalf("xfs UUID changed from %s to %s: the image was reformatted", before, after)
	}
	// Asking for what is there works.
	must(t, "stage as xfs", stage(t, p, volX, staging, mountCap("xfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)))
	if _, ok := mountAt(t, staging); !ok {
		t.Fatal("xfs staging mount missing")
	}
	unstage(t, p, volX, staging)
}

// TestUnfinishedMkfsIsRedone stages a volume whose image holds the start of
// an xfs whose mkfs never finished (sb_inprogress set, as a mkfs.xfs cut
// short by the end of a pod's grace period leaves it), which blkid names
// xfs and the kernel refuses to mount: the plugin formats it anew and the
// stage succeeds, where it used to retry a mount that could never work.
func TestUnfinishedMkfsIsRedone(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	vol := createSized(t, p, "vol-unfinished", 320<<20) // xfs needs 300 MB
	img := filepath.Join(p.DataDir, vol+".img")
	for _, args := range [][]string{{"mkfs.xfs", "-q", img}, {"xfs_db", "-x", "-c", "sb 0", "-c", "write inprogress 1", img}} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v %s", args, err, out)
		}
	}
	before := fsUUID(t, img)
	staging := mkdir(t, filepath.Join(p.Root, "staging-unfinished"))
	must(t, "stage over an unfinished xfs", stage(t, p, vol, staging, mountCap("xfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)))
	if _, ok := mountAt(t, staging); !ok {
		t.Fatal("xfs staging mount missing")
	}
	unstage(t, p, vol, staging)
	out, err := exec.Command("xfs_db", "-r", "-c", "sb 0", "-c", "print inprogress", img).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "inprogress = 0" {
		t.Errorf("the image's superblock after the stage: %v %s, want inprogress = 0", err, out)
	}
	if after := fsUUID(t, img); after == before {
		t.Errorf("xfs UUID still %s: the unfinished filesystem was not made anew", before)
	}
}
