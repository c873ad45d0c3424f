package soak

import "fmt"

// A group writer writes to the volumes of a group in turn, round after
// round: its record i to the first volume, fsynced, then its record i to
// the second, and so on. A group snapshot is consistent when its members
// were cut at one moment of that writing: each member holds as many of
// the writer's records as the one before it, or one fewer, and the last
// no fewer than the first less one. A member that holds more than the
// one before it saw a write that came after one its predecessor missed.
//
// CheckGroupCut says whether counts, the writer's records in each member
// of a group snapshot (its restores), in the order written, are such a
// cut.
func CheckGroupCut(counts []uint64) error {
	for i := 1; i < len(counts); i++ {
		if counts[i] > counts[i-1] {
			return fmt.Errorf("member %d holds %d records, more than member %d's %d: not one moment", i, counts[i], i-1, counts[i-1])
		}
	}
	if n := len(counts); n > 1 && counts[n-1]+1 < counts[0] {
		return fmt.Errorf("member %d holds %d records, member 0 %d: more than one round apart", n-1, counts[n-1], counts[0])
	}
	return nil
}
