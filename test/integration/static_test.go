package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/test/testenv"
	"github.com/converge-csi/converge/test/testenv/loops"
)

// TestStaticBlockDevice stages a static volume on an existing block device
// named by a stable path: it is formatted and mounted once; when another
// device appears at that path it is refused and left unformatted; the
// first device, back at the path, is staged again with its data.
func TestStaticBlockDevice(t *testing.T) {
	p := testenv.New(t)
	byID := mkdir(t, filepath.Join(p.Dir, "by-id"))
	p.Args = append(p.Args, "--allowed-device-prefix", byID)
	p.Start()

	// Two disks, made by the test: loop devices on files outside the
	// plugin's data directory.
	var disks []string
	disksDir := mkdir(t, filepath.Join(p.Dir, "disks"))
	for _, name := range []string{"a", "b"} {
		img := filepath.Join(disksDir, name+".img")
		must(t, "image", os.WriteFile(img, nil, 0o600))
		must(t, "size", os.Truncate(img, 64<<20))
		dev, err := devices.AttachLoop(img, true)
		must(t, "attach", err)
		disks = append(disks, dev)
	}
	t.Cleanup(func() {
		p.Stop()
		for _, d := range disks {
			loops.Release(d, disksDir)
		}
	})
	link := filepath.Join(byID, "disk-1")
	point := func(dev string) {
		os.Remove(link)
		must(t, "symlink", os.Symlink(dev, link))
	}
	staging := mkdir(t, filepath.Join(p.Root, "staging-static"))
	target := filepath.Join(mkdir(t, filepath.Join(p.Root, "pod-static")), "mount")
	stageStatic := func(device string) error {
		_, err := p.Node().NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: "static-1", StagingTargetPath: staging, VolumeCapability: rwo,
			VolumeContext: map[string]string{"converge.csi.dev/device": device}})
		return err
	}

	wantCode(t, "a device outside the allowed prefix", stageStatic(disks[0]), codes.InvalidArgument)

	point(disks[0])
	must(t, "stage", stageStatic(link))
	must(t, "publish", publish(t, p, "static-1", staging, target, false))
	must(t, "write", os.WriteFile(filepath.Join(target, "data"), []byte("on disk a"), 0o600))
	unpublish(t, p, "static-1", target)
	unstage(t, p, "static-1", staging)
	if _, err := os.Stat(disks[0]); err != nil {
		t.Fatalf("unstage detached the static device: %v", err)
	}

	point(disks[1])
	err := stageStatic(link)
	wantCode(t, "another device at the same path", err, codes.FailedPrecondition)
	if !strings.Contains(status.Convert(err).Message(), "first staged") {
		t.Errorf("refusal %q does not say why", status.Convert(err).Message())
	}
	if out, _ := exec.Command("blkid", "-p", disks[1]).Output(); len(out) > 0 {
		t.Errorf("the other device was touched: blkid says %s", out)
	}
	if _, ok := mountAt(t, staging); ok {
		t.Error("the other device is mounted")
	}

	point(disks[0])
	must(t, "stage again", stageStatic(link))
	must(t, "publish again", publish(t, p, "static-1", staging, target, false))
	if b, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(b) != "on disk a" {
		t.Errorf("data on the static device: %q, %v", b, err)
	}
	unpublish(t, p, "static-1", target)
	unstage(t, p, "static-1", staging)
}
