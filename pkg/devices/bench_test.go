package devices

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
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
		img := filepath.Join(dir, fmt.Sprintf("%d.img", i))
		if err := os.WriteFile(img, nil, 0o600); err != nil {
			b.Fatal(err)
		}
		if err := os.Truncate(img, 1<<20); err != nil {
			b.Fatal(err)
		}
		d, err := AttachLoop(img)
		if err != nil {
			b.Fatal(err)
		}
		devs = append(devs, d)
	}
	for b.Loop() {
		ls, err := ListLoops("/sys/block", "/proc/partitions")
		if err != nil || len(ls) < 300 {
			b.Fatalf("%d loops, %v", len(ls), err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/300, "µs/loop")
}
