package devices

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/converge-csi/converge/pkg/host"
)

// BenchmarkListLoops lists 300 attached loop devices (as root; skipped
// otherwise), the largest part of observing a node with many volumes.
func BenchmarkListLoops(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	dir := b.TempDir()
	var devs []string
	b.Cleanup(func() {
		for _, d := range devs {
			DetachLoop(d)
		}
	})
	for i := range 300 {
		d, err := AttachLoop(sparseImage(b, filepath.Join(dir, fmt.Sprintf("%d.img", i))), true)
		if err != nil {
			b.Fatal(err)
		}
		devs = append(devs, d)
	}
	// Opening every file for each listing (ListLoops, as the e2e suite
	// does), and keeping them open between listings (the Observer), both
	// in this run.
	kept := newKeptFiles()
	defer kept.close()
	var perCall [2]float64
	for i, list := range []func() ([]host.Loop, error){
		func() ([]host.Loop, error) { return ListLoops("/sys/block", "/proc/partitions") },
		func() ([]host.Loop, error) { return kept.listLoops("/sys/block", "/proc/partitions") },
	} {
		b.Run([]string{"open", "kept"}[i], func(b *testing.B) {
			for b.Loop() {
				ls, err := list()
				if err != nil || len(ls) < 300 {
					b.Fatalf("%d loops, %v", len(ls), err)
				}
			}
			perCall[i] = float64(b.Elapsed()) / float64(b.N)
			b.ReportMetric(perCall[i]/1000/300, "µs/loop")
			if i == 1 && perCall[0] > 0 {
				b.ReportMetric(perCall[1]/perCall[0], "kept/open")
			}
		})
	}
}
