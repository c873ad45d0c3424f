package runs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/converge-csi/converge/test/testenv/poll"
)

// cgroupFS is where the machine mounts its cgroup hierarchies.
const cgroupFS = "/sys/fs/cgroup"

// thawTimeout bounds the wait for a run's cgroups to thaw: the kernel
// thaws a cgroup as soon as it is told, so one that stays frozen longer
// has a frozen parent outside the run, which waiting does not change.
const thawTimeout = 5 * time.Second

// removeTimeout bounds the retries of removing a run's cgroups: a killed
// process leaves its cgroups a moment after it is reported gone.
const removeTimeout = 5 * time.Second

// hierarchies lists the mounted cgroup hierarchies: the directories of
// cgroupFS with a cgroup.procs, every v1 hierarchy and the unified one of
// a hybrid machine, whose cgroups runc makes too; a symbolic link (cpu for
// cpu,cpuacct) names one listed already, and is skipped. On a machine of
// cgroup v2 alone, cgroupFS is the one hierarchy.
func hierarchies() []string {
	if _, err := os.Stat(filepath.Join(cgroupFS, "cgroup.procs")); err == nil {
		return []string{cgroupFS}
	}
	var out []string
	entries, _ := os.ReadDir(cgroupFS)
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		h := filepath.Join(cgroupFS, e.Name())
		if _, err := os.Stat(filepath.Join(h, "cgroup.procs")); err == nil {
			out = append(out, h)
		}
	}
	return out
}

// topCgroups lists, in every hierarchy, the cgroups right under its root
// whose name match accepts.
func topCgroups(match func(name string) bool) []string {
	var out []string
	for _, h := range hierarchies() {
		entries, _ := os.ReadDir(h)
		for _, e := range entries {
			if e.IsDir() && match(e.Name()) {
				out = append(out, filepath.Join(h, e.Name()))
			}
		}
	}
	return out
}

// runCgroups lists the cgroups of the run in dir: in every hierarchy,
// those right under its root named after the run (CgroupRoot).
func runCgroups(dir string) []string {
	own := filepath.Base(dir) + "-"
	return topCgroups(func(name string) bool { return strings.HasPrefix(name, own) })
}

// cgroupsUnder lists the cgroups at or under roots, deepest first.
func cgroupsUnder(roots []string) []string {
	var out []string
	for _, root := range roots {
		filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				out = append(out, path)
			}
			return nil
		})
	}
	sort.SliceStable(out, func(i, j int) bool { return strings.Count(out[i], "/") > strings.Count(out[j], "/") })
	return out
}

// thaw thaws every cgroup v1 freezer at or under roots: it writes THAWED
// to each freezer.state, parents first, again until none reads FROZEN or
// FREEZING. A frozen process does not die of SIGKILL, nor of its PID
// namespace's end, until thawed; and a cgroup frozen itself (ctr tasks
// pause freezes a container's own) stays frozen when its parent is
// thawed. It returns the cgroups still frozen after thawTimeout.
func thaw(roots []string) []string {
	var states []string
	for _, cg := range cgroupsUnder(roots) {
		if _, err := os.Stat(filepath.Join(cg, "freezer.state")); err == nil {
			states = append(states, filepath.Join(cg, "freezer.state"))
		}
	}
	sort.SliceStable(states, func(i, j int) bool { return strings.Count(states[i], "/") < strings.Count(states[j], "/") })
	var frozen []string
	poll.Wait(context.Background(), thawTimeout, 50*time.Millisecond, func() error {
		frozen = nil
		for _, s := range states {
			os.WriteFile(s, []byte("THAWED"), 0o644)
		}
		for _, s := range states {
			b, err := os.ReadFile(s)
			if err != nil {
				continue // removed meanwhile
			}
			if state := strings.TrimSpace(string(b)); state == "FROZEN" || state == "FREEZING" {
				frozen = append(frozen, filepath.Dir(s))
			}
		}
		if len(frozen) > 0 {
			return errors.New("frozen")
		}
		return nil
	})
	return frozen
}

// ErrNotStopped marks a freeze that gave up: the processes did not all
// stop within its timeout.
var ErrNotStopped = errors.New("not stopped")

// unblockEvery is how often freeze calls its unblock while it waits.
const unblockEvery = time.Second

// freeze freezes the cgroup v1 freezers of roots, each with every cgroup
// below it, and waits up to timeout until each reads FROZEN: every process
// below has stopped between two steps of its own. A process in a system
// call that sleeps unfreezably (an fsync waiting for its device) stops
// only once the call has returned; one that waits for something only
// another process would end (a filesystem frozen by a process stopped
// already) needs unblock, which freeze calls, when not nil, every
// unblockEvery while it waits. When roots hold no freezer it is an error;
// on a timeout (ErrNotStopped), it thaws roots again and returns an error
// naming the cgroups that had not stopped, with their threads outside the
// freezer's refrigerator, and any cgroup left frozen.
func freeze(roots []string, timeout time.Duration, unblock func()) error {
	var states []string
	for _, r := range roots {
		if s := filepath.Join(r, "freezer.state"); exists(s) {
			states = append(states, s)
		}
	}
	if len(states) == 0 {
		return fmt.Errorf("no cgroup v1 freezer among %q", roots)
	}
	unblocked := time.Now()
	var broken error // a freezer that cannot be written or read: not a timeout
	err := poll.Wait(context.Background(), timeout, 10*time.Millisecond, func() error {
		for _, s := range states {
			if err := os.WriteFile(s, []byte("FROZEN"), 0o644); err != nil {
				broken = err
				return poll.Stop(err)
			}
			b, err := os.ReadFile(s)
			if err != nil {
				broken = err
				return poll.Stop(err)
			}
			if state := strings.TrimSpace(string(b)); state != "FROZEN" {
				if unblock != nil && time.Since(unblocked) >= unblockEvery {
					unblock()
					unblocked = time.Now()
				}
				return fmt.Errorf("%s is %s", filepath.Dir(s), state)
			}
		}
		return nil
	})
	if err == nil {
		return nil
	}
	running := unfrozen(roots)
	if broken != nil {
		still := thaw(roots)
		return fmt.Errorf("the freezer: %w (still frozen: %q)", broken, still)
	}
	if still := thaw(roots); len(still) > 0 {
		return fmt.Errorf("%w: %w (%s); still frozen: %s", ErrNotStopped, err, strings.Join(running, "; "), strings.Join(still, ", "))
	}
	return fmt.Errorf("%w: %w (%s); thawed again", ErrNotStopped, err, strings.Join(running, "; "))
}

// unfrozen names the freezer cgroups at or under roots that are not
// FROZEN, each with its threads outside the freezer's refrigerator and
// where they wait in the kernel (a thread frozen in a freezable sleep is
// named too).
func unfrozen(roots []string) []string {
	var out []string
	for _, cg := range cgroupsUnder(roots) {
		b, err := os.ReadFile(filepath.Join(cg, "freezer.state"))
		if err != nil || strings.TrimSpace(string(b)) == "FROZEN" {
			continue
		}
		tasks, _ := os.ReadFile(filepath.Join(cg, "tasks"))
		var threads []string
		for _, tid := range strings.Fields(string(tasks)) {
			wchan, _ := os.ReadFile("/proc/" + tid + "/wchan")
			if string(wchan) == "__refrigerator" {
				continue
			}
			comm, _ := os.ReadFile("/proc/" + tid + "/comm")
			threads = append(threads, fmt.Sprintf("%s %s in %s", tid, strings.TrimSpace(string(comm)), wchan))
		}
		if len(threads) == 0 {
			continue // a parent, whose state is its children's
		}
		out = append(out, fmt.Sprintf("%s [%s]", cg, strings.Join(threads, ", ")))
	}
	return out
}

// cgroupProcs lists the processes in the cgroups at or under roots, of
// every hierarchy the roots are in.
func cgroupProcs(roots []string) []int {
	var out []int
	for _, cg := range cgroupsUnder(roots) {
		b, _ := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
		for _, field := range strings.Fields(string(b)) {
			var pid int
			if _, err := fmt.Sscan(field, &pid); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}

// removeCgroups removes the cgroups at or under roots, deepest first (a
// cgroup goes with rmdir, once it has no processes and no children), and
// again while one that had processes still has them, until removeTimeout.
// It notes each it could not remove but for its children.
func removeCgroups(roots []string, note func(string, ...any)) {
	failed := map[string]error{}
	poll.Wait(context.Background(), removeTimeout, 100*time.Millisecond, func() error {
		clear(failed)
		for _, cg := range cgroupsUnder(roots) {
			if err := os.Remove(cg); err != nil && !errors.Is(err, os.ErrNotExist) {
				failed[cg] = err
			}
		}
		if len(failed) > 0 {
			return errors.New("cgroups left")
		}
		return nil
	})
	for _, cg := range cgroupsUnder(roots) {
		if err, ok := failed[cg]; ok && len(cgroupsUnder([]string{cg})) == 1 {
			note("remove cgroup %s: %v", cg, err)
		}
	}
}
