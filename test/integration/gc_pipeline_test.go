package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/test/testenv"
)

// stubKubectl stands in for kubectl as docs/operations.md's csi-node gc
// pipeline calls it: "get crd" succeeds when $STUB/crds exists; "get
// KINDS -o json" prints $STUB/KINDS.json and exits with the status in
// $STUB/KINDS.exit, or, with no such file, fails as kubectl does for a
// kind the server lacks; "get pod" names a pod; "exec ... -- csi-node
// ARGS" runs the test's csi-node with ARGS against the test's plugin.
const stubKubectl = `#!/bin/sh
case "$1" in
get)
	case "$2" in
	crd)
		[ -e "$STUB/crds" ] && exit 0
		echo "Error from server (NotFound): customresourcedefinitions.apiextensions.k8s.io \"$3\" not found" >&2
		exit 1 ;;
	pod)
		echo pod/converge-node-stub
		exit 0 ;;
	esac
	[ "$3 $4" = "-o json" ] || { echo "stub kubectl: unexpected get: $*" >&2; exit 2; }
	if [ ! -e "$STUB/$2.json" ]; then
		echo "error: the server doesn't have a resource type \"${2#*,}\"" >&2
		exit 1
	fi
	cat "$STUB/$2.json"
	exit "$(cat "$STUB/$2.exit")" ;;
exec)
	while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done
	shift 2
	exec "$CSI_NODE" "$@" --state-dir "$STATE_DIR" ;;
esac
echo "stub kubectl: unexpected: $*" >&2
exit 2
`

// docsGCPipeline is the csi-node gc line of docs/operations.md, found as
// test/e2e finds it.
func docsGCPipeline(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	must(t, "reading docs/operations.md", err)
	var pipeline string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "| kubectl exec") && strings.Contains(l, "csi-node gc") {
			pipeline = l
		}
	}
	if pipeline == "" {
		t.Fatal("docs/operations.md has no csi-node gc pipeline (a line with | kubectl exec ... csi-node gc)")
	}
	return pipeline
}

// TestGCPipeline runs docs/operations.md's csi-node gc line, as written,
// with --delete --min-age=0, against what kubectl prints when it fails in
// part or lists less than the cluster holds, or another cluster's: each
// such listing deletes nothing, and gc says why. The line deletes exactly the volume and the
// snapshot nothing references with the snapshot CRDs installed, and the
// volume alone without them (a default install), keeping the snapshots.
func TestGCPipeline(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	ref := create(t, p, "gcp-ref")
	orphan := create(t, p, "gcp-orphan")
	refSnap := snapshotOf(t, p, "gcp-ref-snap", ref).GetSnapshotId()
	orphanSnap := snapshotOf(t, p, "gcp-orphan-snap", ref).GetSnapshotId()
	// A pre-provisioned group: only its VolumeGroupSnapshotContent names it.
	grp, err := p.Groups().CreateVolumeGroupSnapshot(ctx(t), &csi.CreateVolumeGroupSnapshotRequest{Name: "gcp-group", SourceVolumeIds: []string{ref}})
	must(t, "CreateVolumeGroupSnapshot", err)
	member := grp.GetGroupSnapshot().GetSnapshots()[0].GetSnapshotId()

	pv := func(driver, handle string) string {
		return `{"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-` + handle + `"}, "spec": {"csi": {"driver": "` + driver + `", "volumeHandle": "` + handle + `"}}}`
	}
	content := `{"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent", "metadata": {"name": "snapcontent-1"},
		"spec": {"driver": "converge.csi.dev", "source": {"volumeHandle": "` + ref + `"}}, "status": {"snapshotHandle": "` + refSnap + `"}}`
	list := func(items ...string) string {
		return `{"apiVersion": "v1", "items": [` + strings.Join(items, ",\n") + `], "kind": "List", "metadata": {"resourceVersion": ""}}` + "\n"
	}
	pvs := []string{pv("converge.csi.dev", ref), pv("other.csi.dev", orphan)}
	groupContent := `{"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshotContent", "metadata": {"name": "groupcontent-1"},
		"spec": {"driver": "converge.csi.dev", "source": {"groupSnapshotHandles": {"volumeGroupSnapshotHandle": "` + grp.GetGroupSnapshot().GetGroupSnapshotId() + `", "volumeSnapshotHandles": ["` + member + `"]}}}}`
	documented := list(append(pvs, content, groupContent)...)
	const kinds = "pv,volumesnapshotcontents,volumegroupsnapshotcontents"

	stub := t.TempDir()
	must(t, "stub kubectl", os.WriteFile(filepath.Join(stub, "kubectl"), []byte(stubKubectl), 0o755))
	pipeline := docsGCPipeline(t)
	run := func(crds bool, kinds, output string, exit int, args ...string) (string, error) {
		t.Helper()
		for _, f := range []string{"crds", "pv.json", "pv.exit", kinds + ".json", kinds + ".exit"} {
			os.Remove(filepath.Join(stub, f))
		}
		if crds {
			must(t, "stub CRDs", os.WriteFile(filepath.Join(stub, "crds"), nil, 0o644))
		}
		must(t, "stub listing", os.WriteFile(filepath.Join(stub, kinds+".json"), []byte(output), 0o644))
		must(t, "stub exit", os.WriteFile(filepath.Join(stub, kinds+".exit"), []byte(strconv.Itoa(exit)), 0o644))
		cmd := exec.Command("sh", "-c", pipeline+" "+strings.Join(args, " "))
		cmd.Env = append(os.Environ(), "PATH="+stub+":"+os.Getenv("PATH"), "NODE=node-1",
			"STUB="+stub, "CSI_NODE="+testenv.Binary(t), "STATE_DIR="+p.StateDir)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	volumeThere := func(id string) bool {
		_, err := os.Stat(filepath.Join(p.DataDir, id+".img"))
		return err == nil
	}
	snapshotThere := func(id string) bool {
		resp, err := p.Controller().ListSnapshots(ctx(t), &csi.ListSnapshotsRequest{SnapshotId: id})
		must(t, "ListSnapshots", err)
		return len(resp.GetEntries()) == 1
	}
	// present returns which of the test's volumes and snapshots are there.
	present := func(ids ...string) []string {
		var out []string
		for _, id := range ids {
			if volumeThere(id) || snapshotThere(id) {
				out = append(out, id)
			}
		}
		return out
	}
	all := []string{ref, orphan, refSnap, orphanSnap, member}

	for _, tc := range []struct {
		name, output string
		exit         int
		wantRefusal  string
	}{
		{name: "kubectl could list nothing", output: list(), exit: 1, wantRefusal: "kubectl exited 1"},
		{name: "kubectl could list the contents alone", output: list(content), exit: 1, wantRefusal: "kubectl exited 1"},
		{name: "kubectl could list the PersistentVolumes alone", output: list(pvs...), exit: 1, wantRefusal: "kubectl exited 1"},
		{name: "kubectl cut short in its output", output: documented[:len(documented)/2], exit: 141, wantRefusal: "reading the input as JSON"},
		{name: "an empty listing", output: list(), wantRefusal: "names no PersistentVolume of converge.csi.dev"},
		{name: "a listing of the contents alone", output: list(content), wantRefusal: "add --cluster-has-no-pvs"},
		{name: "a listing of another driver's PersistentVolume alone", output: list(pv("other.csi.dev", orphan), content), wantRefusal: "names no PersistentVolume of converge.csi.dev"},
		{name: "a listing of another cluster, with a node of this name", output: list(pv("converge.csi.dev", "pvc-other_"+testenv.NodeID)), wantRefusal: "add --node-has-no-pvs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(true, kinds, tc.output, tc.exit, "--delete", "--min-age=0")
			t.Logf("%s", out)
			if err == nil || !strings.Contains(out, tc.wantRefusal) {
				t.Errorf("the pipeline: %v; want it refused with %q", err, tc.wantRefusal)
			}
			if got := present(all...); !slices.Equal(got, all) {
				t.Errorf("there after the pipeline: %v, want %v", got, all)
			}
		})
	}

	// The documented listing, with the snapshot CRDs: exactly the volume
	// and the snapshot nothing references go; the group its content names
	// stays.
	out, err := run(true, kinds, documented, 0, "--delete", "--min-age=0")
	t.Logf("the documented listing:\n%s", out)
	if want := []string{ref, refSnap, member}; err != nil || !slices.Equal(present(all...), want) {
		t.Errorf("the documented listing: %v; there after it: %v, want %v", err, present(all...), want)
	}

	// A default install, without the snapshot CRDs: the line lists the
	// PersistentVolumes alone; the volume nothing references goes, every
	// snapshot stays, and gc says why.
	orphan2 := create(t, p, "gcp-orphan-2")
	orphanSnap2 := snapshotOf(t, p, "gcp-orphan-snap-2", ref).GetSnapshotId()
	out, err = run(false, "pv", list(pvs...), 0, "--delete", "--min-age=0")
	t.Logf("without the snapshot CRDs:\n%s", out)
	all = []string{ref, orphan2, refSnap, orphanSnap2, member}
	if want := []string{ref, refSnap, orphanSnap2, member}; err != nil || !slices.Equal(present(all...), want) {
		t.Errorf("without the snapshot CRDs: %v; there after it: %v, want %v", err, present(all...), want)
	}
	if !strings.Contains(out, "kept: the input names no VolumeSnapshotContent of the driver; if the cluster has none, add --cluster-has-no-snapshots") {
		t.Errorf("without the snapshot CRDs, gc does not say why it keeps the snapshots:\n%s", out)
	}
}
