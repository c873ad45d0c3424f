package pool

import (
	"path/filepath"
	"testing"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/state"
)

// TestForVolumeOfAPoolNotHere checks what the pools answer for a volume
// whose record names a pool this node does not have: no pool, and the
// Missing one in its place, which names it, refuses a request for it as
// RESOURCE_EXHAUSTED naming the pools the node has, and fails a call about
// the volume's image saying which pool and which flag.
func TestForVolumeOfAPoolNotHere(t *testing.T) {
	store, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if _, err := store.Update("v", func(v *state.Volume) error { v.Pool = "gone"; return nil }); err != nil {
		t.Fatal(err)
	}
	ps := NewPools(store, New(store, Options{Dir: t.TempDir(), Ratio: 1}), New(store, Options{Name: "fast", Dir: t.TempDir(), Ratio: 1}))
	p, missing := ps.ForVolume("v")
	if p != nil || missing == nil || missing.Name() != "gone" {
		t.Fatalf("ForVolume: got %v, %+v; want no pool and the missing pool gone", p, missing)
	}
	err = missing.Err()
	if got, want := err.Error(), "this node has no storage pool gone (it has default, fast)"; got != want {
		t.Errorf("Err: got %q, want %q", got, want)
	}
	if e := classified.AsError(err); e.Kind != classified.KindResourceExhausted {
		t.Errorf("Err: got %s, want ResourceExhausted", e.Kind)
	}
	if _, err := ps.ImageSize("v"); err == nil || err.Error() != `this node has no storage pool "gone" (--pool)` {
		t.Errorf("ImageSize: got %v", err)
	}
	if p, missing := ps.ForVolume("other"); p == nil || missing != nil || p.Name() != state.DefaultPool {
		t.Errorf("ForVolume of a volume without a record: got %v, %v; want the default pool", p, missing)
	}
}
