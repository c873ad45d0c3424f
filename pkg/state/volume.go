package state

import (
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/converge-csi/converge/pkg/host"
)

// AccessType says how a volume is presented to a workload.
type AccessType string

const (
	// AccessMount presents a filesystem mounted at the staging path and bind
	// mounted at each target.
	AccessMount AccessType = "mount"
	// AccessBlock presents the raw block device.
	AccessBlock AccessType = "block"
)

// Provisioning says how a volume's image holds its space.
type Provisioning string

const (
	// ProvisionThick allocates every block of the image when the volume is
	// created or grown, and keeps them allocated: the volume's size is
	// space the data directory holds for it alone.
	ProvisionThick Provisioning = "thick"
	// ProvisionThin leaves the image sparse: blocks are allocated as the
	// volume is written and handed back when it discards them, and the
	// node promises thin volumes no more than its overprovisioning ratio
	// allows.
	ProvisionThin Provisioning = "thin"
)

// Stage is the desired staging of a volume: its device attached and, for
// AccessMount, its filesystem mounted at Path.
type Stage struct {
	// Path is the staging target path given by the kubelet.
	Path string `json:"path"`
	// Access is mount or block.
	Access AccessType `json:"access"`
	// FsType is the filesystem the volume must carry (AccessMount only).
	FsType string `json:"fsType,omitempty"`
	// MountFlags are the extra mount options for the staging mount.
	MountFlags []string `json:"mountFlags,omitempty"`
	// MkfsOptions are extra mkfs arguments, used only if the device is
	// formatted.
	MkfsOptions []string `json:"mkfsOptions,omitempty"`
	// Device is the stable path of the existing block device a static
	// volume lives on; empty for a volume on an image of the data
	// directory.
	Device string `json:"device,omitempty"`
	// AccessMode is the CSI access mode name, e.g. SINGLE_NODE_WRITER.
	AccessMode string `json:"accessMode"`
	// ReadOnly is true for reader-only access modes: the device is never
	// formatted and the filesystem is mounted read-only.
	ReadOnly bool `json:"readOnly,omitempty"`

	// MountID is the unique mount ID (statx STATX_MNT_ID_UNIQUE, never
	// reused) of the staging mount the plugin made; 0 until recorded. It
	// is how the plugin knows its own mount wherever it is moved later.
	MountID uint64 `json:"mountID,omitempty"`
	// SpaceRanOutUnder is the MountID of the staging mount under which
	// the data directory was seen full while the volume's image had
	// holes: writes to them failed, and the filesystem may have lost
	// metadata writes. SpaceRanOutAt is when it was first seen. It is a
	// fact about that mount only: the next staging mount of the
	// filesystem is made after a check (fsck).
	SpaceRanOutUnder uint64    `json:"spaceRanOutUnder,omitempty"`
	SpaceRanOutAt    time.Time `json:"spaceRanOutAt,omitzero"`

	// Generation is the volume generation at which this spec last changed.
	Generation int64 `json:"generation"`
	// Deleting marks a withdrawn stage that stays recorded until the
	// reconciler has verified that its mount and device are gone.
	Deleting bool `json:"deleting,omitempty"`
}

// Publish is the desired bind mount of a staged volume at one target path.
type Publish struct {
	// Access is mount or block.
	Access AccessType `json:"access"`
	// AccessMode is the CSI access mode name of the request.
	AccessMode string `json:"accessMode"`
	// ReadOnly asks for a read-only bind mount.
	ReadOnly bool `json:"readOnly,omitempty"`
	// MountFlags are the extra mount options for the bind mount.
	MountFlags []string `json:"mountFlags,omitempty"`

	// MountID is the unique mount ID of the bind mount the plugin made at
	// the target; 0 until recorded (see Stage.MountID).
	MountID uint64 `json:"mountID,omitempty"`

	// Generation is the volume generation at which this spec last changed.
	Generation int64 `json:"generation"`
	// Deleting marks a withdrawn publish that stays recorded until the
	// reconciler has verified that its mount and target are gone.
	Deleting bool `json:"deleting,omitempty"`
}

// Volume is the durable record of one volume: everything the kubelet asked
// for and everything the plugin must remember to undo it.
type Volume struct {
	// ID is the CSI volume ID.
	ID string `json:"id"`
	// Generation is bumped on every change of the record.
	Generation int64 `json:"generation"`
	// Stage is nil when the volume is neither staged nor being unstaged.
	Stage *Stage `json:"stage,omitempty"`
	// Publishes maps a target path to its publish.
	Publishes map[string]*Publish `json:"publishes,omitempty"`
	// Formatted is the filesystem type this plugin created on the device or
	// found there when first asked for it; empty when it never did. A
	// volume whose record says Formatted is never formatted again.
	Formatted string `json:"formatted,omitempty"`
	// Removing is set while DeleteVolume removes the volume's image: no
	// intent is accepted, and a DeleteVolume or CreateVolume of the same
	// name finishes the removal before anything else (a crash may have
	// come between the removal and the record's end).
	Removing bool `json:"removing,omitempty"`
	// Expand is the capacity NodeExpandVolume asked for; nil when none.
	Expand *Expand `json:"expand,omitempty"`
	// DeviceID identifies the device of a static volume, as found at its
	// first stage (the filesystem's UUID, or the device's WWID or serial);
	// another device at the same path is refused.
	DeviceID string `json:"deviceID,omitempty"`
	// FsSize is the device size, in bytes, that the filesystem was last
	// grown to fill; 0 when unknown. A filesystem on a larger device is
	// grown, at expansion, at stage and after a restart.
	FsSize int64 `json:"fsSize,omitempty"`
	// Provisioning is how CreateVolume made the volume's image; empty for
	// a volume made before the plugin recorded it (a sparse image, which
	// is accounted at its full size and made thick at its next stage when
	// the space is there) and for a static volume.
	Provisioning Provisioning `json:"provisioning,omitempty"`
	// Name is the name CreateVolume made the volume under, which its ID
	// holds with the node's name; empty for a volume made before volume
	// IDs named their node (its ID is its name) and for a static volume.
	Name string `json:"name,omitempty"`
	// Pool is the storage pool whose data directory holds the volume's
	// image; empty for the default pool (and for every volume made before
	// pools existed) and for a static volume.
	Pool string `json:"pool,omitempty"`
	// Snapshots maps the ID of each snapshot asked of the volume and not
	// yet taken to its intent. A snapshot once taken is a file of its own,
	// which outlives the volume, and its intent is forgotten.
	Snapshots map[string]*SnapshotIntent `json:"snapshots,omitempty"`
	// Frozen is the staging path whose filesystem the reconciler froze for
	// a snapshot, recorded before the freeze and cleared after the thaw:
	// a crash in between leaves it, and the next pass thaws the filesystem
	// (a frozen filesystem hangs every pod on it). Empty when none.
	Frozen string `json:"frozen,omitempty"`
	// Changed is when the store last wrote the record. A record written
	// before the store kept it gets, in memory, the time the store was
	// opened: it changed then at the latest, so its age is never
	// overstated (csi-node gc keeps what changed within --min-age).
	Changed time.Time `json:"changed,omitzero"`
	// Access is how the volume's data may have been written: AccessMount
	// when CreateVolume made it for a filesystem alone; AccessBlock when
	// CreateVolume made it for a raw block device (any of its capabilities)
	// or it was ever staged as one, for a workload may then have written
	// anything on it. Once AccessBlock it stays so until the volume is
	// removed. Empty for a volume made before the plugin recorded it (see
	// WrittenAs). It is no reason to keep a record (Empty): a record that
	// holds nothing else is of a volume the plugin never formatted nor
	// provisioned with a record, which counts as AccessBlock without one.
	Access AccessType `json:"access,omitempty"`
	// IOLimits is the IO limits the volume's device is to be held to, as
	// its VolumeAttributesClass asks (CreateVolume's mutable parameters,
	// then each ControllerModifyVolume's, merged in); nil when none were
	// ever asked for, which a record written before limits existed
	// decodes as. Once asked for, the intent stays, with no limits left
	// after every one was removed, so that the limits a reconciler applied
	// are withdrawn too (IOLimitsKey).
	IOLimits *IOLimitsIntent `json:"ioLimits,omitempty"`
}

// IOLimitsIntent is the desired IO limits of a volume.
type IOLimitsIntent struct {
	// Limits are the limits; a zero field limits nothing.
	Limits host.IOLimits `json:"limits"`
	// Generation is the volume generation at which Limits last changed:
	// the result under IOLimitsKey tells limits applied from limits
	// asked for.
	Generation int64 `json:"generation"`
}

// WantsIOLimits returns the IO limits asked of the volume: none when it
// has no IOLimits intent.
func (v *Volume) WantsIOLimits() host.IOLimits {
	if v.IOLimits == nil {
		return host.IOLimits{}
	}
	return v.IOLimits.Limits
}

// WrittenAs returns how the volume's data may have been written, which a
// snapshot of it records and a volume made from it must match: AccessBlock
// when its record says so or it is staged as a raw block device now,
// AccessMount when CreateVolume made it for a filesystem alone. A volume
// whose record predates Access counts as AccessMount when the plugin
// formatted it or mounted the filesystem it found (Formatted), else as
// AccessBlock: what the plugin cannot vouch for was possibly written raw.
func (v *Volume) WrittenAs() AccessType {
	switch {
	case v.Access == AccessBlock || v.Stage != nil && v.Stage.Access == AccessBlock:
		return AccessBlock
	case v.Access == AccessMount || v.Access == "" && v.Formatted != "":
		return AccessMount
	}
	return AccessBlock
}

// SnapshotIntent is the desire for a snapshot of the volume.
type SnapshotIntent struct {
	// Generation is the volume generation at which it was asked for.
	Generation int64 `json:"generation"`
	// Group is set when the snapshot is one member of a group snapshot:
	// every member is taken at one instant, with every member's
	// filesystem frozen, in one operation. The group's intent is kept on
	// one member's record alone (the leader: the member whose volume ID
	// sorts first), under the leader's own snapshot ID, so that it is
	// asked for, taken and forgotten as a whole.
	Group *GroupIntent `json:"group,omitempty"`
}

// GroupIntent is the desire for a group snapshot.
type GroupIntent struct {
	// ID is the group snapshot's ID.
	ID string `json:"id"`
	// Members maps the ID of each member volume, the leader's included,
	// to the ID of its snapshot in the group.
	Members map[string]string `json:"members"`
}

// VolumeIDs returns the IDs of the group's member volumes, sorted: the
// order in which they are frozen (and thawed in reverse).
func (g *GroupIntent) VolumeIDs() []string {
	return slices.Sorted(maps.Keys(g.Members))
}

// Equal reports whether g and o ask for the same group.
func (g *GroupIntent) Equal(o *GroupIntent) bool {
	if g == nil || o == nil {
		return g == o
	}
	return g.ID == o.ID && maps.Equal(g.Members, o.Members)
}

// Thin reports whether the volume's image is sparse by request.
func (v *Volume) Thin() bool { return v.Provisioning == ProvisionThin }

// Expand is the desired capacity of a staged volume.
type Expand struct {
	// Bytes is the capacity the device and the filesystem must reach.
	Bytes int64 `json:"bytes"`
	// Generation is the volume generation at which Bytes last changed.
	Generation int64 `json:"generation"`
}

// Empty reports whether the record holds nothing worth keeping.
func (v *Volume) Empty() bool {
	return v.Stage == nil && len(v.Publishes) == 0 && v.Formatted == "" && !v.Removing && v.Provisioning == "" &&
		v.Name == "" && v.Pool == "" && len(v.Snapshots) == 0 && v.Frozen == "" && v.IOLimits == nil
}

// HasNodeIntent reports whether the node holds an intent for the volume: a stage
// or a publish, live or being withdrawn. A record without one only keeps
// what the controller made (its provisioning) or a provenance.
func (v *Volume) HasNodeIntent() bool { return v.Stage != nil || len(v.Publishes) > 0 }

// DeepCopy returns a copy that shares no memory with v.
func (v *Volume) DeepCopy() *Volume {
	if v == nil {
		return nil
	}
	out := *v
	if v.Stage != nil {
		s := *v.Stage
		s.MountFlags = slices.Clone(v.Stage.MountFlags)
		s.MkfsOptions = slices.Clone(v.Stage.MkfsOptions)
		out.Stage = &s
	}
	if v.Expand != nil {
		e := *v.Expand
		out.Expand = &e
	}
	if v.IOLimits != nil {
		l := *v.IOLimits
		out.IOLimits = &l
	}
	if v.Snapshots != nil {
		out.Snapshots = make(map[string]*SnapshotIntent, len(v.Snapshots))
		for id, s := range v.Snapshots {
			c := *s
			if s.Group != nil {
				g := *s.Group
				g.Members = maps.Clone(s.Group.Members)
				c.Group = &g
			}
			out.Snapshots[id] = &c
		}
	}
	if v.Publishes != nil {
		out.Publishes = make(map[string]*Publish, len(v.Publishes))
		for target, p := range v.Publishes {
			c := *p
			c.MountFlags = slices.Clone(p.MountFlags)
			out.Publishes[target] = &c
		}
	}
	return &out
}

// Targets returns the publish target paths in sorted order.
func (v *Volume) Targets() []string {
	targets := make([]string, 0, len(v.Publishes))
	for t := range v.Publishes {
		targets = append(targets, t)
	}
	sort.Strings(targets)
	return targets
}

// MountsReadOnly reports whether the stage mounts its filesystem read-only:
// for a reader-only access mode, or for an "ro" mount flag.
func (s *Stage) MountsReadOnly() bool {
	return s.ReadOnly || slices.Contains(s.MountFlags, "ro")
}

// SameSpec reports whether two stages ask for the same thing, ignoring
// generation, deletion and the recorded mount.
func (s *Stage) SameSpec(o *Stage) bool {
	if s == nil || o == nil {
		return s == o
	}
	return s.Path == o.Path && s.Access == o.Access && s.FsType == o.FsType && s.Device == o.Device &&
		slices.Equal(s.MountFlags, o.MountFlags) && slices.Equal(s.MkfsOptions, o.MkfsOptions) && s.AccessMode == o.AccessMode &&
		s.ReadOnly == o.ReadOnly
}

// SameSpec reports whether two publishes ask for the same thing, ignoring
// generation, deletion and the recorded mount.
func (p *Publish) SameSpec(o *Publish) bool {
	if p == nil || o == nil {
		return p == o
	}
	return p.Access == o.Access && p.AccessMode == o.AccessMode && p.ReadOnly == o.ReadOnly &&
		slices.Equal(p.MountFlags, o.MountFlags)
}

// IntentKey names one intent of a volume for results: "stage" or
// "publish:<target path>".
type IntentKey string

// StageKey is the intent key of a volume's stage.
const StageKey IntentKey = "stage"

// ExpandKey is the intent key of a volume's expansion.
const ExpandKey IntentKey = "expand"

// IOLimitsKey is the intent key of a volume's IO limits.
const IOLimitsKey IntentKey = "ioLimits"

// PublishKey returns the intent key of the publish at target.
func PublishKey(target string) IntentKey { return IntentKey("publish:" + target) }

// SnapshotKey returns the intent key of the snapshot id.
func SnapshotKey(id string) IntentKey { return IntentKey("snapshot:" + id) }

// SnapshotIDs returns the IDs of the snapshots asked of v, sorted.
func (v *Volume) SnapshotIDs() []string {
	ids := make([]string, 0, len(v.Snapshots))
	for id := range v.Snapshots {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}
