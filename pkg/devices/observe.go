package devices

import (
	"fmt"

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
