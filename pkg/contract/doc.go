// Package contract is converge's published contract, in one leaf: the
// names a cluster writes and reads (the driver's name, its topology key,
// the StorageClass parameters and the volume attributes, the on-node-loss
// choices), the rules every request about them follows (which keys are
// known, what a volume capability, a mount flag and an mkfs option may
// be), and the one rule for IDs (CheckID).
//
// It builds on two leaves alone (test/arch's TestContractIsALeaf): host,
// for the filesystems a volume may ask for, and state, for the classified
// errors its rules answer with, the access types, and the one name the
// state package itself must spell (AllowModeChangeKey, which a stage
// transition names). The node server, the node-local controller,
// pkg/nodeloss and converge-controller read their names and rules here, so
// that no copy can drift.
//
// The condition reasons (a volume's health, as the kubelet, the metrics and
// the alert rules see it) are published too, in the subpackage reasons: a
// leaf that imports nothing, since the store carries a reason in a
// volume's condition and this package builds on the store.
//
// A name here never changes: StorageClasses, PVs and alert rules in
// clusters hold it. CheckKeys, ParseOnNodeLoss and CheckID answer with
// classified errors; ParseCapability, CheckMountFlags and CheckMkfsOptions
// with plain ones, which the caller answers INVALID_ARGUMENT (or, for
// ValidateVolumeCapabilities, as its message).
package contract
