// Package classagent hands each change of the VolumeAttributesClass of a
// node's volumes to that node's csi-node. It runs on every node, beside
// csi-node (converge-controller node-agent), with the node's credentials,
// and only reads the API.
//
// Why it exists: a cluster runs one csi-resizer, its leader, beside one
// node's csi-node, and external-resizer has no per-node mode for a modify.
// The leader's csi-node checks the class's parameters and answers a modify
// of another node's volume OK without recording it (pkg/controller); the
// resizer then writes the class into the volume's PersistentVolume
// (spec.volumeAttributesClassName) and marks the claim done. The agent of
// the volume's node sees the PV, reads the class and calls its own
// csi-node's ControllerModifyVolume with the class's parameters, as the
// resizer would have: that csi-node records them durably and its
// reconciler holds the volume to them.
//
// The rules (Decide), for the driver's PVs pinned to this node whose
// handle names this node (or no node: a volume made before IDs named
// theirs):
//   - the PV names a class, and its claim (the one its claimRef names, with
//     the same UID, bound to this PV) names the same class in its spec:
//     what the claim's owner asks for and what the resizer reached agree.
//     A node's credentials may write a PV's class (the resizer's), never a
//     claim's spec, so a stolen node token cannot hand a class the owner
//     did not ask for; while a modify is under way, or was found
//     infeasible, the two differ and the volume keeps what it was handed;
//   - the class exists and is the driver's.
//
// Every PV that passes is handed again at each resync and at start-up: a
// csi-node answers the same parameters again OK and writes nothing, and
// one that lost its store gets them back. A csi-node's refusal is retried
// with backoff and logged with the PV's and the class's names.
package classagent
