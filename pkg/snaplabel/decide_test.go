package snaplabel

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

const (
	driver = "converge.csi.dev"
	topo   = "topology.converge.csi.dev/node"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func node(name string, ready bool) *corev1.Node {
	s := corev1.ConditionFalse
	if ready {
		s = corev1.ConditionTrue
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: s}}}}
}

// pv is the driver's volume with handle, of claim ns/claim, pinned to on.
func pv(handle, claim, on string) *corev1.PersistentVolume {
	p := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-" + handle}, Spec: corev1.PersistentVolumeSpec{
		PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle}},
		ClaimRef:               &corev1.ObjectReference{Namespace: "db", Name: claim},
	}}
	if on != "" {
		p.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: topo, Operator: corev1.NodeSelectorOpIn, Values: []string{on}}}}}}}
	}
	return p
}

// obj is an unstructured object of kind named name, made at age seconds
// after epoch, with fields set at their paths ("spec.source.snapshotHandle").
func obj(kind, name string, age int, fields map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetKind(kind)
	u.SetName(name)
	u.SetUID(types.UID("uid-" + name))
	u.SetCreationTimestamp(metav1.NewTime(epoch.Add(time.Duration(age) * time.Second)))
	for path, v := range fields {
		if path == "labels" {
			u.SetLabels(v.(map[string]string))
			continue
		}
		if path == "annotations" {
			u.SetAnnotations(v.(map[string]string))
			continue
		}
		if err := unstructured.SetNestedField(u.Object, v, strings.Split(path, ".")...); err != nil {
			panic(err)
		}
	}
	return u
}

func vsc(name string, fields map[string]any) *unstructured.Unstructured {
	if _, ok := fields["spec.driver"]; !ok {
		fields["spec.driver"] = driver
	}
	fields["spec.volumeSnapshotRef.name"] = "snap-" + name
	fields["spec.volumeSnapshotRef.namespace"] = "db"
	return obj("VolumeSnapshotContent", name, 0, fields)
}

func vgsc(name string, age int, fields map[string]any) *unstructured.Unstructured {
	fields["spec.driver"] = driver
	fields["spec.volumeGroupSnapshotRef.name"] = "group-" + name
	fields["spec.volumeGroupSnapshotRef.namespace"] = "db"
	return obj("VolumeGroupSnapshotContent", name, age, fields)
}

func class(name, holder string) *unstructured.Unstructured {
	f := map[string]any{"driver": driver}
	if holder != "" {
		f["labels"] = map[string]string{ManagedByLabel: holder}
	}
	return obj("VolumeGroupSnapshotClass", name, 0, f)
}

func handles(h ...string) []any {
	out := make([]any, len(h))
	for i, s := range h {
		out[i] = s
	}
	return out
}

// summary renders actions in a stable order: "label <kind>/<name> <node>"
// or "warn <kind>/<name> <reason> [refs]".
func summary(as []Action) []string {
	var out []string
	for _, a := range as {
		what := a.Object.GetKind() + "/" + a.Object.GetName()
		if a.Node != "" {
			out = append(out, "label "+what+" "+a.Node)
			continue
		}
		var refs []string
		for _, r := range a.Refs {
			refs = append(refs, r.Kind+":"+r.Namespace+"/"+r.Name)
		}
		out = append(out, fmt.Sprintf("warn %s %s %v", what, a.Reason, refs))
	}
	sort.Strings(out)
	return out
}

func TestDecide(t *testing.T) {
	nodes := map[string]*corev1.Node{"node-a": node("node-a", true), "node-b": node("node-b", true),
		"node-c": node("node-c", true), "node-down": node("node-down", false)}
	volumes := IndexVolumes(driver, []*corev1.PersistentVolume{
		pv("data", "data", "node-a"), pv("wal", "wal", "node-a"), pv("other", "other", "node-b"),
		pv("pvc-9_node-x", "moved", "node-b"), pv("loose", "loose", ""),
	})
	done := map[string]any{"status.volumeGroupSnapshotHandle": "groupsnapshot-1_node-a"}
	tests := []struct {
		name                  string
		contents, groups, cls []*unstructured.Unstructured
		want                  []string
		wantMessage           string // a fragment of the first action's message
	}{
		{name: "pre-provisioned content: the handle's node",
			contents: []*unstructured.Unstructured{vsc("c1", map[string]any{"spec.source.snapshotHandle": "snapshot-1_node-a"})},
			want:     []string{"label VolumeSnapshotContent/c1 node-a"}},
		{name: "a name holding the separator: the node is after the last one",
			contents: []*unstructured.Unstructured{vsc("c1", map[string]any{"spec.source.snapshotHandle": "db_wal-0_node-b"})},
			want:     []string{"label VolumeSnapshotContent/c1 node-b"}},
		{name: "a handle naming a node that is gone: warned, on the content and its snapshot",
			contents:    []*unstructured.Unstructured{vsc("c1", map[string]any{"spec.source.snapshotHandle": "snapshot-1_node-gone"})},
			want:        []string{"warn VolumeSnapshotContent/c1 SnapshotNodeGone [VolumeSnapshot:db/snap-c1]"},
			wantMessage: `Node "node-gone", named by snapshot handle "snapshot-1_node-gone", does not exist`},
		{name: "a handle naming no node",
			contents:    []*unstructured.Unstructured{vsc("c1", map[string]any{"spec.source.snapshotHandle": "snapshot-1"})},
			want:        []string{"warn VolumeSnapshotContent/c1 SnapshotNodeUnknown [VolumeSnapshot:db/snap-c1]"},
			wantMessage: `Snapshot handle "snapshot-1" names no node`},
		{name: "an existing label is never changed, even one naming another node",
			contents: []*unstructured.Unstructured{vsc("c1", map[string]any{"spec.source.snapshotHandle": "snapshot-1_node-a",
				"labels": map[string]string{ManagedByLabel: "node-b"}})}},
		{name: "an empty label is a label too",
			contents: []*unstructured.Unstructured{vsc("c1", map[string]any{"spec.source.snapshotHandle": "snapshot-1_node-a",
				"labels": map[string]string{ManagedByLabel: ""}})}},
		{name: "another driver's content is not ours",
			contents: []*unstructured.Unstructured{vsc("c1", map[string]any{"spec.driver": "other.csi.dev", "spec.source.snapshotHandle": "snapshot-1_node-a"})}},
		{name: "a group's member content: its group handle's node",
			contents: []*unstructured.Unstructured{vsc("c1", map[string]any{"spec.source.volumeHandle": "data",
				"annotations": map[string]string{GroupHandleAnnotation: "groupsnapshot-1_node-b"}})},
			want: []string{"label VolumeSnapshotContent/c1 node-b"}},
		{name: "a dynamic content with a status handle: the handle's node",
			contents: []*unstructured.Unstructured{vsc("c1", map[string]any{"spec.source.volumeHandle": "data", "status.snapshotHandle": "snapshot-1_node-c"})},
			want:     []string{"label VolumeSnapshotContent/c1 node-c"}},
		{name: "a content that names only a volume is not routed (a request to snapshot it is snapshot-controller's to route)",
			contents:    []*unstructured.Unstructured{vsc("c1", map[string]any{"spec.source.volumeHandle": "data"})},
			want:        []string{"warn VolumeSnapshotContent/c1 SnapshotNodeUnknown [VolumeSnapshot:db/snap-c1]"},
			wantMessage: `names only a volume`},
		{name: "a group on one node: the content and its class get the node",
			groups: []*unstructured.Unstructured{vgsc("g1", 0, map[string]any{"spec.source.volumeHandles": handles("data", "wal"),
				"spec.volumeGroupSnapshotClassName": "converge"})},
			cls:  []*unstructured.Unstructured{class("converge", ""), class("idle", "")},
			want: []string{"label VolumeGroupSnapshotClass/converge node-a", "label VolumeGroupSnapshotContent/g1 node-a"}},
		{name: "a group spanning nodes: warned with each claim's node, labelled for the first",
			groups: []*unstructured.Unstructured{vgsc("g1", 0, map[string]any{"spec.source.volumeHandles": handles("data", "other")})},
			want: []string{"label VolumeGroupSnapshotContent/g1 node-a",
				"warn VolumeGroupSnapshotContent/g1 GroupSpansNodes [VolumeGroupSnapshot:db/group-g1]"},
			wantMessage: "The group's volumes lie on different nodes: claim db/data on node-a, claim db/other on node-b"},
		{name: "a group member without a node: warned, not labelled",
			groups: []*unstructured.Unstructured{vgsc("g1", 0, map[string]any{"spec.source.volumeHandles": handles("data", "loose")})},
			want:   []string{"warn VolumeGroupSnapshotContent/g1 SnapshotNodeUnknown [VolumeGroupSnapshot:db/group-g1]"}},
		{name: "a pre-provisioned group: the group handle's node",
			groups: []*unstructured.Unstructured{vgsc("g1", 0, map[string]any{
				"spec.source.groupSnapshotHandles.volumeGroupSnapshotHandle": "groupsnapshot-1_node-a",
				"spec.source.groupSnapshotHandles.volumeSnapshotHandles":     handles("g-0_node-a", "g-1_node-a")})},
			want: []string{"label VolumeGroupSnapshotContent/g1 node-a"}},
		{name: "a pre-provisioned group whose members name another node: warned, labelled for the group's",
			groups: []*unstructured.Unstructured{vgsc("g1", 0, map[string]any{
				"spec.source.groupSnapshotHandles.volumeGroupSnapshotHandle": "groupsnapshot-1_node-a",
				"spec.source.groupSnapshotHandles.volumeSnapshotHandles":     handles("g-0_node-a", "g-1_node-b")})},
			want: []string{"label VolumeGroupSnapshotContent/g1 node-a",
				"warn VolumeGroupSnapshotContent/g1 GroupSpansNodes [VolumeGroupSnapshot:db/group-g1]"},
			wantMessage: `g-1_node-b on "node-b"`},
		{name: "the class is handed over once its node's group is taken",
			groups: []*unstructured.Unstructured{
				vgsc("g1", 0, map[string]any{"spec.source.volumeHandles": handles("data"), "spec.volumeGroupSnapshotClassName": "converge",
					"labels": map[string]string{ManagedByLabel: "node-a"}, "status.volumeGroupSnapshotHandle": done["status.volumeGroupSnapshotHandle"]}),
				vgsc("g2", 1, map[string]any{"spec.source.volumeHandles": handles("other"), "spec.volumeGroupSnapshotClassName": "converge"})},
			cls:  []*unstructured.Unstructured{class("converge", "node-a")},
			want: []string{"label VolumeGroupSnapshotClass/converge node-b", "label VolumeGroupSnapshotContent/g2 node-b"}},
		{name: "first come first served: the oldest waiting group's node takes the class from a holder whose newer group waits",
			groups: []*unstructured.Unstructured{
				vgsc("g1", 5, map[string]any{"spec.source.volumeHandles": handles("data"), "spec.volumeGroupSnapshotClassName": "converge",
					"labels": map[string]string{ManagedByLabel: "node-a"}}),
				vgsc("g2", 1, map[string]any{"spec.source.volumeHandles": handles("other"), "spec.volumeGroupSnapshotClassName": "converge",
					"labels": map[string]string{ManagedByLabel: "node-b"}})},
			cls: []*unstructured.Unstructured{class("converge", "node-a")},
			want: []string{"label VolumeGroupSnapshotClass/converge node-b",
				"warn VolumeGroupSnapshotContent/g1 GroupSnapshotClassBusy [VolumeGroupSnapshot:db/group-g1]"}},
		{name: "the class stays while its node's older group waits",
			groups: []*unstructured.Unstructured{
				vgsc("g1", 0, map[string]any{"spec.source.volumeHandles": handles("data"), "spec.volumeGroupSnapshotClassName": "converge",
					"labels": map[string]string{ManagedByLabel: "node-a"}}),
				vgsc("g2", 1, map[string]any{"spec.source.volumeHandles": handles("other"), "spec.volumeGroupSnapshotClassName": "converge",
					"labels": map[string]string{ManagedByLabel: "node-b"}})},
			cls:  []*unstructured.Unstructured{class("converge", "node-a")},
			want: []string{"warn VolumeGroupSnapshotContent/g2 GroupSnapshotClassBusy [VolumeGroupSnapshot:db/group-g2]"}},
		{name: "a group that failed waits behind the others, and gets the class when none of them waits",
			groups: []*unstructured.Unstructured{
				vgsc("g1", 0, map[string]any{"spec.source.volumeHandles": handles("data"), "spec.volumeGroupSnapshotClassName": "converge",
					"labels": map[string]string{ManagedByLabel: "node-a"}, "status.volumeGroupSnapshotHandle": "x_node-a"}),
				vgsc("g2", 1, map[string]any{"spec.source.volumeHandles": handles("other"), "spec.volumeGroupSnapshotClassName": "converge",
					"labels": map[string]string{ManagedByLabel: "node-b"}, "status.error.message": "volumegroupsnapshotclass \"converge\" not found"})},
			cls:  []*unstructured.Unstructured{class("converge", "node-a")},
			want: []string{"label VolumeGroupSnapshotClass/converge node-b"}},
		{name: "a pre-provisioned group that names the class waits on it",
			groups: []*unstructured.Unstructured{
				vgsc("g1", 0, map[string]any{"spec.volumeGroupSnapshotClassName": "converge",
					"spec.source.groupSnapshotHandles.volumeGroupSnapshotHandle": "groupsnapshot-1_node-b",
					"spec.source.groupSnapshotHandles.volumeSnapshotHandles":     handles("g-0_node-b")})},
			cls:  []*unstructured.Unstructured{class("converge", "")},
			want: []string{"label VolumeGroupSnapshotClass/converge node-b", "label VolumeGroupSnapshotContent/g1 node-b"}},
		{name: "a group that failed gives the class up; the oldest waiting Ready node takes it, a NotReady one is told",
			groups: []*unstructured.Unstructured{
				vgsc("g1", 0, map[string]any{"spec.source.volumeHandles": handles("data"), "spec.volumeGroupSnapshotClassName": "converge",
					"labels": map[string]string{ManagedByLabel: "node-a"}, "status.error.message": "refused"}),
				vgsc("g2", 1, map[string]any{"spec.source.volumeHandles": handles("x"), "spec.volumeGroupSnapshotClassName": "converge",
					"labels": map[string]string{ManagedByLabel: "node-down"}}),
				vgsc("g3", 3, map[string]any{"spec.source.volumeHandles": handles("y"), "spec.volumeGroupSnapshotClassName": "converge",
					"labels": map[string]string{ManagedByLabel: "node-c"}}),
				vgsc("g4", 2, map[string]any{"spec.source.volumeHandles": handles("other"), "spec.volumeGroupSnapshotClassName": "converge",
					"labels": map[string]string{ManagedByLabel: "node-b"}})},
			cls: []*unstructured.Unstructured{class("converge", "node-a")},
			want: []string{"label VolumeGroupSnapshotClass/converge node-b",
				"warn VolumeGroupSnapshotContent/g2 GroupSnapshotClassBusy [VolumeGroupSnapshot:db/group-g2]",
				"warn VolumeGroupSnapshotContent/g3 GroupSnapshotClassBusy [VolumeGroupSnapshot:db/group-g3]"}},
		{name: "a holder that is not Ready gives the class up",
			groups: []*unstructured.Unstructured{
				vgsc("g1", 0, map[string]any{"spec.source.volumeHandles": handles("x"), "spec.volumeGroupSnapshotClassName": "converge",
					"labels": map[string]string{ManagedByLabel: "node-down"}}),
				vgsc("g2", 1, map[string]any{"spec.source.volumeHandles": handles("other"), "spec.volumeGroupSnapshotClassName": "converge",
					"labels": map[string]string{ManagedByLabel: "node-b"}})},
			cls: []*unstructured.Unstructured{class("converge", "node-down")},
			want: []string{"label VolumeGroupSnapshotClass/converge node-b",
				"warn VolumeGroupSnapshotContent/g1 GroupSnapshotClassBusy [VolumeGroupSnapshot:db/group-g1]"}},
		{name: "nothing waits: the class stays where it is",
			groups: []*unstructured.Unstructured{vgsc("g1", 0, map[string]any{"spec.source.volumeHandles": handles("data"),
				"spec.volumeGroupSnapshotClassName": "converge", "labels": map[string]string{ManagedByLabel: "node-a"}, "status.volumeGroupSnapshotHandle": "x_node-a"})},
			cls: []*unstructured.Unstructured{class("converge", "node-b")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := World{Driver: driver, TopologyKey: topo, Nodes: nodes, Volumes: volumes, Contents: tc.contents, GroupContents: tc.groups, Classes: tc.cls}
			got := Decide(w)
			if g, want := summary(got), tc.want; strings.Join(g, "\n") != strings.Join(want, "\n") {
				t.Errorf("got\n  %s\nwant\n  %s", strings.Join(g, "\n  "), strings.Join(want, "\n  "))
			}
			if tc.wantMessage != "" {
				found := false
				for _, a := range got {
					found = found || strings.Contains(a.Message, tc.wantMessage)
				}
				if !found {
					t.Errorf("no message holds %q: %+v", tc.wantMessage, got)
				}
			}
		})
	}
}
