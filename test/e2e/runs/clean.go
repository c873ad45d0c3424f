package runs

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/converge-csi/converge/pkg/devices"
)

// Clean takes down what is left of the run in dir, at its own teardown
// once its daemons have stopped, or after it was killed: it thaws the
// run's frozen cgroups, kills every process in them and every process
// that names dir, detaches the mounts under dir and the loop devices of
// files under it, puts back the kernel tunables and host paths the run
// changed, and removes the run's cgroups and dir. It touches nothing of
// another run's, and returns what it failed to do, which concerns only
// this run. A run already cleaned is a no-op; a dir that is not a run's
// directory is refused, and noted.
func Clean(dir string) []string {
	return clean(dir, true)
}

// clean is Clean; with host false it leaves the kernel tunables and the
// host paths as they are: they are the machine's, and a live run uses
// them now.
func clean(dir string, host bool) []string {
	var notes []string
	note := func(format string, args ...any) { notes = append(notes, fmt.Sprintf(format, args...)) }
	if !isRunDir(dir) {
		note("%q is not a run's directory: nothing cleaned", dir)
		return notes
	}
	cgroups := runCgroups(dir)
	stop(cgroups, dir, note)
	// Listed while the pools are still mounted: an image in a pool is
	// found through the pool's mount.
	loops := LoopsBackedUnder(dir)
	ids := identities(loops)
	// The kubelet's bind mount of its root is among the mounts; a node's
	// namespaces hold their copies of them until their last process has
	// gone, as the loop devices under them do.
	unmountUnder(dir, note)
	detachLoops(loops, ids, detachTimeout, note)
	removeLogLinks(dir) // before the host paths: they live in one
	if host {
		restoreSysctls(dir, note)
		removeHostPaths(dir, note)
	}
	removeCgroups(cgroups, note)
	// A pod's target that csi-node sealed for a repair (devices.Seal) is
	// immutable once its volume is gone, and would stay.
	if _, err := devices.UnsealTree(dir); err != nil {
		note("unseal the targets under %s: %v", dir, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		note("remove %s: %v", dir, err)
	}
	return notes
}

// Thaw thaws the frozen cgroups of the run in dir, as Clean does first, so
// that its processes can end: a test freezes a node's containers (ctr
// tasks pause), and a teardown that comes while they are frozen would
// wait on them in vain. It returns the cgroups still frozen, which Clean
// tries again. A run with none frozen, or a dir that is not a run's
// directory, is a no-op.
func Thaw(dir string) []string {
	if !isRunDir(dir) {
		return nil
	}
	return thaw(runCgroups(dir))
}

// CleanStale cleans up after the earlier runs that were killed before they
// could take themselves down (a test binary's timeout ends it with a
// panic), and whose owner no longer runs: it cleans each one's directory
// as Clean does, and then what runs left whose directory is gone: their
// cgroups and the loop devices of files that were in it, and the cgroups
// of runs from before cgroups were named after their run
// (converge-e2e-<node>). It returns notes saying what it cleaned and what
// it failed to, each naming the run. It never touches a live run's
// objects, nor, while a run is live, the kernel tunables and host paths
// it uses; a directory named as a run's that is not this user's or is
// open to others is noted and left alone (runDirs). Nothing to clean is a
// no-op.
func CleanStale() []string {
	var notes []string
	noteFor := func(run string) func(string, ...any) {
		return func(format string, args ...any) { notes = append(notes, run+": "+fmt.Sprintf(format, args...)) }
	}
	var dirs []string
	live := false
	for _, dir := range runDirs() {
		if ownerAlive(dir) {
			live = true // another suite's, running now
		} else {
			dirs = append(dirs, dir)
		}
	}
	notes = append(notes, untrustedRunDirs()...)
	orphans := orphans()
	// Every stale run's processes go first: a mount, and the loop device
	// under it, stays while the mount namespace of any process holds a
	// copy, and a run's namespaces copy the mounts there are when they are
	// made, another stale run's among them.
	for _, dir := range dirs {
		notes = append(notes, dir+": its owner is gone: cleaned")
		stop(runCgroups(dir), dir, noteFor(dir))
	}
	for _, o := range orphans {
		notes = append(notes, o.name+": "+o.what()+": cleaned")
		stop(o.cgroups, o.dir, noteFor(o.name))
	}
	// While a run is live, the kernel tunables and host paths are its:
	// a stale run's records of them are left unapplied.
	for _, dir := range dirs {
		for _, n := range clean(dir, !live) {
			notes = append(notes, dir+": "+n)
		}
	}
	for _, o := range orphans {
		detachLoops(o.loops, o.ids, detachTimeout, noteFor(o.name))
		removeCgroups(o.cgroups, noteFor(o.name))
	}
	return notes
}

// orphan is what a run left on the machine once its directory was gone:
// its cgroups and the loop devices of files that were in the directory.
type orphan struct {
	// name names the run: its directory, or, for a cgroup of the naming
	// before runs named theirs, the cgroup's name.
	name string
	// dir is the run's directory; "" for a cgroup of the earlier naming,
	// which says nothing of its run.
	dir     string
	cgroups []string          // the run's cgroups, in every hierarchy
	loops   map[string]string // device to backing file
	ids     map[string]loopID // what each of loops was attached to when listed
}

// orphans lists what runs whose directory is gone left, run by run. A run
// whose directory exists is either live or one CleanStale cleans by its
// directory, and is not listed.
func orphans() []*orphan {
	byName := map[string]*orphan{}
	of := func(name, dir string) *orphan {
		if byName[name] == nil {
			byName[name] = &orphan{name: name, dir: dir, loops: map[string]string{}}
		}
		return byName[name]
	}
	for _, cg := range topCgroups(func(name string) bool { return strings.HasPrefix(name, prefix) }) {
		name := filepath.Base(cg)
		dir, ok := runOf(name)
		switch {
		case !ok:
			o := of(name, "")
			o.cgroups = append(o.cgroups, cg)
		case !exists(dir):
			o := of(dir, dir)
			o.cgroups = append(o.cgroups, cg)
		}
	}
	for dev, file := range attachedLoops() {
		if dir, ok := loopRun(file); ok && !exists(dir) {
			of(dir, dir).loops[dev] = file
		}
	}
	var out []*orphan
	for _, o := range byName {
		o.ids = identities(o.loops)
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// what says what the run left and why it is found without its directory.
func (o *orphan) what() string {
	var left []string
	if len(o.cgroups) > 0 {
		left = append(left, "cgroups "+strings.Join(cgroupNames(o.cgroups), ", "))
	}
	for _, dev := range slices.Sorted(maps.Keys(o.loops)) {
		left = append(left, fmt.Sprintf("loop device %s (%s)", dev, o.loops[dev]))
	}
	why := "its directory is gone"
	if o.dir == "" {
		why = "named after its node, not its run (the naming before runs named their cgroups)"
	}
	return why + "; left " + strings.Join(left, ", ")
}

// stop thaws the cgroups at or under roots, then kills every process in
// them and, when dir is not "", every process that names dir; it notes
// what it could not thaw or kill.
func stop(roots []string, dir string, note func(string, ...any)) {
	for _, cg := range thaw(roots) {
		note("thaw cgroup %s: still frozen", cg)
	}
	find := func() []int {
		pids := cgroupProcs(roots)
		if dir != "" {
			pids = append(pids, ProcessesMentioning(dir)...)
		}
		return pids
	}
	for _, p := range killAll(find) {
		note("kill %s: it does not end", p)
	}
}

// cgroupNames lists the distinct names of cgroups, sorted.
func cgroupNames(cgroups []string) []string {
	var out []string
	for _, cg := range cgroups {
		out = append(out, filepath.Base(cg))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// attachedLoops maps every attached loop device to its backing file.
func attachedLoops() map[string]string {
	out := map[string]string{}
	loops := listLoops()
	for _, l := range loops {
		out[l.Device] = l.BackingFile
	}
	return out
}

// loopRun names the run whose directory holds (or held) file: the run
// directory in the temporary directory that file lies under.
func loopRun(file string) (dir string, ok bool) {
	rest, found := strings.CutPrefix(file, os.TempDir()+"/")
	if !found {
		return "", false
	}
	name, _, under := strings.Cut(rest, "/")
	if !under || !isRunName(name) {
		return "", false
	}
	return filepath.Join(os.TempDir(), name), true
}

// exists reports whether path exists.
func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
