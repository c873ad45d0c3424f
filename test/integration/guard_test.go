package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-csi/converge/pkg/volstatus"
	"github.com/converge-csi/converge/test/testenv"
)

// spaceOf returns the size and the free space of dir's filesystem as the
// kubelet sees them for nodefs.available: f_blocks and f_bavail.
func spaceOf(t *testing.T, dir string) (total, free int64) {
	t.Helper()
	var st unix.Statfs_t
	must(t, "statfs "+dir, unix.Statfs(dir, &st))
	return int64(st.Blocks) * st.Bsize, int64(st.Bavail) * st.Bsize
}

// guardOf is a guard of percent of a filesystem of total bytes, in whole
// 4 KiB blocks as the plugin keeps it.
func guardOf(total int64, percent float64) int64 {
	g := int64(float64(total) * percent / 100)
	return (g + 4095) / 4096 * 4096
}

// defaultPool returns the default pool's space as the plugin reports it.
func defaultPool(t *testing.T, p *testenv.Plugin) volstatus.PoolStatus {
	t.Helper()
	code, body := p.StatusGet("/status/pool")
	var pool volstatus.PoolStatus
	if err := json.Unmarshal([]byte(body), &pool); err != nil || code != 200 {
		t.Fatalf("/status/pool: %d %v: %s", code, err, body)
	}
	return pool
}

// fillWithThick creates thick volumes of size bytes named prefix-0, -1...
// until one is refused, which must be RESOURCE_EXHAUSTED for the guard and
// leave no image, and returns the IDs of those made.
func fillWithThick(t *testing.T, p *testenv.Plugin, prefix string, size int64) []string {
	t.Helper()
	var ids []string
	for i := 0; ; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		err := createProvisioned(p, t, name, "thick", size)
		if err != nil {
			wantCode(t, "thick create past the guard", err, codes.ResourceExhausted)
			if !strings.Contains(status.Convert(err).Message(), "guard") {
				t.Errorf("refusal %q does not name the guard", status.Convert(err).Message())
			}
			if _, err := os.Stat(filepath.Join(p.DataDir, vid(name)+".img")); !os.IsNotExist(err) {
				t.Errorf("the refused volume left an image: %v", err)
			}
			return ids
		}
		ids = append(ids, vid(name))
		if i > 20 {
			t.Fatalf("no refusal after %d thick volumes of %d bytes", i, size)
		}
	}
}

// checkGuardFree checks that dir's filesystem has guard bytes free, and no
// room above it for another volume of size bytes: the guard refused the
// volume, not a lack of space.
func checkGuardFree(t *testing.T, dir string, guard, size int64, made int) {
	t.Helper()
	total, free := spaceOf(t, dir)
	t.Logf("%d thick volumes of %d MiB made; %d MiB of %d MiB free, guard %d MiB", made, size/mib, free/mib, total/mib, guard/mib)
	if free < guard {
		t.Errorf("%d bytes free after the thick volumes, below the guard of %d bytes", free, guard)
	}
	if free-guard >= size {
		t.Errorf("%d bytes free, %d above the guard: a volume of %d bytes was refused that fits", free, free-guard, size)
	}
}

// TestGuardStaysFreeOfThickVolumes fills a 320 MiB data directory whose
// guard is 25% with thick volumes of 48 MiB until one is refused: the
// refusal is RESOURCE_EXHAUSTED and names the guard, the guard is still
// free, and GetCapacity, the status and the metrics say what is left above
// it. Started again with a guard above what is free, as after an upgrade
// that brought the guard to a pool filled before, the pool is nearly full:
// its volumes stage, publish and take writes as before, while a new
// volume, thick or thin, an expansion and a snapshot, even one that takes
// no space at once, are refused RESOURCE_EXHAUSTED, and GetCapacity
// answers 0.
func TestGuardStaysFreeOfThickVolumes(t *testing.T) {
	p := testenv.New(t, "--pool-guard", "25%")
	smallDataDir(t, p, 320*mib)
	p.Start()

	const size = 48 * mib
	total, _ := spaceOf(t, p.DataDir)
	guard := guardOf(total, 25)
	// A thin volume never written: its snapshot takes no space at once.
	must(t, "create empty thin", createProvisioned(p, t, "empty-thin", "thin", 4*mib))
	ids := fillWithThick(t, p, "thick", size)
	checkGuardFree(t, p.DataDir, guard, size, len(ids))

	pool := defaultPool(t, p)
	if pool.GuardBytes != guard || pool.NearlyFull || pool.KubeletFilesystem {
		t.Errorf("status: guard %d, nearly full %v, on the kubelet's filesystem %v; want %d, false, false", pool.GuardBytes, pool.NearlyFull, pool.KubeletFilesystem, guard)
	}
	thick, thin := capacityFor(t, p, "thick"), capacityFor(t, p, "thin")
	if thick >= size || thick > pool.FreeBytes-guard || thick != pool.ThickAvailableBytes || thin != thick {
		t.Errorf("GetCapacity thick %d, thin %d; status: available %d, %d free above the guard; want what is left above the guard, less than %d",
			thick, thin, pool.ThickAvailableBytes, pool.FreeBytes-guard, size)
	}
	if _, metrics := p.StatusGet("/metrics"); !strings.Contains(metrics, fmt.Sprintf(`converge_data_directory_bytes{kind="guard",pool="default"} %g`, float64(guard))) {
		t.Errorf("the metrics lack the guard of %d bytes", guard)
	}

	// Past the guard: what was promised keeps working, nothing more is.
	p.Stop()
	p.Args = []string{"--pool-guard", "60%"}
	p.Start()
	if pool := defaultPool(t, p); !pool.NearlyFull || pool.ThickAvailableBytes != 0 || pool.ThinAvailableBytes != 0 {
		t.Errorf("status past the guard: nearly full %v, available thick %d, thin %d; want true, 0, 0", pool.NearlyFull, pool.ThickAvailableBytes, pool.ThinAvailableBytes)
	}
	for _, prov := range []string{"thick", "thin"} {
		if c := capacityFor(t, p, prov); c != 0 {
			t.Errorf("GetCapacity %s past the guard: %d, want 0", prov, c)
		}
		wantCode(t, prov+" create past the guard", createProvisioned(p, t, "late-"+prov, prov, 4*mib), codes.ResourceExhausted)
	}
	_, target := upPublishedExisting(t, p, ids[0])
	if _, n := fill(t, target, "data", size); n < size/2 {
		t.Errorf("%s: ENOSPC after %d bytes of a %d-byte volume promised before the guard", ids[0], n, size)
	}
	_, err := p.Controller().ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: ids[1], CapacityRange: &csi.CapacityRange{RequiredBytes: size + 16*mib}})
	wantCode(t, "expansion past the guard", err, codes.ResourceExhausted)
	_, err = p.Controller().CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: ids[0]})
	wantCode(t, "snapshot past the guard", err, codes.ResourceExhausted)
	_, err = p.Controller().CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "snap-empty", SourceVolumeId: vid("empty-thin")})
	wantCode(t, "snapshot of an empty volume past the guard", err, codes.ResourceExhausted)
	if err != nil && !strings.Contains(status.Convert(err).Message(), "guard") {
		t.Errorf("refusal %q does not name the guard", status.Convert(err).Message())
	}

	downAndDelete(t, p, ids[0])
	for _, id := range append(ids[1:], vid("empty-thin")) {
		_, err := p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
		must(t, "delete "+id, err)
	}
}

// TestGuardOnTheKubeletsFilesystem runs the plugin with its data directory
// and the kubelet's directory on one 320 MiB filesystem, as on a node
// whose root filesystem holds both, and no --pool-guard: the pool keeps
// 20% free, above the kubelet's default eviction threshold (15% where the
// images share the filesystem), and says that it is on the kubelet's
// filesystem. Thick volumes fill it up to that guard and no further. A
// --pool-guard below the threshold is obeyed, and warned of in the log
// and the status.
func TestGuardOnTheKubeletsFilesystem(t *testing.T) {
	p := testenv.New(t)
	testenv.FilesystemAt(t, p, p.StateDir, 320*mib, "ext4", "-q", "-F", "-m0")
	kubelet := mkdir(t, filepath.Join(p.StateDir, "kubelet"))
	p.Args = []string{"--kubelet-dir", kubelet}
	p.Start()

	const size = 32 * mib
	total, _ := spaceOf(t, p.DataDir)
	guard := guardOf(total, 20)
	if pool := defaultPool(t, p); pool.GuardBytes != guard || !pool.KubeletFilesystem || pool.GuardBelowKubeletEviction {
		t.Errorf("status: guard %d, on the kubelet's filesystem %v, below its threshold %v; want %d, true, false",
			pool.GuardBytes, pool.KubeletFilesystem, pool.GuardBelowKubeletEviction, guard)
	}
	ids := fillWithThick(t, p, "thick", size)
	checkGuardFree(t, p.DataDir, guard, size, len(ids))
	if _, free := spaceOf(t, p.DataDir); free*100 < total*15 {
		t.Errorf("%d of %d bytes free: below the kubelet's eviction threshold of 15%%", free, total)
	}
	if strings.Contains(p.Log(), "below the kubelet's eviction threshold") {
		t.Error("the plugin warns of a guard below the kubelet's eviction threshold with its default guard")
	}

	p.Stop()
	p.Args = append(p.Args, "--pool-guard", "5%")
	p.Start()
	if !strings.Contains(p.Log(), "Storage pool's guard is below the kubelet's eviction threshold") {
		t.Error("no warning in the log of a guard of 5% on the kubelet's filesystem")
	}
	if pool := defaultPool(t, p); !pool.GuardBelowKubeletEviction || pool.GuardBytes != guardOf(total, 5) {
		t.Errorf("status: guard %d, below the kubelet's threshold %v; want 5%% and true", pool.GuardBytes, pool.GuardBelowKubeletEviction)
	}
	// The guard configured is obeyed: room for one more.
	must(t, "thick create above a guard of 5%", createProvisioned(p, t, "more", "thick", size))
	for _, id := range append(ids, vid("more")) {
		_, err := p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
		must(t, "delete "+id, err)
	}
}
