package pool

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

// Restore is a volume being copied from a snapshot. A copy may take
// minutes (a sparse copy of many gigabytes), longer than a request waits
// (external-provisioner's --timeout is 10 s by default): it goes on past
// the request that started it, and the retries of the request wait for it
// (Pool.RestoreOf, Wait).
type Restore struct {
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

// Wait waits for the copy to end and returns its failure. When ctx ends
// first the copy goes on, and the error says so: the retry of the request
// finds it.
func (r *Restore) Wait(ctx context.Context) error {
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return fmt.Errorf("volume %s is still being restored from snapshot %s; the restore goes on, and a retry of the request finds it: %w", r.volume, r.snapshot, ctx.Err())
	}
}

// SnapshotID is the snapshot the volume is copied from.
func (r *Restore) SnapshotID() string { return r.snapshot }

// restores are the copies from snapshots under way, by volume ID. A copy
// is registered, and deregistered once it has ended, under the pool's lock
// (see Promise.StartRestore), so that its volume is promised its size from
// before the copy starts until its image counts itself.
type restores struct {
	// mu guards jobs. It is taken alone, also inside the pool's lock.
	mu   locks.Mutex
	jobs map[string]*Restore
	// running counts the copies' goroutines, which stop joins.
	running sync.WaitGroup
}

// get returns the restore of volume id under way, or nil.
func (rs *restores) get(id string) *Restore {
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

func (rs *restores) add(r *Restore) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.jobs == nil {
		rs.jobs = map[string]*Restore{}
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
func (rs *restores) run(r *Restore, copy func() error, end func(err error)) {
	rs.running.Add(1)
	go func() {
		defer rs.running.Done()
		end(contained(r, copy))
	}()
}

// contained runs copy and turns its panic into the restore's failure.
func contained(r *Restore, copy func() error) (err error) {
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

// StartRestore starts copying snapshot snap into the image of volume id,
// of size bytes, promised already, in the background, and registers the
// copy. The copy goes on whatever becomes of the request: it ends whole or
// absent (devices.CopyFile), and on failure the record's provisioning is
// cleared as for any volume not made. The snapshot is in from, this
// pool's snapshots or another pool's. release runs when the copy has
// ended.
func (pr Promise) StartRestore(id, name string, from *Pool, snap devices.SnapshotInfo, size int64, prov state.Provisioning, release func()) *Restore {
	p := pr.p
	r := &Restore{volume: id, snapshot: snap.ID, source: snap.Allocated, size: size, thin: prov == state.ProvisionThin, done: make(chan struct{})}
	p.restores.add(r)
	klog.InfoS("Restoring volume from snapshot; the copy goes on past the request", "volumeID", id, "pool", p.Name(), "snapshotID", snap.ID, "bytes", size, "snapshotAllocatedBytes", snap.Allocated)
	copy := func() error { return p.copy(p.copies, p, id, from, snap, size, prov == state.ProvisionThick) }
	p.restores.run(r, copy, func(err error) {
		defer release()
		// The copy has ended (whole, or absent when err) and is still
		// registered.
		// gofail: var poolRestoreAfterCopy struct{}
		p.Within(func(pr Promise) error {
			p.restores.remove(id)
			if err != nil {
				pr.unrecord(id)
				klog.ErrorS(err, "Restore failed", "volumeID", id, "snapshotID", snap.ID)
			} else {
				klog.InfoS("Restored volume from snapshot", "volumeID", id, "name", name, "pool", p.Name(), "bytes", size, "provisioning", prov, "snapshotID", snap.ID)
			}
			return nil
		})
		r.err = err
		close(r.done)
	})
	return r
}

// CopySnapshot makes the image of volume id in pool into, size bytes, from
// snapshot snap, which from holds: the copy, grown to size, every block
// allocated for a thick volume, which appears whole or not at all (a crash
// in between leaves no image, and the retried CreateVolume makes it anew).
// A snapshot of into is copied as into copies (a reflink where it can);
// one of another pool, on another filesystem, by a sparse copy. The
// controller's DeleteSnapshot refuses the snapshot while its restore is
// registered (Pools.RestoresFrom); one deleted before is NOT_FOUND. It is
// the CopyFunc of a pool whose Options name none.
func CopySnapshot(ctx context.Context, into *Pool, id string, from *Pool, snap devices.SnapshotInfo, size int64, thick bool) error {
	var err error
	if from == into {
		err = into.snapshots.Restore(ctx, snap.ID, into.images.Path(id), size, thick)
	} else {
		err = devices.CopyFile(ctx, from.snapshots.Path(snap.ID), into.images.Path(id), devices.CopySparse, devices.CopyOptions{Size: size, Thick: thick})
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
func (p *Pool) Restoring() []Restoring {
	out := p.restores.list()
	for i, r := range out {
		if u, err := p.images.Copying(r.VolumeID); err == nil {
			out[i].Copied = min(u.Allocated, r.SourceBytes)
		}
	}
	return out
}
