package integration

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/converge-csi/converge/pkg/volstatus"
	"github.com/converge-csi/converge/test/testenv"
)

const poolKey = "converge.csi.dev/pool"

// createIn makes a volume named name of size bytes in pool ("" for none
// named) and returns its ID, or the error.
func createIn(t *testing.T, p *testenv.Plugin, name, pool string, size int64, source *csi.VolumeContentSource) (string, error) {
	t.Helper()
	params := map[string]string{}
	if pool != "" {
		params[poolKey] = pool
	}
	resp, err := p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: name, Parameters: params,
		CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{rwo}, VolumeContentSource: source})
	return resp.GetVolume().GetVolumeId(), err
}

// capacityOf is what GetCapacity answers for thick volumes of pool.
func capacityOf(t *testing.T, p *testenv.Plugin, pool string) (available, largest int64, err error) {
	t.Helper()
	resp, err := p.Controller().GetCapacity(ctx(t), &csi.GetCapacityRequest{Parameters: map[string]string{poolKey: pool}})
	return resp.GetAvailableCapacity(), resp.GetMaximumVolumeSize().GetValue(), err
}

// TestPools runs csi-node with two pools besides the default one, an xfs
// that clones by reflink and an ext4, each a filesystem of its own. A
// StorageClass's pool places the image in that pool's directory, and
// GetCapacity answers for the pool named; an invalid name is refused, one
// this node lacks has no capacity and is RESOURCE_EXHAUSTED. A snapshot
// lives in its volume's pool; a restore into another pool copies it. An
// expansion grows the image in its pool. Across a restart every pool's
// volumes are found as they were.
func TestPools(t *testing.T) {
	p := testenv.New(t)
	fast := testenv.PoolFilesystem(t, p, "fast", 512*mib, "xfs", "-q", "-f", "-m", "reflink=1")
	plain := testenv.PoolFilesystem(t, p, "plain", 256*mib, "ext4", "-q", "-F", "-m0")
	p.Args = append(p.Args, "--pool", "fast="+fast, "--pool", "plain="+plain+",ratio=2")
	p.Start()

	// Placement and capacity.
	id, err := createIn(t, p, "in-fast", "fast", volSize, nil)
	must(t, "create in fast", err)
	if _, err := os.Stat(filepath.Join(fast, id+".img")); err != nil {
		t.Errorf("the image of a volume of pool fast: %v", err)
	}
	for _, dir := range []string{p.DataDir, plain} {
		if _, err := os.Stat(filepath.Join(dir, id+".img")); !os.IsNotExist(err) {
			t.Errorf("an image of %s in %s: %v", id, dir, err)
		}
	}
	_, err = createIn(t, p, "in-fast", "plain", volSize, nil)
	wantCode(t, "the same name in another pool", err, codes.AlreadyExists)
	_, err = createIn(t, p, "bad-name", "Fast_1", volSize, nil)
	wantCode(t, "an invalid pool name", err, codes.InvalidArgument)
	_, err = createIn(t, p, "elsewhere", "nvme", volSize, nil)
	wantCode(t, "a pool this node lacks", err, codes.ResourceExhausted)
	if err != nil && !strings.Contains(err.Error(), "nvme") {
		t.Errorf("the refusal does not name the pool: %v", err)
	}
	fastAvail, _, err := capacityOf(t, p, "fast")
	must(t, "capacity of fast", err)
	plainAvail, _, err := capacityOf(t, p, "plain")
	must(t, "capacity of plain", err)
	if fastAvail > 512*mib-volSize || fastAvail < 256*mib || plainAvail > 256*mib || plainAvail < 128*mib {
		t.Errorf("capacity: fast %d, plain %d; want each its own filesystem's free space, fast's less the volume made in it", fastAvail, plainAvail)
	}
	if avail, _, err := capacityOf(t, p, "nvme"); err != nil || avail != 0 {
		t.Errorf("capacity of a pool this node lacks: got %d, %v; want 0", avail, err)
	}
	_, err = createIn(t, p, "too-big", "plain", 300*mib, nil)
	wantCode(t, "more than the pool's filesystem", err, codes.OutOfRange)

	// A snapshot in the volume's pool, restored into another pool.
	_, target := upPublishedExisting(t, p, id)
	must(t, "write", os.WriteFile(filepath.Join(target, "data"), []byte("in pool fast"), 0o600))
	must(t, "sync", syncFile(filepath.Join(target, "data")))
	snap := snapshotOf(t, p, "fast-snap", id)
	if _, err := os.Stat(filepath.Join(fast, "snapshots", snap.GetSnapshotId()+".snap")); err != nil {
		entries, _ := os.ReadDir(filepath.Join(fast, "snapshots"))
		t.Errorf("the snapshot is not in its volume's pool: %v (%v)", err, entries)
	}
	restored, err := createIn(t, p, "restored-plain", "plain", volSize, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshotId()}}})
	must(t, "restore into plain", err)
	if _, err := os.Stat(filepath.Join(plain, restored+".img")); err != nil {
		t.Errorf("the restored image is not in pool plain: %v", err)
	}
	_, restoredAt := upPublishedExisting(t, p, restored)
	if got, err := os.ReadFile(filepath.Join(restoredAt, "data")); err != nil || string(got) != "in pool fast" {
		t.Errorf("the restored volume: got %q, %v", got, err)
	}

	// Expansion in the volume's own pool (the image: an ext4 grows
	// online only with CAP_SYS_RESOURCE, which root lacks here), within
	// that pool's space.
	_, err = p.Controller().ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: id,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * volSize}})
	must(t, "expand in fast", err)
	_, err = p.Controller().ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: restored,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 300 * mib}})
	wantCode(t, "an expansion past pool plain's filesystem", err, codes.OutOfRange)
	if st, err := os.Stat(filepath.Join(fast, id+".img")); err != nil || st.Size() != 2*volSize {
		t.Errorf("the grown image in pool fast: %v, %v; want %d bytes", st, err, 2*volSize)
	}

	// A restart finds every pool's volumes as they were.
	p.Stop()
	p.Start()
	for _, path := range []string{target, restoredAt} {
		if _, err := p.Node().NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: map[string]string{target: id, restoredAt: restored}[path], VolumePath: path}); err != nil {
			t.Errorf("stats at %s after the restart: %v", path, err)
		}
	}
	// Status and metrics speak of each pool.
	out, err := exec.Command(testenv.Binary(t), "status", "--state-dir", p.StateDir).CombinedOutput()
	must(t, "csi-node status", err)
	t.Logf("csi-node status with three pools:\n%s", out)
	for _, want := range []string{"POOL default    " + p.DataDir + ": size", "POOL fast       " + fast + ": size", "POOL plain      " + plain + ": size",
		"), xfs, punches holes", "), ext4, punches holes", "ratio 2)", "(copied by reflink)", "(copied by sparse)"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("csi-node status lacks %q", want)
		}
	}
	_, metrics := p.StatusGet("/metrics")
	for _, want := range []string{`converge_data_directory_bytes{kind="promised_thick",pool="fast"} 1.34217728e+08`,
		`converge_data_directory_bytes{kind="promised_thick",pool="plain"} 6.7108864e+07`,
		`converge_data_directory_nearly_full{pool="plain"} 0`, `converge_snapshots{pool="fast"} 1`, `converge_snapshots{pool="default"} 0`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	downAndDelete(t, p, restored)
	downAndDelete(t, p, id)
	_, err = p.Controller().DeleteSnapshot(ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshotId()})
	must(t, "delete the snapshot", err)
	for _, dir := range []string{fast, plain} {
		if entries, _ := os.ReadDir(dir); len(entries) > 2 {
			t.Errorf("pool directory %s after the deletions: %v", dir, entries)
		}
	}
}

// TestPoolOnAnotherPoolsFilesystemIsNotServed starts csi-node with two
// pools on the default pool's filesystem, as a node whose pools' disks did
// not mount has them: both would promise the default pool's space, so
// neither is served, and the start goes on, since refusing it would stop
// the default pool's volumes too. Each is reported unreadable with the
// reason (the status, /metrics), a volume asked of one is
// RESOURCE_EXHAUSTED (the provisioner tries another node), and the default
// pool works.
func TestPoolOnAnotherPoolsFilesystemIsNotServed(t *testing.T) {
	p := testenv.New(t)
	a, b := mkdir(t, filepath.Join(p.Dir, "a")), mkdir(t, filepath.Join(p.Dir, "b"))
	p.Args = append(p.Args, "--pool", "a="+a, "--pool", "b="+b)
	p.Start()
	code, body := p.StatusGet("/status/pools")
	var pools []volstatus.PoolStatus
	if err := json.Unmarshal([]byte(body), &pools); code != http.StatusOK || err != nil {
		t.Fatalf("/status/pools: %d %v\n%s", code, err, body)
	}
	errs := map[string]string{}
	for _, ps := range pools {
		errs[ps.Name] = ps.Error
	}
	if len(pools) != 3 || errs["default"] != "" || !strings.Contains(errs["a"], "pools default and a are on one filesystem") ||
		!strings.Contains(errs["b"], "pools default and b are on one filesystem") {
		t.Errorf("pools: got %+v, want default served, a and b not, each saying why", pools)
	}
	_, metrics := p.StatusGet("/metrics")
	for _, want := range []string{`converge_data_directory_unreadable{pool="a"} 1`, `converge_data_directory_unreadable{pool="default"} 0`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	_, err := createIn(t, p, "wants-a", "a", volSize, nil)
	wantCode(t, "a volume of a pool not served", err, codes.ResourceExhausted)
	id := createSized(t, p, "in-default", volSize)
	_, err = p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
	must(t, "delete the default pool's volume", err)
}

// TestPoolNotOnThisNode starts csi-node with a pool whose directory this
// node does not have (one DaemonSet serves nodes with and without the
// pool's disk): it starts without the pool and never makes its directory,
// a volume asked of it is RESOURCE_EXHAUSTED (the provisioner tries
// another node), GetCapacity answers 0 for it, and the default pool works.
func TestPoolNotOnThisNode(t *testing.T) {
	p := testenv.New(t)
	absent := filepath.Join(p.Dir, "mnt", "nvme")
	p.Args = append(p.Args, "--pool", "fast="+absent)
	p.Start()
	if _, err := os.Stat(absent); !os.IsNotExist(err) {
		t.Errorf("csi-node made the directory of a pool this node lacks: %v", err)
	}
	_, err := createIn(t, p, "wants-fast", "fast", volSize, nil)
	wantCode(t, "a volume of a pool this node lacks", err, codes.ResourceExhausted)
	if avail, _, err := capacityOf(t, p, "fast"); err != nil || avail != 0 {
		t.Errorf("capacity of a pool this node lacks: %d, %v; want 0", avail, err)
	}
	id, err := createIn(t, p, "in-default", "", volSize, nil)
	must(t, "a volume of the default pool", err)
	_, err = p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
	must(t, "delete", err)
	if !strings.Contains(p.Log(), `"Storage pool is not on this node: its directory does not exist" pool="fast"`) {
		t.Error("csi-node did not log that the pool is not on this node")
	}
}
