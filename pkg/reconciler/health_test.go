package reconciler

import (
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/state"
)

// staged makes a volume staged and published at one target and settles.
func (h *harness) stagedAndPublished(id string) (staging, target string) {
	h.t.Helper()
	staging, target = h.volume(id)
	h.update(id, func(v *state.Volume) {
		v.Stage = stageSpec(staging)
		v.Publishes = map[string]*state.Publish{target: publishSpec()}
	})
	h.runUntilIdle()
	if got, want := mountPaths(h.world), []string{staging, target}; !slices.Equal(got, want) {
		h.t.Fatalf("mounts after set-up: got %v, want %v", got, want)
	}
	return staging, target
}

// tornDown withdraws volume id's stage and its publish at target, settles,
// and fails the test unless nothing is left mounted.
func (h *harness) tornDown(id, target string) {
	h.t.Helper()
	h.update(id, func(v *state.Volume) {
		v.Stage.Deleting = true
		v.Publishes[target].Deleting = true
	})
	h.runUntilIdle()
	if m := mountPaths(h.world); len(m) != 0 {
		h.t.Errorf("mounts after teardown: got %v, want none", m)
	}
}

// staged makes a volume staged, with no publish, and settles.
func (h *harness) staged(id string) (staging string) {
	h.t.Helper()
	staging, _ = h.volume(id)
	h.update(id, func(v *state.Volume) { v.Stage = stageSpec(staging) })
	h.runUntilIdle()
	return staging
}

// wantNormal fails the test unless volume id's condition is normal.
func (h *harness) wantNormal(id, when string) {
	h.t.Helper()
	if c := h.store.Condition(id); c.Abnormal {
		h.t.Errorf("condition %s: got %+v, want normal", when, c)
	}
}

// callsSince returns the calls made after the first n.
func (h *harness) callsSince(n int) string {
	return strings.Join(h.world.Calls()[n:], ",")
}

func TestShutDownFilesystemIsRemounted(t *testing.T) {
	h := newHarness(t)
	staging, target := h.stagedAndPublished("v1")
	n := len(h.world.Calls())
	h.world.damage(h.world.Path("v1"), true, false)

	h.runUntilIdle()
	// The target is sealed before its unmount, so that a container the
	// kubelet restarts meanwhile cannot write to the bare directory.
	want := "seal " + target + ",unmount " + target + ",unmount " + staging + ",blkid,mount " + staging + ",bind " + target
	if got := h.callsSince(n); got != want {
		t.Errorf("calls:\n got %s\nwant %s", got, want)
	}
	h.wantNormal("v1", "after repair")
	if got := strings.Join(h.world.Calls(), ","); strings.Count(got, "mkfs") != 1 {
		t.Errorf("calls: got %s, want exactly one mkfs", got)
	}
}

func TestRepairsBackOffWhenDamageComesBack(t *testing.T) {
	h := newHarness(t)
	staging, _ := h.stagedAndPublished("v1")
	image := h.world.Path("v1")
	h.world.killSuperblock(image, true) // every remount gets the dead superblock again
	h.world.damage(image, true, false)

	unmounts := func() int {
		n := 0
		for _, c := range h.world.Calls() {
			if c == "unmount "+staging {
				n++
			}
		}
		return n
	}
	// Without the repair backoff, each pass would unmount and remount.
	for range 10 {
		h.r.Pass(t.Context())
		h.r.wait()
	}
	if got := unmounts(); got != 1 {
		t.Fatalf("staging unmounts in 10 passes without time passing: got %d, want 1", got)
	}
	c := h.store.Condition("v1")
	if c.Health != state.Inaccessible || c.Reason != "FilesystemUnusable" {
		t.Errorf("condition: got %+v, want INACCESSIBLE FilesystemUnusable", c)
	}
	h.clock.Step(DefaultBackoffInitial)
	for range 10 {
		h.r.Pass(t.Context())
		h.r.wait()
	}
	if got := unmounts(); got != 2 {
		t.Errorf("staging unmounts after one backoff: got %d, want 2", got)
	}

	// Once the superblock is released, the next repair heals the volume
	// and resets the backoff.
	h.world.killSuperblock(image, false)
	h.clock.Step(DefaultBackoffMax)
	h.runUntilIdle()
	h.wantNormal("v1", "after the superblock is released")
	// Healed, the repair backoff is reset: damage coming back at once is
	// repaired at once.
	before := unmounts()
	h.world.damage(image, true, false)
	h.runUntilIdle()
	if got := unmounts(); got != before+1 {
		t.Errorf("staging unmounts of damage right after healing: got %d, want 1 (no repair backoff)", got-before)
	}
	h.wantNormal("v1", "after the damage came back and was repaired")
}

func TestReadOnlyAfterErrorsWaitsForPublishesToGo(t *testing.T) {
	h := newHarness(t)
	staging, target := h.stagedAndPublished("v1")
	n := len(h.world.Calls())
	h.world.damage(h.world.Path("v1"), false, true)

	h.runUntilIdle()
	if got := h.callsSince(n); got != "" {
		t.Errorf("calls while a pod uses the filesystem: got %s, want none", got)
	}
	c := h.store.Condition("v1")
	if c.Health != state.Degraded || c.Reason != "FilesystemReadOnly" {
		t.Errorf("condition: got %+v, want DEGRADED FilesystemReadOnly", c)
	}
	if r, _ := h.store.Result("v1", state.PublishKey(target)); !r.Ready {
		t.Errorf("existing publish: got %+v, want still ready", r)
	}

	// A new publish is not made on the damaged filesystem, and says why.
	second := "/k/pod-v1/second"
	h.update("v1", func(v *state.Volume) { v.Publishes[second] = publishSpec() })
	h.runUntilIdle()
	if r, _ := h.store.Result("v1", state.PublishKey(second)); r.Ready || !strings.Contains(r.Waiting, "read-only after errors") {
		t.Errorf("new publish: got %+v, want not ready, waiting on the read-only filesystem", r)
	}

	// Once the pods are gone, the filesystem is remounted (fsck runs in
	// FormatAndMount) and the waiting publish is made.
	h.update("v1", func(v *state.Volume) { v.Publishes[target].Deleting = true })
	h.runUntilIdle()
	want := "unmount " + target + ",unmount " + staging + ",blkid,mount " + staging + ",bind " + second
	if got := h.callsSince(n); got != want {
		t.Errorf("calls:\n got %s\nwant %s", got, want)
	}
	h.wantNormal("v1", "after remount")
}

func TestCorruptedTargetIsRemounted(t *testing.T) {
	h := newHarness(t)
	_, target := h.stagedAndPublished("v1")
	n := len(h.world.Calls())
	h.world.corruptMount(target, syscall.ESTALE)
	h.r.Pass(t.Context())
	h.r.wait()
	if c := h.store.Condition("v1"); c.Reason != "PublishMountUnusable" {
		t.Errorf("condition: got %+v, want PublishMountUnusable", c)
	}
	h.world.corruptMount(target, nil)
	h.runUntilIdle()
	if got, want := h.callsSince(n), "seal "+target+",unmount "+target+",bind "+target; got != want {
		t.Errorf("calls: got %s, want %s", got, want)
	}
}

// A target that cannot be sealed (a filesystem without the immutable flag
// under the kubelet's directory) is still repaired: an unusable volume
// helps no pod.
func TestUnsealableTargetIsStillRemounted(t *testing.T) {
	h := newHarness(t)
	_, target := h.stagedAndPublished("v1")
	h.world.failOn("seal "+target, syscall.EOPNOTSUPP)
	n := len(h.world.Calls())
	h.world.corruptMount(target, syscall.ESTALE)
	h.r.Pass(t.Context())
	h.r.wait()
	h.world.corruptMount(target, nil)
	h.runUntilIdle()
	if got, want := h.callsSince(n), "seal "+target+",unmount "+target+",bind "+target; got != want {
		t.Errorf("calls: got %s, want %s", got, want)
	}
	h.wantNormal("v1", "after remount")
}

func TestDetachedFromOutsideIsKept(t *testing.T) {
	h := newHarness(t)
	h.stagedAndPublished("v1")
	image := h.world.Path("v1")
	h.world.autoClear(image)
	l, _ := h.world.loop(image)
	n := len(h.world.Calls())

	h.r.Pass(t.Context())
	h.r.wait()
	if c := h.store.Condition("v1"); c.Reason != "DeviceDetachPending" {
		t.Errorf("condition: got %+v, want DeviceDetachPending", c)
	}
	h.runUntilIdle()
	if got, want := h.callsSince(n), "keep "+l.Device; got != want {
		t.Errorf("calls: got %s, want %s", got, want)
	}
	h.wantNormal("v1", "after keep")
}

func TestConditionNamesUnusablePaths(t *testing.T) {
	h := newHarness(t)
	staging, target := h.stagedAndPublished("v1")
	h.world.failOn("mount "+staging, errors.New("busy"))
	h.world.unmountAll() // someone unmounted both
	h.r.Pass(t.Context())
	h.r.wait()
	h.r.Pass(t.Context())
	c := h.store.Condition("v1")
	if c.Reason != "StagingMountMissing" || c.Health != state.Inaccessible {
		t.Errorf("condition: got %+v, want INACCESSIBLE StagingMountMissing", c)
	}
	if !slices.Equal(c.Unusable, []string{staging, target}) {
		t.Errorf("unmounted: got %v, want %v", c.Unusable, []string{staging, target})
	}
	h.world.failOn("mount "+staging, nil)
	h.clock.Step(time.Minute)
	h.runUntilIdle()
	if c := h.store.Condition("v1"); c.Abnormal || len(c.Unusable) > 0 {
		t.Errorf("condition after healing: got %+v, want normal", c)
	}
}

func TestDataLossOfAStagedVolumeIsReportedNotRolledBack(t *testing.T) {
	h := newHarness(t)
	staging, target := h.stagedAndPublished("v1")
	image := h.world.Path("v1")
	h.world.unmountAll()     // both mounts gone...
	h.world.setFs(image, "") // ...and the filesystem with them
	h.runUntilIdle()

	if n := h.world.mkfsCount(image); n != 1 {
		t.Fatalf("formatted %d times, want once", n)
	}
	v, err := h.store.Get("v1")
	if err != nil || v.Stage == nil || v.Stage.Deleting || v.Publishes[target] == nil || v.Publishes[target].Deleting {
		t.Fatalf("record after data loss: got %+v, %v; want the stage and publish kept", v, err)
	}
	c := h.store.Condition("v1")
	if c.Health != state.DataLost || c.Reason != "FilesystemMissing" || !slices.Contains(c.Unusable, staging) {
		t.Errorf("condition: got %+v, want DATA_LOSS FilesystemMissing with %s unusable", c, staging)
	}
}

func TestTerminalStageFailureWithdrawsItsPublishes(t *testing.T) {
	h := newHarness(t)
	staging, target := h.volume("v1")
	h.world.setFs(h.world.Path("v1"), "xfs") // not what the stage asks for
	v := h.update("v1", func(v *state.Volume) {
		v.Stage = stageSpec(staging)
		v.Publishes = map[string]*state.Publish{target: publishSpec()}
	})
	h.runUntilIdle()
	if f := h.store.TerminalFailureFor("v1", state.PublishKey(target), v.Publishes[target].Generation); f == nil || f.Kind != classified.KindFailedPrecondition || !strings.Contains(f.Message, "staging failed") {
		t.Errorf("publish final: got %+v, want FailedPrecondition naming the staging failure", f)
	}
	if got, err := h.store.Get("v1"); err == nil {
		t.Errorf("record after rollback: got %+v, want it gone", got)
	}
}

func TestNoFreeLoopDeviceIsResourceExhausted(t *testing.T) {
	h := newHarness(t)
	staging, _ := h.volume("v1")
	h.world.failOn("attach", devices.ErrNoLoopDevice)
	v := h.update("v1", func(v *state.Volume) { v.Stage = stageSpec(staging) })
	h.runUntilIdle()
	r, _ := h.store.Result("v1", state.StageKey)
	if r.Ready || r.Err == nil || r.Err.Kind != classified.KindResourceExhausted || r.Generation != v.Stage.Generation {
		t.Fatalf("result: got %+v, want a ResourceExhausted failure", r)
	}
	if got, _ := h.store.Get("v1"); got.Stage == nil || got.Stage.Deleting {
		t.Errorf("stage after running out of loop devices: got %+v, want it kept and retried", got.Stage)
	}
}

func TestRepeatedFailuresAreDegraded(t *testing.T) {
	h := newHarness(t)
	h.stagedAndPublished("v1")
	// A second pod's publish keeps failing.
	target := "/k/pod-v1/second"
	h.world.failOn("bind "+target, errors.New("EBUSY"))
	h.update("v1", func(v *state.Volume) { v.Publishes[target] = publishSpec() })
	for i := range repeatedFailures {
		h.r.Pass(t.Context())
		h.r.wait()
		h.clock.Step(DefaultBackoffMax)
		if c := h.store.Condition("v1"); i < repeatedFailures-1 && c.Reason == "OperationFailing" {
			t.Fatalf("after %d failures: got %+v, want not yet OperationFailing", i+1, c)
		}
	}
	h.r.Pass(t.Context())
	h.r.wait()
	if c := h.store.Condition("v1"); c.Health != state.Degraded || c.Reason != "OperationFailing" || !strings.Contains(c.Message, "publish "+target) {
		t.Errorf("condition: got %+v, want DEGRADED OperationFailing naming the publish", c)
	}
	h.world.failOn("bind "+target, nil)
	h.clock.Step(DefaultBackoffMax)
	h.runUntilIdle()
	h.wantNormal("v1", "after the publish was made")
}

// TestOnlyOwnMountsAreStrays checks that the plugin unmounts a mount of a
// volume at a path no record names only when it made that mount: the
// kubelet's subPath bind mounts inside the kubelet directory, and a mount
// that reused the mountinfo ID of one of the plugin's, are someone else's
// and stay; the plugin's own mount, moved away by a rename, goes.
func TestOnlyOwnMountsAreStrays(t *testing.T) {
	h := newHarness(t)
	_, target := h.stagedAndPublished("v1")
	h.runUntilIdle()
	v, _ := h.store.Get("v1")
	if v.Stage.MountID == 0 || v.Publishes[target].MountID == 0 {
		t.Fatalf("mount IDs after publish: stage %d, publish %d; want both recorded", v.Stage.MountID, v.Publishes[target].MountID)
	}
	// The kubelet bind mounts a directory of the volume for a container.
	subPath := "/k/pods/v1/volume-subpaths/pv/c/0"
	m, _ := h.world.topMount(target)
	m.Path, m.Root = subPath, "/data"
	h.world.mountOutside(m, false)
	h.runUntilIdle()
	if !slices.Contains(mountPaths(h.world), subPath) {
		t.Errorf("the kubelet's subPath mount at %s was unmounted", subPath)
	}

	// The plugin's own publish mount is moved away by a rename, and the
	// kubelet's subPath mount is made again; the kernel may give it the
	// mountinfo ID the moved mount had once that one is gone.
	moved := "/k/moved/mount"
	h.world.moveMounts(target, moved)
	h.runUntilIdle()
	paths := mountPaths(h.world)
	if slices.Contains(paths, moved) {
		t.Errorf("the plugin's own mount moved to %s was not unmounted: %v", moved, paths)
	}
	if !slices.Contains(paths, target) || !slices.Contains(paths, subPath) {
		t.Errorf("mounts after healing: got %v, want %s published again and %s kept", paths, target, subPath)
	}
	reused, _ := h.world.topMount(target)
	reused.Path = "/k/pods/v1/volume-subpaths/pv/c/1"
	h.world.mountOutside(reused, false)
	h.runUntilIdle()
	if !slices.Contains(mountPaths(h.world), reused.Path) {
		t.Errorf("a second subPath mount at %s was unmounted", reused.Path)
	}
}
