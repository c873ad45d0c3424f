package pool

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/state"
)

// TestPoolsKeepBothOrders checks the two orders of a node's pools: start-up
// repairs, probes and logs them as they were given (the default pool
// first), while listings walk them by name.
func TestPoolsKeepBothOrders(t *testing.T) {
	var pools []*Pool
	for _, name := range []string{state.DefaultPool, "zeta", "alpha"} {
		pools = append(pools, New(nil, Options{Name: name, Dir: t.TempDir(), Ratio: 1}))
	}
	ps := NewPools(nil, pools...)
	names := func(pools []*Pool) []string {
		var out []string
		for _, p := range pools {
			out = append(out, p.Name())
		}
		return out
	}
	if got, want := names(ps.Configured()), []string{state.DefaultPool, "zeta", "alpha"}; !slices.Equal(got, want) {
		t.Errorf("Configured: %v, want %v", got, want)
	}
	if got, want := names(ps.All()), []string{"alpha", state.DefaultPool, "zeta"}; !slices.Equal(got, want) {
		t.Errorf("All: %v, want %v", got, want)
	}
}

// TestStatusesReportAnUnreadablePoolBesideTheOthers: a pool whose space
// cannot be read (its directory gone here; a failing disk on a node) is
// reported with its error and nothing measured, and the node's other
// pools are reported as ever.
func TestStatusesReportAnUnreadablePoolBesideTheOthers(t *testing.T) {
	store, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	gone := filepath.Join(t.TempDir(), "gone")
	good := New(store, Options{Name: state.DefaultPool, Dir: t.TempDir(), Ratio: 1})
	bad := New(store, Options{Name: "fast", Dir: gone, Ratio: 1})
	ps := NewPools(store, good, bad).Statuses("node")
	if len(ps) != 2 {
		t.Fatalf("got %d pools, want 2: %+v", len(ps), ps)
	}
	if ps[0].Name != state.DefaultPool || ps[0].Error != "" || ps[0].SizeBytes == 0 {
		t.Errorf("the readable pool: got %+v, want its size and no error", ps[0])
	}
	if ps[1].Name != "fast" || ps[1].Dir != gone || ps[1].Node != "node" || !strings.Contains(ps[1].Error, gone) || ps[1].SizeBytes != 0 {
		t.Errorf("the unreadable pool: got %+v, want its name, directory, node and an error naming %s, nothing measured", ps[1], gone)
	}
}

// TestPoolsOnOneFilesystemAreLeftOut: two pools other than the default one
// on one filesystem (the default pool's data directory on a disk of its
// own, and neither pool's disk mounted) cannot tell which is on its own
// disk: both are left out and reported, and the default pool is served.
func TestPoolsOnOneFilesystemAreLeftOut(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts a tmpfs: needs root")
	}
	data := t.TempDir()
	if err := unix.Mount("tmpfs", data, "tmpfs", 0, "size=8m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(data, unix.MNT_DETACH) })
	store, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	root := t.TempDir()
	var opts []Options
	for _, o := range []struct{ name, dir string }{{state.DefaultPool, data}, {"fast", filepath.Join(root, "fast")}, {"slow", filepath.Join(root, "slow")}} {
		if err := os.MkdirAll(o.dir, 0o700); err != nil {
			t.Fatal(err)
		}
		opts = append(opts, Options{Name: o.name, Dir: o.dir, Ratio: 1})
	}
	ps, err := Open(store, opts, t.TempDir())
	if err != nil {
		t.Fatalf("opening the pools: %v, want the default one served", err)
	}
	var served []string
	for _, p := range ps.Configured() {
		served = append(served, p.Name())
	}
	if !slices.Equal(served, []string{state.DefaultPool}) {
		t.Errorf("served: got %v, want the default pool alone", served)
	}
	for _, st := range ps.Statuses("node") {
		if left := st.Name != state.DefaultPool; left != (st.Error != "") || (left && !strings.Contains(st.Error, "on one filesystem")) {
			t.Errorf("pool %s: got error %q, want one saying it shares a filesystem: %v", st.Name, st.Error, left)
		}
	}
}
