package soak

import "testing"

func TestCheckGroupCut(t *testing.T) {
	for _, tc := range []struct {
		counts []uint64
		ok     bool
	}{
		{[]uint64{5, 5, 5}, true},
		{[]uint64{6, 5, 5}, true}, // cut mid-round
		{[]uint64{6, 6, 5}, true},
		{[]uint64{5}, true},
		{nil, true},
		{[]uint64{5, 6, 5}, false}, // the second member saw a later write
		{[]uint64{7, 6, 5}, false}, // two rounds apart
		{[]uint64{5, 5, 6}, false},
	} {
		if err := CheckGroupCut(tc.counts); (err == nil) != tc.ok {
			t.Errorf("%v: %v, want ok %v", tc.counts, err, tc.ok)
		}
	}
}
