package devices

import (
	"fmt"
	"github.com/converge-csi/converge/pkg/host"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
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

// BenchmarkCheckMount checks 200 mount points, as a pass does at 100
// volumes (a staging and a target path each, kubelet-deep), resolving each
// beneath a root opened once for the pass (as Observe leaves it) and
// opening the root for each check (as before), in the same run.
func BenchmarkCheckMount(b *testing.B) {
	root := b.TempDir()
	var paths []string
	for i := range 200 {
		p := filepath.Join(root, "pods", fmt.Sprintf("uid-%d", i), "volumes", "kubernetes.io~csi", "pv", "mount")
		if err := os.MkdirAll(p, 0o755); err != nil {
			b.Fatal(err)
		}
		paths = append(paths, p)
	}
	var perPass [2]float64
	for i, name := range []string{"pinned", "per-check"} {
		b.Run(name, func(b *testing.B) {
			o := &Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block", Paths: NewPaths([]string{root})}
			defer o.Close()
			if i == 0 {
				o.rootsMu.Lock()
				o.roots = o.Paths.pin()
				o.rootsMu.Unlock()
			}
			for b.Loop() {
				for _, p := range paths {
					if _, err := o.CheckMount(p); err != nil {
						b.Fatal(err)
					}
				}
			}
			perPass[i] = float64(b.Elapsed()) / float64(b.N)
			b.ReportMetric(perPass[i]/1000, "µs/pass")
			if i == 1 && perPass[0] > 0 {
				b.ReportMetric(perPass[0]/perPass[1], "pinned/per-check")
			}
		})
	}
}

// BenchmarkObserveOwnDevices observes 100 attached images of a data
// directory, as a pass of a node with 100 staged volumes does: with the
// data directory given, every device's backing file is checked to be the
// image at its path (backing_linux.go; the kernel is asked once per
// attachment, then a stat per device per pass), and without it, by path
// alone as before, in the same run. It reports the ratio.
func BenchmarkObserveOwnDevices(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root for loop devices")
	}
	dir := b.TempDir()
	attachImages(b, dir, 100)
	var perPass [2]float64
	for i, name := range []string{"identity", "path-only"} {
		b.Run(name, func(b *testing.B) {
			o := &Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block"}
			if i == 0 {
				o.Pools = map[string]string{"default": dir}
			}
			defer o.Close()
			for b.Loop() {
				obs, err := o.Observe()
				if err != nil {
					b.Fatal(err)
				}
				if i == 0 && len(obs.LoopsFor(filepath.Join(dir, "v0.img"))) != 1 {
					b.Fatal("the data directory's first image has no device")
				}
			}
			perPass[i] = float64(b.Elapsed()) / float64(b.N)
			b.ReportMetric(perPass[i]/1000, "µs/pass")
			if i == 1 && perPass[1] > 0 {
				b.ReportMetric(perPass[0]/perPass[1], "identity/path-only")
			}
		})
	}
}

// BenchmarkObserveVolume observes one volume among 100 attached images
// and 300 other mounts, as a request's early start does (ObserveVolume):
// with statmount(2), against the same with the mount table read whole (as
// before Linux 6.13) and the observation of every device a pass makes
// (Observe), in the same run, and reports the ratios.
func BenchmarkObserveVolume(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root for loop devices")
	}
	dir := b.TempDir()
	devs := attachImages(b, dir, 100)
	paths := bindMounts(b, dir, 300)
	var perCall [3]float64
	for i, name := range []string{"one-volume", "one-volume-mount-table", "every-device"} {
		b.Run(name, func(b *testing.B) {
			o := &Observer{MountInfo: "/proc/self/mountinfo", SysBlock: "/sys/block", Pools: map[string]string{"default": dir}}
			defer o.Close()
			o.filesOnce.Do(o.keepFiles)
			if i == 1 {
				o.index.usableOnce.Do(func() {}) // as a kernel without statmount
			} else if i == 0 && !o.index.ready() {
				b.Skip("the kernel has no statmount with every field read")
			}
			for b.Loop() {
				var obs *host.Observation
				var err error
				if i < 2 {
					obs, err = o.ObserveVolume(devs[:1], nil, paths[:1])
				} else {
					obs, err = o.Observe()
				}
				if err != nil {
					b.Fatal(err)
				}
				if len(obs.LoopsFor(filepath.Join(dir, "v0.img"))) != 1 {
					b.Fatal("the data directory's first image has no device")
				}
				if _, ok := obs.MountAt(paths[0]); !ok {
					b.Fatal("the volume's path has no mount")
				}
			}
			perCall[i] = float64(b.Elapsed()) / float64(b.N)
			b.ReportMetric(perCall[i]/1000, "µs/observation")
			if i == 2 && perCall[2] > 0 {
				b.ReportMetric(perCall[0]/perCall[2], "one/every")
				b.ReportMetric(perCall[0]/perCall[1], "statmount/mount-table")
			}
		})
	}
}

// bindMounts mounts a tmpfs in dir and binds it at n paths there, and
// returns them; the test's clean-up unmounts them.
func bindMounts(b *testing.B, dir string, n int) []string {
	src := filepath.Join(dir, "binds-src")
	if err := os.Mkdir(src, 0o700); err != nil {
		b.Fatal(err)
	}
	if err := unix.Mount("converge-bench", src, "tmpfs", 0, "size=1m"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Unmount(src, unix.MNT_DETACH) })
	paths := make([]string, n)
	for i := range paths {
		paths[i] = filepath.Join(dir, fmt.Sprintf("bind-%d", i))
		if err := os.Mkdir(paths[i], 0o700); err != nil {
			b.Fatal(err)
		}
		if err := unix.Mount(src, paths[i], "", unix.MS_BIND, ""); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { unix.Unmount(paths[i], unix.MNT_DETACH) })
	}
	return paths
}
