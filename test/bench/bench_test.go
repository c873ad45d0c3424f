// Package bench measures converge on the real kernel against the raw floor
// (the least work a stage and a publish can be: a loop attach, mkfs, a
// mount(2) and a bind mount(2), by hand) and against the mount-utils
// baseline (the same calls the plugin made before it mounted through the
// kernel's mount API: blkid, mount-utils' format-and-mount with mount(8),
// and the plugin's descriptor-based bind), all in the same run, with no
// gRPC, store or reconciler for the two by hand. Run it with make bench; it
// is not part of make test.
//
// Each benchmark reports medians (and p99 for bursts) in milliseconds as
// custom metrics, and the ratio converge/raw floor. Two figures have
// floors of their own, measured in the same rounds: a publish against the
// raw bind + one durable record + one empty call (the least a durable
// publish answered over the socket costs), and the teardown of a burst
// against the raw floor with the kubelet's calls before each step. Every
// way starts every attach from a fresh loop device number, as converge's
// unstage leaves one (numbers_test.go).
package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/test/testenv"
)

const volSize = 64 << 20

var rwo = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// vol names the paths of one volume under a root.
type vol struct{ id, image, staging, target string }

func newVol(root, dataDir, id string) vol {
	return vol{id: id, image: filepath.Join(dataDir, id+".img"), staging: filepath.Join(root, "staging", id), target: filepath.Join(root, "pods", id, "mount")}
}

func (v vol) dirs(b testing.TB) {
	for _, d := range []string{v.staging, filepath.Dir(v.target)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			b.Fatal(err)
		}
	}
}

// baseline does the raw work of a stage and a publish with the same calls
// the plugin makes, and undoes it.
type baseline struct {
	root    string
	dataDir string
	mounter *devices.Mounter
	paths   *devices.Paths
	images  *devices.Images
}

func newBaseline(b testing.TB, dir string) *baseline {
	root := filepath.Join(dir, "base")
	data := filepath.Join(dir, "base-data")
	for _, d := range []string{root, data} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			b.Fatal(err)
		}
	}
	paths := devices.NewPaths([]string{root})
	return &baseline{root: root, dataDir: data, paths: paths, images: &devices.Images{Dir: data},
		mounter: devices.NewMounter(mount.NewWithoutSystemd(""), utilexec.New(), 1<<10, paths)}
}

func (bl *baseline) vol(id string) vol { return newVol(bl.root, bl.dataDir, id) }

func (bl *baseline) stage(v vol) (string, error) {
	dev, err := devices.AttachLoop(v.image, false)
	if err != nil {
		return "", err
	}
	probe, err := bl.mounter.DiskFormat(context.Background(), dev)
	if err != nil {
		return dev, err
	}
	_, err = bl.mounter.FormatAndMount(context.Background(), probe, v.staging, "ext4", []string{"errors=remount-ro"}, nil)
	return dev, err
}

// rawFloor does the least a stage and a publish can do, by hand: attach
// the image, mkfs.ext4 -F -m0 (what mount-utils runs) told that the device
// reads only zeros (the images are new: nothing to zero, as converge
// formats them since 2026-11-24), mount(2), a bind mount(2); no probe, no
// check, no record. It shares the mount-utils
// baseline's directories and images.
//
// Its mkfs and mount are converge's for a thick ext4 volume with no
// parameters: mount-utils runs mkfs.ext4 with the stage's options before
// its own "-F -m0" (pkg/devices.FormatAndMount adds "-E
// assume_storage_prezeroed=1" for a new image), and the reconciler mounts
// with errors=remount-ro alone (pkg/reconciler.stageOptions: discard is
// for thin volumes).
type rawFloor struct {
	*baseline
	// steps, when set, records each step's time.
	steps *stepTimes
}

func (r rawFloor) stage(v vol) (string, error) {
	start := time.Now()
	dev, err := devices.AttachLoop(v.image, false)
	if err != nil {
		return "", err
	}
	start = r.steps.add("attach", start)
	if out, err := exec.Command("mkfs.ext4", "-F", "-m0", "-E", host.Mke2fsPrezeroed+"=1", dev).CombinedOutput(); err != nil {
		return dev, fmt.Errorf("mkfs.ext4 %s: %v: %s", dev, err, out)
	}
	start = r.steps.add("mkfs", start)
	err = unix.Mount(dev, v.staging, "ext4", 0, "errors=remount-ro")
	r.steps.add("mount", start)
	return dev, err
}

func (r rawFloor) publish(v vol) error {
	start := time.Now()
	if err := os.Mkdir(v.target, 0o750); err != nil {
		return err
	}
	err := unix.Mount(v.staging, v.target, "", unix.MS_BIND, "")
	r.steps.add("bind", start)
	return err
}

func (r rawFloor) teardown(v vol, dev string) error {
	for _, p := range []string{v.target, v.staging} {
		if err := umount(p); err != nil {
			return err
		}
	}
	if err := os.Remove(v.target); err != nil {
		return err
	}
	return devices.DetachLoop(dev)
}

// umount unmounts the mount at p by hand, with umount(2).
func umount(p string) error {
	if err := unix.Unmount(p, 0); err != nil {
		return fmt.Errorf("umount %s: %w", p, err)
	}
	return nil
}

// calledFloor is the raw floor with the kubelet's calls around it: before
// each step, the call that would carry it (a stage, a publish, an
// unpublish, an unstage) is made to the plugin as a call it answers at
// once (NodeGetCapabilities). Against the raw floor it shows what the
// calls alone cost a burst of volumes on this machine: the share of a
// ratio that no plugin answering the kubelet over its socket avoids.
type calledFloor struct {
	rawFloor
	node csi.NodeClient
}

func (c calledFloor) call() error {
	_, err := c.node.NodeGetCapabilities(context.Background(), &csi.NodeGetCapabilitiesRequest{})
	return err
}

func (c calledFloor) stage(v vol) (string, error) {
	if err := c.call(); err != nil {
		return "", err
	}
	return c.rawFloor.stage(v)
}

func (c calledFloor) publish(v vol) error {
	if err := c.call(); err != nil {
		return err
	}
	return c.rawFloor.publish(v)
}

func (c calledFloor) teardown(v vol, dev string) error {
	if err := c.call(); err != nil {
		return err
	}
	if err := umount(v.target); err != nil {
		return err
	}
	if err := os.Remove(v.target); err != nil {
		return err
	}
	if err := c.call(); err != nil {
		return err
	}
	if err := umount(v.staging); err != nil {
		return err
	}
	return devices.DetachLoop(dev)
}

func (bl *baseline) publish(v vol) error {
	if err := bl.paths.Mkdir(v.target); err != nil {
		return err
	}
	_, err := bl.mounter.BindMount(v.staging, v.target, nil)
	return err
}

func (bl *baseline) teardown(v vol, dev string) error {
	for _, p := range []string{v.target, v.staging} {
		if err := bl.mounter.Unmount(p); err != nil {
			return err
		}
	}
	if err := bl.paths.Remove(v.target); err != nil {
		return err
	}
	return devices.DetachLoop(dev)
}

// plugin wraps a running csi-node with the calls the kubelet makes.
type plugin struct {
	*testenv.Plugin
}

func (p plugin) vol(id string) vol { return newVol(p.Root, p.DataDir, id) }

// create makes a volume named name and returns its ID.
func (p plugin) create(b testing.TB, name string) string {
	return p.createSized(b, name, volSize)
}

// createSized makes a volume of size bytes named name and returns its ID.
func (p plugin) createSized(b testing.TB, name string, size int64) string {
	resp, err := p.Controller().CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{rwo}})
	if err != nil {
		b.Fatal(err)
	}
	return resp.GetVolume().GetVolumeId()
}

func (p plugin) stage(v vol) error {
	return retried(func() error {
		_, err := p.Node().NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging, VolumeCapability: rwo})
		return err
	})
}

func (p plugin) publish(v vol) error {
	return retried(func() error {
		_, err := p.Node().NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging, TargetPath: v.target, VolumeCapability: rwo})
		return err
	})
}

// deadlineRetries counts the calls retried after DEADLINE_EXCEEDED.
var deadlineRetries atomic.Int64

// retried calls call again while it answers DEADLINE_EXCEEDED, as the
// kubelet does: the plugin gives a call at most its MaxWait (2 minutes),
// and on a slow disk a burst of 1000 stages can take longer than that
// (each mkfs waits for the disk's flushes). The benchmarks report the
// count.
func retried(call func() error) error {
	for {
		err := call()
		if status.Code(err) != codes.DeadlineExceeded {
			return err
		}
		deadlineRetries.Add(1)
	}
}

func (p plugin) teardown(v vol) error {
	if _, err := p.Node().NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.target}); err != nil {
		return err
	}
	_, err := p.Node().NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging})
	return err
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// quantile returns the q-quantile of ds (sorted in place).
func quantile(ds []time.Duration, q float64) time.Duration {
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}

func timed(f func() error) (time.Duration, error) {
	start := time.Now()
	err := f()
	return time.Since(start), err
}

func start(b *testing.B, args ...string) plugin {
	removeNewLoopNodes(b)
	// At -v=2, as deploy/ runs it: the tests' -v=4 writes a log line per
	// call and command, which is not what a node pays.
	p := plugin{testenv.New(b, append([]string{"-v", "2"}, args...)...)}
	p.Start()
	return p
}

// makeImages creates n fresh thick images for the baseline, as converge's
// CreateVolume does by default.
func makeImages(b *testing.B, bl *baseline, prefix string, n int) []vol {
	vols := make([]vol, n)
	for i := range vols {
		vols[i] = bl.vol(fmt.Sprintf("%s-%d", prefix, i))
		if err := bl.images.Create(vols[i].id, volSize, true); err != nil {
			b.Fatal(err)
		}
		vols[i].dirs(b)
	}
	return vols
}

// stager is a way to stage and publish a volume by hand: the raw floor (with
// or without the calls) or the mount-utils baseline.
type stager interface {
	stage(v vol) (string, error)
	publish(v vol) error
	teardown(v vol, dev string) error
}

// BenchmarkOneVolume measures, for one volume at a time, stage + publish
// and publish alone through the plugin's socket against the raw floor and
// the mount-utils baseline, alternating the three so that all see the same
// machine. A publish is also measured against its physical floor: the raw
// bind mount, one durable record (a write and an fdatasync on the plugin's
// state filesystem) and one empty call over the socket, each measured in
// every round: the record right after the raw stage, where converge's
// publish writes its own (an fdatasync costs more or less with what came
// before it: here 0.9 ms after 20 ms idle, 0.5 ms right after another),
// the call between the rounds, where converge is not reacting to a mount
// the floor made (its mount watcher asks for a pass at every mount).
//
// Every way starts each attach from a fresh loop device number: converge
// removes a thick volume's number at its unstage, and the ways by hand
// remove theirs after their teardown (untimed); converge's removals are
// waited for before the ways by hand start, in case they trail its
// answers.
func BenchmarkOneVolume(b *testing.B) {
	const (
		rounds = 25
		// Per round: the samples of a durable record and of an empty
		// call, taken between the ways so they see the same machine.
		samples = 4
	)
	p := start(b)
	bl := newBaseline(b, p.Dir)
	steps := &stepTimes{}
	floorWay := rawFloor{baseline: bl, steps: steps}
	records := newRecordLog(b, p.StateDir)
	var cStage, cPub, syncs, calls, removals, placedSyncs []time.Duration
	removalTimeouts := 0
	handStage, handPub := map[string][]time.Duration{}, map[string][]time.Duration{}
	sample := func() {
		for range samples {
			d, err := timed(records.write)
			if err != nil {
				b.Fatal(err)
			}
			syncs = append(syncs, d)
			d, err = timed(func() error {
				_, err := p.Node().NodeGetCapabilities(context.Background(), &csi.NodeGetCapabilitiesRequest{})
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
			calls = append(calls, d)
		}
	}
	for b.Loop() {
		for i := range rounds {
			id := fmt.Sprintf("one-%d-%d", b.N, i)
			cv := p.vol(p.create(b, id))
			cv.dirs(b)
			d1, err := timed(func() error { return p.stage(cv) })
			if err != nil {
				b.Fatal(err)
			}
			d2, err := timed(func() error { return p.publish(cv) })
			if err != nil {
				b.Fatal(err)
			}
			cStage, cPub = append(cStage, d1+d2), append(cPub, d2)
			used := loopsBackedIn(p.DataDir)
			if err := p.teardown(cv); err != nil {
				b.Fatal(err)
			}
			waited, ok := awaitRemoved(used, p.DataDir, removalWait)
			if !ok {
				removalTimeouts++
			}
			removals = append(removals, waited)
			sample()
			for _, way := range []struct {
				name string
				s    stager
			}{{"raw", floorWay}, {"mount-utils", bl}} {
				v := makeImages(b, bl, way.name+"-"+id, 1)[0]
				var dev string
				d3, err := timed(func() error { var err error; dev, err = way.s.stage(v); return err })
				if err != nil {
					b.Fatal(err)
				}
				if way.name == "raw" {
					// The floor's durable record where converge's is: the
					// first write and fdatasync after a stage, which
					// flushes what the stage left in the disk's cache
					// (back to back, a second one costs about half).
					d, err := timed(records.write)
					if err != nil {
						b.Fatal(err)
					}
					placedSyncs = append(placedSyncs, d)
				}
				d4, err := timed(func() error { return way.s.publish(v) })
				if err != nil {
					b.Fatal(err)
				}
				handStage[way.name] = append(handStage[way.name], d3+d4)
				handPub[way.name] = append(handPub[way.name], d4)
				if err := way.s.teardown(v, dev); err != nil {
					b.Fatal(err)
				}
				removeNumbers(b, []string{dev})
			}
		}
	}
	// What converge adds to a publish, round by round: the raw publish of
	// the same round took 0.08-1.02 ms within an hour (the disk's state),
	// and converge's follows it.
	added := make([]float64, len(cPub))
	for i := range cPub {
		added[i] = ms(cPub[i] - handPub["raw"][i])
	}
	cs, rs, ms2 := quantile(cStage, 0.5), quantile(handStage["raw"], 0.5), quantile(handStage["mount-utils"], 0.5)
	cp, rp, mp := quantile(cPub, 0.5), quantile(handPub["raw"], 0.5), quantile(handPub["mount-utils"], 0.5)
	fs, rf := quantile(placedSyncs, 0.5), quantile(calls, 0.5)
	pubFloor := rp + fs + rf
	b.ReportMetric(ms(cs), "stage+publish-ms")
	b.ReportMetric(ms(rs), "raw-stage+publish-ms")
	b.ReportMetric(ms(ms2), "mount-utils-stage+publish-ms")
	b.ReportMetric(float64(cs)/float64(rs), "stage+publish-ratio")
	b.ReportMetric(ms(cp), "publish-ms")
	b.ReportMetric(ms(rp), "raw-publish-ms")
	b.ReportMetric(float64(cp)/float64(rp), "publish-ratio")
	b.ReportMetric(ms(fs), "fdatasync-ms")
	// The cost of any call over the socket, for where a publish's time goes.
	b.ReportMetric(ms(rf), "rpc-floor-ms")
	b.ReportMetric(ms(pubFloor), "publish-floor-ms")
	b.ReportMetric(float64(cp)/float64(pubFloor), "publish-floor-ratio")
	compare("one volume: stage + publish, median", "ms", ms(cs), ms(rs), ms(ms2), 1.15)
	compare("one volume: publish alone against its floor (raw bind + fdatasync + empty call), median", "ms", ms(cp), ms(pubFloor), 0, 1.2)
	compare("one volume: publish alone against the raw bind alone, median", "ms", ms(cp), ms(rp), ms(mp), 0)
	absolute("one volume: a record written + fdatasync on the state filesystem after the raw stage, median", "ms", ms(fs), 0)
	absolute("one volume: an empty call (NodeGetCapabilities), median", "ms", ms(rf), 0)
	note(fmt.Sprintf("one volume: publish floor %.2f ms = raw bind %.2f + fdatasync %.2f + empty call %.2f (medians: of %d rounds for the bind and the record, "+
		"written where converge's publish writes its own, right after the stage; of %d calls made between the rounds, where converge does not react to a mount of the floor's)",
		ms(pubFloor), ms(rp), ms(fs), ms(rf), len(handPub["raw"]), len(calls)))
	note(fmt.Sprintf("one volume: back to back, %d at a time between the rounds, a record written + fdatasync took %.2f ms (median of %d)",
		samples, ms(quantile(syncs, 0.5)), len(syncs)))
	note("one volume: the raw floor's steps, medians: " + steps.String())
	b.ReportMetric(median(added), "publish-added-ms")
	note(fmt.Sprintf("one volume: a publish took %.2f ms more than the raw publish of its round (median of %d rounds)", median(added), len(added)))
	removalNote("one volume", removals, removalTimeouts)
}

// removalNote records how long converge's loop number removals trailed
// its teardowns' answers.
func removalNote(what string, waits []time.Duration, timeouts int) {
	line := fmt.Sprintf("%s: converge's loop numbers all removed %.2f ms (median; max %.2f ms) after its teardown answered",
		what, ms(quantile(waits, 0.5)), ms(quantile(waits, 1)))
	if timeouts > 0 {
		line += fmt.Sprintf("; in %d of %d rounds some were not removed within %v", timeouts, len(waits), removalWait)
	}
	note(line)
}

// burst runs f for every volume at once and returns the wall time and
// each volume's latency.
func burst(b *testing.B, vols []vol, f func(vol) error) (time.Duration, []time.Duration) {
	lat := make([]time.Duration, len(vols))
	var wg sync.WaitGroup
	start := time.Now()
	for i, v := range vols {
		wg.Go(func() {
			d, err := timed(func() error { return f(v) })
			if err != nil {
				b.Error(err)
			}
			lat[i] = d
		})
	}
	wg.Wait()
	return time.Since(start), lat
}

// handBurst stages and publishes vols at once by hand, then tears them
// down at once and removes their images, and returns the set-up's wall
// time and per-volume latency and the teardown's cost.
func handBurst(b *testing.B, s stager, vols []vol) (time.Duration, []time.Duration, cost) {
	devs := make([]string, len(vols))
	index := map[string]int{}
	for i, v := range vols {
		index[v.id] = i
	}
	var mu sync.Mutex
	wall, lat := burst(b, vols, func(v vol) error {
		dev, err := s.stage(v)
		mu.Lock()
		devs[index[v.id]] = dev
		mu.Unlock()
		if err != nil {
			return err
		}
		return s.publish(v)
	})
	down := teardownBurst(b, vols, func(v vol) error { return s.teardown(v, devs[index[v.id]]) })
	// As converge's unstages do, after the time taken.
	removeNumbers(b, devs)
	// The images are thick: kept, the rounds' would fill the disk.
	for _, v := range vols {
		if err := os.Remove(v.image); err != nil {
			b.Error(err)
		}
	}
	return wall, lat, down
}

// cost is what a teardown took: its wall time, and the CPU time the whole
// machine was busy meanwhile (every process's and the kernel's, from
// /proc/stat), which tells whether the CPUs bound it. /proc/stat counts in
// 10 ms ticks: busy is good to about 20 ms.
type cost struct{ wall, busy time.Duration }

// teardownBurst runs f for every volume at once, as burst does, and
// returns its cost.
func teardownBurst(b *testing.B, vols []vol, f func(vol) error) cost {
	busy, _ := machineBusy(b)
	wall, _ := burst(b, vols, f)
	after, _ := machineBusy(b)
	return cost{wall, time.Duration(after-busy) * time.Second / 100}
}

// machineBusy reads /proc/stat: the USER_HZ (100) ticks the machine's CPUs
// have been busy since it started (user, nice, system, irq and softirq of
// its first line; not idle, iowait, or steal, which is another guest's),
// and how many CPUs it counts.
func machineBusy(b *testing.B) (ticks int64, cpus int) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	var name string
	var user, nice, system, idle, iowait, irq, softirq int64
	if _, err := fmt.Sscan(string(raw), &name, &user, &nice, &system, &idle, &iowait, &irq, &softirq); err != nil || name != "cpu" {
		b.Fatalf("reading /proc/stat's first line: %q, %v", name, err)
	}
	for _, line := range splitLines(string(raw)) {
		if len(line) > 3 && strings.HasPrefix(line, "cpu") && line[3] >= '0' && line[3] <= '9' {
			cpus++
		}
	}
	return user + nice + system + irq + softirq, cpus
}

// BenchmarkBurst stages and publishes 100 volumes at once, then tears them
// down at once, through the plugin, the raw floor, the mount-utils
// baseline and the raw floor with the calls (calledFloor), with the same
// parallelism (one goroutine per volume), in burstRounds rounds that
// alternate the four. A single teardown of the raw
// floor took anywhere from 40 to 91 ms on the same machine within minutes
// (its disk's flushes vary), so each figure is the median of the rounds,
// and each ratio the median of the rounds' own ratios (converge against the
// raw floor of the same round). The teardown's goal is against the raw
// floor with the kubelet's calls, which no plugin answering them avoids.
// As in BenchmarkOneVolume, every attach starts from a fresh loop number.
func BenchmarkBurst(b *testing.B) {
	const n = 100
	const burstRounds = 5
	p := start(b)
	bl := newBaseline(b, p.Dir)
	var cWalls, rWalls, mWalls, cDowns, rDowns, mDowns, wallRatios, downRatios []float64
	var callWallRatios, callDownRatios, callDowns, calledRatios []float64
	// The CPU time the machine was busy during converge's teardown and
	// the called floor's, their ratio, the plugin's own CPU time, and the
	// CPUs busy on average (busy time over wall time).
	var cBusy, callBusy, busyRatios, pluginCPU, cCPUs, callCPUs []float64
	var removals []time.Duration
	removalTimeouts := 0
	var cLat, rLat, mLat []time.Duration
	var passes, passTime float64
	for b.Loop() {
		for round := range burstRounds {
			cvols := make([]vol, n)
			for i := range cvols {
				id := fmt.Sprintf("burst-%d-%d-%d", b.N, round, i)
				cvols[i] = p.vol(p.create(b, id))
				cvols[i].dirs(b)
			}
			cWall, lat := burst(b, cvols, func(v vol) error {
				if err := p.stage(v); err != nil {
					return err
				}
				return p.publish(v)
			})
			cLat = append(cLat, lat...)
			used := loopsBackedIn(p.DataDir)
			passTimeBefore, passesBefore := passTotals(b, p)
			cpu0, _ := procStat(b, p.PID())
			cCost := teardownBurst(b, cvols, p.teardown)
			cpu1, _ := procStat(b, p.PID())
			cDown := cCost.wall
			passTimeAfter, passesAfter := passTotals(b, p)
			passes += passesAfter - passesBefore
			passTime += passTimeAfter - passTimeBefore
			// The plugin's work in the background after a teardown
			// (removing thick volumes' device numbers) must not land in
			// the baselines' measurements.
			waited, ok := awaitRemoved(used, p.DataDir, removalWait)
			if !ok {
				removalTimeouts++
			}
			removals = append(removals, waited)
			prefix := fmt.Sprintf("%d-%d", b.N, round)
			rWall, rl, rCost := handBurst(b, rawFloor{baseline: bl}, makeImages(b, bl, "raw-burst-"+prefix, n))
			mWall, ml, mCost := handBurst(b, bl, makeImages(b, bl, "mu-burst-"+prefix, n))
			callWall, _, callCost := handBurst(b, calledFloor{rawFloor{baseline: bl}, p.Node()}, makeImages(b, bl, "called-burst-"+prefix, n))
			rDown, mDown, callDown := rCost.wall, mCost.wall, callCost.wall
			cBusy, callBusy = append(cBusy, ms(cCost.busy)), append(callBusy, ms(callCost.busy))
			if callCost.busy > 0 {
				busyRatios = append(busyRatios, float64(cCost.busy)/float64(callCost.busy))
			}
			pluginCPU = append(pluginCPU, ms(cpu1-cpu0))
			cCPUs, callCPUs = append(cCPUs, float64(cCost.busy)/float64(cDown)), append(callCPUs, float64(callCost.busy)/float64(callDown))
			callWallRatios = append(callWallRatios, float64(callWall)/float64(rWall))
			callDownRatios = append(callDownRatios, float64(callDown)/float64(rDown))
			callDowns = append(callDowns, ms(callDown))
			calledRatios = append(calledRatios, float64(cDown)/float64(callDown))
			rLat, mLat = append(rLat, rl...), append(mLat, ml...)
			cWalls, rWalls, mWalls = append(cWalls, ms(cWall)), append(rWalls, ms(rWall)), append(mWalls, ms(mWall))
			cDowns, rDowns, mDowns = append(cDowns, ms(cDown)), append(rDowns, ms(rDown)), append(mDowns, ms(mDown))
			wallRatios = append(wallRatios, float64(cWall)/float64(rWall))
			downRatios = append(downRatios, float64(cDown)/float64(rDown))
		}
	}
	b.ReportMetric(median(cWalls), "burst-wall-ms")
	b.ReportMetric(median(rWalls), "raw-burst-wall-ms")
	b.ReportMetric(median(mWalls), "mount-utils-burst-wall-ms")
	b.ReportMetric(median(wallRatios), "burst-ratio")
	b.ReportMetric(ms(quantile(cLat, 0.5)), "burst-p50-ms")
	b.ReportMetric(ms(quantile(cLat, 0.99)), "burst-p99-ms")
	b.ReportMetric(median(cDowns), "teardown-wall-ms")
	b.ReportMetric(median(rDowns), "raw-teardown-wall-ms")
	b.ReportMetric(median(downRatios), "teardown-ratio")
	// Passes the reconciler made during a teardown (all volumes), the
	// mean of the rounds.
	b.ReportMetric(passes/float64(len(cDowns)), "teardown-passes")
	b.ReportMetric(passTime*1000/float64(len(cDowns)), "teardown-pass-total-ms")
	compareRatio("100 volumes at once: wall (median of rounds)", "ms", median(cWalls), median(rWalls), median(mWalls), median(wallRatios), 1.3)
	compare("100 volumes at once: p50 per volume", "ms", ms(quantile(cLat, 0.5)), ms(quantile(rLat, 0.5)), ms(quantile(mLat, 0.5)), 0)
	compare("100 volumes at once: p99 per volume", "ms", ms(quantile(cLat, 0.99)), ms(quantile(rLat, 0.99)), ms(quantile(mLat, 0.99)), 0)
	b.ReportMetric(median(callDowns), "called-floor-teardown-wall-ms")
	b.ReportMetric(median(calledRatios), "teardown-called-floor-ratio")
	compareRatio("teardown of the 100 against the raw floor with the kubelet's calls: wall (median of rounds)", "ms", median(cDowns), median(callDowns), 0, median(calledRatios), 1.3)
	compareRatio("teardown of the 100 against the raw floor: wall (median of rounds)", "ms", median(cDowns), median(rDowns), median(mDowns), median(downRatios), 0)
	b.ReportMetric(median(cBusy), "teardown-busy-cpu-ms")
	b.ReportMetric(median(callBusy), "called-floor-teardown-busy-cpu-ms")
	compareRatio("teardown of the 100 against the raw floor with the kubelet's calls: the machine's CPU time busy (median of rounds)", "ms",
		median(cBusy), median(callBusy), 0, median(busyRatios), 0)
	_, cpus := machineBusy(b)
	whole := func(v []float64) string {
		parts := make([]string, len(v))
		for i, x := range v {
			parts[i] = fmt.Sprintf("%.0f", x)
		}
		return strings.Join(parts, ", ")
	}
	note(fmt.Sprintf("teardown of 100, CPUs busy on average, of %d (median of rounds): converge %.2f, the floor with the calls %.2f; "+
		"by round, converge %s, the floor %s; the machine's CPU time busy by round, converge %s ms, the floor %s ms; converge's plugin %.0f ms of CPU (median). "+
		"Near %d busy, on a machine running nothing else, a teardown is bound by the CPU time it takes. "+
		"Counted in 10 ms ticks, steal left out; converge's window includes its loop numbers' removals that begin before its teardown ends, the floor's does not",
		cpus, median(cCPUs), median(callCPUs), joinNums(cCPUs), joinNums(callCPUs), whole(cBusy), whole(callBusy), median(pluginCPU), cpus))
	note("100 volumes, round by round: burst ratios " + joinNums(wallRatios) + "; teardown ratios " + joinNums(downRatios) +
		" (against the floor with the calls " + joinNums(calledRatios) + "); raw teardowns " + joinNums(rDowns) +
		" ms, with the calls " + joinNums(callDowns) + " ms")
	removalNote("100 volumes", removals, removalTimeouts)
	b.ReportMetric(median(callWallRatios), "called-floor-burst-ratio")
	b.ReportMetric(median(callDownRatios), "called-floor-teardown-ratio")
	note(fmt.Sprintf("100 volumes: the raw floor with an empty call to the plugin before each step: teardown %.2fx the raw floor "+
		"(what the kubelet's two calls alone add; rounds %s); burst %.2fx (rounds %s: the calls spread the volumes' mkfs runs out, so no floor)",
		median(callDownRatios), joinNums(callDownRatios), median(callWallRatios), joinNums(callWallRatios)))
}

// median returns the median of v; for an even count, the mean of the two
// middle values.
func median(v []float64) float64 {
	v = slices.Sorted(slices.Values(v))
	if len(v) == 0 {
		return 0
	}
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func joinNums(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(parts, ", ")
}

// procStat reads a process's CPU time (user+system) and resident memory.
func procStat(b *testing.B, pid int) (cpu time.Duration, rssKiB int) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name, which is in parentheses.
	rest := string(raw[bytesLastIndex(raw, ')')+2:])
	var f [20]int64
	var state string
	fmt.Sscan(rest, &state, &f[0], &f[1], &f[2], &f[3], &f[4], &f[5], &f[6], &f[7], &f[8], &f[9], &f[10], &f[11])
	ticks := f[10] + f[11] // utime, stime (fields 14 and 15)
	cpu = time.Duration(ticks) * time.Second / 100
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	var kb int
	for _, line := range splitLines(string(status)) {
		if _, err := fmt.Sscanf(line, "VmRSS: %d kB", &kb); err == nil {
			break
		}
	}
	return cpu, kb
}

func bytesLastIndex(b []byte, c byte) int {
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == c {
			return i
		}
	}
	return -1
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := range len(s) {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return out
}

// passTotals reads the total duration and count of reconcile passes from
// the plugin's metrics, over its status socket.
func passTotals(b *testing.B, p plugin) (sum, count float64) {
	v := metricValues(p, "converge_reconcile_pass_duration_seconds_sum", "converge_reconcile_pass_duration_seconds_count")
	return v[0], v[1]
}

// metricValues reads the values of the plugin's metrics of the given
// names (each a series without labels), over its status socket; a metric
// it does not export reads 0.
func metricValues(p plugin, names ...string) []float64 {
	_, raw := p.StatusGet("/metrics")
	values := make([]float64, len(names))
	for _, line := range splitLines(raw) {
		for i, name := range names {
			fmt.Sscanf(line, name+" %g", &values[i])
		}
	}
	return values
}

// thousandVolSize is the size of BenchmarkThousandVolumes' volumes: thick,
// a thousand of them take 16 GiB of the disk (64 MiB ones, 64 GiB, more
// than this machine kind has free).
const thousandVolSize = 16 << 20

// BenchmarkThousandVolumes stages and publishes 1000 volumes, then
// measures the idle plugin (CPU per minute over a measured window at the
// default resync period, resident memory, the duration of a pass from the
// metrics), and the time from a restart to Probe ready, after a SIGKILL
// (the state log replayed) and after a clean stop.
func BenchmarkThousandVolumes(b *testing.B) {
	n := 1000
	if v := os.Getenv("CONVERGE_BENCH_VOLUMES"); v != "" {
		fmt.Sscan(v, &n)
	}
	window := 60 * time.Second
	p := start(b)
	vols := make([]vol, n)
	for i := range vols {
		id := fmt.Sprintf("k-%04d", i)
		vols[i] = p.vol(p.createSized(b, id, thousandVolSize))
		vols[i].dirs(b)
	}
	for b.Loop() {
		deadlineRetries.Store(0)
		setup, _ := burst(b, vols, func(v vol) error {
			if err := p.stage(v); err != nil {
				return err
			}
			return p.publish(v)
		})
		b.ReportMetric(setup.Seconds(), "setup-s")
		b.ReportMetric(float64(deadlineRetries.Load()), "deadline-retries")
		if n := deadlineRetries.Load(); n > 0 {
			note(fmt.Sprintf("%d volumes at once: %d calls answered DEADLINE_EXCEEDED after 2 minutes and were retried, as the kubelet does", len(vols), n))
		}
		absolute(fmt.Sprintf("%d volumes at once: wall", n), "s", setup.Seconds(), 0)

		// A crash right after: the restart replays what the state log
		// holds since its last checkpoint.
		p.Kill()
		logged := len(p.Log())
		start := time.Now()
		p.Start() // waits for Probe ready
		b.ReportMetric(time.Since(start).Seconds(), "restart-after-kill-s")
		absolute(fmt.Sprintf("%d volumes: restart after SIGKILL to Probe ready", n), "s", time.Since(start).Seconds(), 2)
		var replayed float64
		if _, tail, ok := strings.Cut(p.Log()[logged:], `"Replayed the state log" records=`); ok {
			fmt.Sscan(tail, &replayed)
		}
		b.ReportMetric(replayed, "replayed-records")
		absolute(fmt.Sprintf("%d volumes: records that restart replayed", n), "", replayed, 0)

		time.Sleep(2 * time.Second) // let the set-up's last passes end
		cpu0, _ := procStat(b, p.PID())
		sum0, count0 := passTotals(b, p)
		time.Sleep(window)
		cpu1, rss := procStat(b, p.PID())
		sum1, count1 := passTotals(b, p)
		idle := 100 * float64(cpu1-cpu0) / float64(window)
		b.ReportMetric(idle, "idle-cpu-%")
		b.ReportMetric(float64(rss)/1024, "rss-MiB")
		absolute(fmt.Sprintf("%d volumes idle: CPU, %% of a core", n), "%", idle, 1)
		absolute(fmt.Sprintf("%d volumes idle: resident memory", n), "MiB", float64(rss)/1024, 0)
		if count1 > count0 {
			b.ReportMetric(1000*(sum1-sum0)/(count1-count0), "idle-pass-ms")
			absolute(fmt.Sprintf("%d volumes idle: one reconcile pass", n), "ms", 1000*(sum1-sum0)/(count1-count0), 0)
		}
		b.ReportMetric(count1-count0, "idle-passes")

		p.Stop()
		start = time.Now()
		p.Start() // waits for Probe ready
		b.ReportMetric(time.Since(start).Seconds(), "restart-to-ready-s")
		absolute(fmt.Sprintf("%d volumes: restart to Probe ready", n), "s", time.Since(start).Seconds(), 2)

		down, _ := burst(b, vols, p.teardown)
		b.ReportMetric(down.Seconds(), "teardown-s")
		absolute(fmt.Sprintf("%d volumes: teardown at once", n), "s", down.Seconds(), 0)
	}
}

// removeNewLoopNodes removes, when b ends, the loop device nodes the kernel
// made during it (it makes one on demand for every attach beyond those it
// has, and keeps them): left behind, a thousand idle nodes make every later
// loop listing (a read of each device's size), and so every pass of every
// later run, slower.
// Nodes that were there before, or are attached, are kept.
func removeNewLoopNodes(b *testing.B) {
	before := loopNodes()
	b.Cleanup(func() {
		ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return
		}
		defer unix.Close(ctl)
		for n := range loopNodes() {
			if !before[n] {
				// EBUSY for an attached device: it stays.
				unix.IoctlSetInt(ctl, unix.LOOP_CTL_REMOVE, n)
			}
		}
	})
}

// loopNodes is the set of loop device numbers the kernel has now.
func loopNodes() map[int]bool {
	out := map[int]bool{}
	dirs, _ := filepath.Glob("/sys/block/loop*")
	for _, d := range dirs {
		var n int
		if _, err := fmt.Sscanf(filepath.Base(d), "loop%d", &n); err == nil {
			out[n] = true
		}
	}
	return out
}

// BenchmarkCreateVolume measures CreateVolume of a 10 GiB thick volume (its
// space allocated with fallocate) against a sparse one (a thin volume, what
// every volume was before provisioning was recorded), in the same run, and
// DeleteVolume of each.
func BenchmarkCreateVolume(b *testing.B) {
	const (
		rounds = 5
		size   = 10 << 30
	)
	p := start(b)
	// create makes the volume named name and sets id to its ID.
	create := func(name, prov string, id *string) error {
		resp, err := p.Controller().CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: name,
			CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{rwo},
			Parameters: map[string]string{"converge.csi.dev/provisioning": prov}})
		*id = resp.GetVolume().GetVolumeId()
		return err
	}
	remove := func(id string) error {
		_, err := p.Controller().DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: id})
		return err
	}
	var thick, thin, thickDel, thinDel []time.Duration
	for b.Loop() {
		for i := range rounds {
			for _, prov := range []string{"thick", "thin"} {
				var id string
				d, err := timed(func() error { return create(fmt.Sprintf("create-%s-%d-%d", prov, b.N, i), prov, &id) })
				if err != nil {
					b.Fatal(err)
				}
				del, err := timed(func() error { return remove(id) })
				if err != nil {
					b.Fatal(err)
				}
				if prov == "thick" {
					thick, thickDel = append(thick, d), append(thickDel, del)
				} else {
					thin, thinDel = append(thin, d), append(thinDel, del)
				}
			}
		}
	}
	ct, cs := quantile(thick, 0.5), quantile(thin, 0.5)
	b.ReportMetric(ms(ct), "thick-create-ms")
	b.ReportMetric(ms(cs), "sparse-create-ms")
	b.ReportMetric(float64(ct)/float64(cs), "create-ratio")
	compare("CreateVolume of 10 GiB: thick against sparse (RAW), median", "ms", ms(ct), ms(cs), 0, 0)
	compare("DeleteVolume of 10 GiB: thick against sparse (RAW), median", "ms", ms(quantile(thickDel, 0.5)), ms(quantile(thinDel, 0.5)), 0, 0)
}
