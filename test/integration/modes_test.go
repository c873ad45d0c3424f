package integration

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/converge-csi/converge/test/testenv"
)

// TestAccessModes checks the access modes on real mounts: a reader-only
// volume is never formatted and is mounted read-only; a multi-writer one is
// published at two targets; a single-writer one refuses a second target.
func TestAccessModes(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	modes := create(t, p, "modes")
	staging := mkdir(t, filepath.Join(p.Root, "staging-modes"))
	t1 := filepath.Join(mkdir(t, filepath.Join(p.Root, "pod-m1")), "mount")
	t2 := filepath.Join(mkdir(t, filepath.Join(p.Root, "pod-m2")), "mount")
	reader := mountCap("", csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY)
	multi := mountCap("", csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER)
	single := mountCap("", csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)
	pub := func(target string, c *csi.VolumeCapability) error {
		_, err := p.Node().NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: modes, StagingTargetPath: staging, TargetPath: target, VolumeCapability: c})
		return err
	}

	wantCode(t, "reader-only stage of an unformatted volume", stage(t, p, modes, staging, reader), codes.FailedPrecondition)

	must(t, "multi-writer stage", stage(t, p, modes, staging, multi))
	must(t, "first target", pub(t1, multi))
	must(t, "second target", pub(t2, multi))
	must(t, "write", os.WriteFile(filepath.Join(t1, "shared"), []byte("x"), 0o600))
	if _, err := os.Stat(filepath.Join(t2, "shared")); err != nil {
		t.Errorf("the two targets are not the same volume: %v", err)
	}
	unpublish(t, p, modes, t1)
	unpublish(t, p, modes, t2)
	unstage(t, p, modes, staging)

	must(t, "single-writer stage", stage(t, p, modes, staging, single))
	must(t, "first target", pub(t1, single))
	wantCode(t, "second target of a single writer", pub(t2, single), codes.FailedPrecondition)
	unpublish(t, p, modes, t1)
	unstage(t, p, modes, staging)

	must(t, "reader-only stage of a formatted volume", stage(t, p, modes, staging, reader))
	must(t, "reader-only publish", pub(t1, reader))
	if err := os.WriteFile(filepath.Join(t1, "new"), []byte("x"), 0o600); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write to a reader-only volume: got %v, want EROFS", err)
	}
	unpublish(t, p, modes, t1)
	unstage(t, p, modes, staging)
}
