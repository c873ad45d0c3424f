package devices

import (
	"testing"
	"time"
)

// BenchmarkObserve observes this machine as the plugin does every pass (one
// mount table and the attached loop devices), parsing the mount table every
// time (as a resync pass does) and reusing it while the kernel reports no
// change (as a kicked pass does), and reports the ratio.
func BenchmarkObserve(b *testing.B) {
	var perCall [2]float64
	for i, maxAge := range []time.Duration{0, time.Hour} {
		name := map[time.Duration]string{0: "parse", time.Hour: "reuse"}[maxAge]
		b.Run(name, func(b *testing.B) {
			o := &Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block", Partitions: "/proc/partitions", MountTableMaxAge: maxAge}
			defer o.Close()
			for b.Loop() {
				if _, err := o.Observe(); err != nil {
					b.Fatal(err)
				}
			}
			perCall[i] = float64(b.Elapsed()) / float64(b.N)
			if i == 1 && perCall[0] > 0 {
				b.ReportMetric(perCall[1]/perCall[0], "reuse/parse")
			}
		})
	}
}
