package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/converge-csi/converge/test/testenv"
)

// allowModeChangeKey is the StorageClass parameter that lets a volume
// change its volume mode (contract.AllowModeChangeKey).
const allowModeChangeKey = "converge.csi.dev/allow-volume-mode-change"

// createAs makes volume name for capability c from source (nil for an
// empty one), with the class parameters params, and returns its ID.
func createAs(t *testing.T, p *testenv.Plugin, name string, c *csi.VolumeCapability, params map[string]string, source *csi.VolumeContentSource) (string, error) {
	resp, err := p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{
		Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: volSize}, VolumeCapabilities: []*csi.VolumeCapability{c},
		Parameters: params, VolumeContentSource: source,
	})
	return resp.GetVolume().GetVolumeId(), err
}

func snapshotSource(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
}

func volumeSource(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
}

// upRaw stages and publishes volume id as a raw block device and returns
// the device file of the pod.
func upRaw(t *testing.T, p *testenv.Plugin, id string) string {
	t.Helper()
	staging := mkdir(t, filepath.Join(p.Root, "staging-"+id))
	target := filepath.Join(mkdir(t, filepath.Join(p.Root, "pod-"+id)), "dev")
	must(t, "stage "+id+" raw", stage(t, p, id, staging, rawBlock))
	_, err := p.Node().NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rawBlock})
	must(t, "publish "+id+" raw", err)
	return target
}

// downRaw unpublishes and unstages what upRaw set up.
func downRaw(t *testing.T, p *testenv.Plugin, id string) {
	t.Helper()
	unpublish(t, p, id, filepath.Join(p.Root, "pod-"+id, "dev"))
	unstage(t, p, id, filepath.Join(p.Root, "staging-"+id))
}

func deleteVolume(t *testing.T, p *testenv.Plugin, id string) {
	t.Helper()
	_, err := p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
	must(t, "delete "+id, err)
}

// wantModeRefused fails unless err refuses a volume mode change naming
// both volume modes and the parameter.
func wantModeRefused(t *testing.T, what string, err error, from, to string) {
	t.Helper()
	wantCode(t, what, err, codes.InvalidArgument)
	if err != nil && (!strings.Contains(err.Error(), "volume mode "+from) || !strings.Contains(err.Error(), "volume mode "+to) || !strings.Contains(err.Error(), allowModeChangeKey)) {
		t.Errorf("%s: the refusal %q does not name volume modes %s and %s and %s", what, err, from, to, allowModeChangeKey)
	}
}

// TestVolumeKeepsItsMode plays a tenant who writes an ext4 filesystem on a
// raw block volume, as a crafted one would be, and asks for it back as a
// filesystem volume: its snapshot restored as a Filesystem volume and its
// clone as one are refused INVALID_ARGUMENT, so that no e2fsck or kernel
// mount ever runs on what the tenant wrote; a class with the parameter
// allows both, and the stage mounts the filesystem the tenant wrote.
// A Block volume restores and clones as a Block volume holding its bytes,
// a Filesystem volume's snapshot restores as a Filesystem volume and not
// as a Block one, and a volume made for a filesystem that was staged as a
// raw block device once (a second PV of it in volume mode Block) counts as
// Block from then on.
func TestVolumeKeepsItsMode(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	allow := map[string]string{allowModeChangeKey: "true"}

	raw, err := createAs(t, p, "mode-raw", rawBlock, nil, nil)
	must(t, "create a Block volume", err)
	dev := upRaw(t, p, raw)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-L", "tenant", dev).CombinedOutput(); err != nil {
		t.Fatalf("the tenant's mkfs on its device: %v: %s", err, out)
	}
	payload := bytes.Repeat([]byte("raw data"), 512)
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	must(t, "open the device", err)
	_, err = f.WriteAt(payload, volSize-int64(len(payload)))
	if err == nil {
		err = f.Sync()
	}
	f.Close()
	must(t, "write the device's end", err)

	s := snapshotOf(t, p, "mode-raw-snap", raw)
	_, err = createAs(t, p, "mode-raw-as-fs", rwo, nil, snapshotSource(s.GetSnapshotId()))
	wantModeRefused(t, "a Block volume's snapshot restored as a Filesystem volume", err, "Block", "Filesystem")
	_, err = createAs(t, p, "mode-raw-clone-fs", rwo, nil, volumeSource(raw))
	wantModeRefused(t, "a Block volume cloned as a Filesystem volume", err, "Block", "Filesystem")
	for _, name := range []string{"mode-raw-as-fs", "mode-raw-clone-fs"} {
		if _, err := os.Stat(filepath.Join(p.DataDir, vid(name)+".img")); !os.IsNotExist(err) {
			t.Errorf("the refused %s has an image: %v", name, err)
		}
	}

	// Block to Block: the bytes come back, through the device.
	for name, source := range map[string]*csi.VolumeContentSource{"mode-raw-restored": snapshotSource(s.GetSnapshotId()), "mode-raw-clone": volumeSource(raw)} {
		id, err := createAs(t, p, name, rawBlock, nil, source)
		must(t, name+" as a Block volume", err)
		got := make([]byte, len(payload))
		f, err := os.Open(upRaw(t, p, id))
		must(t, "open "+name, err)
		_, err = f.ReadAt(got, volSize-int64(len(payload)))
		f.Close()
		must(t, "read "+name, err)
		if !bytes.Equal(got, payload) {
			t.Errorf("%s does not hold what was written on the Block volume", name)
		}
		downRaw(t, p, id)
		deleteVolume(t, p, id)
	}

	// Allowed by the class: the stage mounts the filesystem found there.
	for name, source := range map[string]*csi.VolumeContentSource{"mode-raw-allowed": snapshotSource(s.GetSnapshotId()), "mode-raw-clone-allowed": volumeSource(raw)} {
		id, err := createAs(t, p, name, rwo, allow, source)
		must(t, name+" as a Filesystem volume, allowed", err)
		staging, _ := upPublishedExisting(t, p, id)
		src, ok := mountAt(t, staging)
		if !ok {
			t.Fatalf("%s: nothing mounted at its staging path", name)
		}
		if label, err := exec.Command("blkid", "-o", "value", "-s", "LABEL", src).Output(); err != nil || strings.TrimSpace(string(label)) != "tenant" {
			t.Errorf("%s: the filesystem mounted is labelled %q (%v), want the tenant's", name, label, err)
		}
		downAndDelete(t, p, id)
	}
	downRaw(t, p, raw)
	deleteVolume(t, p, raw)

	// Filesystem to Filesystem, and not to Block.
	fs, _, target := upPublished(t, p, "mode-fs")
	must(t, "write a file", os.WriteFile(filepath.Join(target, "file"), []byte("in the filesystem"), 0o600))
	fsSnap := snapshotOf(t, p, "mode-fs-snap", fs)
	_, err = createAs(t, p, "mode-fs-as-raw", rawBlock, nil, snapshotSource(fsSnap.GetSnapshotId()))
	wantModeRefused(t, "a Filesystem volume's snapshot restored as a Block volume", err, "Filesystem", "Block")
	_, err = createAs(t, p, "mode-fs-clone-raw", rawBlock, nil, volumeSource(fs))
	wantModeRefused(t, "a Filesystem volume cloned as a Block volume", err, "Filesystem", "Block")
	for name, source := range map[string]*csi.VolumeContentSource{"mode-fs-restored": snapshotSource(fsSnap.GetSnapshotId()), "mode-fs-clone": volumeSource(fs)} {
		id, err := createAs(t, p, name, rwo, nil, source)
		must(t, name+" as a Filesystem volume", err)
		_, restored := upPublishedExisting(t, p, id)
		if got, err := os.ReadFile(filepath.Join(restored, "file")); err != nil || string(got) != "in the filesystem" {
			t.Errorf("%s: got %q, %v; want the file written before", name, got, err)
		}
		downAndDelete(t, p, id)
	}
	downAndDelete(t, p, fs)

	// Made for a filesystem, staged raw once.
	once, err := createAs(t, p, "mode-once-raw", rwo, nil, nil)
	must(t, "create a Filesystem volume", err)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", upRaw(t, p, once)).CombinedOutput(); err != nil {
		t.Fatalf("mkfs on the device: %v: %s", err, out)
	}
	downRaw(t, p, once)
	onceSnap := snapshotOf(t, p, "mode-once-raw-snap", once)
	_, err = createAs(t, p, "mode-once-as-fs", rwo, nil, snapshotSource(onceSnap.GetSnapshotId()))
	wantModeRefused(t, "the snapshot of a volume once staged raw, restored as a Filesystem volume", err, "Block", "Filesystem")
	_, err = createAs(t, p, "mode-once-clone-fs", rwo, nil, volumeSource(once))
	wantModeRefused(t, "a volume once staged raw, cloned as a Filesystem volume", err, "Block", "Filesystem")
	deleteVolume(t, p, once)

	for _, id := range []string{s.GetSnapshotId(), fsSnap.GetSnapshotId(), onceSnap.GetSnapshotId()} {
		_, err := p.Controller().DeleteSnapshot(ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: id})
		must(t, "delete snapshot "+id, err)
	}
}
