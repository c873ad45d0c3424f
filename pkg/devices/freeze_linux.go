package devices

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// FIFREEZE and FITHAW (linux/fs.h: _IOWR('X', 119, int) and
// _IOWR('X', 120, int)), which x/sys does not define.
const (
	fifreeze = 0xC0045877
	fithaw   = 0xC0045878
)

// ErrFrozen is returned by Freeze for a filesystem that is frozen already
// (by someone else, or by a freeze a crash left behind).
var ErrFrozen = errors.New("the filesystem is frozen already")

// Freeze freezes the filesystem mounted at path, resolved beneath the
// roots without symlinks: its writes block, and what was written is on
// its device, until Thaw. A filesystem that is frozen already is
// ErrFrozen; one that cannot be frozen (no freeze support) is an error
// matching EOPNOTSUPP.
func (p *Paths) Freeze(path string) error {
	return p.freezeIoctl(path, fifreeze, "FIFREEZE")
}

// Sync writes out what is dirty in the filesystem mounted at path
// (syncfs), while its writes go on: done before Freeze, the freeze has
// only what came meanwhile to write.
func (p *Paths) Sync(path string) error {
	fd, err := p.openAs(path, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("syncfs %s: %w", path, err)
	}
	return nil
}

// Thaw thaws the filesystem mounted at path. A filesystem that is not
// frozen is a no-op.
func (p *Paths) Thaw(path string) error {
	return p.freezeIoctl(path, fithaw, "FITHAW")
}

func (p *Paths) freezeIoctl(path string, req uint, name string) error {
	fd, err := p.openAs(path, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	err = unix.IoctlSetInt(fd, req, 0)
	switch {
	case err == nil:
		return nil
	case req == fifreeze && errors.Is(err, unix.EBUSY):
		return fmt.Errorf("%s %s: %w", name, path, ErrFrozen)
	case req == fithaw && errors.Is(err, unix.EINVAL):
		return nil // not frozen
	}
	return fmt.Errorf("%s %s: %w", name, path, err)
}
