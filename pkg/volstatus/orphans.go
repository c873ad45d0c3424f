package volstatus

import "time"

// Orphan is a volume or a snapshot of this node that nothing in the
// cluster references (csi-node gc), with what became of it.
type Orphan struct {
	// Kind is "volume" or "snapshot".
	Kind string `json:"kind"`
	ID   string `json:"id"`
	Pool string `json:"pool"`
	// Bytes is the image's size; 0 for a volume's record without one.
	Bytes int64 `json:"bytes"`
	// Changed is when the image last changed or the snapshot was taken;
	// for a record without an image, when the record last changed.
	Changed time.Time `json:"changed,omitzero"`
	// Kept, when not empty, says why it stays; otherwise Deleted says
	// whether it went (false: a dry run).
	Kept    string `json:"kept,omitempty"`
	Deleted bool   `json:"deleted"`
}

// GCRequest is what csi-node gc asks the running plugin: the IDs the
// cluster references, which kinds of them the listing covers, the least
// age of what may go, and whether to delete.
//
// A kind the listing does not cover is kept whole: a listing that names
// no PersistentVolume of the driver cannot tell a volume nothing
// references from one whose PersistentVolume kubectl failed to list. The
// zero request covers nothing and so deletes nothing.
type GCRequest struct {
	Referenced []string `json:"referenced"`
	// Volumes says Referenced holds the handle of every PersistentVolume
	// of the driver; when false, no volume is left over.
	Volumes bool `json:"volumes"`
	// Snapshots says Referenced holds the handle of every
	// VolumeSnapshotContent of the driver; when false, no snapshot is
	// left over.
	Snapshots bool `json:"snapshots"`
	// NodeUnlisted is the operator's word that no PersistentVolume or
	// VolumeSnapshotContent of the cluster names a volume or snapshot of
	// this node; without it, a listing that names none of them is refused
	// while this node holds any (it may be another cluster's).
	NodeUnlisted bool          `json:"nodeUnlisted"`
	MinAge       time.Duration `json:"minAge"`
	Delete       bool          `json:"delete"`
}
