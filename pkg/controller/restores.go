package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/capacity"
	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/locks"
	"github.com/converge-csi/converge/pkg/state"
)

// restore is a volume being copied from a snapshot. A copy may take
// minutes (a sparse copy of many gigabytes), longer than a request waits
// (external-provisioner's --timeout is 10 s by default): it goes on past
// the request that started it, and the retries of the request wait for it.
type restore struct {
	volume, snapshot string
	// source is the data of the snapshot (its allocated bytes), which the
	// copy reads.
	source int64
	// size and thin are what the volume is promised while it is copied.
	size int64
	thin bool
	// done is closed when the copy has ended, err set before.
	done chan struct{}
	err  error
}

// wait waits for the copy to end and returns its failure. When ctx ends
// first the copy goes on, and the error says so: the retry of the request
// finds it.
func (r *restore) wait(ctx context.Context) error {
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return fmt.Errorf("volume %s is still being restored from snapshot %s; the restore goes on, and a retry of the request finds it: %w", r.volume, r.snapshot, ctx.Err())
	}
}

// restores are the copies from snapshots under way, by volume ID. A copy
// is registered, and deregistered once it has ended, under the space's lock
// (see Pool.startRestore), so that its volume is promised its size from
// before the copy starts until its image counts itself.
type restores struct {
	// mu guards jobs. It is taken alone, also inside the space's lock.
	mu   locks.Mutex
	jobs map[string]*restore
	// running counts the copies' goroutines, which stop joins.
	running sync.WaitGroup
}

// get returns the restore of volume id under way, or nil.
func (rs *restores) get(id string) *restore {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.jobs[id]
}

// from counts the restores that copy from snapshot id, which is not
// deleted meanwhile.
func (rs *restores) from(id string) int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	n := 0
	for _, r := range rs.jobs {
		if r.snapshot == id {
			n++
		}
	}
	return n
}

func (rs *restores) add(r *restore) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.jobs == nil {
		rs.jobs = map[string]*restore{}
	}
	rs.jobs[r.volume] = r
}

func (rs *restores) remove(id string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	delete(rs.jobs, id)
}

// promised returns what the volumes being restored are promised, by ID.
func (rs *restores) promised() map[string]capacity.Image {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	out := make(map[string]capacity.Image, len(rs.jobs))
	for id, r := range rs.jobs {
		out[id] = capacity.Image{Size: r.size, Thin: r.thin}
	}
	return out
}

// list returns the restores under way in volume ID order, without how far
// their copies are.
func (rs *restores) list() []Restoring {
	rs.mu.Lock()
	out := make([]Restoring, 0, len(rs.jobs))
	for id, r := range rs.jobs {
		out = append(out, Restoring{VolumeID: id, SnapshotID: r.snapshot, Bytes: r.size, SourceBytes: r.source})
	}
	rs.mu.Unlock()
	slices.SortFunc(out, func(a, b Restoring) int { return strings.Compare(a.VolumeID, b.VolumeID) })
	return out
}

// run runs copy in a goroutine that stop joins, then end with its failure;
// a copy that panics fails with its stack logged, and the plugin lives on.
func (rs *restores) run(r *restore, copy func() error, end func(err error)) {
	rs.running.Add(1)
	go func() {
		defer rs.running.Done()
		end(contained(r, copy))
	}()
}

// contained runs copy and turns its panic into the restore's failure.
func contained(r *restore, copy func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			klog.ErrorS(nil, "Restore panicked", "volumeID", r.volume, "snapshotID", r.snapshot, "panic", p, "stack", string(debug.Stack()))
			err = classified.Errorf(classified.KindInternal, "restoring volume %s from snapshot %s failed: internal error: %v", r.volume, r.snapshot, p)
		}
	}()
	return copy()
}

// stop waits for every copy's goroutine to end.
func (rs *restores) stop() { rs.running.Wait() }

// startRestore starts copying snapshot snap into the image of volume id,
// of size bytes, promised already, in the background, and registers the
// copy. The copy goes on whatever becomes of the request: it ends whole or
// absent (devices.CopyFile), and on failure the record's provisioning is
// cleared as for any volume not made. The snapshot is in from, this
// pool's snapshots or another pool's. release runs when the copy has
// ended.
func (p promise) startRestore(id, name string, from *Pool, snap devices.SnapshotInfo, size int64, prov state.Provisioning, release func()) *restore {
	s := p.s
	r := &restore{volume: id, snapshot: snap.ID, source: snap.Allocated, size: size, thin: prov == state.ProvisionThin, done: make(chan struct{})}
	s.restores.add(r)
	klog.InfoS("Restoring volume from snapshot; the copy goes on past the request", "volumeID", id, "pool", s.Name(), "snapshotID", snap.ID, "bytes", size, "snapshotAllocatedBytes", snap.Allocated)
	copy := func() error { return s.restoreImage(s.copies, id, from, snap, size, prov == state.ProvisionThick) }
	s.restores.run(r, copy, func(err error) {
		defer release()
		// The copy has ended (whole, or absent when err) and is still
		// registered.
		// gofail: var controllerRestoreAfterCopy struct{}
		s.within(func(p promise) error {
			s.restores.remove(id)
			if err != nil {
				p.unrecord(id)
				klog.ErrorS(err, "Restore failed", "volumeID", id, "snapshotID", snap.ID)
			} else {
				klog.InfoS("Restored volume from snapshot", "volumeID", id, "name", name, "pool", s.Name(), "bytes", size, "provisioning", prov, "snapshotID", snap.ID)
			}
			return nil
		})
		r.err = err
		close(r.done)
	})
	return r
}

// copySnapshot makes the image of volume id, size bytes, from snapshot
// snap, which from holds: the copy, grown to size, every block allocated
// for a thick volume, which appears whole or not at all (a crash in
// between leaves no image, and the retried CreateVolume makes it anew).
// A snapshot of this pool is copied as the pool copies (a reflink where it
// can); one of another pool, on another filesystem, by a sparse copy.
// DeleteSnapshot refuses the snapshot while its restore is registered;
// one deleted before is NOT_FOUND.
func (s *Pool) copySnapshot(ctx context.Context, id string, from *Pool, snap devices.SnapshotInfo, size int64, thick bool) error {
	var err error
	if from == s {
		err = s.snapshots.Restore(ctx, snap.ID, s.images.Path(id), size, thick)
	} else {
		err = devices.CopyFile(ctx, from.snapshots.Path(snap.ID), s.images.Path(id), devices.CopySparse, devices.CopyOptions{Size: size, Thick: thick})
	}
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return classified.Errorf(classified.KindNotFound, "snapshot %s not found", snap.ID)
		}
		return imageError(err, "restoring volume %s from snapshot %s", id, snap.ID)
	}
	return nil
}

// Restoring is a volume being copied from a snapshot, promised Bytes.
type Restoring struct {
	VolumeID, SnapshotID string
	// Bytes is the volume's size, promised to it until it is made.
	Bytes int64
	// Copied is what the copy holds so far, at most SourceBytes, the
	// snapshot's data: Copied of SourceBytes tells how far it is (a thick
	// copy then allocates the rest of its size).
	Copied, SourceBytes int64
}

// Restoring lists the volumes being copied from a snapshot, by ID, with
// how far each copy is (Copied 0 when that cannot be read).
func (s *Pool) Restoring() []Restoring {
	out := s.restores.list()
	for i, r := range out {
		if u, err := s.images.Copying(r.VolumeID); err == nil {
			out[i].Copied = min(u.Allocated, r.SourceBytes)
		}
	}
	return out
}
