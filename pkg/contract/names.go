package contract

import "slices"

const (
	// DefaultDriverName is the CSI driver's name, unless --driver-name
	// says another: the CSIDriver object, every PV's spec.csi.driver and
	// converge-controller's choice of volumes hold it.
	DefaultDriverName = "converge.csi.dev"
	// TopologyKey is the topology segment that pins a volume to its node:
	// the node's name. CreateVolume answers it, the kubelet labels the
	// node with it, and converge-controller reads it from a PV's node
	// affinity to find the volume's node.
	TopologyKey = "topology.converge.csi.dev/node"
)

// StorageClass parameters. A key a StorageClass gives that is neither one
// of these nor Kubernetes' own (kubernetesPrefixes) is refused (CheckKeys).
const (
	// ProvisioningKey chooses how a volume's image holds its space:
	// "thick" (the default) or "thin".
	ProvisioningKey = "converge.csi.dev/provisioning"
	// PoolKey names the storage pool a volume is made in; absent, the
	// default pool.
	PoolKey = "converge.csi.dev/pool"
	// AllowModeChangeKey lets a restore or clone change a volume's mode
	// (Filesystem and Block, state.Volume.WrittenAs): "true", or "false"
	// (the default). pkg/controller reads it, and the state package's
	// stage transition names it where it refuses to mount a Block
	// volume's data as a filesystem.
	AllowModeChangeKey = "converge.csi.dev/allow-volume-mode-change"
	// OnNodeLossKey is the parameter, and the volume attribute, that says
	// what the cluster does with a volume whose node is gone for good
	// (converge-controller): "retain" (the default) or "release". The node
	// plugin checks the parameter at CreateVolume, so that a class with a
	// wrong value provisions nothing, and records the choice in the
	// volume's attributes (its PV's), where converge-controller reads it.
	OnNodeLossKey = "converge.csi.dev/on-node-loss"
	// MkfsOptionsKey carries extra mkfs options, e.g. "-b 4096 -i 8192"
	// (CheckMkfsOptions). CreateVolume puts it into the volume's
	// attributes, so that the node sees it at stage.
	MkfsOptionsKey = "converge.csi.dev/mkfsOptions"
	// FsTypeKey is Kubernetes' own: the parameter in which the
	// external-provisioner passes a StorageClass's
	// csi.storage.k8s.io/fstype.
	FsTypeKey = "csi.storage.k8s.io/fstype"
)

// DeviceKey is the volume attribute of a static PV that names its existing
// block device by a stable path under an allowed device prefix.
const DeviceKey = "converge.csi.dev/device"

// kubernetesPrefixes are the prefixes of the keys that Kubernetes adds on
// its own to parameters and volume attributes: the kubelet's pod
// information and service account tokens, and the external-provisioner's
// and external-snapshotter's names of what they make. converge reads none
// of them but FsTypeKey.
var kubernetesPrefixes = []string{"csi.storage.k8s.io/", "storage.kubernetes.io/"}

// CreateParameters are the StorageClass parameters CreateVolume knows: a
// copy, so that no importer widens what is accepted.
func CreateParameters() []string { return slices.Clone(createParameters) }

var createParameters = []string{MkfsOptionsKey, ProvisioningKey, PoolKey, OnNodeLossKey, AllowModeChangeKey}

// VolumeAttributes are the volume attributes (a PV's, which the kubelet
// passes to NodeStageVolume and NodePublishVolume) the node knows: what
// CreateVolume writes, and a static PV's device.
// A copy, as CreateParameters.
func VolumeAttributes() []string { return slices.Clone(volumeAttributes) }

var volumeAttributes = []string{DeviceKey, MkfsOptionsKey, OnNodeLossKey}

// VolumeAttributesClass parameters: the IO limits of a volume, which
// CreateVolume receives as its mutable parameters and
// ControllerModifyVolume as the parameters of the class a claim switches
// to (ParseIOLimits). The names are ceph-csi's, so that a class moves
// between the drivers; each maps to one knob of the kernel's block
// throttling (host.IOLimits). A key a class gives that is neither one of
// these nor Kubernetes' own is refused (CheckKeys).
const (
	// MaxReadIOPSKey limits the read operations per second.
	MaxReadIOPSKey = "maxReadIops"
	// MaxWriteIOPSKey limits the write operations per second.
	MaxWriteIOPSKey = "maxWriteIops"
	// MaxReadBPSKey limits the bytes read per second.
	MaxReadBPSKey = "maxReadBps"
	// MaxWriteBPSKey limits the bytes written per second.
	MaxWriteBPSKey = "maxWriteBps"
	// NoLimit is the value of an IO limit key that removes its limit: the
	// word io.max itself reads and writes for none.
	NoLimit = "max"
)

// MutableParameters are the VolumeAttributesClass parameters converge
// knows: a copy, as CreateParameters.
func MutableParameters() []string { return slices.Clone(mutableParameters) }

var mutableParameters = []string{MaxReadIOPSKey, MaxWriteIOPSKey, MaxReadBPSKey, MaxWriteBPSKey}

// GroupDeletionPolicyKey is the one parameter a VolumeGroupSnapshotClass
// may carry for converge, and it means nothing to it: the Kubernetes
// storage suite's generated group class names its deletionPolicy among
// its parameters too (k8s.io/kubernetes test/e2e/storage/utils), and
// csi-snapshotter passes it on. The class's own deletionPolicy field is
// what counts.
const GroupDeletionPolicyKey = "deletionPolicy"
