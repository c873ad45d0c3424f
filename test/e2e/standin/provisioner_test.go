package standin

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// The node the tests' provisioner runs on, another node, and the
// environment deploy/ gives it there.
const (
	here  = "node-a"
	there = "node-b"
	ns    = "kube-system"
	pod   = "converge-node-x"
)

var provisionerEnv = map[string]string{"NODE_NAME": here, "NAMESPACE": ns, "POD_NAME": pod}

// deployArgs are the arguments deploy/ gives the container name, with
// each of changes (--flag=value) in place of the flag's own, or added.
func deployArgs(t *testing.T, name string, changes ...string) []string {
	t.Helper()
	for _, ctr := range deployDaemonSet(t).Spec.Template.Spec.Containers {
		if ctr.Name != name {
			continue
		}
		argv := slices.Clone(ctr.Args)
		for _, c := range changes {
			flag, _, _ := strings.Cut(c, "=")
			i := slices.IndexFunc(argv, func(a string) bool { f, _, _ := strings.Cut(a, "="); return f == flag })
			if i < 0 {
				argv = append(argv, c)
			} else {
				argv[i] = c
			}
		}
		return argv
	}
	t.Fatalf("deploy/ has no container %s", name)
	return nil
}

// without is argv less the flag named.
func without(argv []string, flag string) []string {
	return slices.DeleteFunc(slices.Clone(argv), func(a string) bool { f, _, _ := strings.Cut(a, "="); return f == flag })
}

func TestProvisionerConfig(t *testing.T) {
	for _, tc := range []struct {
		name    string
		argv    []string
		env     map[string]string
		refused string
	}{
		{name: "deploy/'s"},
		{name: "without --node-deployment", argv: []string{"--node-deployment=false"}, refused: "only --node-deployment=true"},
		{name: "--node-deployment without NODE_NAME", env: map[string]string{"NODE_NAME": ""}, refused: "NODE_NAME"},
		{name: "--node-deployment-immediate-binding=true", argv: []string{"--node-deployment-immediate-binding=true"}, refused: "only --node-deployment-immediate-binding=false"},
		{name: "--node-deployment-immediate-binding's default", argv: []string{"-node-deployment-immediate-binding"}, refused: "only --node-deployment-immediate-binding=false"},
		{name: "--strict-topology=false", argv: []string{"--strict-topology=false"}, refused: "only --strict-topology=true"},
		{name: "--immediate-topology=true", argv: []string{"--immediate-topology=true"}},
		{name: "--leader-election=true", argv: []string{"--leader-election=true"}, refused: "only --leader-election=false"},
		{name: "--capacity-ownerref-level=1", argv: []string{"--capacity-ownerref-level=1"}, refused: "only --capacity-ownerref-level=0"},
		{name: "--capacity-ownerref-level=-1", argv: []string{"--capacity-ownerref-level=-1"}, refused: "only --capacity-ownerref-level=0"},
		{name: "--enable-capacity without NAMESPACE", env: map[string]string{"NAMESPACE": ""}, refused: "NAMESPACE"},
		{name: "--enable-capacity without POD_NAME", env: map[string]string{"POD_NAME": ""}, refused: "POD_NAME"},
		{name: "--enable-capacity=false, no owner needed", argv: []string{"--enable-capacity=false", "--capacity-ownerref-level=1"}, env: map[string]string{"POD_NAME": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			argv := deployArgs(t, "csi-provisioner", tc.argv...)
			if tc.name == "--node-deployment-immediate-binding's default" {
				argv = without(argv, "--node-deployment-immediate-binding")
			}
			release, _ := releaseNamed("csi-provisioner")
			a, err := parseArgs(release, provisionerFlags, argv)
			if err != nil {
				t.Fatal(err)
			}
			_, err = newProvisionerConfig(a, func(name string) string {
				if v, ok := tc.env[name]; ok {
					return v
				}
				return provisionerEnv[name]
			})
			if tc.refused == "" && err != nil || tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)) {
				t.Errorf("got %v, want refused %q", err, tc.refused)
			}
		})
	}
}

// testProvisioner is a provisioner stand-in on a fake API server and a
// fake driver.
type testProvisioner struct {
	*provisioner
	client *fake.Clientset
	driver *fakeDriver
	log    *bytes.Buffer
}

// newTestProvisioner makes the provisioner of argv on node here, on an API
// server holding objs and deploy/'s DaemonSet pod, with a fake driver.
func newTestProvisioner(t *testing.T, argv []string, objs ...runtime.Object) *testProvisioner {
	t.Helper()
	release, _ := releaseNamed("csi-provisioner")
	a, err := parseArgs(release, provisionerFlags, argv)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := newProvisionerConfig(a, func(name string) string { return provisionerEnv[name] })
	if err != nil {
		t.Fatal(err)
	}
	objs = append(objs, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: ns, UID: "pod-uid"}})
	client := fake.NewClientset(objs...)
	// The API server names an object made with generateName; the fake
	// does not.
	made := 0
	client.PrependReactor("create", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		obj := action.(k8stesting.CreateAction).GetObject().(metav1.Object)
		if obj.GetName() == "" && obj.GetGenerateName() != "" {
			made++
			obj.SetName(fmt.Sprintf("%s%d", obj.GetGenerateName(), made))
		}
		return false, nil, nil
	})
	d := startDriver(t)
	log := &bytes.Buffer{}
	p, err := newProvisioner(context.Background(), cfg, client, nil, csi.NewControllerClient(d.conn(t)), log)
	if err != nil {
		t.Fatal(err)
	}
	return &testProvisioner{p, client, d, log}
}

// class is a converge StorageClass of binding mode, allowing the nodes
// listed (every node if none).
func class(name string, mode storagev1.VolumeBindingMode, nodes ...string) *storagev1.StorageClass {
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: DriverName, VolumeBindingMode: &mode,
		Parameters: map[string]string{"csi.storage.k8s.io/fstype": "ext4", "converge.csi.dev/provisioning": "thick"}}
	if len(nodes) > 0 {
		sc.AllowedTopologies = []corev1.TopologySelectorTerm{{MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{{Key: TopologyKey, Values: nodes}}}}
	}
	return sc
}

// claim is a pending claim of class, whose selected node is node ("" for
// none).
func claim(name, class, node string) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending},
	}
	if node != "" {
		pvc.Annotations = map[string]string{selectedNodeKey: node}
	}
	return pvc
}

// created returns the CreateVolume requests for the claim called name.
func (tp *testProvisioner) created(name string) []*csi.CreateVolumeRequest {
	var out []*csi.CreateVolumeRequest
	for _, c := range tp.driver.called("CreateVolume") {
		if req := c.req.(*csi.CreateVolumeRequest); req.Name == "pvc-uid-"+name {
			out = append(out, req)
		}
	}
	return out
}

// pv returns the PersistentVolume of the claim called name, nil if none.
func (tp *testProvisioner) pv(t *testing.T, name string) *corev1.PersistentVolume {
	pvs, err := tp.client.CoreV1().PersistentVolumes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pvs.Items {
		if pvs.Items[i].Name == "pvc-uid-"+name {
			return &pvs.Items[i]
		}
	}
	return nil
}

// TestProvisionerImmediateBindingFalse: with deploy/'s
// --node-deployment-immediate-binding=false, as csi-provisioner v6.3.0
// does (checkNode), a claim of an Immediate class that no one selected a
// node for is left alone, Pending; a claim whose selected node is this
// node is provisioned here whatever its class's mode; any other is left to
// its node. (=true, the release's default, is refused: TestProvisionerConfig.)
func TestProvisionerImmediateBindingFalse(t *testing.T) {
	tp := newTestProvisioner(t, deployArgs(t, "csi-provisioner"),
		class("late", storagev1.VolumeBindingWaitForFirstConsumer), class("now", storagev1.VolumeBindingImmediate),
		claim("now-unselected", "now", ""), claim("now-here", "now", here),
		claim("late-unselected", "late", ""), claim("late-here", "late", here), claim("late-there", "late", there))
	tp.pass(context.Background(), true)
	for name, want := range map[string]bool{"now-unselected": false, "now-here": true, "late-unselected": false, "late-here": true, "late-there": false} {
		if got := len(tp.created(name)) == 1 && tp.pv(t, name) != nil; got != want {
			t.Errorf("claim %s provisioned: got %v, want %v", name, got, want)
		}
	}
	c, err := tp.client.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), "now-unselected", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if node, ok := c.Annotations[selectedNodeKey]; ok {
		t.Errorf("the Immediate claim was given the selected node %q; want none", node)
	}
	if tp.log.Len() > 0 {
		t.Errorf("errors: %s", tp.log)
	}
}

// TestProvisionerStrictTopology: with deploy/'s --strict-topology=true, as
// csi-provisioner v6.3.0 does (GenerateAccessibilityRequirements),
// CreateVolume asks for the selected node's topology alone, requisite and
// preferred, even where the class allows other nodes too; a selected node
// the class's allowedTopologies exclude is an error, and no CreateVolume.
// (=false is refused: TestProvisionerConfig.)
func TestProvisionerStrictTopology(t *testing.T) {
	tp := newTestProvisioner(t, deployArgs(t, "csi-provisioner"),
		class("any", storagev1.VolumeBindingWaitForFirstConsumer), class("both", storagev1.VolumeBindingWaitForFirstConsumer, there, here),
		class("elsewhere", storagev1.VolumeBindingWaitForFirstConsumer, there),
		claim("any", "any", here), claim("both", "both", here), claim("elsewhere", "elsewhere", here))
	tp.pass(context.Background(), false)
	want := &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{TopologyKey: here}}},
		Preferred: []*csi.Topology{{Segments: map[string]string{TopologyKey: here}}}}
	for _, name := range []string{"any", "both"} {
		reqs := tp.created(name)
		if len(reqs) != 1 || !proto.Equal(reqs[0].AccessibilityRequirements, want) {
			t.Errorf("claim %s: CreateVolume %v; want one with %v", name, reqs, want)
		}
	}
	if reqs := tp.created("elsewhere"); len(reqs) != 0 || tp.pv(t, "elsewhere") != nil {
		t.Errorf("claim elsewhere, selected here, which its class does not allow: CreateVolume %v", reqs)
	}
	if !strings.Contains(tp.log.String(), `selected node "node-a" is not in the allowed topologies of class elsewhere`) {
		t.Errorf("log %q; want the refusal of claim elsewhere", tp.log)
	}
}

// TestProvisionerImmediateTopology: --immediate-topology, false in
// deploy/, changes nothing with --node-deployment (the release applies it
// only to a claim without a selected node, which it never provisions):
// CreateVolume is the same with either value.
func TestProvisionerImmediateTopology(t *testing.T) {
	var reqs []*csi.CreateVolumeRequest
	for _, value := range []string{"false", "true"} {
		tp := newTestProvisioner(t, deployArgs(t, "csi-provisioner", "--immediate-topology="+value),
			class("now", storagev1.VolumeBindingImmediate), claim("c", "now", here), claim("unselected", "now", ""))
		tp.pass(context.Background(), false)
		if got := tp.created("unselected"); len(got) != 0 {
			t.Errorf("--immediate-topology=%s: a claim without a selected node provisioned: %v", value, got)
		}
		got := tp.created("c")
		if len(got) != 1 {
			t.Fatalf("--immediate-topology=%s: CreateVolume %v; want one", value, got)
		}
		reqs = append(reqs, got[0])
	}
	if !proto.Equal(reqs[0], reqs[1]) {
		t.Errorf("CreateVolume with --immediate-topology=false: %v; with true: %v", reqs[0], reqs[1])
	}
}

// TestProvisionerExtraCreateMetadata: with deploy/'s
// --extra-create-metadata=true, CreateVolume's parameters carry the
// claim's name and namespace and the volume's name; without, only the
// class's parameters outside csi.storage.k8s.io/.
func TestProvisionerExtraCreateMetadata(t *testing.T) {
	class := map[string]string{"converge.csi.dev/provisioning": "thick"}
	for value, want := range map[string]map[string]string{
		"true": {"converge.csi.dev/provisioning": "thick", "csi.storage.k8s.io/pvc/name": "c",
			"csi.storage.k8s.io/pvc/namespace": "default", "csi.storage.k8s.io/pv/name": "pvc-uid-c"},
		"false": class,
	} {
		tp := newTestProvisioner(t, deployArgs(t, "csi-provisioner", "--extra-create-metadata="+value),
			classOf(storagev1.VolumeBindingWaitForFirstConsumer), claim("c", "late", here))
		tp.pass(context.Background(), false)
		reqs := tp.created("c")
		if len(reqs) != 1 || !maps.Equal(reqs[0].Parameters, want) {
			t.Errorf("--extra-create-metadata=%s: CreateVolume %v; want parameters %v", value, reqs, want)
		}
	}
}

// classOf is class "late" of mode.
func classOf(mode storagev1.VolumeBindingMode) *storagev1.StorageClass { return class("late", mode) }

// TestProvisionerEnableCapacity: with deploy/'s --enable-capacity=true and
// --capacity-ownerref-level=0, the provisioner publishes this node's
// capacity for each WaitForFirstConsumer class of the driver, in its
// pod's namespace, owned by its pod, and none for an Immediate class (the
// release's default --capacity-for-immediate-binding=false): the one it
// had is deleted. With --enable-capacity=false it publishes nothing and
// asks no capacity.
func TestProvisionerEnableCapacity(t *testing.T) {
	stale := &storagev1.CSIStorageCapacity{ObjectMeta: metav1.ObjectMeta{Name: "stale", Namespace: ns, Labels: map[string]string{
		"csi.storage.k8s.io/drivername": DriverName, "csi.storage.k8s.io/managed-by": "external-provisioner-" + here}},
		StorageClassName: "now", Capacity: resource.NewQuantity(1, resource.BinarySI)}
	objs := []runtime.Object{class("late", storagev1.VolumeBindingWaitForFirstConsumer), class("now", storagev1.VolumeBindingImmediate), stale}

	tp := newTestProvisioner(t, deployArgs(t, "csi-provisioner"), objs...)
	if !tp.pass(context.Background(), true) {
		t.Fatalf("capacity not published: %s", tp.log)
	}
	caps, err := tp.client.StorageV1().CSIStorageCapacities("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(caps.Items) != 1 {
		t.Fatalf("got %d CSIStorageCapacity objects, want one, of class late: %+v", len(caps.Items), caps.Items)
	}
	got := caps.Items[0]
	owner := metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: pod, UID: "pod-uid", Controller: ptr.To(true)}
	if got.Namespace != ns || got.StorageClassName != "late" || got.Capacity.Value() != tp.driver.capacity ||
		got.NodeTopology.MatchLabels[TopologyKey] != here || len(got.OwnerReferences) != 1 || !ownerEqual(got.OwnerReferences[0], owner) {
		t.Errorf("got %+v; want class late's in %s, %d bytes on %s, owned by %+v", got, ns, tp.driver.capacity, here, owner)
	}

	tp = newTestProvisioner(t, deployArgs(t, "csi-provisioner", "--enable-capacity=false"), objs...)
	tp.pass(context.Background(), true)
	caps, err = tp.client.StorageV1().CSIStorageCapacities("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(caps.Items) != 1 || caps.Items[0].Name != "stale" || len(tp.driver.called("GetCapacity")) != 0 {
		t.Errorf("--enable-capacity=false: CSIStorageCapacity objects %+v, GetCapacity %d times; want the stale one alone, untouched, and no call",
			caps.Items, len(tp.driver.called("GetCapacity")))
	}
}

func ownerEqual(a, b metav1.OwnerReference) bool {
	return a.APIVersion == b.APIVersion && a.Kind == b.Kind && a.Name == b.Name && a.UID == b.UID &&
		a.Controller != nil && b.Controller != nil && *a.Controller == *b.Controller
}

// TestProvisionerTimeout: every call to the driver (CreateVolume,
// GetCapacity, DeleteVolume) gets --timeout: deploy/'s 5m, or the
// release's default, 10s.
func TestProvisionerTimeout(t *testing.T) {
	released := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pvc-gone", Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": DriverName},
			Finalizers: []string{ProvisionerFinalizer}},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: DriverName, VolumeHandle: "gone"}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{here}}}}}}}},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeReleased},
	}
	for _, tc := range []struct {
		name string
		argv []string
		want time.Duration
	}{
		{"deploy/'s", deployArgs(t, "csi-provisioner"), 5 * time.Minute},
		{"the default", without(deployArgs(t, "csi-provisioner"), "--timeout"), 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := newTestProvisioner(t, tc.argv, classOf(storagev1.VolumeBindingWaitForFirstConsumer), claim("c", "late", here), released.DeepCopy())
			tp.pass(context.Background(), true)
			for _, method := range []string{"CreateVolume", "GetCapacity", "DeleteVolume"} {
				calls := tp.driver.called(method)
				if len(calls) != 1 || !within(calls[0].left, tc.want) {
					t.Errorf("%s: %v; want one call given %v", method, calls, tc.want)
				}
			}
			if _, err := tp.client.CoreV1().PersistentVolumes().Get(context.Background(), released.Name, metav1.GetOptions{}); err == nil {
				t.Errorf("the released volume's object is still there: %s", tp.log)
			}
		})
	}
}
