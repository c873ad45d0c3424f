// Package classagent hands each change of the VolumeAttributesClass of a
// node's volumes to that node's csi-node. It runs on every node, in a pod
// of its own beside csi-node's (converge-controller node-agent, DaemonSet
// converge-node-agent), whose account only reads PVs, claims and
// VolumeAttributesClasses and writes events: it never holds the node
// pod's credentials.
//
// Why it exists: a cluster runs one csi-resizer, its leader, beside one
// node's csi-node, and external-resizer has no per-node mode for a modify.
// The leader's csi-node checks the class's parameters and answers a modify
// of another node's volume OK without recording it (pkg/controller); the
// resizer then marks the claim done. The agent of the volume's node calls
// its own csi-node's ControllerModifyVolume with the class's parameters,
// every IO limit key the class leaves out given as no limit (csi-node
// merges what it is given, as CSI says): that csi-node records them
// durably and its reconciler holds the volume to that class alone.
//
// The rules (Scope.Decide), for the driver's PVs pinned to this node whose
// handle names this node (or no node: a volume made before IDs named
// theirs): the PV's claim (the one its claimRef names, with the same UID,
// bound to this PV) names a class in its spec, and the class exists and is
// the driver's; or it names none, and every limit is lifted (a volume
// csi-node does not hold has none to lift). Only the claim's spec is
// read: its owner writes it, and no node's credentials may. What the
// resizer writes with a node's credentials (the PV's class, the claim's
// status) is what the claim shows, never what a volume gets, so a stolen
// node token can neither give a volume a class its owner did not ask for
// nor keep it from the one it asks for. A class the volume's csi-node
// refuses (INVALID_ARGUMENT) is the one the resizer's csi-node refused
// too: the modify is infeasible. A volume handle that two PVs of the node
// name gets nothing from either, since one of them may have been made
// with a stolen node's credentials to bring its own claim's class to the
// other's volume (where the node admission policy is off). That refusal
// keeps the true claim's class from its volume too, a denial a stolen
// node can cause there: a Warning event VolumeHandleShared on the claim
// of each such PV tells it, once per set of PVs.
//
// Every volume of the node is handed again at each resync and at
// start-up: a csi-node answers the same parameters again OK and writes
// nothing, and one that lost its store gets them back. A csi-node's
// refusal is retried with backoff, logged, and told in a Warning event on
// the claim at the third try and again at each resync while it lasts.
package classagent
