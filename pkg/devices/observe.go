package devices

import (
	"fmt"
	"os"

	"k8s.io/mount-utils"

	"github.com/converge-csi/converge/pkg/state"
)

// Observer reads the actual state of the machine.
type Observer struct {
	// MountInfo is the mountinfo file, normally /proc/self/mountinfo.
	MountInfo string
	// SysBlock is the sysfs block directory, normally /sys/block.
	SysBlock string
}

// Observe parses the mount table once and lists the loop devices.
func (o *Observer) Observe() (*state.Snapshot, error) {
	mounts, err := ReadMounts(o.MountInfo)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", o.MountInfo, err)
	}
	loops, err := ListLoops(o.SysBlock)
	if err != nil {
		return nil, fmt.Errorf("listing loop devices: %w", err)
	}
	return state.NewSnapshot(mounts, loops), nil
}

// CheckMount stats a mount point and returns the error when it shows a
// corrupted mount (ENOTCONN, ESTALE, EIO and the others of mount-utils'
// IsCorruptedMnt); any other outcome is nil, as the mount table is the
// authority on whether something is mounted there.
func (o *Observer) CheckMount(path string) error {
	_, err := os.Stat(path)
	if err != nil && mount.IsCorruptedMnt(err) {
		return err
	}
	return nil
}
