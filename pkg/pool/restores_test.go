package pool

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
)

// snapshotted returns a pool whose restores copy as copy says, its store,
// and snapshot "s" of a thick volume "v" made in it.
func snapshotted(t *testing.T, copy CopyFunc) (*Pool, *state.Store, devices.SnapshotInfo) {
	t.Helper()
	store, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	p := New(store, Options{Dir: t.TempDir(), Ratio: 1, CopyMode: devices.CopySparse, Copy: copy})
	t.Cleanup(p.Close)
	err = p.Within(func(pr Promise) error {
		if err := pr.Record("v", "v", state.ProvisionThick, state.AccessMount, host.IOLimits{}); err != nil {
			return err
		}
		return pr.MakeImage("v", MinVolumeSize, state.ProvisionThick)
	})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := p.Take(t.Context(), "s", p.Image("v"), devices.SnapshotOf{Source: "v"}, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	return p, store, snap
}

// restore makes volume id of p from snap as CreateVolume does, promised
// and recorded within the promise, and waits for its copy.
func restore(ctx context.Context, p *Pool, id string, snap devices.SnapshotInfo) error {
	var r *Restore
	err := p.Within(func(pr Promise) error {
		if err := pr.CheckVolume(false, MinVolumeSize, 0); err != nil {
			return err
		}
		if err := pr.Record(id, id, state.ProvisionThick, state.AccessMount, host.IOLimits{}); err != nil {
			return err
		}
		r = pr.StartRestore(id, id, p, snap, MinVolumeSize, state.ProvisionThick, func() {})
		return nil
	})
	if err != nil {
		return err
	}
	return r.Wait(ctx)
}

// TestRestorePanicIsContained checks that a copy that panics fails its
// restore, as INTERNAL naming the panic, leaves no image or record of a
// volume made, and that the plugin goes on: the next restore works.
func TestRestorePanicIsContained(t *testing.T) {
	var panicking atomic.Bool
	panicking.Store(true)
	p, store, snap := snapshotted(t, func(ctx context.Context, into *Pool, id string, from *Pool, snap devices.SnapshotInfo, size int64, thick bool) error {
		if panicking.Load() {
			panic("copy went wrong")
		}
		return CopySnapshot(ctx, into, id, from, snap, size, thick)
	})
	err := restore(t.Context(), p, "r", snap)
	if e := classified.AsError(err); err == nil || e.Kind != classified.KindInternal || !strings.Contains(err.Error(), "copy went wrong") {
		t.Fatalf("a restore whose copy panics: got %v, want INTERNAL naming the panic", err)
	}
	if _, err := p.ImageSize("r"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the failed restore left an image: %v", err)
	}
	if v, err := store.Get("r"); err == nil && v.Provisioning != "" {
		t.Errorf("the failed restore left the record of a volume made %s", v.Provisioning)
	}
	if got := p.Restoring(); len(got) != 0 {
		t.Errorf("restores under way after the panic: %+v", got)
	}
	panicking.Store(false)
	if err := restore(t.Context(), p, "r", snap); err != nil {
		t.Errorf("the restore after the panic: %v", err)
	}
}

// TestCloseEndsRestores checks that Close ends a copy under way (through
// its context) and returns only once the copy has ended, leaving no image.
func TestCloseEndsRestores(t *testing.T) {
	started, ended := make(chan struct{}), make(chan struct{})
	p, _, snap := snapshotted(t, func(ctx context.Context, _ *Pool, _ string, _ *Pool, _ devices.SnapshotInfo, _ int64, _ bool) error {
		close(started)
		<-ctx.Done()
		// Slow to end, so that a Close that does not wait returns first.
		time.Sleep(20 * time.Millisecond)
		close(ended)
		return ctx.Err()
	})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	if err := restore(ctx, p, "r", snap); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the request: got %v, want its deadline exceeded while the copy goes on", err)
	}
	<-started
	p.Close()
	select {
	case <-ended:
	default:
		t.Fatal("Close returned before the copy ended")
	}
	if _, err := p.ImageSize("r"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the ended copy left an image: %v", err)
	}
}
