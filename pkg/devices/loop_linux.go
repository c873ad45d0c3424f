package devices

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/host"
)

const (
	loopControl = "/dev/loop-control"
	// attachBudget bounds how long AttachLoop keeps claiming free devices
	// that other processes take or remove first (a node has other loop
	// users: losetup, snap, another CSI driver, converge's own removals).
	// Past it the attach fails, as a plain error the operation's backoff
	// retries; each claim that lost took no device.
	attachBudget = 10 * time.Second
	// attachFirstWait and attachMaxWait bound the wait between two claims:
	// it doubles from the first to the most. A claim lost to another
	// process is lost in microseconds; waiting a little more each time
	// lets a process that attaches and detaches as fast as it can get out
	// of the way (TestAttachWhileOthersChurn).
	attachFirstWait = 100 * time.Microsecond
	attachMaxWait   = 50 * time.Millisecond
)

// ErrNoLoopDevice is returned when the kernel has no free loop device.
var ErrNoLoopDevice = errors.New("no free loop device")

// AttachLoop attaches file to a free loop device with direct I/O, passing
// discards on to the file or refusing them, and returns the device node.
// The device is not auto-cleared: it stays attached until DetachLoop, so a
// mount can outlive the plugin process.
//
// The kernel offers every caller the same lowest free device, so another
// process can take it, or remove it, between the offer and the claim:
// AttachLoop then waits a little (claimWait) and asks again, until
// attachBudget has passed. A device it claimed but cannot use (its
// discards stuck off, for a thin volume) is detached and removed before
// the next try: no claim that lost leaves a device attached.
func AttachLoop(file string, discards bool) (string, error) {
	backing, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		return "", fmt.Errorf("opening image: %w", err)
	}
	defer backing.Close()

	ctl, err := os.OpenFile(loopControl, os.O_RDWR, 0)
	if err != nil {
		return "", fmt.Errorf("opening %s: %w", loopControl, err)
	}
	defer ctl.Close()

	deadline := time.Now().Add(attachBudget)
	for lost := 0; ; lost++ {
		dev, err := claimLoop(ctl, backing)
		if err == nil {
			// Outside attachMu: a queue limit written makes the kernel
			// freeze the device's queue, which waits out an RCU grace
			// period (14-22 ms on an idle machine here), and the other
			// attaches need not wait for it (BenchmarkAttachBurst).
			err = SetDiscards("/sys/block", dev, discards)
			if err == nil {
				if lost > 0 {
					klog.Background().V(2).Info("Loop device claimed after others were taken, removed or stuck first", "device", dev, "lost", lost)
				}
				return dev, nil
			}
			// Another device number comes next time.
			if derr := DetachLoop(dev); derr != nil {
				return "", fmt.Errorf("%w; and then %w", err, derr)
			}
			if !errors.Is(err, ErrDiscardsStuck) {
				return "", err
			}
			removeLoop(dev)
		} else if !errors.Is(err, errTaken) {
			return "", err
		}
		if time.Now().After(deadline) {
			// Other processes took every free device offered:
			// contention, not exhaustion, so a plain error that is
			// retried.
			return "", fmt.Errorf("no loop device could be claimed in %v: each of the %d free ones offered was taken or removed by another process first, or kept its discards stuck off", attachBudget, lost+1)
		}
		time.Sleep(claimWait(lost, rand.Float64()))
	}
}

// claimWait returns how long to wait after the lost-th claim in a row that
// lost (0 for the first): twice as long each time, from attachFirstWait up
// to attachMaxWait, of which r (in [0, 1)) draws a point in the upper half,
// so that processes that lost the same device come back at different
// moments.
func claimWait(lost int, r float64) time.Duration {
	d := attachMaxWait
	if lost < 20 && attachFirstWait<<lost < attachMaxWait {
		d = attachFirstWait << lost
	}
	return d/2 + time.Duration(r*float64(d/2))
}

// errTaken is claimLoop's answer when another process took the free
// device it was offered, or removed it, first.
var errTaken = errors.New("loop device taken meanwhile")

// claimLoop attaches backing to the free loop device the kernel offers.
// The plugin's own claims take turns: the kernel offers each caller the
// same lowest free number, so a burst of them at once would race for it,
// one winner a round, and run out of retries.
func claimLoop(ctl, backing *os.File) (string, error) {
	attachMu.Lock()
	defer attachMu.Unlock()
	n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
	if err != nil {
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENODEV) {
			return "", ErrNoLoopDevice
		}
		return "", fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
	}
	dev := fmt.Sprintf("/dev/loop%d", n)
	err = configureLoop(dev, backing)
	if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENXIO) {
		return "", errTaken // someone else took it first, or removed it (see Detach)
	}
	if err != nil {
		return "", err
	}
	return dev, nil
}

// sectorSize is the logical block size of every volume's loop device.
const sectorSize = 512

// attachMu makes the attaches of this process take turns (AttachLoop).
var attachMu sync.Mutex

func configureLoop(dev string, backing *os.File) error {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", dev, err)
	}
	defer f.Close()
	// 512 byte sectors, always: a filesystem made on the device was made
	// for them, and mounts on them wherever the image lives. Left to the
	// kernel, the sector size follows the backing file's direct I/O
	// alignment, which xfs raises to its block size once the file shares
	// blocks (a snapshot, a clone): an ext4 of 1 KiB blocks would no
	// longer mount. Where the backing wants more than 512, the device
	// runs without direct I/O instead.
	cfg := unix.LoopConfig{Fd: uint32(backing.Fd()), Size: sectorSize}
	cfg.Info.Flags = unix.LO_FLAGS_DIRECT_IO
	name := backing.Name()
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], name)
	if err := unix.IoctlLoopConfigure(int(f.Fd()), &cfg); err != nil {
		return fmt.Errorf("LOOP_CONFIGURE %s: %w", dev, err)
	}
	return nil
}

// DetachLoop releases a loop device. If the device is still open (mounted),
// the kernel detaches it when it is last closed. Detaching a device that is
// not attached is a no-op.
func DetachLoop(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("opening %s: %w", dev, err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("LOOP_CLR_FD %s: %w", dev, err)
	}
	return nil
}

// GrowLoop makes an attached loop device take the current size of its
// backing file (LOOP_SET_CAPACITY). A device already that size is a no-op.
func GrowLoop(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", dev, err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		return fmt.Errorf("LOOP_SET_CAPACITY %s: %w", dev, err)
	}
	return nil
}

// ErrDiscardsStuck is returned when a loop device's discards cannot be
// turned on again: the kernel keeps the limit a user wrote for the device
// number across detaches, and once it is 0 no other value is accepted
// until the device is removed.
var ErrDiscardsStuck = errors.New("the kernel keeps discards off on this loop device until it is removed")

// SetDiscards makes an attached loop device pass discards on to its backing
// file, which punches holes in it (on: as far as the device can), or refuse
// them (queue/discard_max_bytes 0), so that nothing written to it, neither
// mkfs nor a trim nor a filesystem mounted with discard, hands a thick
// volume's space back. sysBlock is normally /sys/block.
func SetDiscards(sysBlock, dev string, on bool) error {
	queue := filepath.Join(sysBlock, filepath.Base(dev), "queue")
	value := int64(0)
	if on {
		// The limit the device allows, in whole discard granules: the
		// kernel refuses any other.
		hw, err := readInt(filepath.Join(queue, "discard_max_hw_bytes"))
		if err != nil {
			return err
		}
		granule, err := readInt(filepath.Join(queue, "discard_granularity"))
		if err != nil {
			return err
		}
		if hw > 0 && granule == 0 {
			return fmt.Errorf("%s: %w", dev, ErrDiscardsStuck)
		}
		if granule > 0 {
			value = hw / granule * granule
		}
	}
	// A device that already passes discards on, or refuses them, as asked
	// is left as it is (the observation tells the two apart the same way):
	// each write freezes the device's queue (see AttachLoop), and a fresh
	// device passes them on.
	if cur, err := readInt(filepath.Join(queue, "discard_max_bytes")); err == nil && (cur != 0) == on {
		return nil
	}
	if err := os.WriteFile(filepath.Join(queue, "discard_max_bytes"), strconv.AppendInt(nil, value, 10), 0); err != nil {
		return fmt.Errorf("setting the discard limit of %s to %d: %w", dev, value, err)
	}
	return nil
}

// removeLoop removes an unattached loop device, so that the kernel makes
// the number afresh, with its default limits, for its next user. A device
// someone uses meanwhile stays (EBUSY); one removed already is ENODEV.
func removeLoop(dev string) error {
	n, err := strconv.Atoi(strings.TrimPrefix(dev, "/dev/loop"))
	if err != nil {
		return fmt.Errorf("%s is not a loop device", dev)
	}
	ctl, err := os.OpenFile(loopControl, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer ctl.Close()
	if err := unix.IoctlSetInt(int(ctl.Fd()), unix.LOOP_CTL_REMOVE, n); err != nil {
		return fmt.Errorf("LOOP_CTL_REMOVE %s: %w", dev, err)
	}
	return nil
}

// readInt reads a sysfs attribute that holds a number.
func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

// KeepLoop clears the auto-clear flag of an attached loop device, undoing a
// losetup -d that someone ran while the device was mounted: without it the
// device would vanish with its last mount. A device that is not attached is
// an error.
func KeepLoop(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", dev, err)
	}
	defer f.Close()
	info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
	if err != nil {
		return fmt.Errorf("LOOP_GET_STATUS64 %s: %w", dev, err)
	}
	if info.Flags&unix.LO_FLAGS_AUTOCLEAR == 0 {
		return nil
	}
	info.Flags &^= unix.LO_FLAGS_AUTOCLEAR
	if err := unix.IoctlLoopSetStatus64(int(f.Fd()), info); err != nil {
		return fmt.Errorf("LOOP_SET_STATUS64 %s: %w", dev, err)
	}
	return nil
}

// ListLoops returns the attached loop devices, read from sysfs under
// sysBlock (normally /sys/block).
func ListLoops(sysBlock string) ([]host.Device, error) {
	return listLoops(sysBlock, &oneShot{buf: make([]byte, attrBuf)}, nil)
}

// listLoops is ListLoops reading with r. devs caches each device's number
// between listings (nil for none); an entry is used only while r reads the
// device through a descriptor kept since it was made.
//
// Every loop device in sysBlock is visited, attached or not. The kernel's
// list of the attached ones, /proc/partitions (the devices of non-zero
// size), cannot be trusted whole: the kernel writes it a page at a time and
// resumes each page by the index of the next device, so a device removed
// meanwhile (a detached one's number given back, LOOP_CTL_REMOVE) makes the
// next page skip an attached one, which would then read as detached
// (TestListLoopsWhileOthersGo). A directory of sysfs resumes by the next
// name's hash and skips nothing.
func listLoops(sysBlock string, r fileReader, devs map[string]host.DevNum) ([]host.Device, error) {
	names, err := r.names(sysBlock)
	if err != nil {
		return nil, err
	}
	var out []host.Device
	for _, name := range names {
		if !strings.HasPrefix(name, "loop") {
			continue
		}
		d, attached, err := readLoop(sysBlock, name, r, devs)
		if err != nil {
			return nil, err
		}
		if attached {
			out = append(out, d)
		}
	}
	return out, nil
}

// readLoop reads the loop device name from its directory in sysBlock with
// r, and says whether it is attached: a device of size 0, without a
// backing file, or removed meanwhile is not. An attribute the kernel
// wrote and that does not parse is an error. devs is listLoops' cache of
// device numbers.
//
// loopAttrs names every attribute it reads.
func readLoop(sysBlock, name string, r fileReader, devs map[string]host.DevNum) (host.Device, bool, error) {
	dir := sysBlock + "/" + name
	// sysfs gives the size in 512-byte sectors; 0 is a device not
	// attached (or attached to an empty file, which no image is).
	sectors, same, err := r.read(dir + "/size")
	if err != nil {
		return host.Device{}, false, nil // removed meanwhile
	}
	n, err := strconv.ParseInt(strings.TrimSpace(sectors), 10, 64)
	if err != nil {
		return host.Device{}, false, fmt.Errorf("%s/size: %w", dir, err)
	}
	if n == 0 {
		return host.Device{}, false, nil
	}
	backing, _, err := r.read(dir + "/loop/backing_file")
	if err != nil {
		return host.Device{}, false, nil // not attached
	}
	dev, ok, err := loopDevNum(dir, name, r, same, devs)
	if !ok || err != nil {
		return host.Device{}, false, err
	}
	// A deleted backing file reads "<path> (deleted)".
	backingFile := strings.TrimSuffix(strings.TrimSuffix(backing, "\n"), " (deleted)")
	seq, _, _ := r.read(dir + "/diskseq")
	autoclear, _, _ := r.read(dir + "/loop/autoclear")
	discard, _, _ := r.read(dir + "/queue/discard_max_bytes")
	var backingSize, allocated int64
	var st unix.Stat_t
	if err := unix.Stat(backingFile, &st); err == nil {
		backingSize, allocated = st.Size, st.Blocks*512
	}
	discards := strings.TrimSpace(discard)
	return host.Device{
		Device:           "/dev/" + name,
		Dev:              dev,
		AutoClear:        strings.TrimSpace(autoclear) == "1",
		Size:             n * 512,
		BackingSize:      backingSize,
		BackingAllocated: allocated,
		BackingFile:      backingFile,
		Seq:              strings.TrimSpace(seq),
		Discards:         discards != "" && discards != "0",
	}, true, nil
}

// loopAttrs are the attributes of a loop device's directory that readLoop
// reads.
var loopAttrs = []string{"size", "loop/backing_file", "dev", "diskseq", "loop/autoclear", "queue/discard_max_bytes"}

// loopDevNum is the number of the loop device name, whose directory is
// dir: the one cached in devs while same says r still reads the device
// it was read from (a device's number never changes while the device
// exists, and a kept descriptor of a removed device fails), else read
// from dir and cached. ok is false when the device was removed meanwhile.
func loopDevNum(dir, name string, r fileReader, same bool, devs map[string]host.DevNum) (dev host.DevNum, ok bool, err error) {
	if dev, ok := devs[name]; ok && same {
		return dev, true, nil
	}
	devRaw, _, err := r.read(dir + "/dev")
	if err != nil {
		return host.DevNum{}, false, nil // removed meanwhile
	}
	if dev, err = parseDevNum(strings.TrimSpace(devRaw)); err != nil {
		return host.DevNum{}, false, fmt.Errorf("%s/dev: %w", dir, err)
	}
	if devs != nil {
		devs[name] = dev
	}
	return dev, true, nil
}

// attrBuf is the buffer for a sysfs attribute: sysfs hands out at most a
// page, so a read into a larger buffer gets the whole attribute at once.
const attrBuf = 2 * 4096

// fileReader reads sysfs: attributes, and the names in a directory.
type fileReader interface {
	// read reads an attribute whole; same is true when it was read
	// through a descriptor kept open since an earlier listing, or since
	// the device's attach (keptFiles.prime).
	read(path string) (s string, same bool, err error)
	// names lists a directory.
	names(dir string) ([]string, error)
}

// oneShot opens, reads and closes each file.
type oneShot struct{ buf []byte }

func (o *oneShot) read(path string) (string, bool, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", false, err
	}
	defer unix.Close(fd)
	s, err := preadAttr(fd, &o.buf)
	return s, false, err
}

func (o *oneShot) names(dir string) ([]string, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return readNames(fd, &o.buf)
}

// readNames lists the directory open at fd from its current offset.
func readNames(fd int, buf *[]byte) ([]string, error) {
	var names []string
	for {
		n, err := unix.Getdents(fd, *buf)
		if errors.Is(err, unix.EINVAL) && len(*buf) < attrBuf {
			*buf = make([]byte, attrBuf) // too small for the next entry
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent((*buf)[:n], -1, names)
	}
}

// preadAttr reads a sysfs attribute open at fd: one read, unless it filled
// the buffer (more than sysfs hands out for an attribute at once).
func preadAttr(fd int, buf *[]byte) (string, error) {
	n, err := unix.Pread(fd, *buf, 0)
	if err != nil {
		return "", err
	}
	if n < len(*buf) {
		return string((*buf)[:n]), nil
	}
	return preadAll(fd, buf)
}

// preadAll reads the file open at fd from its start to its end, growing
// *buf as needed. The kernel generates these files anew for each read
// from offset 0. A read may come back short before the end (a seq_file
// hands out at most a page of whole lines at a time), so only a read of
// nothing ends it.
func preadAll(fd int, buf *[]byte) (string, error) {
	n := 0
	for {
		if n == len(*buf) {
			*buf = append(*buf, make([]byte, len(*buf))...)
		}
		m, err := unix.Pread(fd, (*buf)[n:], int64(n))
		if err != nil {
			return "", err
		}
		if m == 0 {
			return string((*buf)[:n]), nil
		}
		n += m
	}
}

// keptFiles reads sysfs through descriptors it keeps open between calls:
// one pread each rather than an open, a read and a close. A descriptor is
// never read stale: the kernel generates the file anew for each read, and a
// device's attributes go away when it is removed, and a loop device's loop
// attributes when it is detached, after which their descriptors fail
// (ENODEV, even once the device is attached again); any failure closes the
// descriptor and opens the file anew.
type keptFiles struct {
	// mu guards everything below.
	mu  sync.Mutex
	buf []byte
	fds map[string]*keptFile
	// dir is the directory listed, kept open (-1 before the first
	// listing), dirPath its path.
	dir     int
	dirPath string
	// devs caches the devices' numbers for listLoops.
	devs map[string]host.DevNum
	// round counts listings; a descriptor neither read in the latest
	// nor opened since (prime) is closed.
	round int
	// max bounds the descriptors kept, so that a node with very many loop
	// devices never runs the plugin out of descriptors: past it, files
	// are opened and closed for each read.
	max int
}

type keptFile struct {
	fd    int
	round int
}

func newKeptFiles() *keptFiles {
	// A quarter of the process's descriptor limit (which Go raises to the
	// hard limit at start): up to 5 per attached device, 1 per other.
	max := 256
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil && rl.Cur/4 > uint64(max) {
		max = int(min(rl.Cur/4, 1<<20))
	}
	return &keptFiles{buf: make([]byte, attrBuf), fds: map[string]*keptFile{}, dir: -1, devs: map[string]host.DevNum{}, max: max}
}

func (k *keptFiles) read(path string) (string, bool, error) {
	if f := k.fds[path]; f != nil {
		if s, err := preadAttr(f.fd, &k.buf); err == nil {
			f.round = k.round
			return s, true, nil
		}
		unix.Close(f.fd)
		delete(k.fds, path)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", false, err
	}
	s, err := preadAttr(fd, &k.buf)
	if err != nil || len(k.fds) >= k.max {
		unix.Close(fd)
		return s, false, err
	}
	k.fds[path] = &keptFile{fd: fd, round: k.round}
	return s, false, nil
}

func (k *keptFiles) names(dir string) ([]string, error) {
	if k.dir >= 0 && k.dirPath == dir {
		if _, err := unix.Seek(k.dir, 0, io.SeekStart); err == nil {
			return readNames(k.dir, &k.buf)
		}
	}
	if k.dir >= 0 {
		unix.Close(k.dir)
		k.dir = -1
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	k.dir, k.dirPath = fd, dir
	return readNames(fd, &k.buf)
}

// listLoops is ListLoops with k's descriptors; those of devices no longer
// listed, or no longer attached, are closed.
func (k *keptFiles) listLoops(sysBlock string) ([]host.Device, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.round++
	loops, err := listLoops(sysBlock, k, k.devs)
	for path, f := range k.fds {
		if f.round != k.round {
			unix.Close(f.fd)
			delete(k.fds, path)
		}
	}
	if err == nil {
		listed := make(map[string]bool, len(loops))
		for _, l := range loops {
			listed[strings.TrimPrefix(l.Device, "/dev/")] = true
		}
		for name := range k.devs {
			if !listed[name] {
				delete(k.devs, name)
			}
		}
	}
	return loops, err
}

// readLoops reads the loop devices devs (as "/dev/loopN") and returns
// those attached: through the descriptors the listing keeps when no one
// holds them (a read of a kept descriptor is half the cost of an open, a
// read and a close), else opening and closing each attribute. It never
// waits for them: a pass's listing holds them while it reads every device
// of the machine, which takes tens of milliseconds while devices detach (a
// read of a detaching device's queue attributes waits for the detach), and
// a request's early start must not wait for it.
func (k *keptFiles) readLoops(sysBlock string, devs []string) ([]host.Device, error) {
	var r fileReader = &oneShot{buf: make([]byte, attrBuf)}
	var nums map[string]host.DevNum
	if k.mu.TryLock() {
		defer k.mu.Unlock()
		r, nums = k, k.devs
	}
	var out []host.Device
	for _, dev := range devs {
		name, ok := strings.CutPrefix(dev, "/dev/")
		if !ok || !strings.HasPrefix(name, "loop") || strings.Contains(name, "/") {
			return nil, fmt.Errorf("%s is not a loop device", dev)
		}
		d, attached, err := readLoop(sysBlock, name, r, nums)
		if err != nil {
			return nil, err
		}
		if attached {
			out = append(out, d)
		}
	}
	return out, nil
}

// prime opens, and keeps, the attributes of the loop device name, just
// attached: the first observation of a new device (a request's early
// start right after its stage's attach) then reads each with one pread,
// rather than an open each, which costs more for a device whose sysfs
// files nobody has opened yet (20-30 µs each here). A descriptor of an
// earlier device of that name is replaced. It never waits: while a listing
// holds the descriptors, the device's first read opens them.
func (k *keptFiles) prime(sysBlock, name string) {
	if !k.mu.TryLock() {
		return
	}
	defer k.mu.Unlock()
	// Its number is read through the new descriptors once, not taken from
	// a listing's cache of another device of the name.
	delete(k.devs, name)
	for _, attr := range loopAttrs {
		path := sysBlock + "/" + name + "/" + attr
		if f := k.fds[path]; f != nil {
			unix.Close(f.fd)
			delete(k.fds, path)
		}
		if len(k.fds) >= k.max {
			return
		}
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		k.fds[path] = &keptFile{fd: fd, round: k.round}
	}
}

// close closes every descriptor.
func (k *keptFiles) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for path, f := range k.fds {
		unix.Close(f.fd)
		delete(k.fds, path)
	}
	if k.dir >= 0 {
		unix.Close(k.dir)
		k.dir = -1
	}
}

func parseDevNum(s string) (host.DevNum, error) {
	maj, min, ok := strings.Cut(s, ":")
	if !ok {
		return host.DevNum{}, fmt.Errorf("malformed device number %q", s)
	}
	a, err := strconv.ParseUint(maj, 10, 32)
	if err != nil {
		return host.DevNum{}, err
	}
	b, err := strconv.ParseUint(min, 10, 32)
	if err != nil {
		return host.DevNum{}, err
	}
	return host.DevNum{Major: uint32(a), Minor: uint32(b)}, nil
}

// LoopDevices attaches and detaches loop devices. Its zero value removes a
// thick device's number within Detach; NewLoopDevices' removes it after
// Detach returns (see Removals).
type LoopDevices struct {
	// removals, when not nil, takes the numbers Detach leaves to remove.
	removals *Removals
	// observer, when not nil, is told of each device attached (see
	// Observer.attached).
	observer *Observer
}

// NewLoopDevices returns LoopDevices whose Detach leaves the removal of a
// thick device's number to r, off the caller's path, and whose Attach
// readies o to read the device it attached.
func NewLoopDevices(r *Removals, o *Observer) LoopDevices {
	return LoopDevices{removals: r, observer: o}
}

// SetDiscards calls SetDiscards on /sys/block.
func (LoopDevices) SetDiscards(dev string, on bool) error { return SetDiscards("/sys/block", dev, on) }

// Attach calls AttachLoop. A thin attach first starts the removals
// waiting for detaches to pause (Removals.startNow).
func (l LoopDevices) Attach(image string, discards bool) (string, error) {
	if discards && l.removals != nil {
		l.removals.startNow()
	}
	dev, err := AttachLoop(image, discards)
	if err == nil && l.observer != nil {
		l.observer.attached(dev)
	}
	return dev, err
}

// Grow calls GrowLoop.
func (LoopDevices) Grow(dev string) error { return GrowLoop(dev) }

// Keep calls KeepLoop.
func (LoopDevices) Keep(dev string) error { return KeepLoop(dev) }

// Detach calls DetachLoop and reports whether the device is gone: its
// number has no backing file any more, or another one (a device someone
// else holds open is only marked, and goes at its last close; another
// process may attach the number as soon as it is free).
//
// A device whose discards were turned off (a thick volume's) is removed
// after a detach that left it unattached (by l's Removals, or at once): the
// kernel keeps a device number's discard limit across detaches, and once
// it is 0 nothing but a removal resets it, so the number's next user,
// converge or not, would get a device that passes no discards. Between the
// detach and the removal another process can still be offered the number;
// and a device held open goes at its last close, when converge is not there
// to remove it. Either is logged (the number keeps discards off for whoever
// takes it; converge's own thin attaches remove it and take another).
func (l LoopDevices) Detach(dev string) (gone bool, err error) {
	sys := filepath.Join("/sys/block", filepath.Base(dev))
	off, _ := readInt(filepath.Join(sys, "queue", "discard_max_bytes"))
	backing := func() ([]byte, error) {
		// A deleted backing file reads "<path> (deleted)".
		b, err := os.ReadFile(filepath.Join(sys, "loop", "backing_file"))
		return bytes.TrimSuffix(bytes.TrimSpace(b), []byte(" (deleted)")), err
	}
	before, _ := backing()
	if err := DetachLoop(dev); err != nil {
		return false, err
	}
	after, err := backing()
	gone = errors.Is(err, os.ErrNotExist) || (err == nil && !bytes.Equal(after, before))
	if off != 0 {
		return gone, nil
	}
	logger := klog.Background().WithValues("device", dev)
	if !gone {
		logger.Info("Loop device held open by another user; it detaches at that user's last close and its number then keeps discards off until removed")
		return false, nil
	}
	if err == nil {
		// Attached to another file already: another user's now.
		return true, nil
	}
	// The detach made the disk anew (a new diskseq): this one is to go.
	// Without its diskseq (a kernel before 5.15, or the number gone
	// already) a later removal could not tell it from a number made
	// again since: it is removed now, as it always was.
	seq, serr := os.ReadFile(filepath.Join(sys, "diskseq"))
	n := detached{dev: dev, seq: string(bytes.TrimSpace(seq))}
	if serr != nil || n.seq == "" || l.removals == nil || !l.removals.add(n) {
		removeNumber(n)
	}
	return true, nil
}

// detached is a device left unattached whose number is to be removed: its
// name, and the sequence number of the disk it was (sysfs diskseq; "" when
// the kernel has none).
type detached struct{ dev, seq string }

// removeNumber removes the unattached number of a device whose discards
// were off, and logs when another user holds it first. A number that is
// another disk by now (removed and made again, by anyone: its diskseq
// changed) is not the one detached, and is left alone.
func removeNumber(d detached) {
	dev := d.dev
	if d.seq != "" {
		sys := filepath.Join("/sys/block", filepath.Base(dev))
		cur, err := os.ReadFile(filepath.Join(sys, "diskseq"))
		if err != nil || string(bytes.TrimSpace(cur)) != d.seq {
			// Another disk by now. Attached again before the removal
			// (by converge, or by another loop user, whose device then
			// passes no discards until its detach), it keeps discards
			// off: the backing file tells whose it is.
			if off, err := readInt(filepath.Join(sys, "queue", "discard_max_bytes")); err == nil && off == 0 {
				if backing, err := os.ReadFile(filepath.Join(sys, "loop", "backing_file")); err == nil {
					klog.Background().V(2).Info("Loop device number attached again before its removal; it keeps discards off until its next detach", "device", dev, "backingFile", string(bytes.TrimSpace(backing)))
				}
			}
			return
		}
	}
	if err := removeLoop(dev); err != nil && !errors.Is(err, unix.ENODEV) {
		klog.Background().Info("Loop device number in use before it could be removed; it keeps discards off for its user until that user's detach", "device", dev, "err", err)
	}
}
