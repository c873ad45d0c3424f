package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
)

// volumeSnapshot creates a VolumeSnapshot of claim in the converge class,
// waits for it to be ready, and deletes it when t ends.
func volumeSnapshot(t *testing.T, name, claimName string) {
	t.Helper()
	ctx := context.Background()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1",
		"kind":       "VolumeSnapshot",
		"metadata":   map[string]any{"name": name},
		"spec": map[string]any{
			"volumeSnapshotClassName": "converge",
			"source":                  map[string]any{"persistentVolumeClaimName": claimName},
		},
	}}
	snaps := c.dynamic.Resource(volumeSnapshots).Namespace(ns)
	if _, err := snaps.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create VolumeSnapshot %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := snaps.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete VolumeSnapshot %s: %v", name, err)
		}
	})
	poll(t, 2*time.Minute, "VolumeSnapshot "+name+" ready", func() (bool, string) {
		got, err := snaps.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ready, _, _ := unstructured.NestedBool(got.Object, "status", "readyToUse")
		return ready, fmt.Sprintf("%v", got.Object["status"])
	})
}

// claimFrom creates a claim of the converge class filled from source (a
// VolumeSnapshot, or a claim when snapshot is false), deleted when t ends.
func claimFrom(t *testing.T, name, source string, snapshot bool) {
	t.Helper()
	claimFromMode(t, name, source, snapshot, fs)
}

// claimFromMode is claimFrom with a volume mode.
func claimFromMode(t *testing.T, name, source string, snapshot bool, mode corev1.PersistentVolumeMode) {
	t.Helper()
	ref := &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: source}
	if snapshot {
		ref = &corev1.TypedObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: source}
	}
	makeClaim(t, name, mode, rwo, volumeSize, "converge", ref)
}

// testSnapshotRestoreAndClone runs snapshots through the real
// snapshot-controller and csi-snapshotter (--node-deployment): a pod
// writes, a VolumeSnapshot becomes ready, the pod writes more; a claim
// restored from the snapshot holds exactly what was written before it; a
// claim cloned from the source holds both; the source claim is deleted and
// the snapshot still restores; deleting the VolumeSnapshot deletes the
// snapshot on the node.
func testSnapshotRestoreAndClone(t *testing.T) {
	claim(t, "snap-src", fs, rwo)
	writer := startPod(t, podSpec{name: "snap-writer", claims: []string{"snap-src"}})
	src := boundVolume(t, "snap-src")
	mustExec(t, writer.Name, "echo before > "+dataDir+"/before && sync")
	volumeSnapshot(t, "snap-1", "snap-src")
	mustExec(t, writer.Name, "echo after > "+dataDir+"/after && sync")

	claimFrom(t, "snap-restored", "snap-1", true)
	reader := startPod(t, podSpec{name: "snap-reader", claims: []string{"snap-restored"}})
	if got := mustExec(t, reader.Name, "cat "+dataDir+"/before"); got != "before" {
		t.Errorf("the restored claim holds %q in before, want %q", got, "before")
	}
	if out, err := execIn(t, reader.Name, "ls "+dataDir+"/after"); err == nil {
		t.Errorf("the restored claim holds a file written after the snapshot: %s", out)
	}

	claimFrom(t, "snap-clone", "snap-src", false)
	cloneReader := startPod(t, podSpec{name: "snap-clone-reader", claims: []string{"snap-clone"}})
	if got := mustExec(t, cloneReader.Name, "cat "+dataDir+"/before "+dataDir+"/after"); got != "before\nafter" {
		t.Errorf("the clone holds %q, want both files", got)
	}

	// The source goes; the snapshot still restores.
	release(t, src, "snap-src", writer.Name)
	claimFrom(t, "snap-restored-2", "snap-1", true)
	reader2 := startPod(t, podSpec{name: "snap-reader-2", claims: []string{"snap-restored-2"}})
	if got := mustExec(t, reader2.Name, "cat "+dataDir+"/before"); got != "before" {
		t.Errorf("restored after the source's deletion: %q, want %q", got, "before")
	}

	for _, p := range []string{reader.Name, cloneReader.Name, reader2.Name} {
		deletePod(t, p)
	}
	ctx := context.Background()
	if err := c.dynamic.Resource(volumeSnapshots).Namespace(ns).Delete(ctx, "snap-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, time.Minute, "the snapshot deleted on the node", func() (bool, string) {
		entries, _ := os.ReadDir(filepath.Join(c.dataDir, "snapshots"))
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return len(names) == 0, strings.Join(names, ", ")
	})
}

// testSnapshotOfRawBlock takes a snapshot of a raw block claim a pod wrote
// to, then overwrites it: a block claim restored from the snapshot reads
// what was written before it.
func testSnapshotOfRawBlock(t *testing.T) {
	claim(t, "snap-raw", blk, rwo)
	writer := startPod(t, podSpec{name: "snap-raw-writer", claims: []string{"snap-raw"}, block: true})
	src := boundVolume(t, "snap-raw")
	write := func(token string) {
		t.Helper()
		mustExec(t, writer.Name, fmt.Sprintf("printf %%s %q | dd of=%s bs=4096 conv=sync,fsync 2>/dev/null", token, blockPath))
	}
	write("raw before")
	volumeSnapshot(t, "snap-raw-1", "snap-raw")
	write("raw after!")

	claimFromMode(t, "snap-raw-restored", "snap-raw-1", true, blk)
	reader := startPod(t, podSpec{name: "snap-raw-reader", claims: []string{"snap-raw-restored"}, block: true})
	if got := mustExec(t, reader.Name, fmt.Sprintf("dd if=%s bs=10 count=1 2>/dev/null", blockPath)); got != "raw before" {
		t.Errorf("the restored block claim reads %q, want %q", got, "raw before")
	}
	deletePod(t, reader.Name)
	release(t, src, "snap-raw", writer.Name)
}
