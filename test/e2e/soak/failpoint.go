package soak

import (
	"fmt"
	"slices"
)

// CrashTerm is the gofail term of the soak's panics: a panic the first
// time the failpoint is reached, and nothing after. A panic that no
// recover() of csi-node contains ends it, and the kubelet restarts it; a
// contained one fails the operation under way, mid-step, and it is
// retried.
const CrashTerm = `1*panic("soak")`

// KillTerm is the gofail term of the soak's kills: csi-node sleeps at the
// failpoint, once, long enough for the soak to see it there
// (failpointCount) and SIGKILL it, as the fault tests' walk does: a crash
// at that step whatever recover() would contain a panic.
const KillTerm = "1*sleep(30000)"

// failpointDelays are the soak's delays at a failpoint, in milliseconds:
// once each, long enough to widen the window between two steps, and short
// of csi-node's liveness probe's timeout (5 s, deploy/), so that a delay
// that holds up the probe fails no probe.
var failpointDelays = []int{500, 1500, 3000}

// PickFailpoint chooses, by draw (a plan's target), one of the failpoints
// names and the gofail term to arm it with: a third of the draws
// CrashTerm, a third KillTerm, the others a sleep, once, of one of
// failpointDelays. The choice depends on the draw and the set of names
// alone, not on their order, so that a plan replays; as the draw goes
// through len(names)*3*len(failpointDelays) values, every name gets every
// term. With no names it returns "", "".
func PickFailpoint(names []string, draw int) (name, term string) {
	if len(names) == 0 {
		return "", ""
	}
	sorted := slices.Sorted(slices.Values(names))
	// A negative draw is as good as any: its bits, unsigned.
	d := uint(draw)
	n := uint(len(sorted))
	name, r := sorted[d%n], d/n
	switch r % 3 {
	case 0:
		return name, CrashTerm
	case 1:
		return name, KillTerm
	}
	return name, fmt.Sprintf("1*sleep(%d)", failpointDelays[(r/3)%uint(len(failpointDelays))])
}
