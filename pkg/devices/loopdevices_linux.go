package devices

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

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
