// Package snaplabel is converge-controller's snapshot labeller: it gives
// converge's snapshot contents the node label that distributed
// snapshotting routes them by, where external-snapshotter v8.7.0 gives
// none.
//
// Each node runs csi-snapshotter with --node-deployment, which watches only
// the VolumeSnapshotContents, VolumeGroupSnapshotContents and
// VolumeGroupSnapshotClasses labelled
// snapshot.storage.kubernetes.io/managed-by=<its node>. snapshot-controller
// labels only the VolumeSnapshotContents it makes for a VolumeSnapshot of
// a PV. So, without this package, a content made by hand or by a restore
// of a backup (pre-provisioned), a group content, the member contents of
// a group and every VolumeGroupSnapshotClass reach no node: they never
// become ready, and a bound one never finishes deleting (only the sidecar
// takes the bound-protection finalizer off).
//
// The rules (Decide), for objects of the driver only:
//   - a VolumeSnapshotContent without the label gets its node's: the node
//     its snapshot handle names (contract.NodeOfID; a converge snapshot ID
//     is <name>_<node>), else the node of its source volume (its PV's
//     node affinity, else the volume handle's suffix);
//   - a VolumeGroupSnapshotContent without the label gets the node of its
//     group handle (pre-provisioned; every member handle must agree), else
//     of its volumes; a group whose volumes lie on several nodes is
//     labelled with the first one's node, whose csi-node refuses it, so
//     that the refusal shows on the VolumeGroupSnapshot and deleting it
//     completes, and a GroupSpansNodes event lists each claim's node;
//   - a group whose volume handle is ambiguous is not labelled at all: the
//     handle is carried by several PVs, or names an existing node other
//     than the one its PV's affinity pins it to (see World.volume). A PV
//     anyone may make must not draw a tenant's group snapshot to its
//     maker's node; a VolumeHandleAmbiguous event names the PVs and nodes;
//   - a VolumeGroupSnapshotClass carries one node's label at a time, as
//     csi-snapshotter reads the class from its filtered cache: it is
//     handed from node to node, held by a node while a group content of
//     that node still waits on it (see handover).
//
// An existing label on a content is never changed. A content whose node
// cannot be found, or names a node that does not exist, gets a Warning
// event that says so, on the content and on its (group) snapshot.
package snaplabel
