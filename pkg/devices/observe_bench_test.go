package devices

import (
	"testing"
)

// BenchmarkObserve observes this machine as the plugin does every pass:
// one parse of the mount table and the attached loop devices.
func BenchmarkObserve(b *testing.B) {
	o := &Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block"}
	for b.Loop() {
		if _, err := o.Observe(); err != nil {
			b.Fatal(err)
		}
	}
}
