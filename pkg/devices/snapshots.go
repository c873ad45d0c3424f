package devices

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// snapshotSuffix ends every snapshot file name.
	snapshotSuffix = ".snap"
	// The extended attributes a snapshot file carries: the volume it was
	// taken of, and when (RFC 3339, nanoseconds).
	xattrSource  = "user.converge.source"
	xattrCreated = "user.converge.created"
	// xattrFsType is the filesystem the volume carried, when it had one.
	xattrFsType = "user.converge.fstype"
	// xattrAccess is how the volume's data may have been written (see
	// SnapshotOf.Access); snapshots taken before it was recorded lack it.
	xattrAccess = "user.converge.access"
	// xattrGroup is the group snapshot the snapshot is a member of.
	xattrGroup = "user.converge.group"
)

// Snapshots keeps the snapshots of this node's volumes: one file each in
// Dir (on the data directory's filesystem, so that a reflink can share
// the image's blocks), a copy of the volume's image made by CopyFile. What
// it was taken of, and when, are extended attributes set before the copy
// is renamed to its name, so a snapshot file never lacks them. IDs must
// have been validated by the caller.
type Snapshots struct {
	// Dir holds the snapshot files.
	Dir string
	// Mode is how Dir's filesystem copies (ProbeCopyMode).
	Mode CopyMode
}

// SnapshotOf is what a snapshot records of the volume it was taken of.
type SnapshotOf struct {
	// Source is the ID of the volume.
	Source string
	// FsType is the filesystem the volume carried when it was taken; ""
	// when it had none the plugin knew of (a raw block volume).
	FsType string
	// Access is how the volume's data may have been written when it was
	// taken, as the caller names it ("block": raw, "mount": only through
	// its filesystem); "" for a snapshot taken before snapshots recorded
	// it.
	Access string
	// Group is the ID of the group snapshot it is a member of; "" for a
	// snapshot taken alone.
	Group string
}

// SnapshotInfo describes a snapshot.
type SnapshotInfo struct {
	ID string
	SnapshotOf
	// Size is the size of the image it holds: the least a volume
	// restored from it can be.
	Size int64
	// Allocated is what its file allocates (blocks it shares with the
	// image or other snapshots counted in full).
	Allocated int64
	// Created is when it was taken.
	Created time.Time
}

// Path returns the file of snapshot id.
func (s *Snapshots) Path(id string) string {
	return filepath.Join(s.Dir, id+snapshotSuffix)
}

// Take copies image, the image of the volume of, to snapshot id, as
// CopyFile does (whole or absent after a crash), stamped with of and now.
// An existing snapshot id is an error matching os.ErrExist.
func (s *Snapshots) Take(ctx context.Context, id, image string, of SnapshotOf, now time.Time) (SnapshotInfo, error) {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return SnapshotInfo{}, err
	}
	attrs := map[string]string{xattrSource: of.Source, xattrCreated: now.UTC().Format(time.RFC3339Nano)}
	if of.FsType != "" {
		attrs[xattrFsType] = of.FsType
	}
	if of.Access != "" {
		attrs[xattrAccess] = of.Access
	}
	if of.Group != "" {
		attrs[xattrGroup] = of.Group
	}
	if err := CopyFile(ctx, image, s.Path(id), s.Mode, CopyOptions{Attrs: attrs}); err != nil {
		return SnapshotInfo{}, err
	}
	return s.Get(id)
}

// Flush writes out what is dirty of image, so that a copy of it that
// follows (a reflink writes the source out first) has little left to
// write while the volume's filesystem is frozen.
func (s *Snapshots) Flush(image string) error { return flushFile(image) }

// flushFile writes out what is dirty of the file at path.
func flushFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Fdatasync(int(f.Fd()))
}

// TempID returns the ID of a snapshot that serves only to make something
// (a clone): List never shows it, and RemoveStaleTemps removes it.
func (s *Snapshots) TempID(name string) string { return tempPrefix + name }

// IsTemp reports whether id is a TempID.
func (s *Snapshots) IsTemp(id string) bool { return strings.HasPrefix(id, tempPrefix) }

// Taken reports whether snapshot id exists.
func (s *Snapshots) Taken(id string) (bool, error) {
	_, err := os.Stat(s.Path(id))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// Restore copies snapshot id to image, which must not exist, as CopyFile
// does, grown to size bytes where the snapshot is smaller and with every
// block allocated when thick: the image appears whole, of its size and
// with its space, or not at all, whenever a crash comes.
func (s *Snapshots) Restore(ctx context.Context, id, image string, size int64, thick bool) error {
	return CopyFile(ctx, s.Path(id), image, s.Mode, CopyOptions{Size: size, Thick: thick})
}

// Get describes snapshot id; an error matching os.ErrNotExist when there
// is none.
func (s *Snapshots) Get(id string) (SnapshotInfo, error) {
	path := s.Path(id)
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return SnapshotInfo{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	source, err := getXattr(path, xattrSource)
	if err != nil {
		return SnapshotInfo{}, err
	}
	raw, err := getXattr(path, xattrCreated)
	if err != nil {
		return SnapshotInfo{}, err
	}
	created, err := time.Parse(time.RFC3339Nano, raw)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("snapshot %s: creation time %q: %w", id, raw, err)
	}
	fsType, err := getXattr(path, xattrFsType)
	if err != nil && !errors.Is(err, unix.ENODATA) {
		return SnapshotInfo{}, err
	}
	access, err := getXattr(path, xattrAccess)
	if err != nil && !errors.Is(err, unix.ENODATA) {
		return SnapshotInfo{}, err
	}
	group, err := getXattr(path, xattrGroup)
	if err != nil && !errors.Is(err, unix.ENODATA) {
		return SnapshotInfo{}, err
	}
	return SnapshotInfo{ID: id, SnapshotOf: SnapshotOf{Source: source, FsType: fsType, Access: access, Group: group},
		Size: st.Size, Allocated: st.Blocks * 512, Created: created}, nil
}

// List describes every snapshot, sorted by ID. A snapshot deleted while
// it lists is left out.
func (s *Snapshots) List() ([]SnapshotInfo, error) {
	ids, err := idsIn(s.Dir, snapshotSuffix)
	if err != nil {
		return nil, err
	}
	var out []SnapshotInfo
	for _, id := range ids {
		info, err := s.Get(id)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}

// Delete removes snapshot id. A missing snapshot is a no-op.
func (s *Snapshots) Delete(id string) error { return removeSynced(s.Path(id)) }

// RemoveStaleTemps removes what crashed snapshots left (see CopyFile).
// Call it when no snapshot is being taken.
func (s *Snapshots) RemoveStaleTemps() error { return RemoveStaleTemps(s.Dir) }

// getXattr reads the extended attribute name of path.
func getXattr(path, name string) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Getxattr(path, name, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, 2*len(buf))
			continue
		}
		if err != nil {
			return "", &os.PathError{Op: "getxattr " + name, Path: path, Err: err}
		}
		return string(buf[:n]), nil
	}
}
