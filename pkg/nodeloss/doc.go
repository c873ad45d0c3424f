// Package nodeloss is converge-controller's work: what the cluster does
// with converge's volumes when their node is gone for good. Its loop is
// Watcher, which only converge-controller runs; it is never on a node's data
// path, and it is not the node-local CSI Controller service
// (pkg/controller). A converge
// volume is an image on one node's disk; its PersistentVolume is pinned to
// that node by the topology key, so when the node is gone its claims stay
// bound to it and the pods that use them stay Pending.
//
// A node is gone when its Node object has been absent for a grace period,
// or when it carries the node.kubernetes.io/out-of-service taint and is not
// Ready (Kubernetes' non-graceful node shutdown, whose pod GC force-deletes
// a tainted node's pods only then too). A node that exists without the
// taint, or reports Ready, is never gone: nothing is ever released while
// it is there. The grace exists because a deleted Node is not always a
// dead machine: a running kubelet whose Node was deleted does not register
// it again (it registers only when it starts), so a live node deleted by
// mistake stays absent until its kubelet is restarted, and from the API it
// looks like a dead one. While a node would be gone unless it comes back
// (absent within the grace, or tainted and Ready), a Warning event
// NodeLossPending on each of its volumes and their claims says, once, what
// converge will do and when, and what the operator can do.
//
// For each of the driver's volumes on a gone node, its on-node-loss choice
// decides (contract.OnNodeLoss): the StorageClass parameter
// converge.csi.dev/on-node-loss as CreateVolume recorded it in the volume's
// attributes, so that a class made again under the same name with another
// choice changes no volume made before it. A PV that records none
// (provisioned before converge recorded it, or static) takes its class's,
// from a class no newer than the PV only.
//
//   - retain (the default, and what a PV or class with a value converge
//     does not know, or a PV without a record whose class is gone or newer,
//     means): nothing is deleted. A Warning event on the claim and
//     the volume says where the data is and what the operator can do; if
//     the node comes back, so do the pods, with their data.
//   - release: the claim is deleted, and the pods that use it (Pending, or
//     left on the gone node), so that the StatefulSet makes both again and
//     the new claim is provisioned on another node, empty. Only a
//     StatefulSet's claims are released: a claim made by hand is nobody's
//     to make again, so it is kept, with an event that says why (TopoLVM
//     deletes every claim; converge will not delete what nothing re-creates).
//     Once the claim is gone the volume is released: its PersistentVolume
//     is deleted and the provisioner's finalizer taken off, as the
//     provisioner of the gone node cannot run DeleteVolume. A volume whose
//     reclaim policy is Retain keeps its PersistentVolume, Released.
//
// A node that comes back under its name finds its retained volumes where
// they were. What was released is not given back: its images stay on the
// node's disk, referenced by nothing, and csi-node gc lists them.
//
// Every pass is level-triggered: decide reads one consistent view (World)
// and returns every action with its reason; act carries them out, each
// idempotent, so a pass cut short is finished by the next.
package nodeloss
