package pool

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/devices"
)

// Missing is a storage pool this node does not have: one a volume's
// record names (the volume made in a pool configured then), or a request.
// Its volumes have no image here, and every call about one fails saying
// so, as the calls of a pool that has them would answer: it stands in for
// the pool where one is needed (the reconciler's), and Err is the failure
// of a request that needs the pool (the controller's).
type Missing struct {
	name string
	has  []string // the pools the node has, by name
}

// NewMissing returns pool name, which this node does not have; has are
// the names of the pools it has.
func NewMissing(name string, has []string) Missing {
	return Missing{name: name, has: has}
}

// Name is the pool's name.
func (m Missing) Name() string { return m.name }

// Err is the failure of a request about a volume or snapshot of the pool,
// or for a volume in it: RESOURCE_EXHAUSTED, which has the provisioner try
// another node, as for a full pool, naming the pools this node has.
func (m Missing) Err() error {
	return classified.Errorf(classified.KindResourceExhausted, "this node has no storage pool %s (it has %s)", m.name, strings.Join(m.has, ", "))
}

// notHere is the failure of a call about an image or snapshot of the
// pool, which it cannot hold here.
func (m Missing) notHere() error {
	return fmt.Errorf("this node has no storage pool %q (--pool)", m.name)
}

// Image is "": the pool has no image here.
func (m Missing) Image(string) string { return "" }

// IDOf reports that no path is an image of the pool.
func (m Missing) IDOf(string) (string, bool) { return "", false }

// ImageSize, Reserve, Blank, Taken, DeleteSnapshot, ImageAllocated and
// Take fail saying the pool is not here, with an error that does not
// match os.ErrNotExist: the volume's image may well exist, on the pool's
// own disk, which this node does not serve.
func (m Missing) ImageSize(string) (int64, error)      { return 0, m.notHere() }
func (m Missing) Reserve(string) error                 { return m.notHere() }
func (m Missing) Blank(string) (bool, error)           { return false, m.notHere() }
func (m Missing) Taken(string) (bool, error)           { return false, m.notHere() }
func (m Missing) DeleteSnapshot(string) error          { return m.notHere() }
func (m Missing) ImageAllocated(string) (int64, error) { return 0, m.notHere() }
func (m Missing) Take(context.Context, string, string, devices.SnapshotOf, time.Time) (devices.SnapshotInfo, error) {
	return devices.SnapshotInfo{}, m.notHere()
}

// GrowImage fails as a request for space in the pool does (Err).
func (m Missing) GrowImage(string, int64) (int64, error) { return 0, m.Err() }

// Flush fails as for an image that does not exist.
func (m Missing) Flush(image string) error { return fmt.Errorf("%s: %w", image, os.ErrNotExist) }

// Guard is none: the pool has no filesystem here to keep free.
func (m Missing) Guard() capacity.Guard { return capacity.Guard{} }

// CopyMode is "": the pool copies nothing here.
func (m Missing) CopyMode() devices.CopyMode { return "" }
