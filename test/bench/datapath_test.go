package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
)

const (
	// dataPathFileSize is the size of the file fio reads and writes on
	// each side: large enough that a random 4 KiB access seldom meets a
	// block the disk's own cache (the hypervisor's, on a VM) has just
	// seen, small enough to write out in about a second here.
	dataPathFileSize = 1 << 30
	// dataPathVolSize leaves the volume's ext4 room for the file, the
	// random first writes' file, its journal and its metadata.
	dataPathVolSize = 3 << 30
	// dataPathRounds: each round makes fresh volumes and a fresh host
	// file, so that every round's first write meets unallocated space.
	dataPathRounds = 3
	// dataPathRuntime is each timed fio job's length: 2.5 s at iodepth 1
	// here is some 30,000 writes, enough for a p99; the whole benchmark
	// runs in about 4 minutes.
	dataPathRuntime = 2500 * time.Millisecond
	// fioFile is the file's name on each side; fioFirstFile that of the
	// file the random first writes go to.
	fioFile      = "fio.dat"
	fioFirstFile = "fio-first.dat"
)

// fioJob is one fio workload, run the same on every side.
type fioJob struct {
	// key names it in the metrics; what in the table.
	key, what string
	rw, bs    string
	depth     int
	// fdatasync makes every write durable before the next one is issued.
	fdatasync bool
	// once writes the whole file once; ioBytes, when not 0, is how much
	// the job reads or writes; a job with neither runs for
	// dataPathRuntime.
	once    bool
	ioBytes int64
	// bandwidth reports MiB/s rather than IOPS; latency adds the writes'
	// completion latency, p50 and p99.
	bandwidth, latency bool
}

// dataPathJobs are the timed jobs, in the order each round runs them.
var dataPathJobs = []fioJob{
	{key: "randread-4k-qd32", what: "4k random read, iodepth 32", rw: "randread", bs: "4k", depth: 32},
	{key: "randread-4k-qd1", what: "4k random read, iodepth 1", rw: "randread", bs: "4k", depth: 1},
	{key: "randwrite-4k-qd32", what: "4k random write, iodepth 32", rw: "randwrite", bs: "4k", depth: 32},
	{key: "randwrite-4k-qd1", what: "4k random write, iodepth 1", rw: "randwrite", bs: "4k", depth: 1, latency: true},
	{key: "randwrite-4k-qd1-fdatasync", what: "4k random write + fdatasync each, iodepth 1", rw: "randwrite", bs: "4k", depth: 1, fdatasync: true},
	{key: "read-1M-qd32", what: "1M sequential read, iodepth 32", rw: "read", bs: "1M", depth: 32, bandwidth: true},
	{key: "write-1M-qd32", what: "1M sequential write, iodepth 32", rw: "write", bs: "1M", depth: 32, bandwidth: true},
}

// firstWrite writes the whole fresh file once, sequentially, before the
// timed jobs: on a thin volume every block of it is allocated in the
// image as it is written; on a thick one, and in the host's file, fio's
// fallocate has reserved them (unwritten extents), and the write
// converts them.
var firstWrite = fioJob{key: "first-write-1M-qd32", what: "first write of the whole file, 1M sequential, iodepth 32", rw: "write", bs: "1M", depth: 32, bandwidth: true, once: true}

// firstRandomWrite writes 4 KiB blocks at random into half of another
// fresh file, each block once (fio's random map): what a database's first
// writes into a new file meet, the allocation of each block in a thin
// image, scattered. A time-based run would wrap around the file on a fast
// disk, and overwrite.
var firstRandomWrite = fioJob{key: "first-randwrite-4k-qd32", what: "first writes, 4k random into half of a fresh file, iodepth 32", rw: "randwrite", bs: "4k", depth: 32,
	ioBytes: dataPathFileSize / 2}

// dataTarget is one side fio runs on: the host's file or a volume's.
type dataTarget struct {
	name string
	// file is fio's file; vol the volume it is on (nil for the host's).
	file string
	vol  *vol
}

// fioResult is what a fio job measured.
type fioResult struct {
	iops, mibps, p50us, p99us float64
	// readBytes is what fio read; diskRead what the disk under the data
	// directory read meanwhile.
	readBytes, diskRead int64
}

// dataFigure is one figure of the data path, in every round.
type dataFigure struct {
	key, what, unit string
	// values holds each target's figure, by round.
	values map[string][]float64
}

// BenchmarkDataPath measures what a converge volume costs the data path:
// fio with direct I/O on a 1 GiB file on the mounted filesystem of a
// published volume (thick and thin, ext4, staged and published through
// the plugin's socket as the kubelet asks), against the same fio job on a
// file of the same size on the host filesystem the data directory is on,
// beside it (the other benchmarks' data directory: the machine's disk).
// Each job runs on the host's file and on both volumes in turn, in an
// order that rotates, so that the three see the same disk; each round
// makes fresh volumes and fresh host files, whose first writes it
// measures before the timed jobs (firstWrite, firstRandomWrite): a thin
// image allocates its blocks as they are first written. It reports each
// figure's median of the rounds on each side, and the median of the
// rounds' own ratios volume/host.
//
// Direct I/O must reach the disk on both sides: a read served from the
// page cache would make either side look faster than the disk. The
// benchmark checks that the loop devices run with direct I/O, and
// compares, for each read job, the bytes the disk under the data
// directory read with those fio read (the note "disk read per byte fio
// read": 1 or more when nothing came from the page cache; other work on
// the machine only adds to it).
//
// It needs fio; without it, it is skipped.
func BenchmarkDataPath(b *testing.B) {
	fio, err := exec.LookPath("fio")
	if err != nil {
		b.Skip("needs fio (Debian package fio)")
	}
	p := start(b)
	hostDir := filepath.Join(p.Dir, "host")
	if err := os.MkdirAll(hostDir, 0o700); err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(p.DataDir, 0o700); err != nil {
		b.Fatal(err)
	}
	if !sameFilesystem(b, hostDir, p.DataDir) {
		b.Fatalf("%s and the data directory %s are on different filesystems", hostDir, p.DataDir)
	}
	diskStat := diskStatPath(b, p.DataDir)
	engine := fioEngine(b, fio, hostDir)
	version, _ := exec.Command(fio, "--version").Output()

	figures := dataFigures()
	byKey := map[string]*dataFigure{}
	for _, f := range figures {
		byKey[f.key] = f
	}
	sides := []string{"host", "thick", "thin"}
	diskPerRead := map[string][]float64{}
	var dio []string
	var thinBefore, thinAfter []float64
	for b.Loop() {
		for round := range dataPathRounds {
			targets := []dataTarget{{name: "host", file: filepath.Join(hostDir, fioFile)}}
			for _, prov := range []string{"thick", "thin"} {
				id := p.createProvisioned(b, fmt.Sprintf("datapath-%s-%d-%d", prov, b.N, round), dataPathVolSize, prov)
				v := p.vol(id)
				v.dirs(b)
				if err := p.stage(v); err != nil {
					b.Fatal(err)
				}
				if err := p.publish(v); err != nil {
					b.Fatal(err)
				}
				dio = append(dio, prov+" "+loopDirectIO(v.image))
				targets = append(targets, dataTarget{name: prov, file: filepath.Join(v.target, fioFile), vol: &v})
			}
			thinImage := targets[2].vol.image
			thinBefore = append(thinBefore, allocatedMiB(b, thinImage))
			for _, t := range rotate(targets, round) {
				r := runFio(b, fio, engine, firstWrite, t.file, diskStat)
				byKey[firstWrite.key].values[t.name] = append(byKey[firstWrite.key].values[t.name], r.mibps)
			}
			thinAfter = append(thinAfter, allocatedMiB(b, thinImage))
			for _, t := range rotate(targets, round+1) {
				r := runFio(b, fio, engine, firstRandomWrite, filepath.Join(filepath.Dir(t.file), fioFirstFile), diskStat)
				byKey[firstRandomWrite.key].values[t.name] = append(byKey[firstRandomWrite.key].values[t.name], r.iops)
			}
			for j, job := range dataPathJobs {
				for _, t := range rotate(targets, round+j) {
					r := runFio(b, fio, engine, job, t.file, diskStat)
					if job.bandwidth {
						byKey[job.key].values[t.name] = append(byKey[job.key].values[t.name], r.mibps)
					} else {
						byKey[job.key].values[t.name] = append(byKey[job.key].values[t.name], r.iops)
					}
					if job.latency {
						byKey[job.key+"-p50"].values[t.name] = append(byKey[job.key+"-p50"].values[t.name], r.p50us)
						byKey[job.key+"-p99"].values[t.name] = append(byKey[job.key+"-p99"].values[t.name], r.p99us)
					}
					if r.readBytes > 0 && diskStat != "" {
						diskPerRead[t.name] = append(diskPerRead[t.name], float64(r.diskRead)/float64(r.readBytes))
					}
				}
			}
			for _, t := range targets[1:] {
				if err := p.teardown(*t.vol); err != nil {
					b.Fatal(err)
				}
				if _, err := p.Controller().DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: t.vol.id}); err != nil {
					b.Fatal(err)
				}
			}
			for _, f := range []string{targets[0].file, filepath.Join(hostDir, fioFirstFile)} {
				if err := os.Remove(f); err != nil {
					b.Fatal(err)
				}
			}
		}
	}

	for _, f := range figures {
		host := median(f.values["host"])
		b.ReportMetric(host, "host-"+f.key+"-"+f.unit)
		for _, side := range sides[1:] {
			ratios := make([]float64, len(f.values[side]))
			for i, v := range f.values[side] {
				ratios[i] = v / f.values["host"][i]
			}
			vm, ratio := median(f.values[side]), median(ratios)
			b.ReportMetric(vm, side+"-"+f.key+"-"+f.unit)
			b.ReportMetric(ratio, side+"-"+f.key+"-ratio")
			compareRatio(fmt.Sprintf("data path, %s volume against the host's file (RAW): %s, median of %d", side, f.what, dataPathRounds),
				f.unit, vm, host, 0, ratio, 0)
			note(fmt.Sprintf("data path, %s: %s, %s: volume %s, host %s, ratio %s by round", side, f.what, f.unit,
				joinNums(f.values[side]), joinNums(f.values["host"]), joinNums(ratios)))
		}
	}
	note(fmt.Sprintf("data path: %s, ioengine %s, direct=1, a %d MiB file, each timed job %v (time-based, no ramp), %d rounds, sides in rotating order",
		strings.TrimSpace(string(version)), engine, dataPathFileSize>>20, dataPathRuntime, dataPathRounds))
	note("data path: the volumes' loop devices' direct I/O (sysfs loop/dio), by round: " + strings.Join(dio, ", "))
	note(fmt.Sprintf("data path: the thin image's allocated MiB before its first write, by round: %s; after it: %s",
		joinNums(thinBefore), joinNums(thinAfter)))
	if diskStat == "" {
		note("data path: the data directory is on no block device; the page cache check was not made")
	}
	for _, side := range sides {
		if v := diskPerRead[side]; len(v) > 0 {
			lo := slices.Min(v)
			b.ReportMetric(lo, side+"-min-disk-read-per-fio-read")
			note(fmt.Sprintf("data path, %s: bytes the disk (%s) read per byte fio read, the least of %d read jobs: %.2f",
				side, filepath.Dir(diskStat), len(v), lo))
			if lo < 0.9 {
				b.Errorf("data path, %s: the disk read %.2f bytes per byte fio read: part of the reads came from a cache", side, lo)
			}
		}
	}
}

// dataFigures lists the figures the benchmark reports, each with no
// values yet.
func dataFigures() []*dataFigure {
	var out []*dataFigure
	add := func(key, what, unit string) {
		out = append(out, &dataFigure{key: key, what: what, unit: unit, values: map[string][]float64{}})
	}
	for _, j := range append([]fioJob{firstWrite, firstRandomWrite}, dataPathJobs...) {
		unit := "IOPS"
		if j.bandwidth {
			unit = "MiB/s"
		}
		add(j.key, j.what, unit)
		if j.latency {
			add(j.key+"-p50", j.what+": completion latency p50", "us")
			add(j.key+"-p99", j.what+": completion latency p99", "us")
		}
	}
	return out
}

// rotate returns ts starting at its k-th (modulo its length).
func rotate(ts []dataTarget, k int) []dataTarget {
	k %= len(ts)
	return append(append([]dataTarget{}, ts[k:]...), ts[:k]...)
}

// createProvisioned makes a volume of size bytes named name, thick or thin
// as prov says, and returns its ID.
func (p plugin) createProvisioned(b testing.TB, name string, size int64, prov string) string {
	resp, err := p.Controller().CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: name,
		CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{rwo},
		Parameters: map[string]string{"converge.csi.dev/provisioning": prov}})
	if err != nil {
		b.Fatal(err)
	}
	return resp.GetVolume().GetVolumeId()
}

// runFio runs job on file and returns what it measured. diskStat, when
// not empty, is the sysfs stat file of the disk whose reads are counted.
func runFio(b *testing.B, fio, engine string, job fioJob, file, diskStat string) fioResult {
	args := []string{"--name=" + job.key, "--filename=" + file, "--size=" + strconv.Itoa(dataPathFileSize),
		"--direct=1", "--ioengine=" + engine, "--rw=" + job.rw, "--bs=" + job.bs, "--iodepth=" + strconv.Itoa(job.depth),
		"--output-format=json"}
	switch {
	case job.ioBytes != 0:
		args = append(args, "--io_size="+strconv.FormatInt(job.ioBytes, 10))
	case !job.once:
		args = append(args, "--time_based", fmt.Sprintf("--runtime=%dms", dataPathRuntime.Milliseconds()))
	}
	if job.fdatasync {
		args = append(args, "--fdatasync=1")
	}
	before := diskSectorsRead(b, diskStat)
	cmd := exec.Command(fio, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("fio %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	after := diskSectorsRead(b, diskStat)
	var res struct {
		Jobs []struct {
			Read, Write fioSide
		}
	}
	// fio may print notes before its JSON.
	if i := bytes.IndexByte(out, '{'); i > 0 {
		out = out[i:]
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Jobs) != 1 {
		b.Fatalf("fio's output: %v: %s", err, out)
	}
	r, w := res.Jobs[0].Read, res.Jobs[0].Write
	return fioResult{
		iops:      r.IOPS + w.IOPS,
		mibps:     float64(r.BW+w.BW) / 1024,
		p50us:     w.Clat.Percentile["50.000000"] / 1000,
		p99us:     w.Clat.Percentile["99.000000"] / 1000,
		readBytes: r.IOBytes,
		diskRead:  512 * (after - before),
	}
}

// fioSide is one direction of a fio job's JSON report.
type fioSide struct {
	IOBytes int64   `json:"io_bytes"`
	BW      int64   `json:"bw"` // KiB/s
	IOPS    float64 `json:"iops"`
	Clat    struct {
		Percentile map[string]float64 `json:"percentile"`
	} `json:"clat_ns"`
}

// fioEngine returns io_uring when fio can use it here, libaio otherwise
// (a kernel or a sandbox that refuses io_uring).
func fioEngine(b *testing.B, fio, dir string) string {
	probe := filepath.Join(dir, "probe")
	defer os.Remove(probe)
	err := exec.Command(fio, "--name=probe", "--filename="+probe, "--size=1M", "--direct=1", "--ioengine=io_uring",
		"--rw=read", "--bs=4k", "--output-format=json").Run()
	if err != nil {
		return "libaio"
	}
	return "io_uring"
}

// sameFilesystem reports whether a and b are on one filesystem.
func sameFilesystem(tb testing.TB, a, b string) bool {
	var sa, sb syscall.Stat_t
	if err := syscall.Stat(a, &sa); err != nil {
		tb.Fatal(err)
	}
	if err := syscall.Stat(b, &sb); err != nil {
		tb.Fatal(err)
	}
	return sa.Dev == sb.Dev
}

// diskStatPath returns the sysfs stat file of the block device dir's
// filesystem is on, or "" when it is on none (tmpfs, overlay).
func diskStatPath(b *testing.B, dir string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		b.Fatal(err)
	}
	path := fmt.Sprintf("/sys/dev/block/%d:%d/stat", unix.Major(st.Dev), unix.Minor(st.Dev))
	if _, err := os.Stat(path); err != nil {
		return ""
	}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		return real
	}
	return path
}

// diskSectorsRead reads the sectors read field of a sysfs stat file
// (Documentation/block/stat.rst); 0 for no file.
func diskSectorsRead(b *testing.B, stat string) int64 {
	if stat == "" {
		return 0
	}
	raw, err := os.ReadFile(stat)
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		b.Fatalf("%s: %q", stat, raw)
	}
	n, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		b.Fatalf("%s: %v", stat, err)
	}
	return n
}

// loopDirectIO returns the direct I/O flag (sysfs loop/dio) of the loop
// devices attached to image.
func loopDirectIO(image string) string {
	var flags []string
	for n := range loopNodes() {
		raw, err := os.ReadFile(fmt.Sprintf("/sys/block/loop%d/loop/backing_file", n))
		if err != nil || strings.TrimSpace(string(raw)) != image {
			continue
		}
		d, _ := os.ReadFile(fmt.Sprintf("/sys/block/loop%d/loop/dio", n))
		flags = append(flags, fmt.Sprintf("loop%d dio=%s", n, strings.TrimSpace(string(d))))
	}
	if len(flags) == 0 {
		return "no loop device"
	}
	return strings.Join(flags, " ")
}

// allocatedMiB is the space file has allocated on its filesystem.
func allocatedMiB(b *testing.B, file string) float64 {
	var st syscall.Stat_t
	if err := syscall.Stat(file, &st); err != nil {
		b.Fatal(err)
	}
	return float64(st.Blocks*512) / (1 << 20)
}
