package soak

import (
	"testing"
	"time"
)

// TestFullSeedHoldsEveryKind: the plan of FullSeed, two minutes on two
// nodes (make test's short soak), holds an event of every kind, so that
// every fault and operation runs in every make test whatever the random
// seed beside it draws (hack/test.sh's SOAK_SEED is full+0). A change of
// the kinds that breaks this needs a new FullSeed.
func TestFullSeedHoldsEveryKind(t *testing.T) {
	kinds := Kinds(2)
	plan, err := Plan(FullSeed, 2*time.Minute, kinds)
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]int{}
	for _, e := range plan {
		held[e.Kind]++
	}
	for _, k := range kinds {
		if held[k.Name] == 0 {
			t.Errorf("seed %d's plan of 2m holds no %s event (%v)", FullSeed, k.Name, held)
		}
	}
}
