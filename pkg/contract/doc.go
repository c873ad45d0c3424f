// Package contract is converge's published contract, in one leaf: the
// names a cluster writes and reads (the driver's name, its topology key,
// the StorageClass parameters and the volume attributes, the on-node-loss
// choices), the condition reasons (Reason, Reasons: a volume's health, as
// the kubelet, the metrics and the alert rules see it), the rules every
// request about them follows (which keys are known, what a mount flag and
// an mkfs option may be), and the one rule for IDs (CheckID). The rule for
// a CSI volume capability, the one that reads a CSI type, is its
// subpackage capability.
//
// It builds on two leaves alone and links no CSI nor gRPC (test/arch's
// TestContractIsALeaf): host, for the filesystems a volume may ask for,
// and classified, for the classified errors its rules answer with. It
// knows nothing of the store: the state package builds on it instead, for
// the reasons a volume's condition carries and the one name its stage
// transition spells (AllowModeChangeKey). The node server, the node-local
// controller, the store, the reconciler, pkg/nodeloss and
// converge-controller read their names and rules here, so that no copy can
// drift; converge-controller reads them without linking the store or
// bbolt (TestConvergeControllerLinksNoStore).
//
// A name here never changes: StorageClasses, PVs and alert rules in
// clusters hold it. CheckKeys, ParseOnNodeLoss and CheckID answer with
// classified errors; CheckMountFlags, CheckMkfsOptions and
// capability.Parse with plain ones, which the caller answers
// INVALID_ARGUMENT (or, for ValidateVolumeCapabilities, as its message).
package contract
