package devices

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/converge-csi/converge/pkg/host"
)

// unfinishedXfs makes an xfs in a new file of size bytes in dir and, when
// unfinished, sets its superblock's sb_inprogress as a mkfs.xfs cut short
// leaves it; it returns the file.
func unfinishedXfs(t *testing.T, dir string, unfinished bool) string {
	t.Helper()
	img := filepath.Join(dir, "xfs.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 320<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.xfs", "-q", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.xfs: %v: %s", err, out)
	}
	if unfinished {
		if out, err := exec.Command("xfs_db", "-x", "-c", "sb 0", "-c", "write inprogress 1", img).CombinedOutput(); err != nil {
			t.Fatalf("xfs_db: %v: %s", err, out)
		}
	}
	return img
}

// TestProbeTellsAnUnfinishedXfs probes an xfs whose mkfs finished and one
// whose superblock says it never did: blkid names both xfs, and only the
// second is Unfinished.
func TestProbeTellsAnUnfinishedXfs(t *testing.T) {
	for _, exe := range []string{"mkfs.xfs", "xfs_db", "blkid"} {
		if _, err := exec.LookPath(exe); err != nil {
			t.Skipf("needs %s", exe)
		}
	}
	m := NewMounter(mount.NewFakeMounter(nil), utilexec.New(), 1, NewPaths([]string{t.TempDir()}))
	for _, unfinished := range []bool{false, true} {
		img := unfinishedXfs(t, t.TempDir(), unfinished)
		p, err := m.DiskFormat(context.Background(), img)
		if err != nil {
			t.Fatal(err)
		}
		if p.Type != host.FsXFS || p.Unfinished != unfinished {
			t.Errorf("unfinished %v: probe says %q, unfinished %v", unfinished, p.Type, p.Unfinished)
		}
		if r := p.Redo(); r.Type != "" || r.Unfinished || r.Device != img {
			t.Errorf("redo of %+v: %+v, want a probe of %s that found nothing", p, r, img)
		}
	}
}
