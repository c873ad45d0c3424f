package devices

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/converge-csi/converge/pkg/host"
)

// CgroupIO applies IO limits to the IO that pods do on a device, as the
// kernel's blk-throttle rules in their cgroups, on cgroup v1 (the blkio
// controller) or v2 (the io controller). Make one with DetectCgroupIO; the
// zero CgroupIO refuses every call.
//
// On v1 a rule binds only the tasks right in its cgroup: blk-throttle's
// groups are flat there, each hung off the device's top queue whatever
// its place in the hierarchy (blk-throttle.c, throtl_pd_init: only "on
// the default hierarchy" does a group's parent queue become its parent
// cgroup's). So each cgroup of a pod that holds tasks needs the rules,
// and a container started later has none until they are written again;
// the limit is then per cgroup, not for the pod as a whole. v1 also
// charges buffered writes' writeback to the root cgroup
// (Documentation/admin-guide/cgroup-v2.rst, "Writeback"): there, only
// reads and direct IO are limited. On v2 a rule in the pod's cgroup
// limits all IO of its subtree.
type CgroupIO struct {
	// Version is the cgroup version the io controller is on: 1 or 2.
	Version int
	// Root is the root of the hierarchy the io controller is on:
	// <root>/blkio on v1, <root> on v2.
	Root string
	// Problem says why pods' cgroups may lack the rules' files although
	// the controller is there (io not enabled below the root on v2), as
	// DetectCgroupIO saw it at start; "" when it saw none. The files are
	// read again at each pass, and a cgroup without them is reported then
	// (ErrIONotEnabled).
	Problem string

	pods *podCgroups
	// write writes one rule to a cgroup file, in one write, as the kernel
	// takes it; a test's fake hierarchy of plain files stands in for the
	// kernel there.
	write func(path, rule string) error
}

// DetectCgroupIO finds where the io controller is below root (normally
// /sys/fs/cgroup): cgroup v1 when root/blkio has the blkio.throttle files
// (as on a hybrid machine, where v2 is mounted too but io is bound to v1),
// v2 when root/cgroup.controllers lists io. Neither is an error that
// names what was missing. A controller that is there but not enabled
// where the pods' cgroups are (v2: io not in the root's or the kubelet's
// cgroup.subtree_control, so their cgroups have no io.max) is no error:
// it may be enabled later, and Problem says what to enable.
func DetectCgroupIO(root string) (CgroupIO, error) {
	v1 := filepath.Join(root, "blkio")
	if _, err := os.Stat(filepath.Join(v1, v1Knobs[0].file)); err == nil {
		return newCgroupIO(1, v1)
	}
	controllers := filepath.Join(root, "cgroup.controllers")
	b, err := os.ReadFile(controllers)
	if err == nil && slices.Contains(strings.Fields(string(b)), "io") {
		c, err := newCgroupIO(2, root)
		if err == nil {
			c.Problem = ioNotEnabledBelow(c.Root)
		}
		return c, err
	}
	why := fmt.Sprintf("%s does not list io", controllers)
	if err != nil {
		why = err.Error()
	}
	return CgroupIO{}, fmt.Errorf("no io controller: %s has no %s (cgroup v1), and %s (cgroup v2)", v1, v1Knobs[0].file, why)
}

func newCgroupIO(version int, root string) (CgroupIO, error) {
	// Walks do not follow a symlink, and some distributions link the
	// controller's directory to a joint one (blkio -> blkio,io).
	resolved, err := filepath.EvalSymlinks(root)
	if err != nil {
		return CgroupIO{}, fmt.Errorf("cgroup hierarchy %s: %w", root, err)
	}
	return CgroupIO{Version: version, Root: resolved, pods: newPodCgroups(resolved), write: writeCgroupFile}, nil
}

// ioNotEnabledBelow says why the cgroups below the v2 root may have no
// io.max: io not in the root's cgroup.subtree_control, or a kubelet's
// cgroup (kubepods, kubepods.slice) without io.max or without io in its
// own subtree_control, where its pods' cgroups are; "" when none of them
// says so, or they cannot be read.
func ioNotEnabledBelow(root string) string {
	enabled := func(dir string) (bool, bool) {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
		return err == nil && slices.Contains(strings.Fields(string(b)), "io"), err == nil
	}
	if on, known := enabled(root); known && !on {
		return fmt.Sprintf("io is not in %s: no cgroup below the root has io.max, and pods' IO limits cannot be applied until it is enabled there",
			filepath.Join(root, "cgroup.subtree_control"))
	}
	var problems []string
	// Where the pods' cgroups are looked for (walkPodCgroups).
	_ = walkDirs(root, kubepodsSearchDepth, func(path, name string) bool {
		parent := ""
		if dir := filepath.Dir(path); dir != root {
			parent = filepath.Base(dir)
		}
		if _, ok := kubepodsCgroup(parent, name); !ok {
			return true
		}
		if !isDir(path) {
			return false
		}
		if _, err := os.Stat(filepath.Join(path, ioMaxFile)); errors.Is(err, os.ErrNotExist) {
			problems = append(problems, missingKnob(path, filepath.Join(path, ioMaxFile)).Error())
		} else if on, known := enabled(path); known && !on {
			problems = append(problems, fmt.Sprintf("io is not in %s: the pods' cgroups below it have no io.max", filepath.Join(path, "cgroup.subtree_control")))
		}
		return false
	})
	return strings.Join(problems, "; ")
}

// errNoCgroupIO is the zero CgroupIO's answer.
var errNoCgroupIO = errors.New("cgroup io not detected (DetectCgroupIO)")

// PodCgroups returns the cgroups of the pod that need the rules for its
// IO to be limited: on v1 the pod's cgroup and every cgroup below it (its
// containers' and its sandbox's), on v2 the pod's cgroup alone. When the
// pod has no cgroup on this node, the error wraps ErrPodCgroupNotFound.
// The pod's cgroup is remembered, and looked for again once it is gone.
func (c CgroupIO) PodCgroups(podUID string) ([]string, error) {
	if c.pods == nil {
		return nil, errNoCgroupIO
	}
	dir, err := c.pods.find(podUID)
	if err != nil {
		return nil, err
	}
	if c.Version == 2 {
		return []string{dir}, nil
	}
	dirs, err := cgroupsBelow(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w %s: %s went away", ErrPodCgroupNotFound, podUID, dir)
	}
	return dirs, err
}

// Throttle returns the rules in force in the cgroup dir for the device
// dev, 0 for each count that has none. When dir does not exist (the pod
// went away) the error wraps ErrCgroupGone and os.ErrNotExist; when dir
// exists without the rules' file, ErrIONotEnabled; a dir outside Root is
// refused.
func (c CgroupIO) Throttle(dir string, dev host.DevNum) (host.IOLimits, error) {
	if err := c.check(dir); err != nil {
		return host.IOLimits{}, err
	}
	if c.Version == 2 {
		rules, err := readCgroupFile(dir, ioMaxFile, parseIOMax)
		return rules[dev], err
	}
	var l host.IOLimits
	for _, k := range v1Knobs {
		rules, err := readCgroupFile(dir, k.file, parseV1Throttle)
		if err != nil {
			return host.IOLimits{}, err
		}
		k.set(&l, rules[dev])
	}
	return l, nil
}

// SetThrottle makes the rules in force in the cgroup dir for the device
// dev equal l: it sets the counts l limits and removes the others. It
// writes only what differs (each write restarts the group's throttling
// slice, blk-throttle.c tg_conf_updated), so calling it again is a no-op.
// Limits the kernel cannot hold (host.IOLimits.Check) are refused before
// anything is written. When dir does not exist (the pod went away) the
// error wraps ErrCgroupGone and os.ErrNotExist; when dir exists without
// the rules' file, ErrIONotEnabled; a dir outside Root is refused.
func (c CgroupIO) SetThrottle(dir string, dev host.DevNum, l host.IOLimits) error {
	if err := c.check(dir); err != nil {
		return err
	}
	if err := l.Check(); err != nil {
		return err
	}
	if c.Version == 2 {
		rules, err := readCgroupFile(dir, ioMaxFile, parseIOMax)
		if err != nil || rules[dev] == l {
			return err
		}
		p := filepath.Join(dir, ioMaxFile)
		if err := c.write(p, formatIOMax(dev, l)); err != nil {
			return cgroupFileError(dir, p, err)
		}
		return nil
	}
	for _, k := range v1Knobs {
		rules, err := readCgroupFile(dir, k.file, parseV1Throttle)
		if err != nil {
			return err
		}
		if rules[dev] == k.get(l) {
			continue
		}
		p := filepath.Join(dir, k.file)
		if err := c.write(p, formatV1Throttle(dev, k.get(l))); err != nil {
			return cgroupFileError(dir, p, err)
		}
	}
	return nil
}

// check refuses the zero CgroupIO and a dir that is not strictly inside
// its hierarchy.
func (c CgroupIO) check(dir string) error {
	if c.pods == nil {
		return errNoCgroupIO
	}
	if _, _, err := host.Beneath(dir, []string{c.Root}); err != nil {
		return fmt.Errorf("cgroup %s: %w", dir, err)
	}
	return nil
}

// readCgroupFile reads and parses the file name of the cgroup dir. Only
// a dir that is gone wraps ErrCgroupGone; a file missing from a cgroup
// that exists is ErrIONotEnabled (missingKnob).
func readCgroupFile[T any](dir, name string, parse func(string) (map[host.DevNum]T, error)) (map[host.DevNum]T, error) {
	p := filepath.Join(dir, name)
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, cgroupFileError(dir, p, err)
	}
	rules, err := parse(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return rules, nil
}

// ErrCgroupGone is wrapped (with os.ErrNotExist) by Throttle and
// SetThrottle for a cgroup directory that does not exist: its pod or
// container went away.
var ErrCgroupGone = errors.New("the cgroup is gone")

// ErrIONotEnabled is wrapped by Throttle and SetThrottle for a cgroup that
// exists and lacks the blk-throttle file: the io controller is not
// enabled there. It never wraps os.ErrNotExist: the cgroup is not gone,
// and its pod's IO is not limited until the controller is enabled.
var ErrIONotEnabled = errors.New("the io controller is not enabled in the cgroup")

// cgroupFileError is the error of a read or write of the file p of the
// cgroup dir that failed with err: ErrCgroupGone when dir is gone,
// ErrIONotEnabled (missingKnob) when dir is there and p is not, else err.
func cgroupFileError(dir, p string, err error) error {
	switch {
	case !errors.Is(err, os.ErrNotExist):
		return err
	case !isDir(dir):
		return fmt.Errorf("cgroup %s: %w: %w", dir, ErrCgroupGone, err)
	}
	return missingKnob(dir, p)
}

// missingKnob says what to enable for the cgroup dir to have the file p.
func missingKnob(dir, p string) error {
	if filepath.Base(p) == ioMaxFile {
		parent := filepath.Dir(dir)
		return fmt.Errorf("%w: %s has no %s: enable io in %s (echo +io > %s; under systemd, IOAccounting=yes on the kubelet's slices, or Delegate=yes on its unit)",
			ErrIONotEnabled, dir, ioMaxFile, filepath.Join(parent, "cgroup.subtree_control"), filepath.Join(parent, "cgroup.subtree_control"))
	}
	return fmt.Errorf("%w: %s has no %s: the kernel lacks blk-throttle (CONFIG_BLK_DEV_THROTTLING), or the directory is not in the blkio hierarchy",
		ErrIONotEnabled, dir, filepath.Base(p))
}

// writeCgroupFile writes rule to the cgroup file path in one write, as
// the kernel parses one rule per write; it never creates the file.
func writeCgroupFile(path, rule string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.Write([]byte(rule))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %q to %s: %w", rule, path, err)
	}
	return nil
}
