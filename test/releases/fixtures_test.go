// Package releases makes the store fixtures of a release: the state store
// that a release's csi-node wrote, checked in under
// pkg/state/testdata/releases/<tag>/ so that pkg/state's tests prove that
// the current code still reads it. hack/store-fixtures.sh builds the
// release's csi-node from its commit and runs TestWriteStoreFixtures with
// it; without that script's environment the test is skipped.
package releases

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/test/testenv"
)

// OutEnv names the environment variable holding the directory the
// fixtures are written to; the test is skipped without it.
const OutEnv = "CONVERGE_FIXTURES_OUT"

// ReleaseEnv names the environment variable holding the release tag the
// binary was built from, written into the manifest.
const ReleaseEnv = "CONVERGE_FIXTURES_RELEASE"

// Manifest is what the generator asked of the release's csi-node, in
// pkg/state's fixture format (manifest.json): what every fixture state
// of the release must hold when the current code reads it.
type Manifest struct {
	Release string `json:"release"`
	// States are the subdirectories, each a copy of the state directory's
	// store (gzipped) at one moment; Replays says whether its log holds
	// records that bbolt does not, for Open to replay.
	States []State `json:"states"`
	// Volumes are every volume the store must hold, sorted by ID.
	Volumes []Volume `json:"volumes"`
	// Snapshots are taken: files of their own beside the images, outside
	// the store, their provenance in extended attributes (Xattrs), which
	// pkg/devices' tests read with the current code.
	Snapshots []Snapshot `json:"snapshots"`
}

// State is one copy of the store.
type State struct {
	Dir     string `json:"dir"`
	How     string `json:"how"`
	Replays bool   `json:"replays"`
}

// Volume is one volume as it was asked for.
type Volume struct {
	ID           string `json:"id"`
	Name         string `json:"name"`
	Pool         string `json:"pool,omitempty"`
	Provisioning string `json:"provisioning"`
	// Access is how CreateVolume made it: mount or block.
	Access string `json:"access"`
	// Formatted is the filesystem the plugin made on it; empty if none.
	Formatted string `json:"formatted,omitempty"`
	// FsSize is the size of the filesystem the plugin made or grew; 0 if
	// none.
	FsSize int64 `json:"fsSize,omitempty"`
	// Stage is its staging, nil if it is not staged.
	Stage *Stage `json:"stage,omitempty"`
	// Targets are the paths it is published at, sorted.
	Targets []string `json:"targets,omitempty"`
	// PendingSnapshots are the IDs of the snapshots asked of it and not
	// yet taken, sorted.
	PendingSnapshots []string `json:"pendingSnapshots,omitempty"`
	// ExpandBytes is the size NodeExpandVolume asked for; 0 if none.
	ExpandBytes int64 `json:"expandBytes,omitempty"`
	// FromSnapshot is the snapshot it was restored from, if any.
	FromSnapshot string `json:"fromSnapshot,omitempty"`
}

// Stage is a volume's staging as asked for.
type Stage struct {
	Path       string `json:"path"`
	Access     string `json:"access"`
	AccessMode string `json:"accessMode"`
}

// Snapshot is a snapshot taken: what it was asked of, and what its file
// holds.
type Snapshot struct {
	ID     string `json:"id"`
	Source string `json:"source"`
	// FsType and Access are the source's filesystem ("" for none) and how
	// it was made (mount or block).
	FsType string `json:"fsType,omitempty"`
	Access string `json:"access"`
	// Size is the size of its file; Xattrs are the user.* extended
	// attributes the release set on it.
	Size   int64             `json:"size"`
	Xattrs map[string]string `json:"xattrs"`
}

const size = 32 << 20

var (
	mountRWO = &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	blockRWO = &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
)

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// TestWriteStoreFixtures runs the csi-node of $CONVERGE_BINARY (a
// release's) on real loop devices and makes, in the default pool and in
// a pool "fast": a thick volume staged and published with a file
// written; a thin one only created; a thick raw block volume staged,
// published twice and grown; a thin one in pool fast staged; a snapshot
// of the first and of the raw one, a volume restored from the first, and
// a snapshot of the first asked for while someone else holds its
// filesystem frozen, so that its intent is in the store. It copies the store after
// a SIGKILL (the log not yet checkpointed into bbolt) and again after a
// restart and a SIGTERM (checkpointed), writes the manifest of what it
// asked for, and tears everything down.
func TestWriteStoreFixtures(t *testing.T) {
	out := os.Getenv(OutEnv)
	if out == "" || os.Getenv(testenv.BinaryEnv) == "" {
		t.Skipf("generator of release fixtures: run by hack/store-fixtures.sh (needs $%s and $%s)", OutEnv, testenv.BinaryEnv)
	}
	p := testenv.New(t)
	// Each pool on a filesystem of its own: what the volumes may take
	// does not depend on the machine's free space.
	testenv.FilesystemAt(t, p, p.DataDir, 512<<20, "ext4", "-q", "-F", "-m0")
	fast := testenv.PoolFilesystem(t, p, "fast", 128<<20, "ext4", "-q", "-F", "-m0")
	p.Args = append(p.Args, "--pool", "fast="+fast)
	p.Start()
	c, n := p.Controller(), p.Node()
	m := Manifest{Release: os.Getenv(ReleaseEnv)}

	create := func(name, pool, prov string, capability *csi.VolumeCapability, source *csi.VolumeContentSource) *Volume {
		params := map[string]string{"converge.csi.dev/provisioning": prov}
		if pool != "" {
			params["converge.csi.dev/pool"] = pool
		}
		resp, err := c.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: name, Parameters: params, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
			VolumeCapabilities: []*csi.VolumeCapability{capability}, VolumeContentSource: source})
		must(t, "create "+name, err)
		v := &Volume{ID: resp.GetVolume().GetVolumeId(), Name: name, Pool: pool, Provisioning: prov, Access: "mount"}
		if capability == blockRWO {
			v.Access = "block"
		}
		return v
	}
	stage := func(v *Volume, capability *csi.VolumeCapability) {
		path := filepath.Join(p.Root, "staging", v.Name)
		must(t, "mkdir", os.MkdirAll(path, 0o750))
		_, err := n.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: v.ID, StagingTargetPath: path, VolumeCapability: capability})
		must(t, "stage "+v.Name, err)
		v.Stage = &Stage{Path: path, Access: v.Access, AccessMode: "SINGLE_NODE_WRITER"}
		if v.Access == "mount" {
			v.Formatted, v.FsSize = "ext4", size
		}
	}
	publish := func(v *Volume, pod string, capability *csi.VolumeCapability) string {
		target := filepath.Join(p.Root, "pods", pod, v.Name)
		must(t, "mkdir", os.MkdirAll(filepath.Dir(target), 0o750))
		_, err := n.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: v.ID, StagingTargetPath: v.Stage.Path, TargetPath: target, VolumeCapability: capability})
		must(t, "publish "+v.Name, err)
		v.Targets = append(v.Targets, target)
		return target
	}

	thick := create("thick", "", "thick", mountRWO, nil)
	stage(thick, mountRWO)
	target := publish(thick, "pod-a", mountRWO)
	must(t, "write", os.WriteFile(filepath.Join(target, "data"), []byte("written by "+m.Release), 0o600))
	thin := create("thin", "", "thin", mountRWO, nil)
	raw := create("raw", "", "thick", blockRWO, nil)
	stage(raw, blockRWO)
	publish(raw, "pod-a", blockRWO)
	rawTarget := publish(raw, "pod-b", blockRWO)
	_, err := n.NodeExpandVolume(ctx(t), &csi.NodeExpandVolumeRequest{VolumeId: raw.ID, VolumePath: rawTarget, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * size}})
	must(t, "expand raw", err)
	raw.ExpandBytes = 2 * size
	inFast := create("in-fast", "fast", "thin", mountRWO, nil)
	stage(inFast, mountRWO)
	for _, of := range []*Volume{thick, raw} {
		snap, err := c.CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "snap-" + of.Name, SourceVolumeId: of.ID})
		must(t, "snapshot of "+of.Name, err)
		m.Snapshots = append(m.Snapshots, snapshotFile(t, filepath.Join(p.DataDir, "snapshots"), snap.GetSnapshot().GetSnapshotId(), of))
	}
	restored := create("restored", "", "thick", mountRWO,
		&csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: m.Snapshots[0].ID}}})
	restored.FromSnapshot = m.Snapshots[0].ID
	// A snapshot asked for and not yet taken is an intent in its
	// volume's record until it is taken; someone else's freeze of the
	// volume's filesystem holds it there (the plugin waits for the thaw).
	freeze(t, thick.Stage.Path)
	short, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err = c.CreateSnapshot(short, &csi.CreateSnapshotRequest{Name: "snap-pending", SourceVolumeId: thick.ID})
	cancel()
	if err == nil {
		t.Fatal("a snapshot of a filesystem frozen by someone else was taken")
	}
	thick.PendingSnapshots = []string{"snap-pending_" + testenv.NodeID}
	for _, v := range []*Volume{inFast, raw, restored, thick, thin} {
		m.Volumes = append(m.Volumes, *v)
	}

	p.Kill()
	m.States = append(m.States, State{Dir: "killed", How: "SIGKILL after the requests: the log holds records bbolt does not", Replays: true})
	saveStore(t, p.StateDir, filepath.Join(out, "killed"))
	p.Start()
	p.Stop()
	m.States = append(m.States, State{Dir: "stopped", How: "restart, then SIGTERM: the log checkpointed into bbolt at Close", Replays: false})
	saveStore(t, p.StateDir, filepath.Join(out, "stopped"))
	thaw(t, thick.Stage.Path)
	b, err := json.MarshalIndent(m, "", "  ")
	must(t, "manifest", err)
	must(t, "manifest", os.WriteFile(filepath.Join(out, "manifest.json"), append(b, '\n'), 0o644))

	// Tear everything down, as the kubelet and the provisioner would.
	p.Start()
	c, n = p.Controller(), p.Node()
	pending, err := c.CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "snap-pending", SourceVolumeId: thick.ID})
	must(t, "the pending snapshot after the thaw", err)
	_, err = c.DeleteSnapshot(ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: pending.GetSnapshot().GetSnapshotId()})
	must(t, "delete the pending snapshot", err)
	for _, v := range m.Volumes {
		for _, target := range v.Targets {
			_, err := n.NodeUnpublishVolume(ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: v.ID, TargetPath: target})
			must(t, "unpublish "+v.Name, err)
		}
		if v.Stage != nil {
			_, err := n.NodeUnstageVolume(ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: v.ID, StagingTargetPath: v.Stage.Path})
			must(t, "unstage "+v.Name, err)
		}
	}
	for _, v := range m.Volumes {
		_, err := c.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: v.ID})
		must(t, "delete "+v.Name, err)
	}
	for _, snap := range m.Snapshots {
		_, err = c.DeleteSnapshot(ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: snap.ID})
		must(t, "delete snapshot "+snap.ID, err)
	}
}

// snapshotFile describes the file of snapshot id, taken of v, in dir.
func snapshotFile(t *testing.T, dir, id string, v *Volume) Snapshot {
	t.Helper()
	path := filepath.Join(dir, id+".snap")
	st, err := os.Stat(path)
	must(t, "the snapshot's file", err)
	s := Snapshot{ID: id, Source: v.ID, FsType: v.Formatted, Access: v.Access, Size: st.Size(), Xattrs: map[string]string{}}
	buf := make([]byte, 4096)
	n, err := unix.Listxattr(path, buf)
	must(t, "listing the snapshot's xattrs", err)
	for _, name := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		if !strings.HasPrefix(name, "user.") {
			continue
		}
		val := make([]byte, 4096)
		n, err := unix.Getxattr(path, name, val)
		must(t, "reading xattr "+name, err)
		s.Xattrs[name] = string(val[:n])
	}
	return s
}

// saveStore copies the store's files of stateDir (state.db and its log
// state.db-wal), gzipped, into dir. The log is a preallocated file of
// zeros past its records: gzipped it takes a few kilobytes.
func saveStore(t *testing.T, stateDir, dir string) {
	t.Helper()
	must(t, "mkdir", os.MkdirAll(dir, 0o755))
	for _, name := range []string{"state.db", "state.db-wal"} {
		raw, err := os.ReadFile(filepath.Join(stateDir, name))
		must(t, "reading the store", err)
		var b bytes.Buffer
		w, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
		_, err = io.Copy(w, bytes.NewReader(raw))
		must(t, "gzip", err)
		must(t, "gzip", w.Close())
		must(t, "writing the fixture", os.WriteFile(filepath.Join(dir, name+".gz"), b.Bytes(), 0o644))
	}
}

// freeze freezes the filesystem mounted at path, as someone else than
// the plugin would, until thaw or the end of the test.
func freeze(t *testing.T, path string) {
	t.Helper()
	if out, err := exec.Command("fsfreeze", "--freeze", path).CombinedOutput(); err != nil {
		t.Fatalf("fsfreeze --freeze %s: %v: %s", path, err, out)
	}
	t.Cleanup(func() { exec.Command("fsfreeze", "--unfreeze", path).Run() })
}

// thaw thaws the filesystem at path that freeze froze.
func thaw(t *testing.T, path string) {
	t.Helper()
	if out, err := exec.Command("fsfreeze", "--unfreeze", path).CombinedOutput(); err != nil {
		t.Fatalf("fsfreeze --unfreeze %s: %v: %s", path, err, out)
	}
}
