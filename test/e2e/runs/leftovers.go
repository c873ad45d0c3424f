package runs

import (
	"fmt"
	"maps"
	"os"
	"slices"
)

// Leftovers lists what of the run in dir remains on the machine: its
// directory, mounts under it, loop devices backed by files under it,
// processes that name it, and its cgroups. After Clean, none is expected;
// dir "" has none.
func Leftovers(dir string) []string {
	if dir == "" {
		return nil
	}
	var out []string
	if _, err := os.Stat(dir); err == nil {
		out = append(out, "directory "+dir)
	}
	for _, m := range mountsUnder(dir) {
		out = append(out, "mount "+m)
	}
	loops := LoopsBackedUnder(dir)
	for _, dev := range slices.Sorted(maps.Keys(loops)) {
		out = append(out, fmt.Sprintf("loop device %s (%s)", dev, loops[dev]))
	}
	for _, pid := range ProcessesMentioning(dir) {
		out = append(out, describeProcess(pid))
	}
	if isRunDir(dir) {
		for _, cg := range runCgroups(dir) {
			out = append(out, "cgroup "+cg)
		}
	}
	return out
}

// Stale lists what runs that are not live left on the machine, besides
// the run in self (the caller's, whose own leftovers Leftovers lists):
// the directories whose owner is gone, and the cgroups and loop devices
// of runs whose directory is gone. CleanStale removes them; what it could
// not remove is listed here afterwards. Nothing left is an empty list.
func Stale(self string) []string {
	var out []string
	for _, dir := range runDirs() {
		if dir != self && !ownerAlive(dir) {
			out = append(out, "directory "+dir)
		}
	}
	for _, o := range orphans() {
		if o.dir != "" && o.dir == self {
			continue
		}
		for _, cg := range o.cgroups {
			out = append(out, "cgroup "+cg)
		}
		for _, dev := range slices.Sorted(maps.Keys(o.loops)) {
			out = append(out, fmt.Sprintf("loop device %s (%s)", dev, o.loops[dev]))
		}
	}
	return out
}
