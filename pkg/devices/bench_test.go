package devices

import (
	"github.com/converge-csi/converge/test/testenv/loops"

	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/converge-csi/converge/pkg/host"
)

// BenchmarkListLoops lists 300 attached loop devices (as root; skipped
// otherwise), the largest part of observing a node with many volumes.
func BenchmarkListLoops(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	attachImages(b, b.TempDir(), 300)
	// Opening every file for each listing (ListLoops, as the e2e suite
	// does), and keeping them open between listings (the Observer), both
	// in this run.
	kept := newKeptFiles()
	defer kept.close()
	var perCall [2]float64
	for i, list := range []func() ([]host.Device, error){
		func() ([]host.Device, error) { return ListLoops("/sys/block") },
		func() ([]host.Device, error) { return kept.listLoops("/sys/block") },
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

// BenchmarkSnapshotCopy copies the image of a mounted 1 GiB ext4 volume
// holding 512 MiB of written data (as root; skipped otherwise) the two
// ways a data directory allows: by reflink (the data directory on xfs with
// reflinks) and by a sparse copy (on ext4), the volume's filesystem frozen
// for the copy, as a snapshot of a staged volume takes it. It reports how
// long the filesystem stays frozen each way (issue 15's goal: under 50 ms
// with reflink): the first time, which also writes out what was just
// written, and the median.
func BenchmarkSnapshotCopy(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	for _, way := range []struct {
		mode    CopyMode
		fs      string
		mkfsArg []string
	}{{CopyReflink, host.FsXFS, []string{"-m", "reflink=1"}}, {CopySparse, host.FsExt4, nil}} {
		b.Run(string(way.mode), func(b *testing.B) {
			data, _ := mountFreshSized(b, b.TempDir(), way.fs, 4<<30, way.mkfsArg...)
			if got, err := ProbeCopyMode(data); err != nil || got != way.mode {
				b.Fatalf("the data directory copies by %q (%v), want %q", got, err, way.mode)
			}
			img := filepath.Join(data, "vol.img")
			if err := os.WriteFile(img, nil, 0o600); err != nil {
				b.Fatal(err)
			}
			if err := os.Truncate(img, 1<<30); err != nil {
				b.Fatal(err)
			}
			dev, err := AttachLoop(img, true)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { loops.Release(dev, filepath.Dir(img)) })
			root := b.TempDir()
			vol := filepath.Join(root, "vol")
			if err := os.Mkdir(vol, 0o700); err != nil {
				b.Fatal(err)
			}
			if out, err := exec.Command("mkfs.ext4", "-q", "-F", dev).CombinedOutput(); err != nil {
				b.Fatalf("mkfs.ext4: %v: %s", err, out)
			}
			if err := syscall.Mount(dev, vol, host.FsExt4, 0, ""); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { syscall.Unmount(vol, syscall.MNT_DETACH) })
			chunk := bytes.Repeat([]byte{0x5a}, 1<<20)
			f, err := os.Create(filepath.Join(vol, "data"))
			if err != nil {
				b.Fatal(err)
			}
			for range 512 {
				if _, err := f.Write(chunk); err != nil {
					b.Fatal(err)
				}
			}
			if err := f.Close(); err != nil {
				b.Fatal(err)
			}
			paths := NewPaths([]string{root})
			var frozen []time.Duration
			i := 0
			for b.Loop() {
				snap := filepath.Join(data, fmt.Sprintf("snap-%d", i))
				i++
				// As the reconciler does: what is dirty is written out
				// before the freeze, while the volume's writes go on.
				if err := paths.Sync(vol); err != nil {
					b.Fatal(err)
				}
				if err := (&Snapshots{}).Flush(img); err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				if err := paths.Freeze(vol); err != nil {
					b.Fatal(err)
				}
				err := CopyFile(context.Background(), img, snap, way.mode, CopyOptions{})
				if terr := paths.Thaw(vol); terr != nil {
					b.Fatal(terr)
				}
				frozen = append(frozen, time.Since(start))
				if err != nil {
					b.Fatal(err)
				}
				os.Remove(snap)
			}
			// The first copy also writes out the 512 MiB just written.
			b.ReportMetric(float64(frozen[0].Microseconds())/1000, "first-frozen-ms")
			slices.Sort(frozen)
			b.ReportMetric(float64(frozen[len(frozen)/2].Microseconds())/1000, "frozen-ms")
		})
	}
}

// BenchmarkAttachBurst attaches 50 images at once, as a burst of stages
// does, with discards refused (a thick volume's device: a queue limit
// written after the attach) and passed on (a thin one's), and reports the
// wall time of the burst. Each round's devices are released before the
// next, their nodes too, so every round starts from the same machine.
func BenchmarkAttachBurst(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	const n = 50
	for _, discards := range []bool{false, true} {
		b.Run(map[bool]string{false: "thick", true: "thin"}[discards], func(b *testing.B) {
			dir := b.TempDir()
			images := make([]string, n)
			for i := range images {
				images[i] = sparseImage(b, filepath.Join(dir, fmt.Sprintf("%d.img", i)))
			}
			devs := make([]string, n)
			release := func() {
				for i, d := range devs {
					if d != "" {
						loops.Release(d, dir)
						devs[i] = ""
					}
				}
			}
			b.Cleanup(release)
			var total time.Duration
			for b.Loop() {
				errs := make([]error, n)
				var wg sync.WaitGroup
				start := time.Now()
				for i := range n {
					wg.Go(func() { devs[i], errs[i] = AttachLoop(images[i], discards) })
				}
				wg.Wait()
				total += time.Since(start)
				b.StopTimer()
				release()
				if err := errors.Join(errs...); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/burst")
		})
	}
}

// BenchmarkThickDetachBurst detaches 50 thick volumes' devices at once, as
// a teardown of many volumes does: with Detach, which removes each number
// at once, against DetachLoop alone (the numbers removed later, out of the
// timed part, as converge did until 2026-11-25, 500 ms after each detach),
// in alternating rounds of the same run; it reports the median of each and
// the median of the rounds' ratios.
func BenchmarkThickDetachBurst(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	const n = 50
	dir := b.TempDir()
	images := make([]string, n)
	for i := range images {
		images[i] = sparseImage(b, filepath.Join(dir, fmt.Sprintf("%d.img", i)))
	}
	devs := make([]string, n)
	b.Cleanup(func() {
		for _, d := range devs {
			if d != "" {
				loops.Release(d, dir)
			}
		}
	})
	burst := func(f func(i int)) time.Duration {
		var wg sync.WaitGroup
		start := time.Now()
		for i := range n {
			wg.Go(func() { f(i) })
		}
		wg.Wait()
		return time.Since(start)
	}
	var removing, keeping, ratios []float64
	for b.Loop() {
		var took [2]time.Duration
		for way := range 2 {
			b.StopTimer()
			errs := make([]error, n)
			burst(func(i int) { devs[i], errs[i] = AttachLoop(images[i], false) })
			if err := errors.Join(errs...); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if way == 0 {
				took[way] = burst(func(i int) { (LoopDevices{}).Detach(devs[i]) })
			} else {
				took[way] = burst(func(i int) { DetachLoop(devs[i]) })
				b.StopTimer()
				for _, d := range devs {
					removeLoop(d)
				}
				b.StartTimer()
			}
			clear(devs)
		}
		removing = append(removing, float64(took[0].Microseconds())/1000)
		keeping = append(keeping, float64(took[1].Microseconds())/1000)
		ratios = append(ratios, float64(took[0])/float64(took[1]))
	}
	med := func(xs []float64) float64 {
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	b.ReportMetric(med(removing), "detach-and-remove-ms")
	b.ReportMetric(med(keeping), "detach-only-ms")
	b.ReportMetric(med(ratios), "ratio")
}

// attachImages attaches n sparse images v0.img ... in dir, each to a loop
// device released when b ends, and returns the devices.
func attachImages(b *testing.B, dir string, n int) []string {
	b.Helper()
	var devs []string
	b.Cleanup(func() {
		for _, d := range devs {
			loops.Release(d, dir)
		}
	})
	for i := range n {
		d, err := AttachLoop(sparseImage(b, filepath.Join(dir, fmt.Sprintf("v%d.img", i))), true)
		if err != nil {
			b.Fatal(err)
		}
		devs = append(devs, d)
	}
	return devs
}
