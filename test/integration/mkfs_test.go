package integration

import (
	"os/exec"
	"path/filepath"
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
	dev, _, _ := mountAt(t, staging)
	out, err := exec.Command("tune2fs", "-l", dev).Output()
	must(t, "tune2fs", err)
	if !strings.Contains(string(out), "Block size:               1024") || !strings.Contains(string(out), "volume name:   converge") {
		t.Errorf("the filesystem was not made with the options:\n%s", out)
	}
	unstage(t, p, vid("mkfs-1k"), staging)
}
