package controller

import (
	"slices"
	"testing"

	"github.com/converge-csi/converge/pkg/state"
)

// TestPoolsKeepBothOrders checks the two orders of a node's pools: start-up
// repairs, probes and logs them as they were given (the default pool
// first), while listings walk them by name.
func TestPoolsKeepBothOrders(t *testing.T) {
	var pools []*Pool
	for _, name := range []string{state.DefaultPool, "zeta", "alpha"} {
		pools = append(pools, NewPool(nil, PoolOptions{Name: name, Dir: t.TempDir(), Ratio: 1}))
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
