package snaplabel

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/converge-csi/converge/pkg/contract"
)

// ManagedByLabel is the label by which a node-deployed csi-snapshotter
// selects the objects it takes: its value is the node's name
// (external-snapshotter v8.7.0, pkg/utils/util.go).
const ManagedByLabel = "snapshot.storage.kubernetes.io/managed-by"

// The v1 resources the labeller reads and labels.
var (
	ContentsGVR      = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}
	GroupContentsGVR = schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: "v1", Resource: "volumegroupsnapshotcontents"}
	GroupClassesGVR  = schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: "v1", Resource: "volumegroupsnapshotclasses"}
)

// Event reasons.
const (
	// ReasonNodeUnknown: no node can be read from the content.
	ReasonNodeUnknown = "SnapshotNodeUnknown"
	// ReasonNodeGone: the node the content names has no Node object.
	ReasonNodeGone = "SnapshotNodeGone"
	// ReasonSpansNodes: a group's volumes, or its handles, name several
	// nodes.
	ReasonSpansNodes = "GroupSpansNodes"
	// ReasonClassWaits: a group content waits for the class, which is
	// held by, or handed to, another node.
	ReasonClassWaits = "GroupSnapshotClassBusy"
	// ReasonVolumeAmbiguous: a group's member volume handle is carried by
	// several PVs, or names a node other than its PV's, so it names no
	// node the labeller may trust.
	ReasonVolumeAmbiguous = "VolumeHandleAmbiguous"
	// ReasonLabelled: the labeller labelled the content (Normal).
	ReasonLabelled = "SnapshotNodeLabelled"
)

// World is what one pass decides on: the caches' objects.
type World struct {
	// Driver is the CSI driver whose contents are labelled.
	Driver string
	// TopologyKey pins a PV to its node.
	TopologyKey string
	// Nodes are the nodes that exist, by name.
	Nodes map[string]*corev1.Node
	// Volumes are the driver's PVs by their CSI volume handle
	// (IndexVolumes): every PV that carries a handle, since several of
	// them make it ambiguous.
	Volumes map[string][]*corev1.PersistentVolume
	// Contents, GroupContents and Classes are the snapshot objects (all
	// drivers'; Decide picks the driver's). GroupContents and Classes are
	// nil where the group API is not served.
	Contents, GroupContents, Classes []*unstructured.Unstructured
}

// Action is one thing a pass does: label Object with Node (Node != ""),
// or warn (Reason and Message) on Object and on Refs.
type Action struct {
	Resource schema.GroupVersionResource
	Object   *unstructured.Unstructured
	// Node is the label's value to set; "" for a warning only.
	Node string
	// Reason and Message are the event's; a label with a Reason is also
	// announced (Normal), a Warning otherwise.
	Reason, Message string
	// Warning says whether the event is a Warning.
	Warning bool
	// Refs are the other objects the event goes on: the content's
	// VolumeSnapshot or VolumeGroupSnapshot.
	Refs []*corev1.ObjectReference
}

// Decide returns what a pass does: the labels to add and the warnings to
// give, the classes' handover first (a group content labelled in the same
// pass then finds its class on its node), then the contents.
func Decide(w World) []Action {
	var out []Action
	planned := map[types.UID]string{} // group contents' labels after this pass
	for _, c := range w.Contents {
		if str(c, "spec", "driver") != w.Driver || hasLabel(c) {
			continue
		}
		out = append(out, w.content(c))
	}
	for _, g := range w.GroupContents {
		if str(g, "spec", "driver") != w.Driver {
			continue
		}
		if hasLabel(g) {
			planned[g.GetUID()] = g.GetLabels()[ManagedByLabel]
			continue
		}
		a := w.group(g)
		out = append(out, a...)
		for _, x := range a {
			if x.Node != "" {
				planned[g.GetUID()] = x.Node
			}
		}
	}
	return append(w.handover(planned), out...)
}

// content decides a VolumeSnapshotContent that carries no label.
func (w World) content(c *unstructured.Unstructured) Action {
	refs := ref(c, "VolumeSnapshot", "spec", "volumeSnapshotRef")
	handle := str(c, "spec", "source", "snapshotHandle")
	if handle == "" {
		handle = str(c, "status", "snapshotHandle")
	}
	if handle != "" {
		node := contract.NodeOfID(handle)
		if node == "" {
			return warn(ContentsGVR, c, refs, ReasonNodeUnknown, fmt.Sprintf(
				"Snapshot handle %q names no node (a %s snapshot ID ends with _<node>), so no node's csi-snapshotter takes this content and it never becomes ready. "+
					"If the handle is right, label the content %s=<node> yourself; otherwise delete it", handle, w.Driver, ManagedByLabel))
		}
		return w.labelOrGone(ContentsGVR, c, refs, node, fmt.Sprintf("snapshot handle %q", handle))
	}
	// A member snapshot-controller made for a group names its volume, and
	// its group's handle in an annotation: the group's node is the
	// member's. A content that names a volume and nothing else is a
	// request to snapshot that volume, which only snapshot-controller
	// routes (it labels the contents it makes for a VolumeSnapshot).
	group := c.GetAnnotations()[GroupHandleAnnotation]
	if node := contract.NodeOfID(group); node != "" {
		return w.labelOrGone(ContentsGVR, c, refs, node, fmt.Sprintf("group snapshot handle %q", group))
	}
	return warn(ContentsGVR, c, refs, ReasonNodeUnknown, fmt.Sprintf(
		"This content names no snapshot handle (nor, in annotation %s, a group's), so no node's csi-snapshotter takes it: converge-controller routes a content by the node its handle names, "+
			"and leaves one that names only a volume (a request to snapshot it) to snapshot-controller, which labels the contents it makes. If the content is right, label it %s=<node> yourself; otherwise delete it", GroupHandleAnnotation, ManagedByLabel))
}

// GroupHandleAnnotation is the annotation in which snapshot-controller
// names the group snapshot handle of a member content it makes.
const GroupHandleAnnotation = "groupsnapshot.storage.k8s.io/volumeGroupSnapshotHandle"

// group decides a VolumeGroupSnapshotContent that carries no label.
func (w World) group(g *unstructured.Unstructured) []Action {
	refs := ref(g, "VolumeGroupSnapshot", "spec", "volumeGroupSnapshotRef")
	handle := str(g, "spec", "source", "groupSnapshotHandles", "volumeGroupSnapshotHandle")
	if handle == "" {
		handle = str(g, "status", "volumeGroupSnapshotHandle")
	}
	if handle != "" {
		node := contract.NodeOfID(handle)
		if node == "" {
			return []Action{warn(GroupContentsGVR, g, refs, ReasonNodeUnknown, fmt.Sprintf(
				"Group snapshot handle %q names no node (a %s group snapshot ID ends with _<node>), so no node's csi-snapshotter takes this content. "+
					"If the handle is right, label the content %s=<node> yourself; otherwise delete it", handle, w.Driver, ManagedByLabel))}
		}
		var out []Action
		members, _, _ := unstructured.NestedStringSlice(g.Object, "spec", "source", "groupSnapshotHandles", "volumeSnapshotHandles")
		var others []string
		for _, m := range members {
			if n := contract.NodeOfID(m); n != node {
				others = append(others, fmt.Sprintf("%s on %q", m, n))
			}
		}
		if len(others) > 0 {
			out = append(out, warn(GroupContentsGVR, g, refs, ReasonSpansNodes, fmt.Sprintf(
				"Group snapshot handle %q names node %s, but member snapshots name others: %s. A %s group lives on one node: labelled for %s, whose csi-node answers for the members it does not have",
				handle, node, strings.Join(others, ", "), w.Driver, node)))
		}
		return append(out, w.labelOrGone(GroupContentsGVR, g, refs, node, fmt.Sprintf("group snapshot handle %q", handle)))
	}
	return w.groupOfVolumes(g, refs)
}

// groupOfVolumes decides a group content that names no group handle (a
// dynamic one) by the nodes of its volumes. A member whose handle is
// ambiguous (World.volume) leaves the whole group unlabelled: labelling it
// for the node its PersistentVolume claims would hand the tenant's
// snapshot to whoever made that PersistentVolume.
func (w World) groupOfVolumes(g *unstructured.Unstructured, refs []*corev1.ObjectReference) []Action {
	vols, _, _ := unstructured.NestedStringSlice(g.Object, "spec", "source", "volumeHandles")
	if len(vols) == 0 {
		return []Action{warn(GroupContentsGVR, g, refs, ReasonNodeUnknown,
			"The content names neither a group snapshot handle nor volumes, so no node can be found for it")}
	}
	members := make([]volume, len(vols))
	var doubts []string
	for i, v := range vols {
		if members[i] = w.volume(v); members[i].ambiguous != "" {
			doubts = append(doubts, members[i].ambiguous)
		}
	}
	if len(doubts) > 0 {
		return []Action{warn(GroupContentsGVR, g, refs, ReasonVolumeAmbiguous, strings.Join(doubts, " ")+" "+ambiguityAdvice)}
	}
	var where []string
	nodes := map[string]bool{}
	for i, m := range members {
		if m.node == "" {
			return []Action{warn(GroupContentsGVR, g, refs, ReasonNodeUnknown, fmt.Sprintf(
				"The node of member volume %s cannot be found (its PersistentVolume is missing or not pinned to one node by %s, and the handle names no node), "+
					"so no node's csi-snapshotter takes this group. Delete the VolumeGroupSnapshot", w.volumeName(vols[i]), w.TopologyKey))}
		}
		nodes[m.node] = true
		where = append(where, fmt.Sprintf("%s on %s", w.volumeName(vols[i]), m.node))
	}
	first := members[0].node
	var out []Action
	if len(nodes) > 1 {
		out = append(out, warn(GroupContentsGVR, g, refs, ReasonSpansNodes, fmt.Sprintf(
			"The group's volumes lie on different nodes: %s. A %s group snapshot is taken on one node, so this one cannot be taken: "+
				"labelled for %s, whose csi-node refuses it. Delete the VolumeGroupSnapshot and select claims that live on one node",
			strings.Join(where, ", "), w.Driver, first)))
	}
	return append(out, w.labelOrGone(GroupContentsGVR, g, refs, first, fmt.Sprintf("the node of volume %s", w.volumeName(vols[0]))))
}

// labelOrGone labels o with node when the node exists, and warns
// otherwise; from says where the node was read.
func (w World) labelOrGone(gvr schema.GroupVersionResource, o *unstructured.Unstructured, refs []*corev1.ObjectReference, node, from string) Action {
	if _, ok := w.Nodes[node]; !ok {
		return warn(gvr, o, refs, ReasonNodeGone, fmt.Sprintf(
			"Node %q, named by %s, does not exist, so no node's csi-snapshotter takes this content and it never becomes ready. "+
				"If the node comes back under its name, the content is labelled then; if the node is gone for good, its snapshots went with its disk: delete the content", node, from))
	}
	return Action{Resource: gvr, Object: o, Node: node, Refs: refs, Reason: ReasonLabelled,
		Message: fmt.Sprintf("Labelled %s=%s (from %s), for that node's csi-snapshotter", ManagedByLabel, node, from)}
}

// handover decides the classes' labels. csi-snapshotter reads a
// VolumeGroupSnapshotClass from its node's filtered cache, to create a
// dynamic group and to check a pre-provisioned one that names the class,
// so the class must carry the label of the node whose content waits on it;
// one label names one node. A content waits while it is neither taken (a
// group handle in its status, or ready) nor being deleted; one whose
// status holds an error (csi-snapshotter retries it, with backoff) waits
// behind those without one. The class goes to the node of the first
// waiting content (the oldest, those without an error first) whose node is
// Ready, first come first served: a node whose groups keep coming does not
// keep it from an older one's. With nothing waiting it
// stays where it is. A content waiting without an error while the class
// serves another node is told so (GroupSnapshotClassBusy).
func (w World) handover(planned map[types.UID]string) []Action {
	waiting := map[string][]waiter{} // class -> contents
	for _, g := range w.GroupContents {
		class := str(g, "spec", "volumeGroupSnapshotClassName")
		if str(g, "spec", "driver") != w.Driver || class == "" || planned[g.GetUID()] == "" || g.GetDeletionTimestamp() != nil {
			continue
		}
		if ready, _, _ := unstructured.NestedBool(g.Object, "status", "readyToUse"); ready || str(g, "status", "volumeGroupSnapshotHandle") != "" {
			continue // taken
		}
		_, errored, _ := unstructured.NestedMap(g.Object, "status", "error")
		waiting[class] = append(waiting[class], waiter{g: g, node: planned[g.GetUID()], errored: errored})
	}
	var out []Action
	for _, c := range w.Classes {
		if str(c, "driver") != w.Driver || len(waiting[c.GetName()]) == 0 {
			continue
		}
		queue := waiting[c.GetName()]
		sort.Slice(queue, func(i, j int) bool { return queue[i].before(queue[j]) })
		holder := c.GetLabels()[ManagedByLabel]
		next := ""
		for _, q := range queue {
			if w.ready(q.node) {
				next = q.node
				break
			}
		}
		for _, q := range queue {
			if q.node == next || q.errored {
				continue // an error in its status says what is wrong
			}
			why := fmt.Sprintf("VolumeGroupSnapshotClass %s serves node %s's group snapshots first; it comes to node %s when none of them waits", c.GetName(), next, q.node)
			if !w.ready(q.node) {
				why = fmt.Sprintf("Node %s is not Ready: VolumeGroupSnapshotClass %s is handed to the other nodes' groups first, and to this one once the node is Ready", q.node, c.GetName())
			}
			out = append(out, warn(GroupContentsGVR, q.g, ref(q.g, "VolumeGroupSnapshot", "spec", "volumeGroupSnapshotRef"), ReasonClassWaits, why))
		}
		if next == "" || next == holder {
			continue
		}
		msg := fmt.Sprintf("Labelled for node %s, whose group snapshot waits on the class", next)
		if holder != "" {
			msg = fmt.Sprintf("Handed from node %s to node %s, whose group snapshot waits on the class", holder, next)
		}
		out = append(out, Action{Resource: GroupClassesGVR, Object: c, Node: next, Reason: ReasonLabelled, Message: msg})
	}
	return out
}

// waiter is a group content that waits on its class, and its node.
type waiter struct {
	g       *unstructured.Unstructured
	node    string
	errored bool
}

// before orders the waiting contents: those without an error first, then
// the oldest, then by name.
func (a waiter) before(b waiter) bool {
	if a.errored != b.errored {
		return !a.errored
	}
	ta, tb := a.g.GetCreationTimestamp(), b.g.GetCreationTimestamp()
	if !ta.Equal(&tb) {
		return ta.Before(&tb)
	}
	return a.g.GetName() < b.g.GetName()
}

// ready says whether node exists and its Ready condition is True.
func (w World) ready(node string) bool {
	n := w.Nodes[node]
	if n == nil {
		return false
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func warn(gvr schema.GroupVersionResource, o *unstructured.Unstructured, refs []*corev1.ObjectReference, reason, msg string) Action {
	return Action{Resource: gvr, Object: o, Refs: refs, Reason: reason, Message: msg, Warning: true}
}

func hasLabel(o *unstructured.Unstructured) bool {
	_, ok := o.GetLabels()[ManagedByLabel]
	return ok
}

// str is the string at path in o, "" when absent or not a string.
func str(o *unstructured.Unstructured, path ...string) string {
	s, _, _ := unstructured.NestedString(o.Object, path...)
	return s
}

// ref is the object reference at path in o (a content's snapshot), with
// kind set to kind and the snapshot API's group; nil for none.
func ref(o *unstructured.Unstructured, kind string, path ...string) []*corev1.ObjectReference {
	m, ok, _ := unstructured.NestedMap(o.Object, path...)
	if !ok {
		return nil
	}
	r := &corev1.ObjectReference{Kind: kind}
	r.Name, _ = m["name"].(string)
	r.Namespace, _ = m["namespace"].(string)
	uid, _ := m["uid"].(string)
	r.UID = types.UID(uid)
	if r.Name == "" || r.Namespace == "" {
		return nil
	}
	if kind == "VolumeGroupSnapshot" {
		r.APIVersion = GroupContentsGVR.GroupVersion().String()
	} else {
		r.APIVersion = ContentsGVR.GroupVersion().String()
	}
	return []*corev1.ObjectReference{r}
}
