package devices

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/locks"
)

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
	mu  locks.Mutex
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
// files nobody has opened yet. A descriptor of an
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
