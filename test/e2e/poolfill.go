package e2e

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/test/e2e/runs"
)

// A pool filled to its last block: one of the soak's faults (issue 71).
// A ballast file takes every free block of the pool's filesystem, and
// whatever the node writes there next (a thin volume's new block, a new
// image, a clone) fails with ENOSPC until the ballast goes.

// ballastName is the name of the ballast fillPool puts in a pool's
// directory: <pool>/.soak-ballast as the host sees it, so on the node
// /var/lib/converge-pools/<pool>/.soak-ballast for a pool of its pools'
// root and /var/lib/converge/volumes/.soak-ballast for its data
// directory. Hidden, so that csi-node never takes it for an image (it
// lists <id>.img, hidden names aside) nor for a temporary file of its own
// (.tmp-*, which it removes when it starts).
const ballastName = ".soak-ballast"

// fillBufSize is the size of fillPool's writes once fallocate has taken
// what it could: what is left is little.
const fillBufSize = 1 << 20

// fillablePools lists, as the host sees them, the node's pools that are
// filesystems of their own, which a soak may fill (fillPool): its data
// directory when it is one (the second node's) and each pool of its pools'
// root that is one (the first node's fast). A pool on the machine's disk
// (the first node's default pool, in the run's directory) is never
// listed: filling it would fill the machine's disk.
func (n *kubeNode) fillablePools() []string {
	pools, _ := filepath.Glob(filepath.Join(n.poolsDir, "*"))
	return runs.LoopFilesystems(append([]string{n.dataDir}, pools...)...)
}

// fillPool fills the filesystem at dir, a pool's directory as the host
// sees it (one of fillablePools), to ENOSPC with a ballast file,
// <dir>/.soak-ballast (ballastName), and returns free, which removes it
// (a ballast gone already: a no-op). A ballast there already is an error,
// and is left as it is; on any other error nothing of the ballast stays.
// A dir that is not a filesystem of its own in an image (the machine's
// disk, say) is refused.
func fillPool(dir string) (free func() error, err error) {
	if len(runs.LoopFilesystems(dir)) == 0 {
		return nil, fmt.Errorf("%s is not a filesystem of its own on a loop device: not filled", dir)
	}
	path := filepath.Join(dir, ballastName)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("the ballast of %s: %w", dir, err)
	}
	free = func() error {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	err = fill(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		free()
		return nil, fmt.Errorf("fill %s: %w", dir, err)
	}
	return free, nil
}

// fill takes every free block of f's filesystem into f, an empty file:
// first what statfs says is available, with fallocate (in halves, when
// the filesystem needs some of it for the file's own metadata), then with
// writes of ever fewer bytes, each size until ENOSPC, which take what
// fallocate left and what statfs does not count (blocks kept for root);
// then it syncs f.
func fill(f *os.File) error {
	fd := int(f.Fd())
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return err
	}
	var off int64
	for size := int64(st.Bavail) * st.Bsize; size >= st.Bsize; {
		err := unix.Fallocate(fd, 0, off, size)
		switch {
		case err == nil:
			off += size
		case errors.Is(err, unix.ENOSPC):
			size /= 2
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EOPNOTSUPP):
			size = 0 // the writes take it all
		default:
			return fmt.Errorf("fallocate: %w", err)
		}
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		return err
	}
	buf := make([]byte, fillBufSize)
	for _, n := range []int{fillBufSize, min(int(st.Bsize), fillBufSize), 1} {
		for {
			if _, err := f.Write(buf[:n]); errors.Is(err, unix.ENOSPC) {
				break
			} else if err != nil {
				return err
			}
		}
	}
	return f.Sync()
}
