package snaplabel

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	discoveryfake "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// withAPI gives o the apiVersion of gvr, as the server stores it.
func withAPI(o *unstructured.Unstructured, gvr schema.GroupVersionResource) *unstructured.Unstructured {
	o.SetAPIVersion(gvr.GroupVersion().String())
	o.SetResourceVersion("1")
	return o
}

// started is a Labeller on fake clients holding objs, its caches filled.
func started(t *testing.T, groups bool, kube []runtime.Object, objs ...runtime.Object) (*Labeller, *dynamicfake.FakeDynamicClient, *record.FakeRecorder) {
	t.Helper()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		ContentsGVR:      "VolumeSnapshotContentList",
		GroupContentsGVR: "VolumeGroupSnapshotContentList",
		GroupClassesGVR:  "VolumeGroupSnapshotClassList",
	}, objs...)
	rec := record.NewFakeRecorder(100)
	l := New(Config{Client: kubefake.NewClientset(kube...), Dynamic: dyn, Driver: driver, TopologyKey: topo,
		Groups: groups, Resync: time.Hour, Events: rec})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		l.kube.Shutdown()
		l.dyn.Shutdown()
	})
	l.kube.Start(ctx.Done())
	l.dyn.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), l.synced...) {
		t.Fatal("caches did not fill")
	}
	dyn.ClearActions()
	return l, dyn, rec
}

// patches are the patch actions dyn saw, as "<resource>/<name> <body>".
func patches(dyn *dynamicfake.FakeDynamicClient) []string {
	var out []string
	for _, a := range dyn.Actions() {
		if p, ok := a.(clienttesting.PatchAction); ok {
			if p.GetPatchType() != types.MergePatchType {
				out = append(out, "not a merge patch: "+string(p.GetPatchType()))
			}
			out = append(out, p.GetResource().Resource+"/"+p.GetName()+" "+string(p.GetPatch()))
		}
	}
	return out
}

func drain(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// TestPassLabels: a pass labels a pre-provisioned content with a merge
// patch of that one label (the content's other labels stay, and an
// existing label is never touched), warns once about a content whose
// node is gone, on it and on its VolumeSnapshot, and a second pass writes
// and repeats nothing.
func TestPassLabels(t *testing.T) {
	mine := vsc("mine", map[string]any{"spec.source.snapshotHandle": "snapshot-1_node-a", "labels": map[string]string{"keep": "me"}})
	gone := vsc("gone", map[string]any{"spec.source.snapshotHandle": "snapshot-2_node-gone"})
	taken := vsc("taken", map[string]any{"spec.source.snapshotHandle": "snapshot-3_node-a", "labels": map[string]string{ManagedByLabel: "node-b"}})
	l, dyn, rec := started(t, false, []runtime.Object{node("node-a", true)},
		withAPI(mine, ContentsGVR), withAPI(gone, ContentsGVR), withAPI(taken, ContentsGVR))
	ctx := context.Background()
	if err := l.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	want := `volumesnapshotcontents/mine {"metadata":{"labels":{"snapshot.storage.kubernetes.io/managed-by":"node-a"},"resourceVersion":"1"}}`
	if got := patches(dyn); len(got) != 1 || got[0] != want {
		t.Errorf("got patches %q, want [%s]", got, want)
	}
	got, err := dyn.Resource(ContentsGVR).Get(ctx, "mine", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l := got.GetLabels(); len(l) != 2 || l["keep"] != "me" || l[ManagedByLabel] != "node-a" {
		t.Errorf("got labels %v, want keep=me and %s=node-a", l, ManagedByLabel)
	}
	events := drain(rec)
	warnings := 0
	for _, e := range events {
		if strings.HasPrefix(e, corev1.EventTypeWarning+" "+ReasonNodeGone+" ") {
			warnings++
		}
	}
	if warnings != 2 {
		t.Errorf("got events %q, want two %s warnings (the content and its VolumeSnapshot)", events, ReasonNodeGone)
	}

	// The informer sees the label: the next pass leaves the content alone
	// and does not repeat the warning.
	if err := waitFor(func() bool { return hasLabel(cached(t, l, ContentsGVR, "mine")) }); err != nil {
		t.Fatal(err)
	}
	dyn.ClearActions()
	if err := l.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := patches(dyn); len(got) != 0 {
		t.Errorf("second pass: got patches %q, want none", got)
	}
	if got := drain(rec); len(got) != 0 {
		t.Errorf("second pass: got events %q, want none", got)
	}
}

// TestPassGroups: with the group API served, a group content on one node
// and the class it waits on get that node's label.
func TestPassGroups(t *testing.T) {
	g := vgsc("g1", 0, map[string]any{"spec.source.volumeHandles": handles("data", "wal"), "spec.volumeGroupSnapshotClassName": "converge"})
	l, dyn, _ := started(t, true, []runtime.Object{node("node-a", true), pv("data", "data", "node-a"), pv("wal", "wal", "node-a")},
		withAPI(g, GroupContentsGVR), withAPI(class("converge", ""), GroupClassesGVR))
	if err := l.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := patches(dyn)
	want := []string{
		`volumegroupsnapshotclasses/converge {"metadata":{"labels":{"snapshot.storage.kubernetes.io/managed-by":"node-a"},"resourceVersion":"1"}}`,
		`volumegroupsnapshotcontents/g1 {"metadata":{"labels":{"snapshot.storage.kubernetes.io/managed-by":"node-a"},"resourceVersion":"1"}}`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got patches\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// TestPassRefusesAmbiguousHandle: a group content whose volume handle two
// PVs carry (one of them pinned to another node) is not patched, nor is
// its class; it and its VolumeGroupSnapshot get one VolumeHandleAmbiguous
// warning each, which a second pass does not repeat.
func TestPassRefusesAmbiguousHandle(t *testing.T) {
	g := vgsc("g1", 0, map[string]any{"spec.source.volumeHandles": handles("data"), "spec.volumeGroupSnapshotClassName": "converge"})
	l, dyn, rec := started(t, true, []runtime.Object{node("node-a", true), node("node-b", true),
		pv("data", "data", "node-a"), named(pv("data", "evil", "node-b"), "pv-evil")},
		withAPI(g, GroupContentsGVR), withAPI(class("converge", ""), GroupClassesGVR))
	for range 2 {
		if err := l.Pass(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if got := patches(dyn); len(got) != 0 {
		t.Errorf("got patches %q, want none", got)
	}
	events := drain(rec)
	warnings := 0
	for _, e := range events {
		if strings.HasPrefix(e, corev1.EventTypeWarning+" "+ReasonVolumeAmbiguous+" ") && strings.Contains(e, "pv-data (pinned to node node-a), pv-evil (pinned to node node-b)") {
			warnings++
		}
	}
	if warnings != 2 || len(events) != 2 {
		t.Errorf("got events %q, want two %s warnings naming both PVs (the content and its VolumeGroupSnapshot)", events, ReasonVolumeAmbiguous)
	}
}

// TestServed: the labeller runs where the VolumeSnapshotContents are
// served, with groups only where both group resources are.
func TestServed(t *testing.T) {
	res := func(gv string, names ...string) *metav1.APIResourceList {
		l := &metav1.APIResourceList{GroupVersion: gv}
		for _, n := range names {
			l.APIResources = append(l.APIResources, metav1.APIResource{Name: n})
		}
		return l
	}
	for _, tc := range []struct {
		name              string
		lists             []*metav1.APIResourceList
		snapshots, groups bool
	}{
		{name: "none"},
		{name: "snapshots only", lists: []*metav1.APIResourceList{res("snapshot.storage.k8s.io/v1", "volumesnapshots", "volumesnapshotcontents")}, snapshots: true},
		{name: "groups without classes", lists: []*metav1.APIResourceList{res("snapshot.storage.k8s.io/v1", "volumesnapshotcontents"),
			res("groupsnapshot.storage.k8s.io/v1", "volumegroupsnapshotcontents")}, snapshots: true},
		{name: "all", lists: []*metav1.APIResourceList{res("snapshot.storage.k8s.io/v1", "volumesnapshotcontents"),
			res("groupsnapshot.storage.k8s.io/v1", "volumegroupsnapshotcontents", "volumegroupsnapshotclasses")}, snapshots: true, groups: true},
		{name: "groups alone are no use", lists: []*metav1.APIResourceList{
			res("groupsnapshot.storage.k8s.io/v1", "volumegroupsnapshotcontents", "volumegroupsnapshotclasses")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &discoveryfake.FakeDiscovery{Fake: &clienttesting.Fake{Resources: tc.lists}}
			s, g, err := Served(d)
			if err != nil || s != tc.snapshots || g != tc.groups {
				t.Errorf("got %v, %v, %v; want %v, %v, nil", s, g, err, tc.snapshots, tc.groups)
			}
		})
	}
}

func cached(t *testing.T, l *Labeller, gvr schema.GroupVersionResource, name string) *unstructured.Unstructured {
	t.Helper()
	o, err := l.listers[gvr].Get(name)
	if err != nil {
		return &unstructured.Unstructured{}
	}
	return o.(*unstructured.Unstructured)
}

// waitFor polls cond for up to 10 s: the fake informers see a write
// through a watch.
func waitFor(cond func() bool) error {
	for i := 0; i < 1000; i++ {
		if cond() {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("condition not met in 10 s")
}

// TestAllowed: the labeller runs only where converge-controller may both
// list and patch the contents (the snapshots component's RBAC).
func TestAllowed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		verbs []string
		want  bool
	}{{"no RBAC", nil, false}, {"list alone", []string{"list"}, false}, {"list and patch", []string{"list", "patch"}, true}} {
		t.Run(tc.name, func(t *testing.T) {
			client := kubefake.NewClientset()
			client.PrependReactor("create", "selfsubjectaccessreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
				r := a.(clienttesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview)
				attrs := r.Spec.ResourceAttributes
				r.Status.Allowed = attrs.Resource == ContentsGVR.Resource && attrs.Group == ContentsGVR.Group && slices.Contains(tc.verbs, attrs.Verb)
				return true, r, nil
			})
			if got, err := Allowed(context.Background(), client, ContentsGVR); err != nil || got != tc.want {
				t.Errorf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}
