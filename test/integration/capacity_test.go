package integration

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/converge-csi/converge/test/testenv"
	"github.com/converge-csi/converge/test/testenv/poll"
)

const (
	provisioningKey = "converge.csi.dev/provisioning"
	mib             = 1 << 20
)

// smallDataDir gives the plugin a data directory on a filesystem of its
// own: an ext4 image of size bytes, attached and mounted for the test and
// taken down after it (after the plugin stopped).
func smallDataDir(t *testing.T, p *testenv.Plugin, size int64) {
	t.Helper()
	smallDataDirOf(t, p, size, "ext4", "-q", "-F", "-m0")
}

// smallDataDirOf is smallDataDir on a filesystem of type fs, made with
// mkfs.<fs> mkfsArgs.
func smallDataDirOf(t *testing.T, p *testenv.Plugin, size int64, fs string, mkfsArgs ...string) {
	t.Helper()
	testenv.FilesystemAt(t, p, p.DataDir, size, fs, mkfsArgs...)
}

// allocated returns the space allocated to a volume's image (st_blocks).
func allocated(t *testing.T, p *testenv.Plugin, id string) int64 {
	t.Helper()
	var st unix.Stat_t
	must(t, "stat image", unix.Stat(filepath.Join(p.DataDir, id+".img"), &st))
	return st.Blocks * 512
}

func capacityFor(t *testing.T, p *testenv.Plugin, prov string) int64 {
	t.Helper()
	resp, err := p.Controller().GetCapacity(ctx(t), &csi.GetCapacityRequest{Parameters: map[string]string{provisioningKey: prov}})
	must(t, "GetCapacity "+prov, err)
	return resp.GetAvailableCapacity()
}

func createProvisioned(p *testenv.Plugin, t *testing.T, id, prov string, size int64) error {
	_, err := p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{
		Name: id, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{rwo}, Parameters: map[string]string{provisioningKey: prov},
	})
	return err
}

// fill writes random data to a new file at dir in 1 MiB steps, each
// fsynced, until the filesystem is full (ENOSPC) or limit bytes are
// written, and returns the SHA-256 of what was written and acknowledged.
// Any other error (EIO, EROFS) fails the test.
func fill(t *testing.T, dir, name string, limit int64) ([]byte, int64) {
	t.Helper()
	sum, n, err := fillUntilError(dir, name, limit)
	if errors.Is(err, syscall.ENOSPC) {
		// What the short write put in the file is not acknowledged: cut
		// it off, so that the file holds exactly what was.
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY, 0)
		must(t, "open after ENOSPC", err)
		defer f.Close()
		must(t, "truncate after ENOSPC", f.Truncate(n))
		must(t, "sync after ENOSPC", f.Sync())
		return sum, n
	}
	if err != nil {
		t.Fatalf("writing %s at %d bytes: %v (want only ENOSPC)", name, n, err)
	}
	return sum, n
}

func sumOf(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, "read back", err)
	s := sha256.Sum256(b)
	return s[:]
}

// TestThickVolumesKeepTheirPromise runs the plugin on a 320 MiB data
// directory and asks for more thick volumes than fit: the extra one is
// refused RESOURCE_EXHAUSTED and leaves nothing, GetCapacity falls by each
// accepted volume, every accepted volume is then filled to its own ENOSPC
// (each write fsynced) with no EIO nor EROFS and its data reads back
// intact, and each image keeps its blocks after mkfs, a trim inside the
// volume and a restart.
func TestThickVolumesKeepTheirPromise(t *testing.T) {
	p := testenv.New(t)
	smallDataDir(t, p, 320*mib)
	p.Start()

	const size = 64 * mib
	before := capacityFor(t, p, "thick")
	if before < 4*size || before > 320*mib {
		t.Fatalf("capacity of an empty 320 MiB data directory: %d", before)
	}
	var ids []string
	for i := 0; ; i++ {
		id := fmt.Sprintf("thick-%d", i)
		err := createProvisioned(p, t, id, "thick", size)
		if err != nil {
			wantCode(t, "create past the capacity", err, codes.ResourceExhausted)
			if _, err := os.Stat(filepath.Join(p.DataDir, vid(id)+".img")); !os.IsNotExist(err) {
				t.Errorf("the refused volume left an image: %v", err)
			}
			break
		}
		id = vid(id)
		ids = append(ids, id)
		now := capacityFor(t, p, "thick")
		if fell := before - now; fell < size || fell > size+mib {
			t.Errorf("capacity fell by %d bytes for a %d-byte volume, want that much (and at most 1 MiB of metadata)", fell, size)
		}
		before = now
		if got := allocated(t, p, id); got < size {
			t.Errorf("%s: %d bytes allocated at create, want %d", id, got, size)
		}
		if i > 10 {
			t.Fatal("no refusal after 10 volumes of 64 MiB on 320 MiB")
		}
	}
	if len(ids) != 4 {
		t.Errorf("accepted %d volumes of 64 MiB on 320 MiB, want 4", len(ids))
	}
	if before >= size {
		t.Errorf("capacity %d after the refusal, want less than the refused %d", before, size)
	}

	type written struct {
		target string
		sum    []byte
		n      int64
	}
	var data []written
	for _, id := range ids {
		_, target := upPublishedExisting(t, p, id)
		if got := allocated(t, p, id); got < size {
			t.Errorf("%s: %d bytes allocated after mkfs, want %d", id, got, size)
		}
		sum, n := fill(t, target, "data", size)
		if n < size/2 {
			t.Errorf("%s: ENOSPC after %d bytes of a %d-byte volume", id, n, size)
		}
		// A trim inside the volume cannot hand its space back.
		out, _ := exec.Command("fstrim", "-v", target).CombinedOutput()
		t.Logf("%s: %d bytes written to ENOSPC; fstrim: %s", id, n, strings.TrimSpace(string(out)))
		must(t, "remove", os.Remove(filepath.Join(target, "data")))
		exec.Command("sync").Run()
		exec.Command("fstrim", target).Run()
		if got := allocated(t, p, id); got < size {
			t.Errorf("%s: %d bytes allocated after a delete and a trim, want %d", id, got, size)
		}
		sum, n = fill(t, target, "data2", size)
		data = append(data, written{target: target, sum: sum, n: n})
	}

	p.Stop()
	p.Start()
	for i, id := range ids {
		if got := allocated(t, p, id); got < size {
			t.Errorf("%s: %d bytes allocated after a restart, want %d", id, got, size)
		}
		if got := sumOf(t, filepath.Join(data[i].target, "data2")); !bytes.Equal(got, data[i].sum) {
			t.Errorf("%s: the %d bytes written read back differently", id, data[i].n)
		}
	}
	for _, id := range ids {
		downAndDelete(t, p, id)
	}
	if after := capacityFor(t, p, "thick"); after < 4*size {
		t.Errorf("capacity after deleting every volume: %d", after)
	}
}

// TestThinVolumesOvercommitAndGiveSpaceBack runs the plugin on a 320 MiB
// data directory with an overprovisioning ratio of 2 and a guard of 80 MiB:
// thin volumes are promised up to twice the space above the guard and no
// more, the pool guard reports them before writes fail and refuses new
// ones, and space freed in a volume returns to the data directory.
func TestThinVolumesOvercommitAndGiveSpaceBack(t *testing.T) {
	p := testenv.New(t, testenv.VolumeHealth, "--thin-overprovisioning-ratio", "2", "--pool-guard", "80Mi", "--resync-period", "1s")
	smallDataDir(t, p, 320*mib)
	p.Start()

	thick, thin := capacityFor(t, p, "thick"), capacityFor(t, p, "thin")
	if thin < 2*thick-mib || thin > 2*thick {
		t.Errorf("capacity for thin %d, for thick %d: want twice as much for thin", thin, thick)
	}
	const size = 128 * mib
	var ids []string
	for i := 0; ; i++ {
		id := fmt.Sprintf("thin-%d", i)
		if err := createProvisioned(p, t, id, "thin", size); err != nil {
			wantCode(t, "thin create past the ratio", err, codes.ResourceExhausted)
			break
		}
		id = vid(id)
		ids = append(ids, id)
		if got := allocated(t, p, id); got > mib {
			t.Errorf("%s: %d bytes allocated at create, want a sparse image", id, got)
		}
		if i > 10 {
			t.Fatal("no refusal after 10 thin volumes of 128 MiB on 320 MiB")
		}
	}
	// 3 x 128 MiB = 384 MiB fits twice the ~205 MiB above the guard of
	// the ~285 MiB free; a fourth does not.
	if len(ids) != 3 {
		t.Fatalf("accepted %d thin volumes of 128 MiB at ratio 2 on 320 MiB with a guard of 80 MiB, want 3", len(ids))
	}
	err := createProvisioned(p, t, "odd", "sometimes", size)
	wantCode(t, "unknown provisioning", err, codes.InvalidArgument)

	targets := map[string]string{}
	for _, id := range ids[:3] {
		_, targets[id] = upPublishedExisting(t, p, id)
		if got := allocated(t, p, id); got > 16*mib {
			t.Errorf("%s: %d bytes allocated after mkfs, want next to none (mkfs discards)", id, got)
		}
	}
	// Fill the pool to below the guard, but not to full.
	fill(t, targets[ids[0]], "big", 100*mib)
	fill(t, targets[ids[1]], "big", 100*mib)
	fill(t, targets[ids[2]], "some", 40*mib)
	cond := waitCondition(t, p, ids[2], "PoolNearlyFull")
	t.Logf("condition below the guard: %s", cond)
	err = createProvisioned(p, t, "late", "thin", 16*mib)
	wantCode(t, "thin create below the guard", err, codes.ResourceExhausted)
	if c := capacityFor(t, p, "thin"); c != 0 {
		t.Errorf("thin capacity below the guard: %d, want 0", c)
	}

	// Space freed in a volume goes back to the data directory.
	// ext4 discards the freed blocks when their transaction commits, and
	// the loop device punches the holes from its worker: wait for them.
	was := allocated(t, p, ids[0])
	must(t, "remove", os.Remove(filepath.Join(targets[ids[0]], "big")))
	removed := time.Now()
	exec.Command("sync").Run()
	poll.Until(t, 20*time.Second, 100*time.Millisecond, ids[0]+": the space of a deleted 100 MiB file back", func() error {
		if got := allocated(t, p, ids[0]); was-got < 90*mib {
			return fmt.Errorf("allocation went from %d to %d bytes in %v", was, got, time.Since(removed))
		}
		return nil
	})
	t.Logf("%s: 100 MiB deleted; its space was back in the data directory after %v", ids[0], time.Since(removed).Round(time.Millisecond))
	waitCondition(t, p, ids[2], "")
	must(t, "create once there is room", createProvisioned(p, t, "late", "thin", 16*mib))

	for _, id := range ids {
		downAndDelete(t, p, id)
	}
	_, err = p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: vid("late")})
	must(t, "delete late", err)
}

// upPublishedExisting stages and publishes an existing volume read-write.
func upPublishedExisting(t *testing.T, p *testenv.Plugin, id string) (staging, target string) {
	t.Helper()
	staging = mkdir(t, filepath.Join(p.Root, "staging-"+id))
	target = filepath.Join(mkdir(t, filepath.Join(p.Root, "pod-"+id)), "mount")
	must(t, "stage "+id, stage(t, p, id, staging, rwo))
	must(t, "publish "+id, publish(t, p, id, staging, target, false))
	return staging, target
}

// downAndDelete unpublishes, unstages and deletes a volume that
// upPublishedExisting set up.
func downAndDelete(t *testing.T, p *testenv.Plugin, id string) {
	t.Helper()
	unpublish(t, p, id, filepath.Join(p.Root, "pod-"+id, "mount"))
	unstage(t, p, id, filepath.Join(p.Root, "staging-"+id))
	_, err := p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
	must(t, "delete "+id, err)
}

// waitCondition waits until NodeGetVolumeHealth reports the volume with
// reason (healthy for ""), and returns its message.
func waitCondition(t *testing.T, p *testenv.Plugin, id string, reasons ...string) string {
	t.Helper()
	found := ""
	poll.Until(t, 20*time.Second, 200*time.Millisecond, fmt.Sprintf("health of %s with a reason of %q", id, reasons), func() error {
		resp, err := p.Node().NodeGetVolumeHealth(ctx(t), &csi.NodeGetVolumeHealthRequest{VolumeId: id})
		must(t, "health", err)
		hs := resp.GetVolumeHealth().GetHealthStatuses()
		for _, reason := range reasons {
			if reason == "" && len(hs) == 0 {
				found = ""
				return nil
			}
			if reason != "" && len(hs) == 1 && hs[0].GetReason() == reason && hs[0].GetStatus() == csi.VolumeHealthErrorType_DEGRADED {
				found = reason + ": " + hs[0].GetMessage()
				return nil
			}
		}
		return fmt.Errorf("%v", hs)
	})
	return found
}

// TestOldSparseVolumeIsMadeThick stages a volume made before provisioning
// was recorded (a sparse image and no record): GetCapacity accounts for it
// at its full size, it is staged as ever, and its image is then allocated
// whole and its record says thick. The data directory is a filesystem of
// its own: on the shared one, other packages' tests, run at once, moved its
// free space between the two GetCapacity calls by megabytes.
func TestOldSparseVolumeIsMadeThick(t *testing.T) {
	p := testenv.New(t)
	smallDataDir(t, p, 256*mib)
	p.Start()
	before := capacityFor(t, p, "thick")
	const size = 64 * mib
	must(t, "data directory", os.MkdirAll(p.DataDir, 0o700))
	f, err := os.Create(filepath.Join(p.DataDir, "old.img"))
	must(t, "old image", err)
	must(t, "size", f.Truncate(size))
	f.Close()
	if after := capacityFor(t, p, "thick"); before-after < size-mib {
		t.Errorf("capacity fell by %d bytes for an old sparse %d-byte volume, want all of it", before-after, size)
	}
	staging, target := upPublishedExisting(t, p, "old")
	// The reconciler records the volume thick only once the space is
	// reserved, just after the image is allocated whole: wait for both.
	poll.Until(t, 20*time.Second, 100*time.Millisecond, "old image allocated whole and the volume thick after its stage", func() error {
		if got := allocated(t, p, "old"); got < size {
			return fmt.Errorf("%d of %d bytes allocated", got, size)
		}
		out, err := exec.Command(testenv.Binary(t), "status", "--state-dir", p.StateDir).CombinedOutput()
		if err != nil {
			return fmt.Errorf("status: %v: %s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 3 && f[0] == "old" && f[3] == "thick" { // volume, pool, phase, provisioning
				return nil
			}
		}
		return fmt.Errorf("status:\n%s\nwant the old volume thick", out)
	})
	unpublish(t, p, "old", target)
	unstage(t, p, "old", staging)
	_, err = p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: "old"})
	must(t, "delete", err)
}

// TestThinPoolFullIsReported overcommits a 320 MiB data directory with two
// thin volumes of 256 MiB and writes to one until its writes fail for want
// of space in the data directory: the application sees ENOSPC, both volumes
// report PoolFull, and once the other volume frees space they report
// SpaceRanOut (the filesystem may have lost metadata writes) until they are
// staged again, checked: then they are healthy, take writes, and what was
// acknowledged before reads back intact.
func TestThinPoolFullIsReported(t *testing.T) {
	// Two volumes of 256 MiB fit twice the ~285 MiB free less a guard of
	// 16 MiB.
	p := testenv.New(t, testenv.VolumeHealth, "--thin-overprovisioning-ratio", "2", "--pool-guard", "16Mi", "--resync-period", "1s")
	smallDataDir(t, p, 320*mib)
	p.Start()

	const size = 256 * mib
	ids := []string{vid("thin-a"), vid("thin-b")}
	stagings, targets := map[string]string{}, map[string]string{}
	for _, name := range []string{"thin-a", "thin-b"} {
		must(t, "create "+name, createProvisioned(p, t, name, "thin", size))
		id := vid(name)
		stagings[id], targets[id] = upPublishedExisting(t, p, id)
	}
	fill(t, targets[ids[0]], "big", 150*mib)
	sum, n, err := fillUntilError(targets[ids[1]], "big", size)
	// The loop device fails the write with BLK_STS_NOSPC: the application
	// sees ENOSPC at fsync.
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("thin-b: writes failed after %d bytes with %v, want ENOSPC", n, err)
	}
	t.Logf("thin-b: writes failed after %d bytes: %v", n, err)
	for _, id := range ids {
		t.Logf("%s: %s", id, waitCondition(t, p, id, "PoolFull"))
	}
	must(t, "remove", os.Remove(filepath.Join(targets[ids[0]], "big")))
	exec.Command("sync").Run()
	// ext4 may find its lost metadata writes first (at a journal commit)
	// and go read-only, which says more.
	for _, id := range ids {
		t.Logf("%s once there is room: %s", id, waitCondition(t, p, id, "SpaceRanOut", "FilesystemReadOnly"))
	}

	// What the kubelet does when the pods go and come back: the
	// filesystems are mounted anew, after fsck.
	for _, id := range ids {
		unpublish(t, p, id, targets[id])
		unstage(t, p, id, stagings[id])
		must(t, "stage "+id+" again", stage(t, p, id, stagings[id], rwo))
		must(t, "publish "+id+" again", publish(t, p, id, stagings[id], targets[id], false))
		waitCondition(t, p, id, "")
	}
	f, err := os.Open(filepath.Join(targets[ids[1]], "big"))
	must(t, "open what was written", err)
	h := sha256.New()
	_, err = io.CopyN(h, f, n)
	f.Close()
	if err != nil || !bytes.Equal(h.Sum(nil), sum) {
		t.Errorf("thin-b: the %d bytes acknowledged before the data directory filled up read back differently (%v)", n, err)
	}
	if n, _, err := fillUntilError(targets[ids[1]], "after", 32*mib); err != nil {
		t.Errorf("thin-b: staged again with room, writes fail after %d bytes: %v", n, err)
	}

	for _, id := range ids {
		downAndDelete(t, p, id)
	}
}

// fillUntilError writes random data to a new file at dir in 1 MiB steps,
// each fsynced, until a write or sync fails or limit bytes are written,
// and returns the SHA-256 and length of what was acknowledged, and the
// error.
func fillUntilError(dir, name string, limit int64) ([]byte, int64, error) {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, mib)
	var n int64
	for n < limit {
		rand.Read(buf)
		w, err := f.Write(buf)
		if err == nil {
			err = f.Sync()
		}
		if err != nil {
			return h.Sum(nil), n, err
		}
		h.Write(buf[:w])
		n += int64(w)
	}
	return h.Sum(nil), n, nil
}
