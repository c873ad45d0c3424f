package snaplabel

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// decideVolumes decides one group content of the volumes vols, of class
// "converge", in a world of nodes node-a and node-b holding pvs.
func decideVolumes(pvs []*corev1.PersistentVolume, vols ...any) []Action {
	w := World{Driver: driver, TopologyKey: topo,
		Nodes:   map[string]*corev1.Node{"node-a": node("node-a", true), "node-b": node("node-b", true)},
		Volumes: IndexVolumes(driver, pvs),
		GroupContents: []*unstructured.Unstructured{vgsc("g1", 0, map[string]any{
			"spec.source.volumeHandles": vols, "spec.volumeGroupSnapshotClassName": "converge"})},
		Classes: []*unstructured.Unstructured{class("converge", "")}}
	return Decide(w)
}

// named is p renamed, for a second PV that carries p's handle.
func named(p *corev1.PersistentVolume, name string) *corev1.PersistentVolume {
	p.Name = name
	return p
}

// checkRefused fails unless got is the one VolumeHandleAmbiguous warning
// on g1 (no label on it, nor on its class), holding every fragment.
func checkRefused(t *testing.T, got []Action, fragments ...string) {
	t.Helper()
	want := "warn VolumeGroupSnapshotContent/g1 " + ReasonVolumeAmbiguous + " [VolumeGroupSnapshot:db/group-g1]"
	if g := summary(got); len(g) != 1 || g[0] != want {
		t.Fatalf("got\n  %s\nwant\n  %s", strings.Join(g, "\n  "), want)
	}
	for _, f := range fragments {
		if !strings.Contains(got[0].Message, f) {
			t.Errorf("got message %q, want it to hold %q", got[0].Message, f)
		}
	}
}

// TestDecideRefusesSharedHandle: a PV pinned to node-b that carries the
// handle of a tenant's volume on node-a must not draw the tenant's group
// snapshot, or its class, to node-b; nor may the labeller pick the
// tenant's PV, as it cannot tell which is the volume's own.
func TestDecideRefusesSharedHandle(t *testing.T) {
	got := decideVolumes([]*corev1.PersistentVolume{
		pv("data", "data", "node-a"), named(pv("data", "evil", "node-b"), "pv-evil"),
	}, "data")
	checkRefused(t, got, `Volume handle "data" is carried by 2 PersistentVolumes: pv-data (pinned to node node-a), pv-evil (pinned to node node-b).`)
}

// TestDecideRefusesHandleNodeMismatch: a lone PV pinned to node-b that
// carries a handle naming node-a (where that volume lives) must not draw
// the group snapshot to node-b, even beside an unambiguous member.
func TestDecideRefusesHandleNodeMismatch(t *testing.T) {
	got := decideVolumes([]*corev1.PersistentVolume{
		pv("data", "data", "node-a"), pv("pvc-1_node-a", "stolen", "node-b"),
	}, "pvc-1_node-a", "data")
	checkRefused(t, got, `PersistentVolume pv-pvc-1_node-a carries volume handle "pvc-1_node-a", which names node node-a, but its node affinity (`+topo+`) pins it to node node-b.`)
}

// TestDecideLabelsUnambiguousHandles: one PV per handle whose affinity
// agrees with the handle, or whose handle names no existing node (a
// volume made before IDs named their node, its name holding the
// separator), is labelled for its node, and its class handed to it.
func TestDecideLabelsUnambiguousHandles(t *testing.T) {
	tests := []struct {
		name    string
		pvs     []*corev1.PersistentVolume
		handles []any
		want    string
	}{
		{name: "a handle naming its PV's node", pvs: []*corev1.PersistentVolume{pv("pvc-1_node-a", "data", "node-a")},
			handles: handles("pvc-1_node-a"), want: "node-a"},
		{name: "a legacy handle naming no node", pvs: []*corev1.PersistentVolume{pv("pvc-1", "data", "node-b")},
			handles: handles("pvc-1"), want: "node-b"},
		{name: "a legacy handle whose name holds the separator, its suffix no node", pvs: []*corev1.PersistentVolume{pv("db_wal-0", "wal", "node-b")},
			handles: handles("db_wal-0"), want: "node-b"},
		{name: "a PV not pinned: the handle's node", pvs: []*corev1.PersistentVolume{pv("pvc-1_node-b", "data", "")},
			handles: handles("pvc-1_node-b"), want: "node-b"},
		{name: "another driver's PV carrying the handle is not ours", pvs: []*corev1.PersistentVolume{
			pv("pvc-1_node-a", "data", "node-a"), otherDriver(named(pv("pvc-1_node-a", "x", "node-b"), "pv-other"))},
			handles: handles("pvc-1_node-a"), want: "node-a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := summary(decideVolumes(tc.pvs, tc.handles...))
			want := []string{"label VolumeGroupSnapshotClass/converge " + tc.want, "label VolumeGroupSnapshotContent/g1 " + tc.want}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
			}
		})
	}
}

func otherDriver(p *corev1.PersistentVolume) *corev1.PersistentVolume {
	p.Spec.CSI.Driver = "other.csi.dev"
	return p
}

// TestIndexVolumes: every PV of the driver is kept under its handle, by
// name whatever the input order; other drivers' PVs and non-CSI PVs are
// not.
func TestIndexVolumes(t *testing.T) {
	nfs := &corev1.PersistentVolume{}
	nfs.Name = "nfs"
	got := IndexVolumes(driver, []*corev1.PersistentVolume{
		named(pv("h", "b", "node-a"), "pv-b"), otherDriver(pv("h", "x", "node-a")), nfs, named(pv("h", "a", "node-b"), "pv-a"),
	})
	if len(got) != 1 || len(got["h"]) != 2 || got["h"][0].Name != "pv-a" || got["h"][1].Name != "pv-b" {
		t.Errorf("got %v, want only h: [pv-a pv-b]", got)
	}
}
