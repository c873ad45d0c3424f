package classagent

import (
	"maps"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

const (
	driver = "converge.csi.dev"
	key    = "topology.converge.csi.dev/node"
)

var scope = Scope{Driver: driver, Node: "b", TopologyKey: key}

// world is a PV of node b bound to its claim, both naming class slow, and
// that class.
func world() (*corev1.PersistentVolume, *corev1.PersistentVolumeClaim, *storagev1.VolumeAttributesClass) {
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pvc-1"},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource:    corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: "pvc-1_b"}},
			ClaimRef:                  &corev1.ObjectReference{Namespace: "ns", Name: "data", UID: "u1"},
			VolumeAttributesClassName: ptr.To("slow"),
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{"b"}}},
			}}}},
		},
	}
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", UID: "u1"},
		Spec:       corev1.PersistentVolumeClaimSpec{VolumeName: "pvc-1", VolumeAttributesClassName: ptr.To("slow")},
	}
	class := &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: "slow"}, DriverName: driver,
		Parameters: map[string]string{"maxReadIops": "100"}}
	return pv, claim, class
}

func TestDecideHandsTheClassTheClaimNames(t *testing.T) {
	pv, claim, class := world()
	h, why := scope.Decide(pv, claim, class)
	if why != "" {
		t.Fatalf("nothing handed: %s", why)
	}
	// The whole class: the keys it leaves out are handed as no limit, so
	// that csi-node, which merges what it is given, holds nothing of a
	// class the claim left.
	want := map[string]string{"maxReadIops": "100", "maxWriteIops": "max", "maxReadBps": "max", "maxWriteBps": "max"}
	if h.VolumeID != "pvc-1_b" || h.Class != "slow" || !maps.Equal(h.Params, want) {
		t.Errorf("handed %+v, want class slow with parameters %v", h, want)
	}
	if len(class.Parameters) != 1 {
		t.Errorf("the class (the informer's cache) was changed: %v", class.Parameters)
	}
	// What the PV says of its class is the resizer's, written with a
	// node's credentials: only the claim's spec, which its owner writes,
	// decides.
	for _, written := range []*string{nil, ptr.To("forged"), ptr.To("fast")} {
		pv.Spec.VolumeAttributesClassName = written
		if h, why := scope.Decide(pv, claim, class); why != "" || h.Class != "slow" {
			t.Errorf("with the PV naming %v: %+v, %q; want slow handed", written, h, why)
		}
	}
	// A volume made before IDs named their node.
	pv.Spec.CSI.VolumeHandle = "pvc-1"
	if h, why := scope.Decide(pv, claim, class); why != "" || h.VolumeID != "pvc-1" {
		t.Errorf("a legacy handle: %+v, %q", h, why)
	}
}

// TestDecideLiftsTheLimitsOfAClaimOfNoClass: a claim that names no class
// (never did, or went back to none while its switch was pending) is held
// to no limit, whatever the PV says: every key is handed as no limit.
func TestDecideLiftsTheLimitsOfAClaimOfNoClass(t *testing.T) {
	pv, claim, _ := world()
	claim.Spec.VolumeAttributesClassName = nil
	for _, written := range []*string{ptr.To("slow"), nil} {
		pv.Spec.VolumeAttributesClassName = written
		h, why := scope.Decide(pv, claim, nil)
		want := map[string]string{"maxReadIops": "max", "maxWriteIops": "max", "maxReadBps": "max", "maxWriteBps": "max"}
		if why != "" || h.VolumeID != "pvc-1_b" || h.Class != "" || !maps.Equal(h.Params, want) {
			t.Errorf("with the PV naming %q: got %+v, %q; want no class, parameters %v", deref(written), h, why, want)
		}
	}
}

func TestDecideHandsNothingElse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*corev1.PersistentVolume, **corev1.PersistentVolumeClaim, **storagev1.VolumeAttributesClass)
		why    string
	}{
		{"another driver's volume", func(pv *corev1.PersistentVolume, _ **corev1.PersistentVolumeClaim, _ **storagev1.VolumeAttributesClass) {
			pv.Spec.CSI.Driver = "other"
		}, "not a volume of this node"},
		{"a volume pinned to another node", func(pv *corev1.PersistentVolume, _ **corev1.PersistentVolumeClaim, _ **storagev1.VolumeAttributesClass) {
			pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values = []string{"a"}
		}, "not a volume of this node"},
		{"a PV of this node carrying another node's handle", func(pv *corev1.PersistentVolume, _ **corev1.PersistentVolumeClaim, _ **storagev1.VolumeAttributesClass) {
			pv.Spec.CSI.VolumeHandle = "pvc-1_a"
		}, "not a volume of this node"},
		{"an unbound volume", func(pv *corev1.PersistentVolume, _ **corev1.PersistentVolumeClaim, _ **storagev1.VolumeAttributesClass) {
			pv.Spec.ClaimRef = nil
		}, "bound to no claim"},
		{"a claim not found", func(_ *corev1.PersistentVolume, c **corev1.PersistentVolumeClaim, _ **storagev1.VolumeAttributesClass) {
			*c = nil
		}, "not found"},
		{"a claim of the same name, another UID", func(_ *corev1.PersistentVolume, c **corev1.PersistentVolumeClaim, _ **storagev1.VolumeAttributesClass) {
			(*c).UID = "u2"
		}, "not the one bound"},
		{"a claim bound to another volume", func(_ *corev1.PersistentVolume, c **corev1.PersistentVolumeClaim, _ **storagev1.VolumeAttributesClass) {
			(*c).Spec.VolumeName = "pvc-2"
		}, "not the one bound"},
		{"a class not found", func(_ *corev1.PersistentVolume, _ **corev1.PersistentVolumeClaim, k **storagev1.VolumeAttributesClass) {
			*k = nil
		}, "is not found"},
		{"another driver's class", func(_ *corev1.PersistentVolume, _ **corev1.PersistentVolumeClaim, k **storagev1.VolumeAttributesClass) {
			(*k).DriverName = "other"
		}, `of driver "other"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pv, claim, class := world()
			tc.change(pv, &claim, &class)
			h, why := scope.Decide(pv, claim, class)
			if !strings.Contains(why, tc.why) {
				t.Errorf("got %+v, %q; want nothing handed because %q", h, why, tc.why)
			}
		})
	}
}
