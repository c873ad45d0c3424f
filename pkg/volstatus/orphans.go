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
// cluster references, the least age of what may go, and whether to delete.
type GCRequest struct {
	Referenced []string      `json:"referenced"`
	MinAge     time.Duration `json:"minAge"`
	Delete     bool          `json:"delete"`
}
