package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-csi/converge/test/testenv"
)

// TestMkfsOptionsFromStorageClass passes mkfs options from a StorageClass
// parameter through CreateVolume's volume attributes to the format at
// stage; options outside the policy are refused by name.
func TestMkfsOptionsFromStorageClass(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	const key = "converge.csi.dev/mkfsOptions"
	_, err := p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "mkfs-bad", VolumeCapabilities: []*csi.VolumeCapability{rwo},
		Parameters: map[string]string{key: "-J device=/dev/sda"}})
	wantCode(t, "a journal on another device", err, codes.InvalidArgument)
	if msg := status.Convert(err).Message(); !strings.Contains(msg, `"-J"`) {
		t.Errorf("refusal %q does not name -J", msg)
	}

	resp, err := p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "mkfs-1k", CapacityRange: &csi.CapacityRange{RequiredBytes: volSize},
		VolumeCapabilities: []*csi.VolumeCapability{rwo}, Parameters: map[string]string{key: "-b 1024 -L converge"}})
	must(t, "create", err)
	vc := resp.GetVolume().GetVolumeContext()
	if vc[key] != "-b 1024 -L converge" {
		t.Fatalf("volume attributes: got %v, want the mkfs options", vc)
	}
	staging := mkdir(t, filepath.Join(p.Root, "staging-mkfs"))
	_, err = p.Node().NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: vid("mkfs-1k"), StagingTargetPath: staging, VolumeCapability: rwo, VolumeContext: vc})
	must(t, "stage", err)
	dev, _ := mountAt(t, staging)
	out, err := exec.Command("tune2fs", "-l", dev).Output()
	must(t, "tune2fs", err)
	if !strings.Contains(string(out), "Block size:               1024") || !strings.Contains(string(out), "volume name:   converge") {
		t.Errorf("the filesystem was not made with the options:\n%s", out)
	}
	unstage(t, p, vid("mkfs-1k"), staging)
}

// TestNewExt4IsMadeOnZeros stages two thin volumes. The first one's image
// holds no data, so its ext4 is made without zeroing the journal and inode
// tables the device already reads as zeros: the image then holds less than
// the journal alone, and the filesystem checks clean after use. The
// second one's image holds one stray block (no filesystem, so it is
// formatted): its device may hold stale data elsewhere as far as the
// plugin knows, and its journal is zeroed.
func TestNewExt4IsMadeOnZeros(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	for _, tc := range []struct {
		name   string
		stray  bool
		zeroed bool // the journal was left to read as zeros
	}{
		{name: "blank", zeroed: true},
		{name: "stray", stray: true},
	} {
		id := vid("zeros-" + tc.name)
		must(t, "create "+tc.name, createProvisioned(p, t, "zeros-"+tc.name, "thin", volSize))
		image := filepath.Join(p.DataDir, id+".img")
		if tc.stray {
			f, err := os.OpenFile(image, os.O_WRONLY, 0)
			must(t, "open image", err)
			_, err = f.WriteAt([]byte("stray data, no filesystem"), volSize-4096)
			must(t, "write image", err)
			must(t, "close image", f.Close())
		}
		staging := mkdir(t, filepath.Join(p.Root, "staging-zeros-"+tc.name))
		must(t, "stage "+tc.name, stage(t, p, id, staging, rwo))
		dev, _ := mountAt(t, staging)
		out, err := exec.Command("dumpe2fs", "-h", dev).Output()
		must(t, "dumpe2fs", err)
		journal := journalSize(t, string(out))
		if got := allocated(t, p, id); (got < journal) != tc.zeroed {
			t.Errorf("%s: the image holds %d bytes after the stage, with a journal of %d: want the journal zeroed %v", tc.name, got, journal, !tc.zeroed)
		}
		must(t, "write a file", os.WriteFile(filepath.Join(staging, "f"), []byte("data"), 0o600))
		unstage(t, p, id, staging)
		if out, err := exec.Command("e2fsck", "-fn", image).CombinedOutput(); err != nil {
			t.Errorf("%s: e2fsck of the image after use: %v\n%s", tc.name, err, out)
		}
	}
}

// journalSize reads the journal's size from dumpe2fs -h ("Total journal size:
// 4096k").
func journalSize(t *testing.T, dumpe2fs string) int64 {
	t.Helper()
	for _, line := range strings.Split(dumpe2fs, "\n") {
		if v, ok := strings.CutPrefix(line, "Total journal size:"); ok {
			v = strings.TrimSpace(v)
			unit := int64(1)
			switch {
			case strings.HasSuffix(v, "k"):
				unit, v = 1024, strings.TrimSuffix(v, "k")
			case strings.HasSuffix(v, "M"):
				unit, v = 1<<20, strings.TrimSuffix(v, "M")
			}
			n, err := strconv.ParseInt(v, 10, 64)
			must(t, "journal size "+line, err)
			return n * unit
		}
	}
	t.Fatalf("no journal size in dumpe2fs -h:\n%s", dumpe2fs)
	return 0
}

// TestSmallClaimsGetRoomForTheirFilesystem creates a 100 MiB claim of each
// filesystem and stages it: CreateVolume gives each at least what its mkfs
// and its growth need (host.MinSize: xfs 300 MiB, btrfs 256 MiB), so the
// stage formats and mounts it instead of failing on every retry.
func TestSmallClaimsGetRoomForTheirFilesystem(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	for _, fs := range []string{"ext4", "xfs", "btrfs"} {
		c := mountCap(fs, csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
		resp, err := p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{
			Name: "small-" + fs, CapacityRange: &csi.CapacityRange{RequiredBytes: 100 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{c},
		})
		if err != nil {
			t.Fatalf("CreateVolume %s: %v", fs, err)
		}
		id := resp.GetVolume().GetVolumeId()
		staging := mkdir(t, filepath.Join(p.Root, "staging-"+fs))
		if err := stage(t, p, id, staging, c); err != nil {
			t.Errorf("stage a 100 MiB claim of %s (made %d bytes): %v", fs, resp.GetVolume().GetCapacityBytes(), err)
			continue
		}
		unstage(t, p, id, staging)
	}
}
