package devices

import (
	"fmt"
	"os"

	utilexec "k8s.io/utils/exec"
)

// A mkfs that is killed part way (its plugin stopped at the end of a pod's
// grace period, an OOM kill, a node that lost power) can leave the start of
// a filesystem that blkid names but no kernel mounts. mkfs.xfs writes its
// first superblock with sb_inprogress set and clears it only once every
// other structure is written, for most of its run; blkid reports such a
// device as xfs, and the kernel refuses to mount it ("Offline file system
// operation in progress"). mke2fs and mkfs.btrfs write the superblock that
// names their filesystem last, so an unfinished one reads as no
// filesystem.

const (
	// xfsMagic starts an xfs superblock (XFS_SB_MAGIC).
	xfsMagic = "XFSB"
	// xfsInProgressOffset is the offset of sb_inprogress in an xfs
	// superblock (struct xfs_dsb): after the 12-byte label at 108, the
	// six log-size bytes at 120.
	xfsInProgressOffset = 126
)

// xfsUnfinished reports whether dev starts with an xfs superblock whose
// mkfs never finished (sb_inprogress set).
func xfsUnfinished(dev string) (bool, error) {
	f, err := os.Open(dev)
	if err != nil {
		return false, err
	}
	defer f.Close()
	sb := make([]byte, 512)
	if _, err := f.ReadAt(sb, 0); err != nil {
		return false, fmt.Errorf("reading the superblock of %s: %w", dev, err)
	}
	return string(sb[:len(xfsMagic)]) == xfsMagic && sb[xfsInProgressOffset] != 0, nil
}

// Redo returns the probe that makes FormatAndMount format p's device anew
// over a filesystem whose mkfs never finished (p.Unfinished): to
// mount-utils' blkid it answers that nothing is found, and the mkfs
// mount-utils then runs writes over what the unfinished one left (it
// forces mkfs.xfs with -f). Only the caller can tell whether that
// unfinished mkfs was its own to redo.
func (p Probe) Redo() Probe {
	return Probe{Device: p.Device, blkid: &commandRun{
		device: p.Device,
		err:    utilexec.CodeExitError{Err: fmt.Errorf("%s holds a %s whose mkfs never finished", p.Device, p.Type), Code: blkidNothingFound},
	}}
}
