package reconciler

import (
	"fmt"
	"os"
	"slices"
	"sync"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
)

// fakeCgroups is an in-memory cgroup hierarchy as the reconciler's
// Throttler sees it: each pod's cgroups (on v1 the pod's and its
// containers'), and the blk-throttle rules in each cgroup for each
// device. It records every call.
type fakeCgroups struct {
	// mu guards every field below.
	mu sync.Mutex
	// pods maps a pod UID to its cgroups, the pod's own first.
	pods map[string][]string
	// rules maps a cgroup to the rules in force there, by device.
	rules map[string]map[host.DevNum]host.IOLimits
	calls []string
	// fail maps a call ("set <dir>", "read <dir>", "pod <uid>") to the
	// error it returns.
	fail map[string]error
}

func newFakeCgroups() *fakeCgroups {
	return &fakeCgroups{pods: map[string][]string{}, rules: map[string]map[host.DevNum]host.IOLimits{}, fail: map[string]error{}}
}

// podCgroupDir is where the fake keeps the cgroup of pod uid, as the
// kubelet's cgroupfs driver lays out a burstable pod's.
func podCgroupDir(uid string) string { return "/sys/fs/cgroup/blkio/kubepods/burstable/pod" + uid }

func (c *fakeCgroups) PodCgroups(uid string) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, "pod "+uid)
	if err := c.fail["pod "+uid]; err != nil {
		return nil, err
	}
	dirs, ok := c.pods[uid]
	if !ok {
		return nil, fmt.Errorf("%w %s", devices.ErrPodCgroupNotFound, uid)
	}
	return slices.Clone(dirs), nil
}

func (c *fakeCgroups) Throttle(dir string, dev host.DevNum) (host.IOLimits, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, "read "+dir)
	if err := c.fail["read "+dir]; err != nil {
		return host.IOLimits{}, err
	}
	r, ok := c.rules[dir]
	if !ok {
		return host.IOLimits{}, fmt.Errorf("cgroup %s: %w: %w", dir, devices.ErrCgroupGone, os.ErrNotExist)
	}
	return r[dev], nil
}

func (c *fakeCgroups) SetThrottle(dir string, dev host.DevNum, l host.IOLimits) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, "set "+dir)
	if err := c.fail["set "+dir]; err != nil {
		return err
	}
	r, ok := c.rules[dir]
	if !ok {
		return fmt.Errorf("cgroup %s: %w: %w", dir, devices.ErrCgroupGone, os.ErrNotExist)
	}
	if l.IsZero() {
		delete(r, dev)
	} else {
		r[dev] = l
	}
	return nil
}

// What the kubelet, the runtime and an operator do to the cgroups, and
// what tests read of them.

// addPod makes the cgroup of pod uid and of each of its containers.
func (c *fakeCgroups) addPod(uid string, containers ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	dir := podCgroupDir(uid)
	c.pods[uid] = []string{dir}
	c.rules[dir] = map[host.DevNum]host.IOLimits{}
	for _, ctr := range containers {
		c.addContainerLocked(uid, ctr)
	}
}

// addContainer makes the cgroup of a container of pod uid, with no rule.
func (c *fakeCgroups) addContainer(uid, ctr string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.addContainerLocked(uid, ctr)
}

func (c *fakeCgroups) addContainerLocked(uid, ctr string) string {
	dir := podCgroupDir(uid) + "/" + ctr
	c.pods[uid] = append(c.pods[uid], dir)
	c.rules[dir] = map[host.DevNum]host.IOLimits{}
	return dir
}

// removePod removes the cgroups of pod uid.
func (c *fakeCgroups) removePod(uid string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range c.pods[uid] {
		delete(c.rules, d)
	}
	delete(c.pods, uid)
}

// edit sets the rules for dev in dir, as an operator's echo does.
func (c *fakeCgroups) edit(dir string, dev host.DevNum, l host.IOLimits) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l.IsZero() {
		delete(c.rules[dir], dev)
		return
	}
	c.rules[dir][dev] = l
}

// rule returns the rules for dev in dir.
func (c *fakeCgroups) rule(dir string, dev host.DevNum) host.IOLimits {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rules[dir][dev]
}

// cgroupsOf returns the cgroups of pod uid.
func (c *fakeCgroups) cgroupsOf(uid string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.pods[uid])
}

// takeCalls returns the calls made since the last takeCalls.
func (c *fakeCgroups) takeCalls() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	calls := c.calls
	c.calls = nil
	return calls
}

// failOn makes call ("set <dir>", "read <dir>", "pod <uid>") fail with
// err; nil makes it work again.
func (c *fakeCgroups) failOn(call string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		delete(c.fail, call)
		return
	}
	c.fail[call] = err
}

var (
	_ Throttler = (*fakeCgroups)(nil)
	_ Throttler = devices.CgroupIO{}
)
