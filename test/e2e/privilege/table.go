package privilege

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// Namespace tokens of a Question: the namespace converge is installed in,
// whatever its name, and every namespace at once (a SubjectAccessReview
// without a namespace, which cluster-scoped objects are asked with too).
const (
	Install = "converge's"
	Any     = "any"
)

// ResizerLease is the Lease csi-resizer elects its leader on:
// "external-resizer-" and the driver's name with every character but
// letters, digits and '-' made '-' (csi-resizer v2.3.0, cmd/csi-resizer,
// util.SanitizeName of the CSI driver's name).
const ResizerLease = "external-resizer-converge-csi-dev"

// ControllerLease is the Lease converge-controller's replicas elect their
// leader on (cmd/converge-controller).
const ControllerLease = "converge-controller"

// Question is one row of the table: may Account do Verb to Resource
// (resource[/subresource][.group], as kubectl names it) named Name ("" for
// any) in Namespace (Install, Any, or a namespace's name)? Allowed is the
// documented answer, Why the reason for it.
type Question struct {
	Account   string
	Verb      string
	Resource  string
	Namespace string
	Name      string
	Allowed   bool
	Why       string
}

// Parts splits q.Resource into the group, resource and subresource a
// SubjectAccessReview asks for.
func (q Question) Parts() (group, resource, subresource string) {
	r, sub, _ := strings.Cut(q.Resource, "/")
	if sub != "" {
		// persistentvolumeclaims/status, volumesnapshotcontents/status.snapshot.storage.k8s.io
		sub, group, _ = strings.Cut(sub, ".")
		return group, r, sub
	}
	r, group, _ = strings.Cut(r, ".")
	return group, r, ""
}

// The service accounts deploy/ and the chart install.
const (
	Node       = "converge-node"
	NodeAgent  = "converge-node-agent"
	Controller = "converge-controller"
)

const lease = "leases.coordination.k8s.io"

// Table is the documented privilege of each service account: what each
// sidecar, the node agent and converge-controller need (yes), and what a
// node's, its agent's or the controller's stolen token must not reach
// (no). The snapshot rows (the
// node's and the controller's) hold with deploy/'s snapshots component
// (or the chart's snapshots.enabled), which the e2e run installs.
var Table = []Question{
	// converge-node: the Leases.
	{Node, "get", lease, Install, ResizerLease, true, "csi-resizer's leader election"},
	{Node, "update", lease, Install, ResizerLease, true, "csi-resizer's leader election"},
	{Node, "create", lease, Install, "", true, "csi-resizer's first election (RBAC cannot name what is created; the admission policy refuses any other name)"},
	{Node, "delete", lease, Install, ResizerLease, false, "a leader elector never deletes its Lease"},
	{Node, "list", lease, Install, "", false, "a leader elector reads only its own Lease"},
	{Node, "update", lease, Install, "kube-scheduler", false, "another component's leader election"},
	{Node, "get", lease, Install, "kube-controller-manager", false, "another component's leader election"},
	{Node, "update", lease, Install, "kube-controller-manager", false, "another component's leader election"},
	{Node, "update", lease, Install, ControllerLease, false, "converge-controller's leader election"},
	{Node, "get", lease, "default", ResizerLease, false, "another namespace"},
	{Node, "create", lease, "default", "", false, "another namespace"},
	{Node, "get", "secrets", Install, "", false, "no sidecar reads a secret"},
	{Node, "list", "secrets", Any, "", false, "no sidecar reads a secret"},
	// converge-node: csi-provisioner (--node-deployment, --enable-capacity).
	{Node, "watch", "persistentvolumes", Any, "", true, "csi-provisioner: the volumes it made"},
	{Node, "create", "persistentvolumes", Any, "", true, "csi-provisioner: a volume for a claim"},
	{Node, "delete", "persistentvolumes", Any, "", true, "csi-provisioner: a released volume"},
	{Node, "watch", "persistentvolumeclaims", Any, "", true, "csi-provisioner: claims to provision"},
	{Node, "update", "persistentvolumeclaims", Any, "", true, "csi-provisioner: the claim's node annotation"},
	{Node, "watch", "storageclasses.storage.k8s.io", Any, "", true, "csi-provisioner: a claim's class"},
	{Node, "watch", "csinodes.storage.k8s.io", Any, "", true, "csi-provisioner: the node's topology"},
	{Node, "get", "nodes", Any, "", true, "csi-provisioner: its own node"},
	{Node, "get", "volumeattributesclasses.storage.k8s.io", Any, "", true, "csi-provisioner: a claim's attributes class"},
	{Node, "create", "csistoragecapacities.storage.k8s.io", Install, "", true, "csi-provisioner: the node's capacity"},
	{Node, "delete", "csistoragecapacities.storage.k8s.io", Install, "", true, "csi-provisioner: capacity of a class gone"},
	{Node, "create", "csistoragecapacities.storage.k8s.io", "default", "", false, "capacity lives in converge's namespace alone"},
	{Node, "get", "pods", Install, "", true, "csi-provisioner: its pod, the capacity objects' owner"},
	{Node, "get", "daemonsets.apps", Install, "", false, "the capacity objects' owner is the pod (--capacity-ownerref-level=0)"},
	{Node, "list", "volumeattachments.storage.k8s.io", Any, "", false, "converge has no ControllerPublishVolume"},
	{Node, "create", "events", Any, "", true, "every sidecar: events about its objects"},
	{Node, "patch", "events", Any, "", true, "every sidecar: a repeated event"},
	{Node, "list", "events", Any, "", false, "no sidecar reads events"},
	// converge-node: csi-resizer.
	{Node, "patch", "persistentvolumes", Any, "", true, "csi-resizer: the volume's new size"},
	{Node, "patch", "persistentvolumeclaims/status", Any, "", true, "csi-resizer: the claim's resize status"},
	{Node, "watch", "pods", Any, "", false, "csi-resizer runs without its pod informer (--handle-volume-inuse-error=false): converge expands online"},
	{Node, "list", "pods", Any, "", false, "no sidecar lists the cluster's pods"},
	{Node, "get", "pods", "default", "", false, "csi-provisioner reads its own pod, in converge's namespace"},
	{Node, "watch", "volumeattributesclasses.storage.k8s.io", Any, "", true, "csi-resizer: the class a claim switches to, for ControllerModifyVolume"},
	// converge-node: csi-snapshotter (--node-deployment) and restores.
	{Node, "watch", "volumesnapshotclasses.snapshot.storage.k8s.io", Any, "", true, "csi-snapshotter: the snapshot's class"},
	{Node, "update", "volumesnapshotcontents.snapshot.storage.k8s.io", Any, "", true, "csi-snapshotter: the content it takes"},
	{Node, "patch", "volumesnapshotcontents/status.snapshot.storage.k8s.io", Any, "", true, "csi-snapshotter: the content's status"},
	{Node, "update", "volumesnapshots.snapshot.storage.k8s.io", Any, "", true, "csi-provisioner: its finalizer on a snapshot being restored"},
	{Node, "watch", "volumegroupsnapshotclasses.groupsnapshot.storage.k8s.io", Any, "", true, "csi-snapshotter: the group snapshot's class"},
	{Node, "update", "volumegroupsnapshotcontents.groupsnapshot.storage.k8s.io", Any, "", true, "csi-snapshotter: the group content it takes"},
	{Node, "patch", "volumegroupsnapshotcontents/status.groupsnapshot.storage.k8s.io", Any, "", true, "csi-snapshotter: the group content's status"},
	{Node, "create", "volumegroupsnapshotcontents.groupsnapshot.storage.k8s.io", Any, "", false, "snapshot-controller makes the group contents"},
	{Node, "update", "volumegroupsnapshots.groupsnapshot.storage.k8s.io", Any, "", false, "a group snapshot is its owner's and snapshot-controller's"},
	// converge-node-agent: reads, and tells a claim's owner in an event.
	{NodeAgent, "watch", "persistentvolumes", Any, "", true, "the volumes of its node, whose class it hands"},
	{NodeAgent, "list", "persistentvolumes", Any, "", true, "its informer's first list"},
	{NodeAgent, "watch", "persistentvolumeclaims", Any, "", true, "the claim that names a volume's class"},
	{NodeAgent, "list", "persistentvolumeclaims", Any, "", true, "its informer's first list"},
	{NodeAgent, "watch", "volumeattributesclasses.storage.k8s.io", Any, "", true, "the class's parameters"},
	{NodeAgent, "list", "volumeattributesclasses.storage.k8s.io", Any, "", true, "its informer's first list"},
	{NodeAgent, "create", "events", Any, "", true, "VolumeAttributesClassNotApplied and VolumeHandleShared on a claim"},
	{NodeAgent, "patch", "events", Any, "", true, "a repeated event"},
	{NodeAgent, "get", "persistentvolumes", Any, "", false, "it reads its caches alone"},
	{NodeAgent, "patch", "persistentvolumes", Any, "", false, "it changes no volume: csi-resizer writes a volume's class"},
	{NodeAgent, "create", "persistentvolumes", Any, "", false, "it makes no volume"},
	{NodeAgent, "delete", "persistentvolumes", Any, "", false, "it deletes no volume"},
	{NodeAgent, "update", "persistentvolumeclaims", Any, "", false, "it changes no claim"},
	{NodeAgent, "patch", "persistentvolumeclaims/status", Any, "", false, "a modify's status is csi-resizer's"},
	{NodeAgent, "update", "volumeattributesclasses.storage.k8s.io", Any, "", false, "classes are the operator's"},
	{NodeAgent, "list", "events", Any, "", false, "it reads no event"},
	{NodeAgent, "update", "events", Any, "", false, "client-go's recorder patches a repeated event"},
	{NodeAgent, "delete", "events", Any, "", false, "an event goes from the API after an hour, by itself"},
	{NodeAgent, "get", "nodes", Any, "", false, "its node's name comes from its pod (NODE_NAME)"},
	{NodeAgent, "get", "pods", Install, "", false, "it reads no pod"},
	{NodeAgent, "create", "csistoragecapacities.storage.k8s.io", Install, "", false, "capacity is csi-provisioner's"},
	{NodeAgent, "update", lease, Install, ResizerLease, false, "csi-resizer's leader election"},
	{NodeAgent, "get", "secrets", Install, "", false, "it reads no secret"},
	{NodeAgent, "list", "secrets", Any, "", false, "it reads no secret"},
	// converge-controller.
	{Controller, "get", lease, Install, ControllerLease, true, "its leader election"},
	{Controller, "update", lease, Install, ControllerLease, true, "its leader election"},
	{Controller, "create", lease, Install, "", true, "its first election (RBAC cannot name what is created; the admission policy refuses any other name)"},
	{Controller, "delete", lease, Install, ControllerLease, false, "a leader elector never deletes its Lease"},
	{Controller, "update", lease, Install, ResizerLease, false, "csi-resizer's leader election"},
	{Controller, "update", lease, Install, "kube-scheduler", false, "another component's leader election"},
	{Controller, "get", lease, Install, "kube-controller-manager", false, "another component's leader election"},
	{Controller, "get", lease, "default", ControllerLease, false, "another namespace"},
	{Controller, "get", "secrets", Install, "", false, "it reads no secret"},
	{Controller, "list", "secrets", Any, "", false, "it reads no secret"},
	{Controller, "watch", "nodes", Any, "", true, "which nodes are gone"},
	{Controller, "watch", "persistentvolumes", Any, "", true, "the volumes of a node that is gone"},
	{Controller, "delete", "persistentvolumes", Any, "", true, "release: the volume"},
	{Controller, "update", "persistentvolumes", Any, "", true, "release: the provisioner's finalizer"},
	{Controller, "create", "persistentvolumes", Any, "", false, "it makes no volume"},
	{Controller, "delete", "persistentvolumeclaims", Any, "", true, "release: the claim"},
	{Controller, "update", "persistentvolumeclaims", Any, "", false, "it changes no claim"},
	{Controller, "delete", "pods", Any, "", true, "release: the pods that use the claim"},
	{Controller, "watch", "statefulsets.apps", Any, "", true, "whether a StatefulSet makes the claim again"},
	{Controller, "watch", "storageclasses.storage.k8s.io", Any, "", true, "the class's on-node-loss"},
	{Controller, "create", "events", Any, "", true, "NodeLossPending and what it did"},
	{Controller, "create", "csistoragecapacities.storage.k8s.io", Install, "", false, "capacity is csi-provisioner's"},
	// converge-controller: the snapshot labeller (pkg/snaplabel).
	{Controller, "watch", "volumesnapshotcontents.snapshot.storage.k8s.io", Any, "", true, "snapshot labeller: contents without a node"},
	{Controller, "patch", "volumesnapshotcontents.snapshot.storage.k8s.io", Any, "", true, "snapshot labeller: a content's node label (the admission policy allows that label alone)"},
	{Controller, "update", "volumesnapshotcontents.snapshot.storage.k8s.io", Any, "", false, "it sends the label alone, by patch"},
	{Controller, "create", "volumesnapshotcontents.snapshot.storage.k8s.io", Any, "", false, "it makes no content"},
	{Controller, "delete", "volumesnapshotcontents.snapshot.storage.k8s.io", Any, "", false, "it deletes no content"},
	{Controller, "patch", "volumesnapshotcontents/status.snapshot.storage.k8s.io", Any, "", false, "a content's status is its node's csi-snapshotter's"},
	{Controller, "get", "volumesnapshots.snapshot.storage.k8s.io", Any, "", false, "its events name a snapshot by reference"},
	{Controller, "watch", "volumegroupsnapshotcontents.groupsnapshot.storage.k8s.io", Any, "", true, "snapshot labeller: group contents without a node"},
	{Controller, "patch", "volumegroupsnapshotcontents.groupsnapshot.storage.k8s.io", Any, "", true, "snapshot labeller: a group content's node label"},
	{Controller, "patch", "volumegroupsnapshotcontents/status.groupsnapshot.storage.k8s.io", Any, "", false, "a group content's status is its node's csi-snapshotter's"},
	{Controller, "watch", "volumegroupsnapshotclasses.groupsnapshot.storage.k8s.io", Any, "", true, "snapshot labeller: which node takes a group next"},
	{Controller, "patch", "volumegroupsnapshotclasses.groupsnapshot.storage.k8s.io", Any, "", true, "snapshot labeller: the class handed to that node"},
	{Controller, "create", "volumegroupsnapshotclasses.groupsnapshot.storage.k8s.io", Any, "", false, "classes are the operator's"},
	{Controller, "get", "volumegroupsnapshots.groupsnapshot.storage.k8s.io", Any, "", false, "its events name a group snapshot by reference"},
}

// Header is the table's heading row in SECURITY.md.
const Header = "| Account | Verb | Resource | Namespace | Name | Allowed | Why |"

// Markdown renders rows as SECURITY.md shows them, heading included.
func Markdown(rows []Question) string {
	var b strings.Builder
	b.WriteString(Header + "\n|---|---|---|---|---|---|---|\n")
	for _, q := range rows {
		name, allowed := q.Name, "no"
		if name == "" {
			name = "any"
		}
		if q.Allowed {
			allowed = "**yes**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", q.Account, q.Verb, q.Resource, q.Namespace, name, allowed, q.Why)
	}
	return b.String()
}

// Parse reads the table that follows Header in a Markdown document, up to
// its first line that is not a table row. If the document has no such
// table, Parse returns an error.
func Parse(r io.Reader) ([]Question, error) {
	sc := bufio.NewScanner(r)
	found := false
	var rows []Question
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !found {
			found = line == Header
			continue
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		if strings.HasPrefix(line, "|---") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 7 {
			return nil, fmt.Errorf("row %q: got %d cells, want 7", line, len(cells))
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		q := Question{Account: cells[0], Verb: cells[1], Resource: cells[2], Namespace: cells[3], Name: cells[4], Why: cells[6]}
		if q.Name == "any" {
			q.Name = ""
		}
		switch cells[5] {
		case "**yes**":
			q.Allowed = true
		case "no":
		default:
			return nil, fmt.Errorf("row %q: allowed %q, want **yes** or no", line, cells[5])
		}
		rows = append(rows, q)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("no table headed %q", Header)
	}
	return rows, nil
}
