package devices

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/locks"
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
			// period, and the other attaches need not wait for it
			// (BenchmarkAttachBurst).
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
var attachMu locks.Mutex

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
