package reconciler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
	"github.com/converge-csi/converge/pkg/volstatus"
)

// limits are the IO limits the tests' volumes ask for.
var limits = host.IOLimits{ReadIOPS: 200, WriteBPS: 1 << 20}

// podTarget makes the kubelet's directories of pod uid's publish of id
// (below the harness's kubelet directory, /k) and returns the target.
func (h *harness) podTarget(id, uid string) string {
	dir := "/k/pods/" + uid + "/volumes/kubernetes.io~csi/pv-" + id
	h.world.makeDirs("/k/pods/"+uid, "/k/pods/"+uid+"/volumes", "/k/pods/"+uid+"/volumes/kubernetes.io~csi", dir)
	return dir + "/mount"
}

// limitedVolume records volume id staged and published at target, its
// IO limits asked for (l, unless nil), and returns the record.
func (h *harness) limitedVolume(id, target string, l *host.IOLimits) *state.Volume {
	h.t.Helper()
	staging, _ := h.volume(id)
	return h.update(id, func(v *state.Volume) {
		v.Stage = stageSpec(staging)
		v.Publishes = map[string]*state.Publish{target: publishSpec()}
		if l != nil {
			if err := v.RequestIOLimits(*l); err != nil {
				h.t.Fatal(err)
			}
		}
	})
}

// dev returns the device number of id's loop device.
func (h *harness) dev(id string) host.DevNum {
	h.t.Helper()
	l, ok := h.world.loop(h.world.Path(id))
	if !ok {
		h.t.Fatalf("volume %s has no loop device", id)
	}
	return l.Dev
}

// checkRules fails unless every cgroup of pod uid holds want for dev.
func (h *harness) checkRules(uid string, dev host.DevNum, want host.IOLimits) {
	h.t.Helper()
	for _, d := range h.cgroups.cgroupsOf(uid) {
		if got := h.cgroups.rule(d, dev); got != want {
			h.t.Errorf("rules for %v in %s: got %v, want %v", dev, d, got, want)
		}
	}
}

// ioResult returns the result of id's IO limits intent.
func (h *harness) ioResult(id string) state.Result {
	h.t.Helper()
	r, ok := h.store.Result(id, state.IOLimitsKey)
	if !ok {
		h.t.Fatalf("volume %s has no result for its IO limits", id)
	}
	return r
}

// TestIOLimitsAppliedOnPublish checks that a publish's pod gets the
// volume's IO limits in every cgroup (v1: the pod's and each
// container's) before its bind mount is made, and that the intent and
// the publish are then fulfilled.
func TestIOLimitsAppliedOnPublish(t *testing.T) {
	h := newHarness(t)
	h.cgroups.addPod("u1", "ctr-a", "ctr-b")
	target := h.podTarget("v1", "u1")
	var atBind []host.IOLimits
	h.world.before = func(name, _ string) error {
		if name == "bind "+target {
			for _, d := range h.cgroups.cgroupsOf("u1") {
				l, _ := h.world.loop(h.world.Path("v1"))
				atBind = append(atBind, h.cgroups.rule(d, l.Dev))
			}
		}
		return nil
	}
	v := h.limitedVolume("v1", target, &limits)
	h.runUntilIdle()

	h.checkRules("u1", h.dev("v1"), limits)
	if len(atBind) != 3 || slices.ContainsFunc(atBind, func(l host.IOLimits) bool { return l != limits }) {
		t.Errorf("rules in the pod's 3 cgroups when the bind mount was made: got %v, want %v in each", atBind, limits)
	}
	if r := h.ioResult("v1"); !r.Ready || r.Generation != v.IOLimits.Generation {
		t.Errorf("IO limits result: got %+v, want ready at generation %d", r, v.IOLimits.Generation)
	}
	if r, _ := h.store.Result("v1", state.PublishKey(target)); !r.Ready {
		t.Errorf("publish result: got %+v, want ready", r)
	}
	s := h.r.Status()
	if len(s) != 1 || s[0].IOLimitsApplied == nil || s[0].IOLimitsApplied.ReadIOPS != 200 || s[0].IOLimitsApplied.WriteBPS != 1<<20 {
		t.Errorf("status: got applied %+v, want %v", s[0].IOLimitsApplied, limits)
	}
}

// TestIOLimitsDriftRepairedInOnePass checks that a rule changed from
// outside (an operator's echo, a kubelet rewriting the cgroup) is set
// again by the next pass, and counted as a repair; and that a container
// started later (v1: its cgroup has no rule) gets the rules at the next
// pass.
func TestIOLimitsDriftRepairedInOnePass(t *testing.T) {
	h, rec, _, dev := limitedPod(t)
	if n := rec.repairs["set io limits"]; n != 0 {
		t.Fatalf("repairs after the first application: got %d, want 0", n)
	}

	h.editedAndRepaired(rec, dev)

	// The repair backs off as repairs do, so that a rule rewritten at
	// once from outside cannot make the loop churn; past the backoff, a
	// new container is held to the limits at the next pass.
	h.clock.Step(DefaultBackoffMax)
	h.runUntilIdle()
	dir := h.cgroups.addContainer("u1", "ctr-restarted")
	h.clock.Step(DefaultBackoffMax)
	h.pass()
	if got := h.cgroups.rule(dir, dev); got != limits {
		t.Errorf("new container's cgroup after one pass: got %v, want %v", got, limits)
	}
	h.runUntilIdle()
	if r := h.ioResult("v1"); !r.Ready {
		t.Errorf("IO limits result after the repairs: got %+v, want ready", r)
	}
}

// pass runs one pass and waits for the operations it started.
func (h *harness) pass() {
	h.t.Helper()
	h.r.wait()
	if _, err := h.r.Pass(context.Background()); err != nil {
		h.t.Fatal(err)
	}
	h.r.wait()
}

// TestIOLimitsRemovedOnUnpublish checks that the pod of a withdrawn
// publish loses the rules for the volume's device before the publish is
// forgotten: the device's number is reused by the next volume attached.
func TestIOLimitsRemovedOnUnpublish(t *testing.T) {
	h := newHarness(t)
	h.cgroups.addPod("u1", "ctr-a")
	target := h.podTarget("v1", "u1")
	h.limitedVolume("v1", target, &limits)
	h.runUntilIdle()
	dev := h.dev("v1")
	h.checkRules("u1", dev, limits)

	h.update("v1", func(v *state.Volume) { v.RequestUnpublish(target) })
	h.runUntilIdle()
	h.checkRules("u1", dev, host.IOLimits{})
	if v, _ := h.store.Get("v1"); v.Publishes[target] != nil {
		t.Errorf("publish after unpublish: got %+v, want forgotten", v.Publishes[target])
	}
	if slices.Contains(mountPaths(h.world), target) {
		t.Errorf("target still mounted after unpublish")
	}
}

// TestIOLimitsClearThatFailsDoesNotHoldTheUnpublish checks that a
// withdrawn publish whose pod's rules cannot all be removed is
// unpublished all the same, after one try that removes what it can (a
// publish answers without limits when its pod's cgroups cannot be read;
// its unpublish must not then wait for ever, its pod Terminating): the
// cgroups that can be written are cleared, the failure is logged and
// counted (a terminal failure of "clear io limits"), and the next
// withdrawal of the pod tries again.
func TestIOLimitsClearThatFailsDoesNotHoldTheUnpublish(t *testing.T) {
	for _, tc := range []struct {
		name string
		// fail is the cgroup call that fails once the limits are set.
		fail string
		// cleared is whether the container's cgroup, which can still
		// be written, loses its rules.
		cleared bool
	}{
		{name: "the pod's cgroups cannot be listed", fail: "pod u1"},
		{name: "the pod's own cgroup cannot be written", fail: "set " + podCgroupDir("u1"), cleared: true},
		{name: "the pod's own cgroup cannot be read or written", fail: "read+set " + podCgroupDir("u1"), cleared: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, rec, target, dev := limitedPod(t)
			h.checkRules("u1", dev, limits)

			refused := errors.New("write: operation not permitted")
			calls := []string{tc.fail}
			if rest, ok := strings.CutPrefix(tc.fail, "read+set "); ok {
				calls = []string{"read " + rest, "set " + rest}
			}
			// withdraw fails the cgroup calls and withdraws the publish,
			// which must be forgotten past any backoff, as often as a
			// Terminating pod's kubelet would ask.
			withdraw := func(when string) {
				t.Helper()
				for _, c := range calls {
					h.cgroups.failOn(c, refused)
				}
				h.update("v1", func(v *state.Volume) { v.RequestUnpublish(target) })
				for range 3 {
					h.runUntilIdle()
					h.clock.Step(DefaultBackoffMax)
				}
				if v, _ := h.store.Get("v1"); v.Publishes[target] != nil {
					t.Fatalf("publish after the %s unpublish: got %+v, want forgotten", when, v.Publishes[target])
				}
			}
			withdraw("first")
			if slices.Contains(mountPaths(h.world), target) {
				t.Errorf("target still mounted after unpublish")
			}
			ctr := podCgroupDir("u1") + "/ctr-a"
			if got, want := h.cgroups.rule(ctr, dev), (host.IOLimits{}); tc.cleared && got != want {
				t.Errorf("rules in %s, which can be written: got %v, want %v", ctr, got, want)
			}
			if n := rec.ops["clear io limits terminal"]; n != 1 {
				t.Errorf("failed clears counted: got %d, want 1 (one try)", n)
			}

			// Published again and withdrawn again: the clear is tried
			// again, once.
			for _, c := range calls {
				h.cgroups.failOn(c, nil)
			}
			h.update("v1", func(v *state.Volume) { v.Publishes = map[string]*state.Publish{target: publishSpec()} })
			h.runUntilIdle()
			h.checkRules("u1", dev, limits)
			withdraw("second")
			if n := rec.ops["clear io limits terminal"]; n != 2 {
				t.Errorf("failed clears counted after the second withdrawal: got %d, want 2", n)
			}
		})
	}
}

// TestIOLimitsWithdrawnAtANewGeneration checks that limits removed (all
// zero, at a newer generation) are removed from every published pod.
func TestIOLimitsWithdrawnAtANewGeneration(t *testing.T) {
	h := newHarness(t)
	h.cgroups.addPod("u1", "ctr-a")
	h.cgroups.addPod("u2")
	t1, t2 := h.podTarget("v1", "u1"), h.podTarget("v1", "u2")
	h.limitedVolume("v1", t1, &limits)
	h.update("v1", func(v *state.Volume) { v.Publishes[t2] = publishSpec() })
	h.runUntilIdle()
	dev := h.dev("v1")
	h.checkRules("u1", dev, limits)
	h.checkRules("u2", dev, limits)

	v := h.update("v1", func(v *state.Volume) { v.RequestIOLimits(host.IOLimits{}) })
	h.runUntilIdle()
	h.checkRules("u1", dev, host.IOLimits{})
	h.checkRules("u2", dev, host.IOLimits{})
	if r := h.ioResult("v1"); !r.Ready || r.Generation != v.IOLimits.Generation {
		t.Errorf("IO limits result: got %+v, want ready at generation %d", r, v.IOLimits.Generation)
	}
	if s := h.r.Status(); s[0].IOLimitsDesired != nil || s[0].IOLimitsApplied == nil || *s[0].IOLimitsApplied != (volstatus.IOLimits{}) {
		t.Errorf("status: got desired %+v, applied %+v; want none desired, none in force", s[0].IOLimitsDesired, s[0].IOLimitsApplied)
	}
}

// TestIOLimitsWaitForThePodsCgroup checks that a publish whose pod has
// no cgroup yet is answered, and that the limits wait for the cgroup
// without failing; once it is made, the next pass applies them.
func TestIOLimitsWaitForThePodsCgroup(t *testing.T) {
	h := newHarness(t)
	target := h.podTarget("v1", "u1")
	h.limitedVolume("v1", target, &limits)
	h.runUntilIdle()

	if r, _ := h.store.Result("v1", state.PublishKey(target)); !r.Ready {
		t.Errorf("publish result: got %+v, want ready", r)
	}
	r := h.ioResult("v1")
	if r.Ready || r.Err != nil || !strings.Contains(r.Waiting, "the cgroup of pod u1") {
		t.Errorf("IO limits result: got %+v, want waiting for the cgroup of pod u1, no failure", r)
	}
	if c := h.store.Condition("v1"); c.Abnormal {
		t.Errorf("condition: got %+v, want normal", c)
	}

	h.cgroups.addPod("u1", "ctr-a")
	h.runUntilIdle()
	h.checkRules("u1", h.dev("v1"), limits)
	if r := h.ioResult("v1"); !r.Ready {
		t.Errorf("IO limits result once the pod's cgroup is there: got %+v, want ready", r)
	}
}

// TestIOLimitsWithoutAnIOController checks that, on a node without an io
// controller, a volume that asks for limits is published all the same,
// and says why its limits are not held: its condition, its status and its
// intent's result.
func TestIOLimitsWithoutAnIOController(t *testing.T) {
	h := newHarness(t)
	h.r.cfg.Throttler = nil
	h.r.cfg.NoThrottler = "no io controller: /sys/fs/cgroup/blkio has no blkio.throttle.read_iops_device"
	target := h.podTarget("v1", "u1")
	h.limitedVolume("v1", target, &limits)
	h.runUntilIdle()

	if r, _ := h.store.Result("v1", state.PublishKey(target)); !r.Ready {
		t.Errorf("publish result: got %+v, want ready", r)
	}
	c := h.store.Condition("v1")
	if c.Reason != contract.IOLimitsNotApplied || c.Health != state.Degraded || !strings.Contains(c.Message, "no io controller") {
		t.Errorf("condition: got %+v, want DEGRADED %s saying there is no io controller", c, contract.IOLimitsNotApplied)
	}
	if r := h.ioResult("v1"); r.Ready || !strings.Contains(r.Waiting, "no io controller") {
		t.Errorf("IO limits result: got %+v, want not ready, saying there is no io controller", r)
	}
	if s := h.r.Status(); s[0].Reason != string(contract.IOLimitsNotApplied) || !strings.Contains(s[0].Message, "no io controller") {
		t.Errorf("status: got reason %q, message %q; want %s and why", s[0].Reason, s[0].Message, contract.IOLimitsNotApplied)
	}
}

// TestIOLimitsTargetOfNoPod checks that a target not laid out as the
// kubelet's names no pod: nothing is guessed or written, the publish is
// answered, and the condition says so.
func TestIOLimitsTargetOfNoPod(t *testing.T) {
	h := newHarness(t)
	_, target := h.volume("v1")
	h.limitedVolume("v1", target, &limits)
	h.runUntilIdle()

	if r, _ := h.store.Result("v1", state.PublishKey(target)); !r.Ready {
		t.Errorf("publish result: got %+v, want ready", r)
	}
	if c := h.store.Condition("v1"); c.Reason != contract.IOLimitsNotApplied || !strings.Contains(c.Message, target) {
		t.Errorf("condition: got %+v, want %s naming %s", c, contract.IOLimitsNotApplied, target)
	}
	if calls := h.cgroups.takeCalls(); len(calls) != 0 {
		t.Errorf("throttler calls: got %v, want none", calls)
	}
}

// TestVolumesWithoutLimitsNeverReadCgroups checks that a volume whose
// record never asked for IO limits costs nothing: no call of the
// throttler, from set-up to teardown.
func TestVolumesWithoutLimitsNeverReadCgroups(t *testing.T) {
	h := newHarness(t)
	h.cgroups.addPod("u1", "ctr-a")
	target := h.podTarget("v1", "u1")
	h.limitedVolume("v1", target, nil)
	h.runUntilIdle()
	h.update("v1", func(v *state.Volume) { v.RequestUnpublish(target) })
	h.runUntilIdle()
	if calls := h.cgroups.takeCalls(); len(calls) != 0 {
		t.Errorf("throttler calls: got %v, want none", calls)
	}
}

// TestIOLimitsOnlyInThePublishingPods checks that the rules go into the
// cgroups of the pods that publish the volume and no other: not another
// pod's, and so not csi-node's own, whose mkfs and fsck are never
// throttled.
func TestIOLimitsOnlyInThePublishingPods(t *testing.T) {
	h := newHarness(t)
	h.cgroups.addPod("u1", "ctr-a")
	h.cgroups.addPod("csi-node-pod", "csi-node")
	h.limitedVolume("v1", h.podTarget("v1", "u1"), &limits)
	h.runUntilIdle()
	h.checkRules("u1", h.dev("v1"), limits)
	h.checkRules("csi-node-pod", h.dev("v1"), host.IOLimits{})
	for _, c := range h.cgroups.takeCalls() {
		if strings.Contains(c, "csi-node") {
			t.Errorf("throttler call %q about a pod that does not publish the volume", c)
		}
	}
}

// TestIOLimitsFailureIsRetried checks that a rule the kernel refuses is
// a failure of the intent, retried with backoff, while the publish waits
// for its pod's limits.
func TestIOLimitsFailureIsRetried(t *testing.T) {
	h := newHarness(t)
	h.cgroups.addPod("u1", "ctr-a")
	target := h.podTarget("v1", "u1")
	ctr := podCgroupDir("u1") + "/ctr-a"
	h.cgroups.failOn("set "+ctr, errors.New("write: no such device"))
	h.limitedVolume("v1", target, &limits)
	h.runUntilIdle()

	r := h.ioResult("v1")
	if r.Ready || r.Err == nil || !strings.Contains(r.Err.Message, "no such device") {
		t.Errorf("IO limits result: got %+v, want the failure", r)
	}
	if r, _ := h.store.Result("v1", state.PublishKey(target)); r.Ready {
		t.Errorf("publish result: got %+v, want not ready while its pod is not limited", r)
	}
	h.cgroups.failOn("set "+ctr, nil)
	h.clock.Step(DefaultBackoffMax)
	h.runUntilIdle()
	h.checkRules("u1", h.dev("v1"), limits)
	if r, _ := h.store.Result("v1", state.PublishKey(target)); !r.Ready {
		t.Errorf("publish result after the retry: got %+v, want ready", r)
	}
}

// TestIOLimitsIOControllerNotEnabledInThePodsCgroup checks, through
// devices.CgroupIO on a cgroup v2 tree laid out as the kubelet's systemd
// driver lays it out, that a pod's cgroup that is there without io.max
// (io not in its parent's cgroup.subtree_control) is not taken for a pod
// gone: the volume is DEGRADED IOLimitsNotApplied, saying what to enable,
// its publish is answered all the same (as on a node without an io
// controller), and its unpublish is not held back.
func TestIOLimitsIOControllerNotEnabledInThePodsCgroup(t *testing.T) {
	h := newHarness(t)
	const uid = "0b5c8f1e-32c4-4b7a-9d1e-8a2f6c3d4e5f"
	root := t.TempDir()
	slice := filepath.Join(root, "kubepods.slice", "kubepods-burstable.slice")
	pod := filepath.Join(slice, "kubepods-burstable-pod"+strings.ReplaceAll(uid, "-", "_")+".slice")
	if err := os.MkdirAll(filepath.Join(pod, "cri-containerd-c1.scope"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, target := h.v2PodPublish(uid, root, map[string]string{
		"kubepods.slice/io.max":                                          "",
		"kubepods.slice/kubepods-burstable.slice/io.max":                 "",
		"kubepods.slice/kubepods-burstable.slice/cgroup.subtree_control": "cpu memory pids\n",
	}, &limits)

	if r, _ := h.store.Result("v1", state.PublishKey(target)); !r.Ready {
		t.Errorf("publish result: got %+v, want ready", r)
	}
	c := h.store.Condition("v1")
	if c.Reason != contract.IOLimitsNotApplied || c.Health != state.Degraded || !strings.Contains(c.Message, filepath.Join(slice, "cgroup.subtree_control")) {
		t.Errorf("condition: got %+v, want DEGRADED %s naming %s", c, contract.IOLimitsNotApplied, filepath.Join(slice, "cgroup.subtree_control"))
	}
	if r := h.ioResult("v1"); r.Ready || !strings.Contains(r.Waiting, "io controller is not enabled") {
		t.Errorf("IO limits result: got %+v, want waiting, saying the io controller is not enabled", r)
	}
	// Nothing to remove holds the unpublish back.
	h.update("v1", func(v *state.Volume) { v.RequestUnpublish(target) })
	h.runUntilIdle()
	if v, _ := h.store.Get("v1"); v.Publishes[target] != nil {
		t.Errorf("publish after unpublish: got %+v, want forgotten", v.Publishes[target])
	}
}

// TestIOLimitsPodCgroupNeverFound checks that a live publish's pod whose
// cgroup is not found (here: --cgroup-root names a hierarchy where the
// kubelet made none) is not reported while it may be the moment before
// the kubelet makes it, and is reported, naming where it was looked for,
// once it has been missing for cgroupMissingGrace by the reconciler's
// clock; and that the report goes once the cgroup is found.
func TestIOLimitsPodCgroupNeverFound(t *testing.T) {
	h := newHarness(t)
	const uid = "0b5c8f1e-32c4-4b7a-9d1e-8a2f6c3d4e5f"
	root := t.TempDir()
	cg, _ := h.v2PodPublish(uid, root, nil, &limits)

	for _, step := range []time.Duration{0, cgroupMissingGrace / 2, cgroupMissingGrace/2 - time.Second} {
		h.clock.Step(step)
		h.pass()
		if c := h.store.Condition("v1"); c.Abnormal {
			t.Fatalf("condition %s after the publish: got %+v, want normal", h.clock.Since(time.Unix(1_000_000, 0)), c)
		}
	}
	h.clock.Step(time.Second)
	h.pass()
	c := h.store.Condition("v1")
	if c.Reason != contract.IOLimitsNotApplied || c.Health != state.Degraded || !strings.Contains(c.Message, "pod "+uid) ||
		!strings.Contains(c.Message, "within 3 levels of "+cg.Root) || !strings.Contains(c.Message, "--cgroup-root") {
		t.Errorf("condition a minute after the publish: got %+v, want DEGRADED %s naming pod %s, the cgroup root and the depth searched", c, contract.IOLimitsNotApplied, uid)
	}

	pod := filepath.Join(root, "kubepods", "burstable", "pod"+uid)
	if err := os.MkdirAll(pod, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pod, "io.max"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h.runUntilIdle()
	if c := h.store.Condition("v1"); c.Abnormal {
		t.Errorf("condition once the pod's cgroup is found: got %+v, want normal", c)
	}
}

// TestIOLimitsNewContainersAreNoRepairs checks that on cgroup v1, where
// each container's cgroup needs the rules, a container started or
// restarted (a crash loop) gets them at the next pass without counting a
// repair or backing off as one; and that a cgroup seen holding them and
// then edited is a repair.
func TestIOLimitsNewContainersAreNoRepairs(t *testing.T) {
	h := newHarness(t)
	rec := &countingRecorder{ops: map[string]int{}}
	h.r.cfg.Recorder = rec
	h.cgroups.addPod("u1", "ctr-a")
	h.limitedVolume("v1", h.podTarget("v1", "u1"), &limits)
	h.runUntilIdle()
	dev := h.dev("v1")

	for i := range 3 {
		dir := h.cgroups.addContainer("u1", fmt.Sprintf("ctr-restart-%d", i))
		h.pass()
		if got := h.cgroups.rule(dir, dev); got != limits {
			t.Errorf("container %d's new cgroup after one pass: got %v, want %v", i, got, limits)
		}
		h.pass()
	}
	if n := rec.repairs["set io limits"]; n != 0 {
		t.Errorf("repairs after 3 new containers: got %d, want 0", n)
	}

	h.editedAndRepaired(rec, dev)
}

// v2PodPublish makes root a cgroup v2 hierarchy with io enabled at its
// top and files (path below root: content) besides, has the reconciler
// throttle through it, and publishes volume v1, limited to l, for pod uid. It
// returns the throttler and the publish's target.
func (h *harness) v2PodPublish(uid, root string, files map[string]string, l *host.IOLimits) (devices.CgroupIO, string) {
	h.t.Helper()
	all := map[string]string{"cgroup.controllers": "cpu io memory pids\n", "cgroup.subtree_control": "cpu io memory pids\n"}
	for p, content := range files {
		all[p] = content
	}
	for p, content := range all {
		if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
			h.t.Fatal(err)
		}
	}
	cg, err := devices.DetectCgroupIO(root)
	if err != nil {
		h.t.Fatal(err)
	}
	h.r.cfg.Throttler = cg
	target := h.podTarget("v1", uid)
	h.limitedVolume("v1", target, l)
	h.runUntilIdle()
	return cg, target
}

// editedAndRepaired edits the rule of dev in pod u1's container cgroup
// from outside and checks that one pass sets limits back and counts one
// repair (rec's first).
func (h *harness) editedAndRepaired(rec *countingRecorder, dev host.DevNum) {
	h.t.Helper()
	ctr := h.cgroups.cgroupsOf("u1")[1]
	h.cgroups.edit(ctr, dev, host.IOLimits{ReadIOPS: 5})
	h.pass()
	if got := h.cgroups.rule(ctr, dev); got != limits {
		h.t.Errorf("rule edited from outside, after one pass: got %v, want %v", got, limits)
	}
	if n := rec.repairs["set io limits"]; n != 1 {
		h.t.Errorf("repairs after a cgroup held the limits and lost them: got %d, want 1", n)
	}
}

// limitedPod is a harness counting what it records, with pod u1 (one
// container, ctr-a) publishing volume v1 limited to limits, the limits
// applied; it returns the publish's target and the volume's device.
func limitedPod(t *testing.T) (*harness, *countingRecorder, string, host.DevNum) {
	t.Helper()
	h := newHarness(t)
	rec := &countingRecorder{ops: map[string]int{}}
	h.r.cfg.Recorder = rec
	h.cgroups.addPod("u1", "ctr-a")
	target := h.podTarget("v1", "u1")
	h.limitedVolume("v1", target, &limits)
	h.runUntilIdle()
	return h, rec, target, h.dev("v1")
}
