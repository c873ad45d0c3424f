package nodeloss

import (
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/converge-csi/converge/pkg/contract"
)

const (
	testDriver   = "converge.csi.dev"
	testTopology = "topology.converge.csi.dev/node"
)

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

// node is a Node that reports no Ready condition (not Ready), with taints.
func node(name string, taints ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("node-" + name)}}
	for _, k := range taints {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: k, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
	}
	return n
}

// withReady is n with its Ready condition set to status.
func withReady(n *corev1.Node, status corev1.ConditionStatus) *corev1.Node {
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse},
		corev1.NodeCondition{Type: corev1.NodeReady, Status: status})
	return n
}

func class(name, onLoss string) *storagev1.StorageClass {
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: testDriver, Parameters: map[string]string{}}
	if onLoss != "" {
		sc.Parameters[contract.OnNodeLossKey] = onLoss
	}
	return sc
}

// volume is a PersistentVolume of the driver on node, of class, bound to
// claim ns/name (none if name is "").
func volume(name, nodeName, className, ns, claimName string) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("pv-" + name), Finalizers: []string{"kubernetes.io/pv-protection", ProvisionerFinalizer}},
		Spec: corev1.PersistentVolumeSpec{
			StorageClassName:              className,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: testDriver, VolumeHandle: name + "_" + nodeName}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: testTopology, Operator: corev1.NodeSelectorOpIn, Values: []string{nodeName}}},
			}}}},
		},
	}
	if claimName != "" {
		pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: claimName, UID: types.UID("pvc-" + ns + "-" + claimName)}
	}
	return pv
}

func pvc(ns, name, volumeName string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("pvc-" + ns + "-" + name)},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: volumeName}}
}

func pod(ns, name, nodeName string, claims ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("pod-" + ns + "-" + name)}}
	p.Spec.NodeName = nodeName
	for _, c := range claims {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: c, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c}}})
	}
	return p
}

func statefulSet(ns, name string, templates ...string) *appsv1.StatefulSet {
	s := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	for _, t := range templates {
		s.Spec.VolumeClaimTemplates = append(s.Spec.VolumeClaimTemplates, corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: t}})
	}
	return s
}

// world is a World at t0 with grace 30 s of these objects.
func world(objs ...any) *World {
	w := &World{Now: t0, Grace: 30 * time.Second, Nodes: map[string]*corev1.Node{}, AbsentSince: map[string]time.Time{},
		Claims: map[types.NamespacedName]*corev1.PersistentVolumeClaim{}, Classes: map[string]*storagev1.StorageClass{}}
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Node:
			w.Nodes[o.Name] = o
		case *corev1.PersistentVolume:
			w.Volumes = append(w.Volumes, o)
		case *corev1.PersistentVolumeClaim:
			w.Claims[types.NamespacedName{Namespace: o.Namespace, Name: o.Name}] = o
		case *corev1.Pod:
			w.Pods = append(w.Pods, o)
		case *appsv1.StatefulSet:
			w.Sets = append(w.Sets, o)
		case *storagev1.StorageClass:
			w.Classes[o.Name] = o
		default:
			panic(fmt.Sprintf("%T", o))
		}
	}
	return w
}

// actions renders a decision's actions as "kind object" lines.
func actions(d Decision) string {
	var out []string
	for _, a := range d.Actions {
		obj := a.Volume.Name
		switch {
		case a.Pod != nil:
			obj = a.Pod.Namespace + "/" + a.Pod.Name
		case a.Kind == DeleteClaim || a.Kind == Kept:
			obj = a.Claim.Namespace + "/" + a.Claim.Name
		}
		out = append(out, a.Kind.String()+" "+obj)
	}
	return strings.Join(out, "; ")
}

// TestDecide owns what happens to a volume by its node's state and its
// choice (here its class's: the PVs record none; TestDecideChoice owns
// where the choice comes from).
func TestDecide(t *testing.T) {
	deleted := func(o metav1.Object) { ts := metav1.NewTime(t0); o.SetDeletionTimestamp(&ts) }
	for _, tc := range []struct {
		name string
		w    *World
		want string
	}{
		{"a node that is there: nothing, whatever its class says",
			world(node("b"), class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"), pvc("ns", "data-db-0", "v"), statefulSet("ns", "db", "data")),
			""},
		{"a Ready node: nothing",
			world(withReady(node("b"), corev1.ConditionTrue), class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"), pvc("ns", "data-db-0", "v"), statefulSet("ns", "db", "data")),
			""},
		{"a node absent for less than the grace: a warning of what comes, nothing released yet",
			func() *World {
				w := world(class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"), pvc("ns", "data-db-0", "v"), statefulSet("ns", "db", "data"),
					pod("ns", "db-0", "b", "data-db-0"))
				w.AbsentSince["b"] = t0.Add(-29 * time.Second)
				return w
			}(),
			"pending v"},
		{"a node first seen absent now: a warning of what comes, nothing released yet",
			world(class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"), pvc("ns", "data-db-0", "v"), statefulSet("ns", "db", "data")),
			"pending v"},
		{"retain, the node absent within the grace: a warning of what comes",
			world(class("ret", "retain"), volume("v", "b", "ret", "ns", "c"), pvc("ns", "c", "v")),
			"pending v"},
		{"the node absent within the grace, nothing to do when it is gone: no warning",
			func() *World {
				v := volume("v", "b", "rel", "ns", "data-db-0")
				v.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
				return world(class("rel", "release"), v, statefulSet("ns", "db", "data"))
			}(),
			""},
		{"retain, the default: a warning",
			deletedNode(world(class("plain", ""), volume("v", "b", "plain", "ns", "c"), pvc("ns", "c", "v"))),
			"retained v"},
		{"retain, said: a warning",
			deletedNode(world(class("ret", "retain"), volume("v", "b", "ret", "ns", "c"), pvc("ns", "c", "v"))),
			"retained v"},
		{"a class that is gone: retain",
			deletedNode(world(volume("v", "b", "gone", "ns", "data-db-0"), pvc("ns", "data-db-0", "v"), statefulSet("ns", "db", "data"))),
			"retained v"},
		{"a class whose choice is wrong: retain",
			deletedNode(world(class("odd", "delete"), volume("v", "b", "odd", "ns", "data-db-0"), pvc("ns", "data-db-0", "v"), statefulSet("ns", "db", "data"))),
			"retained v"},
		{"release of a StatefulSet's claim: the claim, and its pods, on the node and Pending",
			deletedNode(world(class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"), pvc("ns", "data-db-0", "v"), statefulSet("ns", "db", "data"),
				pod("ns", "db-0", "b", "data-db-0"), pod("ns", "db-0-again", "", "data-db-0"), pod("ns", "other", "a", "other-claim"), pod("elsewhere", "db-0", "a", "data-db-0"))),
			"delete_claim ns/data-db-0; delete_pod ns/db-0; delete_pod ns/db-0-again"},
		{"release on an out-of-service node that is still there and reports no Ready condition",
			world(node("b", OutOfServiceTaint), class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"), pvc("ns", "data-db-0", "v"), statefulSet("ns", "db", "data")),
			"delete_claim ns/data-db-0"},
		{"release on an out-of-service node whose Ready is Unknown (its kubelet stopped reporting)",
			world(withReady(node("b", OutOfServiceTaint), corev1.ConditionUnknown), class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"), pvc("ns", "data-db-0", "v"), statefulSet("ns", "db", "data")),
			"delete_claim ns/data-db-0"},
		{"release on an out-of-service node whose Ready is False",
			world(withReady(node("b", OutOfServiceTaint), corev1.ConditionFalse), class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"), pvc("ns", "data-db-0", "v"), statefulSet("ns", "db", "data")),
			"delete_claim ns/data-db-0"},
		{"an out-of-service node that reports Ready: a warning, nothing released",
			world(withReady(node("b", OutOfServiceTaint), corev1.ConditionTrue), class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"), pvc("ns", "data-db-0", "v"), statefulSet("ns", "db", "data"),
				pod("ns", "db-0", "b", "data-db-0")),
			"pending v"},
		{"another taint is not out of service",
			world(node("b", "node.kubernetes.io/unreachable"), class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"), pvc("ns", "data-db-0", "v"), statefulSet("ns", "db", "data")),
			""},
		{"release of a claim no StatefulSet makes: kept, with a warning",
			deletedNode(world(class("rel", "release"), volume("v", "b", "rel", "ns", "mine"), pvc("ns", "mine", "v"), statefulSet("ns", "db", "data"), pod("ns", "p", "b", "mine"))),
			"kept ns/mine"},
		{"a name like a set's that is not one: kept",
			deletedNode(world(class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-01"), pvc("ns", "data-db-01", "v"), statefulSet("ns", "db", "data"))),
			"kept ns/data-db-01"},
		{"a set of another namespace: kept",
			deletedNode(world(class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"), pvc("ns", "data-db-0", "v"), statefulSet("other", "db", "data"))),
			"kept ns/data-db-0"},
		{"a claim being deleted: its pods, not the claim again; a pod on its way out off the node is left",
			func() *World {
				c := pvc("ns", "data-db-0", "v")
				deleted(c)
				p := pod("ns", "db-0", "", "data-db-0")
				deleted(p)
				q := pod("ns", "db-0-on-b", "b", "data-db-0")
				deleted(q)
				return deletedNode(world(class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"), c, statefulSet("ns", "db", "data"), p, q))
			}(),
			"delete_pod ns/db-0-on-b"},
		{"the claim gone: the volume released",
			deletedNode(world(class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"), statefulSet("ns", "db", "data"))),
			"release v"},
		{"the claim made again since (another UID): the volume released, the new claim left alone",
			func() *World {
				c := pvc("ns", "data-db-0", "")
				c.UID = "new"
				return deletedNode(world(class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"), c, statefulSet("ns", "db", "data")))
			}(),
			"release v"},
		{"a volume naming a claim bound to another volume: not that claim's, which is left with its pods",
			deletedNode(world(class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"), pvc("ns", "data-db-0", "theirs"), statefulSet("ns", "db", "data"),
				pod("ns", "db-0", "a", "data-db-0"))),
			"release v"},
		{"a volume being deleted without the provisioner's finalizer: done",
			func() *World {
				v := volume("v", "b", "rel", "ns", "")
				deleted(v)
				v.Finalizers = []string{"kubernetes.io/pv-protection"}
				return deletedNode(world(class("rel", "release"), v))
			}(),
			""},
		{"a volume being deleted that keeps the provisioner's finalizer: released",
			func() *World {
				v := volume("v", "b", "rel", "ns", "")
				deleted(v)
				return deletedNode(world(class("rel", "release"), v))
			}(),
			"release v"},
		{"reclaim policy Retain: the claim goes, the volume stays",
			func() *World {
				v := volume("v", "b", "rel", "ns", "data-db-0")
				v.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
				return deletedNode(world(class("rel", "release"), v, statefulSet("ns", "db", "data")))
			}(),
			""},
		{"a volume pinned to no node: nothing",
			func() *World {
				v := volume("v", "b", "rel", "ns", "")
				v.Spec.NodeAffinity = nil
				return deletedNode(world(class("rel", "release"), v))
			}(),
			""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := actions(Decide(tc.w, testTopology)); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestDecideChoice owns where a volume's on-node-loss choice comes from:
// the one its PV recorded when it was provisioned, whatever its class says
// now; for a PV that records none, its class's, unless the class was made
// after it; else retain.
func TestDecideChoice(t *testing.T) {
	// recorded is a StatefulSet's volume on the gone node b, of class
	// "c", made at t0-1h, its PV recording choice (none if "-").
	recorded := func(choice string) *corev1.PersistentVolume {
		v := volume("v", "b", "c", "ns", "data-db-0")
		v.CreationTimestamp = metav1.NewTime(t0.Add(-time.Hour))
		if choice != "-" {
			v.Spec.CSI.VolumeAttributes = map[string]string{contract.OnNodeLossKey: choice}
		}
		return v
	}
	// classMade is class "c" saying onLoss, made at t0+ago.
	classMade := func(onLoss string, ago time.Duration) *storagev1.StorageClass {
		sc := class("c", onLoss)
		sc.CreationTimestamp = metav1.NewTime(t0.Add(ago))
		return sc
	}
	const released, retained = "delete_claim ns/data-db-0", "retained v"
	for _, tc := range []struct {
		name  string
		pv    *corev1.PersistentVolume
		class *storagev1.StorageClass // nil: gone
		want  string
		why   string
	}{
		{"recorded release, the class made again since as retain: the volume's",
			recorded("release"), classMade("retain", 0), released, "volume v was provisioned with " + contract.OnNodeLossKey + ": release"},
		{"recorded retain, the class made again since as release: the volume's",
			recorded("retain"), classMade("release", 0), retained, "volume v was provisioned with " + contract.OnNodeLossKey + ": retain"},
		{"recorded release, the class gone: the volume's",
			recorded("release"), nil, released, "volume v was provisioned with"},
		{"recorded release, the class as old as the volume saying none: the volume's",
			recorded("release"), classMade("", -2*time.Hour), released, "volume v was provisioned with"},
		{"recorded a value converge does not know: retain",
			recorded("delete"), classMade("release", -2*time.Hour), retained, `volume v: ` + contract.OnNodeLossKey + `: unknown value "delete"`},
		{"none recorded, the class older than the volume says release: the class's",
			recorded("-"), classMade("release", -2*time.Hour), released, "volume v records no " + contract.OnNodeLossKey + "; StorageClass c says " + contract.OnNodeLossKey + ": release"},
		{"none recorded, the class made in the volume's second says release: the class's",
			recorded("-"), classMade("release", -time.Hour), released, "StorageClass c says"},
		{"none recorded, the class made again after the volume says release: retain",
			recorded("-"), classMade("release", -time.Hour+time.Second), retained, "StorageClass c was made after it"},
		{"none recorded, the class gone: retain",
			recorded("-"), nil, retained, `its StorageClass "c" is gone`},
		{"none recorded, the class names none: retain",
			recorded("-"), classMade("", -2*time.Hour), retained, "StorageClass c names none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := []any{tc.pv, pvc("ns", "data-db-0", "v"), statefulSet("ns", "db", "data")}
			if tc.class != nil {
				objs = append(objs, tc.class)
			}
			d := Decide(deletedNode(world(objs...)), testTopology)
			if got := actions(d); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
			if why := d.Actions[0].Why; !strings.Contains(why, tc.why) {
				t.Errorf("why %q does not say %q", why, tc.why)
			}
		})
	}
}

// deletedNode makes node b of w absent for the grace and more.
func deletedNode(w *World) *World {
	w.AbsentSince["b"] = t0.Add(-w.Grace)
	return w
}

// TestDecideWaitsForTheGrace checks that a pass says when the first absent
// node's grace ends, and counts the volumes on gone nodes by choice.
func TestDecideWaitsForTheGrace(t *testing.T) {
	w := world(class("rel", "release"), class("ret", "retain"),
		volume("v1", "b", "rel", "ns", ""), volume("v2", "c", "ret", "ns", ""), volume("v3", "d", "ret", "ns", ""), volume("v4", "d", "rel", "ns", ""))
	w.AbsentSince["b"] = t0.Add(-10 * time.Second)
	w.AbsentSince["c"] = t0.Add(-25 * time.Second)
	w.AbsentSince["d"] = t0.Add(-time.Hour)
	d := Decide(w, testTopology)
	if d.Next != 5*time.Second {
		t.Errorf("next pass in %v, want 5s (node c's grace)", d.Next)
	}
	if d.OnLost[contract.OnNodeLossRetain] != 1 || d.OnLost[contract.OnNodeLossRelease] != 1 {
		t.Errorf("volumes on gone nodes: %v, want one of each", d.OnLost)
	}
}

// TestActionsSayWhy checks that every action names the node, why it is
// gone and the choice.
func TestActionsSayWhy(t *testing.T) {
	w := deletedNode(world(class("rel", "release"), volume("v", "b", "rel", "ns", "mine"), pvc("ns", "mine", "v")))
	d := Decide(w, testTopology)
	if len(d.Actions) != 1 {
		t.Fatalf("actions: %s", actions(d))
	}
	why := d.Actions[0].Why
	for _, want := range []string{"node b was deleted", "StorageClass rel says " + contract.OnNodeLossKey + ": release", "no StatefulSet makes claim ns/mine again"} {
		if !strings.Contains(why, want) {
			t.Errorf("why %q does not say %q", why, want)
		}
	}
}

// TestPendingSaysWhatComes checks that the warning of a node that would be
// gone unless it comes back says why, when or on what converge would act,
// what it would then do to the volume, where that choice comes from, and
// what the operator can do.
func TestPendingSaysWhatComes(t *testing.T) {
	deleted := "node b was deleted; unless it registers again by 2026-11-25T12:00:20Z, "
	restart := "If the machine is alive, restart its kubelet: a kubelet registers its Node only when it starts"
	tainted := "node b carries the " + OutOfServiceTaint + " taint but reports Ready; once it is not Ready, "
	untaint := "if node b is alive, take the taint off"
	for _, tc := range []struct {
		name string
		w    *World
		want []string
	}{
		{"deleted, release of a StatefulSet's claim",
			world(class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"), pvc("ns", "data-db-0", "v"), statefulSet("ns", "db", "data")),
			[]string{deleted + "converge deletes claim ns/data-db-0 and its pods, and its StatefulSet makes them again on another node, with an empty volume: ",
				"StorageClass rel says " + contract.OnNodeLossKey + ": release", restart, "the pod GC deletes the node's pods"}},
		{"deleted, retain",
			world(class("ret", "retain"), volume("v", "b", "ret", "ns", "c"), pvc("ns", "c", "v")),
			[]string{deleted + "converge keeps claim ns/c and the data on the node: ", "StorageClass ret says " + contract.OnNodeLossKey + ": retain", restart}},
		{"deleted, retain, no claim",
			world(class("ret", "retain"), volume("v", "b", "ret", "ns", "")),
			[]string{deleted + "converge keeps volume v and its data on the node: ", restart}},
		{"deleted, release of a claim no StatefulSet makes",
			world(class("rel", "release"), volume("v", "b", "rel", "ns", "mine"), pvc("ns", "mine", "v")),
			[]string{deleted + "converge keeps claim ns/mine, which no StatefulSet makes again: ", restart}},
		{"deleted, release, the claim gone",
			world(class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0")),
			[]string{deleted + "converge deletes volume v, whose claim is gone: ", restart}},
		{"out of service and Ready, release",
			world(withReady(node("b", OutOfServiceTaint), corev1.ConditionTrue), class("rel", "release"), volume("v", "b", "rel", "ns", "data-db-0"), pvc("ns", "data-db-0", "v"), statefulSet("ns", "db", "data")),
			[]string{tainted + "converge deletes claim ns/data-db-0 and its pods", untaint}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.w.AbsentSince["b"] = t0.Add(-10 * time.Second)
			d := Decide(tc.w, testTopology)
			if got := actions(d); got != "pending v" {
				t.Fatalf("got %q, want %q", got, "pending v")
			}
			for _, want := range tc.want {
				if why := d.Actions[0].Why; !strings.Contains(why, want) {
					t.Errorf("why %q does not say %q", why, want)
				}
			}
		})
	}
}

// TestNodeOfOnlyWhenTheAffinityAgrees: a volume is on a node only when
// every term and every expression of the topology key name that one node;
// a volume whose affinity names two nodes (a forged expression for a node
// that is gone beside its real one) is on none, so nothing acts on it.
func TestNodeOfOnlyWhenTheAffinityAgrees(t *testing.T) {
	in := func(values ...string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: testTopology, Operator: corev1.NodeSelectorOpIn, Values: values}
	}
	other := corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"z1"}}
	for _, tc := range []struct {
		name  string
		terms []corev1.NodeSelectorTerm
		want  string
	}{
		{"one term, one expression", []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{in("a")}}}, "a"},
		{"two terms of the same node", []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{in("a")}},
			{MatchExpressions: []corev1.NodeSelectorRequirement{in("a")}}}, "a"},
		{"another key beside the node", []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{other, in("a")}}}, "a"},
		{"a ghost node first, then the node", []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{in("ghost"), in("a")}}}, ""},
		{"terms of two nodes", []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{in("ghost")}},
			{MatchExpressions: []corev1.NodeSelectorRequirement{in("a")}}}, ""},
		{"a term open to any node", []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{in("a")}},
			{MatchExpressions: []corev1.NodeSelectorRequirement{other}}}, ""},
		{"two values", []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{in("ghost", "a")}}}, ""},
		{"NotIn", []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: testTopology, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"a"}}}}}, ""},
		{"no terms", nil, ""},
	} {
		pv := volume("v", "a", "c", "", "")
		pv.Spec.NodeAffinity.Required.NodeSelectorTerms = tc.terms
		if got := nodeOf(pv, testTopology); got != tc.want {
			t.Errorf("%s: nodeOf = %q, want %q", tc.name, got, tc.want)
		}
	}
}
