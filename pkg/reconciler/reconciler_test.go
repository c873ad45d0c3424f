package reconciler

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
	"github.com/converge-csi/converge/pkg/volstatus"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type harness struct {
	t     *testing.T
	world *fakeWorld
	// cgroups are the pods' cgroups the reconciler's Throttler holds to
	// IO limits.
	cgroups *fakeCgroups
	store   *state.Store
	clock   *clocktesting.FakeClock
	r       *Reconciler
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	store, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	w := newFakeWorld()
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	cg := newFakeCgroups()
	r, err := New(Config{
		Store: store, Observer: w, Loops: w, Filesystems: w, Paths: w, Pools: fakePools(w), Clock: clk,
		Roots: []string{"/k"}, KubeletDir: "/k", Throttler: cg,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, world: w, cgroups: cg, store: store, clock: clk, r: r}
}

// runUntilIdle runs passes, each after waiting for running operations, until a
// pass starts nothing.
func (h *harness) runUntilIdle() {
	h.t.Helper()
	for range 50 {
		h.r.wait()
		n, err := h.r.Pass(context.Background())
		if err != nil {
			h.t.Fatal(err)
		}
		h.r.wait()
		if n == 0 {
			return
		}
	}
	h.t.Fatal("reconciler did not settle in 50 passes")
}

func (h *harness) update(id string, fn func(v *state.Volume)) *state.Volume {
	h.t.Helper()
	v, err := h.store.Update(id, func(v *state.Volume) error { fn(v); return nil })
	if err != nil {
		h.t.Fatal(err)
	}
	return v
}

// volume makes an image and the kubelet's directories for id.
func (h *harness) volume(id string) (staging, target string) {
	h.world.makeImages(id)
	staging = "/k/staging/" + id
	h.world.makeDirs(staging, "/k/pod-"+id)
	return staging, "/k/pod-" + id + "/mount"
}

func stageSpec(path string) *state.Stage {
	return &state.Stage{Path: path, Access: state.AccessMount, AccessMode: "SINGLE_NODE_WRITER"}
}

func publishSpec() *state.Publish {
	return &state.Publish{Access: state.AccessMount, AccessMode: "SINGLE_NODE_WRITER"}
}

func mountPaths(w *fakeWorld) []string {
	var out []string
	for _, m := range w.mountTable() {
		out = append(out, m.Path)
	}
	return out
}

func TestDiffOrder(t *testing.T) {
	loop := &host.Device{Device: "/dev/loop0", Dev: host.DevNum{Major: 7}}
	staged := &actual{loop: loop, stageInPlace: true, stagingMount: &host.Mount{}, targets: map[string]*host.Mount{}}
	bare := &actual{targets: map[string]*host.Mount{}}
	unknown := &actual{loop: loop, stageInPlace: true, stagingMount: &host.Mount{}, targets: map[string]*host.Mount{}, unknownMounts: []string{"/a.moved"}}
	pub := func(deleting bool) *state.Publish { p := publishSpec(); p.Deleting = deleting; return p }
	st := func(deleting bool) *state.Stage { s := stageSpec("/s"); s.Deleting = deleting; return s }
	tests := []struct {
		name string
		v    *state.Volume
		a    *actual
		want []string
	}{
		{name: "nothing recorded", v: &state.Volume{}, a: bare, want: nil},
		{name: "stage before publish", v: &state.Volume{Stage: st(false), Publishes: map[string]*state.Publish{"/t": pub(false)}}, a: bare, want: []string{"stage"}},
		{name: "publish on a ready stage", v: &state.Volume{Stage: st(false), Formatted: "ext4", Publishes: map[string]*state.Publish{"/t": pub(false)}}, a: staged, want: []string{"publish /t"}},
		{name: "provenance missing re-runs stage", v: &state.Volume{Stage: st(false), Publishes: map[string]*state.Publish{"/t": pub(false)}}, a: staged, want: []string{"stage"}},
		{name: "unpublish before set-up", v: &state.Volume{Stage: st(false), Formatted: "ext4", Publishes: map[string]*state.Publish{"/a": pub(false), "/b": pub(true)}}, a: staged, want: []string{"unpublish /b", "publish /a"}},
		{name: "unstage waits for publishes", v: &state.Volume{Stage: st(true), Formatted: "ext4", Publishes: map[string]*state.Publish{"/b": pub(true)}}, a: staged, want: []string{"unpublish /b"}},
		{name: "unstage once publishes are gone", v: &state.Volume{Stage: st(true), Formatted: "ext4"}, a: staged, want: []string{"unstage"}},
		{name: "converged", v: &state.Volume{Stage: st(false), Formatted: "ext4"}, a: staged, want: nil},
		{name: "a mount of unknown owner holds publishes", v: &state.Volume{Stage: st(false), Formatted: "ext4", Publishes: map[string]*state.Publish{"/a": pub(false), "/b": pub(true)}}, a: unknown, want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, a := range diff(tc.v, tc.a) {
				got = append(got, a.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// syncCounter is the store with a count of the durable updates made
// through it.
type syncCounter struct {
	*state.Store
	// updates counts the calls of Update.
	updates atomic.Int32
}

func (s *syncCounter) Update(id string, fn func(v *state.Volume) error) (*state.Volume, error) {
	s.updates.Add(1)
	return s.Store.Update(id, fn)
}

// TestStageRecordsWithoutASync checks that a stage records what it made
// (the provenance, the size the filesystem fills, the staging mount's
// unique ID) in one write that does not wait for the disk: the publish
// that lets data onto the filesystem makes it durable (recordFormatted).
func TestStageRecordsWithoutASync(t *testing.T) {
	h := newHarness(t)
	counter := &syncCounter{Store: h.store}
	h.r.cfg.Store = counter
	staging, _ := h.volume("v1")
	v := h.update("v1", func(v *state.Volume) { v.Stage = stageSpec(staging) })
	h.runUntilIdle()

	if n := counter.updates.Load(); n != 0 {
		t.Errorf("durable updates by the stage: got %d, want 0", n)
	}
	got, _ := h.store.Get("v1")
	if got.Formatted != "ext4" || got.FsSize != 64<<20 || got.Stage.MountID == 0 {
		t.Errorf("record after the stage: got provenance %q, fs size %d, mount ID %d; want ext4, %d and the mount's ID",
			got.Formatted, got.FsSize, got.Stage.MountID, 64<<20)
	}
	if got.Generation != v.Generation+1 {
		t.Errorf("record generation after the stage: got %d, want %d (one write)", got.Generation, v.Generation+1)
	}
}

func TestStageThenPublishThenTeardown(t *testing.T) {
	h := newHarness(t)
	staging, target := h.volume("v1")
	v := h.update("v1", func(v *state.Volume) {
		v.Stage = stageSpec(staging)
		v.Publishes = map[string]*state.Publish{target: publishSpec()}
	})
	h.runUntilIdle()

	if got, want := mountPaths(h.world), []string{staging, target}; !slices.Equal(got, want) {
		t.Fatalf("mounts: got %v, want %v", got, want)
	}
	if r, _ := h.store.Result("v1", state.StageKey); !r.Ready || r.Generation != v.Stage.Generation {
		t.Errorf("stage result: got %+v, want ready at generation %d", r, v.Stage.Generation)
	}
	if r, _ := h.store.Result("v1", state.PublishKey(target)); !r.Ready {
		t.Errorf("publish result: got %+v, want ready", r)
	}
	got, _ := h.store.Get("v1")
	if got.Formatted != "ext4" {
		t.Errorf("provenance: got %q, want ext4", got.Formatted)
	}

	h.tornDown("v1", target)
	if loops := h.world.loopKeys(); len(loops) != 0 {
		t.Errorf("loops after teardown: got %v, want none", loops)
	}
	got, _ = h.store.Get("v1")
	if got.Stage != nil || len(got.Publishes) != 0 || got.Formatted != "ext4" {
		t.Errorf("record after teardown: got %+v, want no intents and provenance kept", got)
	}
	calls := strings.Join(h.world.Calls(), ",")
	dev := fmt.Sprintf("/dev/loop%d", minorOf(h.world.Path("v1")))
	// A new image holds nothing: formatted without blkid.
	want := "blank,attach,mount " + staging + ",mkfs " + dev + ",bind " + target + ",unmount " + target + ",unmount " + staging + ",detach"
	if calls != want {
		t.Errorf("calls:\n got %s\nwant %s", calls, want)
	}
}

// TestWithdrawnMountsAreNotChecked checks that a pass stats the mount
// points of live intents only: a withdrawn publish or stage is unmounted
// whatever its mount's state, and under a teardown of many volumes the
// passes run back to back. The mounts are corrupted, so that a check
// would show.
func TestWithdrawnMountsAreNotChecked(t *testing.T) {
	h := newHarness(t)
	staging, target := h.stagedAndPublished("v1")
	checks := h.world.takeChecks(staging, target)
	h.world.corruptMount(staging, syscall.ENOTCONN)
	h.world.corruptMount(target, syscall.ENOTCONN)
	if checks[0] == 0 || checks[1] == 0 {
		t.Fatal("the live stage and publish were never checked")
	}

	h.tornDown("v1", target)
	if checks := h.world.takeChecks(staging, target); checks[0]+checks[1] != 0 {
		t.Errorf("the withdrawn mounts were checked %v times, want none", checks)
	}
}

// TestOperationAnswersItsRequest checks that a successful stage or publish
// reports its intent fulfilled when it ends, as the kubelet marks a volume
// mounted when its operation succeeds, so the waiting request does not wait
// for another pass; and that a failed one does not.
func TestOperationAnswersItsRequest(t *testing.T) {
	h := newHarness(t)
	staging, target := h.volume("v1")
	v := h.update("v1", func(v *state.Volume) { v.Stage = stageSpec(staging) })
	pass := func() {
		t.Helper()
		if _, err := h.r.Pass(context.Background()); err != nil {
			t.Fatal(err)
		}
		h.r.wait()
	}
	pass()
	if r, _ := h.store.Result("v1", state.StageKey); !r.Ready || r.Generation != v.Stage.Generation {
		t.Fatalf("stage result after the pass that staged: got %+v, want ready at generation %d", r, v.Stage.Generation)
	}
	if c := h.store.Condition("v1"); slices.Contains(c.Unusable, staging) {
		t.Errorf("condition after the pass that staged: got %+v, want %s usable", c, staging)
	}
	v = h.update("v1", func(v *state.Volume) { v.Publishes = map[string]*state.Publish{target: publishSpec()} })
	pass()
	if r, _ := h.store.Result("v1", state.PublishKey(target)); !r.Ready || r.Generation != v.Publishes[target].Generation {
		t.Fatalf("publish result after the pass that published: got %+v, want ready at generation %d", r, v.Publishes[target].Generation)
	}
	if c := h.store.Condition("v1"); slices.Contains(c.Unusable, target) {
		t.Errorf("condition after the pass that published: got %+v, want %s usable (NodeGetVolumeStats reads it)", c, target)
	}

	target2 := "/k/pod-v1b/mount"
	h.world.makeDirs("/k/pod-v1b")
	h.world.failOn("bind "+target2, errors.New("EBUSY"))
	h.update("v1", func(v *state.Volume) { v.Publishes[target2] = publishSpec() })
	pass()
	if r, _ := h.store.Result("v1", state.PublishKey(target2)); r.Ready {
		t.Errorf("result of a failed publish: got %+v, want not ready", r)
	}
	pass() // the pass the failure kicked reports it
	if r, _ := h.store.Result("v1", state.PublishKey(target2)); r.Ready || r.Err == nil {
		t.Errorf("result of a failed publish, a pass later: got %+v, want not ready with its error", r)
	}
}

func TestTransientFailureBacksOff(t *testing.T) {
	h := newHarness(t)
	staging, _ := h.volume("v1")
	h.world.failOn("mount "+staging, errors.New("device busy"))
	h.update("v1", func(v *state.Volume) { v.Stage = stageSpec(staging) })

	attempts := func() int {
		n := 0
		for _, c := range h.world.Calls() {
			if c == "mount "+staging {
				n++
			}
		}
		return n
	}
	ctx := context.Background()
	h.r.Pass(ctx)
	h.r.wait()
	if got := attempts(); got != 1 {
		t.Fatalf("attempts after the first pass: got %d, want 1", got)
	}
	h.r.Pass(ctx) // publishes the failure; the backoff holds the retry
	h.r.wait()
	r, _ := h.store.Result("v1", state.StageKey)
	if r.Err == nil || r.Attempts != 1 || !r.NextRetry.Equal(h.clock.Now().Add(500*time.Millisecond)) {
		t.Fatalf("result after one failure: got %+v, want attempt 1 retrying in 500ms", r)
	}
	if got := attempts(); got != 1 {
		t.Fatalf("retried inside the backoff: %d attempts", got)
	}
	for i, wait := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second} {
		h.clock.Step(wait - time.Millisecond)
		h.r.Pass(ctx)
		h.r.wait()
		if got := attempts(); got != i+1 {
			t.Fatalf("retried %v early: %d attempts, want %d", time.Millisecond, got, i+1)
		}
		h.clock.Step(time.Millisecond)
		h.r.Pass(ctx)
		h.r.wait()
		if got := attempts(); got != i+2 {
			t.Fatalf("after %v: got %d attempts, want %d", wait, got, i+2)
		}
	}
	h.world.failOn("mount "+staging, nil)
	h.clock.Step(DefaultBackoffMax)
	h.runUntilIdle()
	if r, _ := h.store.Result("v1", state.StageKey); !r.Ready || r.Err != nil {
		t.Errorf("after the fault cleared: got %+v, want ready", r)
	}
}

func TestBackoffCaps(t *testing.T) {
	tests := []struct {
		attempts int
		want     time.Duration
	}{
		{1, 500 * time.Millisecond}, {2, time.Second}, {3, 2 * time.Second}, {8, 64 * time.Second},
		{9, 2 * time.Minute}, // 128s, capped
		{50, 2 * time.Minute},
	}
	for _, tc := range tests {
		if got := backoff(500*time.Millisecond, 2*time.Minute, tc.attempts); got != tc.want {
			t.Errorf("backoff(%d): got %v, want %v", tc.attempts, got, tc.want)
		}
	}
}

func TestTerminalFailureRollsBack(t *testing.T) {
	h := newHarness(t)
	staging, _ := h.volume("v1")
	// Someone else's filesystem is on the device: refuse, release the device.
	h.world.setFs(h.world.Path("v1"), "xfs")
	v := h.update("v1", func(v *state.Volume) { v.Stage = stageSpec(staging) })
	h.runUntilIdle()

	if f := h.store.TerminalFailureFor("v1", state.StageKey, v.Stage.Generation); f == nil || f.Kind != classified.KindFailedPrecondition {
		t.Fatalf("final: got %+v, want FailedPrecondition", f)
	}
	if _, err := h.store.Get("v1"); !errors.Is(err, state.ErrNotFound) {
		t.Errorf("record after rollback: got %v, want it gone", err)
	}
	if loops, mounts := h.world.loopKeys(), mountPaths(h.world); len(loops) != 0 || len(mounts) != 0 {
		t.Errorf("left after rollback: loops %v, mounts %v", loops, mounts)
	}
	if n := h.world.mkfsCount(h.world.Path("v1")); n != 0 {
		t.Error("formatted a device holding another filesystem")
	}
	if h.world.fsOf(h.world.Path("v1")) != "xfs" {
		t.Error("the foreign filesystem changed")
	}
}

// A device that carries a partition table holds data: the stage is
// refused at once (FAILED_PRECONDITION, not retried; DATA_LOSS when the
// plugin had formatted the volume), nothing is formatted or mounted, the
// device is released, and the partition table stays.
func TestPartitionedDeviceIsRefused(t *testing.T) {
	for formatted, want := range map[string]classified.Kind{"": classified.KindFailedPrecondition, "ext4": classified.KindDataLoss} {
		h := newHarness(t)
		staging, _ := h.volume("v1")
		h.world.setFs(h.world.Path("v1"), partitionTable)
		v := h.update("v1", func(v *state.Volume) { v.Stage = stageSpec(staging); v.Formatted = formatted })
		h.runUntilIdle()

		f := h.store.TerminalFailureFor("v1", state.StageKey, v.Stage.Generation)
		if f == nil || f.Kind != want || !strings.Contains(f.Message, "partition table") {
			t.Fatalf("formatted %q: final %+v, want %v naming the partition table", formatted, f, want)
		}
		for _, c := range h.world.Calls() {
			if strings.HasPrefix(c, "mkfs") || strings.HasPrefix(c, "mount") {
				t.Errorf("formatted %q: called %s on a device with a partition table", formatted, c)
			}
		}
		if loops, mounts := h.world.loopKeys(), mountPaths(h.world); len(loops) != 0 || len(mounts) != 0 {
			t.Errorf("formatted %q: left after the refusal: loops %v, mounts %v", formatted, loops, mounts)
		}
		if h.world.fsOf(h.world.Path("v1")) != partitionTable {
			t.Errorf("formatted %q: the partition table changed", formatted)
		}
	}
}

// A device that holds the start of an xfs whose mkfs never finished, as a
// plugin stopped mid-mkfs leaves it: on the volume's own image, which the
// record says was never formatted, the stage makes the filesystem anew and
// records it; where the record says the volume was formatted, the stage is
// refused DATA_LOSS, nothing formatted or mounted. Taken for the xfs asked
// for, the volume would never mount.
func TestUnfinishedMkfsIsRedoneOnlyOnItsOwnImage(t *testing.T) {
	xfs := func(path string) *state.Stage { s := stageSpec(path); s.FsType = "xfs"; return s }
	t.Run("never formatted", func(t *testing.T) {
		h := newHarness(t)
		staging, _ := h.volume("v1")
		h.world.setFs(h.world.Path("v1"), unfinishedXfs)
		v := h.update("v1", func(v *state.Volume) { v.Stage = xfs(staging) })
		h.runUntilIdle()
		if f := h.store.TerminalFailureFor("v1", state.StageKey, v.Stage.Generation); f != nil {
			t.Fatalf("final: got %+v, want the stage done", f)
		}
		if !slices.Contains(mountPaths(h.world), staging) {
			t.Errorf("mounts: got %v, want %s", mountPaths(h.world), staging)
		}
		if n := h.world.mkfsCount(h.world.Path("v1")); n != 1 {
			t.Errorf("mkfs ran %d times, want once", n)
		}
		got, err := h.store.Get("v1")
		if err != nil || got.Formatted != "xfs" {
			t.Errorf("record: %+v, %v; want formatted xfs", got, err)
		}
	})
	t.Run("recorded formatted", func(t *testing.T) {
		h := newHarness(t)
		staging, _ := h.volume("v1")
		h.world.setFs(h.world.Path("v1"), unfinishedXfs)
		v := h.update("v1", func(v *state.Volume) { v.Stage = xfs(staging); v.Formatted = "xfs" })
		h.runUntilIdle()
		if f := h.store.TerminalFailureFor("v1", state.StageKey, v.Stage.Generation); f == nil || f.Kind != classified.KindDataLoss || !strings.Contains(f.Message, "never finished") {
			t.Fatalf("final: got %+v, want DataLoss naming the unfinished mkfs", f)
		}
		for _, c := range h.world.Calls() {
			if strings.HasPrefix(c, "mkfs") || strings.HasPrefix(c, "mount") {
				t.Errorf("called %s on a formatted volume's device that now holds an unfinished mkfs", c)
			}
		}
		if h.world.fsOf(h.world.Path("v1")) != unfinishedXfs {
			t.Error("the device's contents changed")
		}
	})
}

func TestProvenanceNeverReformats(t *testing.T) {
	h := newHarness(t)
	staging, _ := h.volume("v1")
	// The record says formatted, but blkid finds nothing: data loss, never mkfs.
	v := h.update("v1", func(v *state.Volume) { v.Stage = stageSpec(staging); v.Formatted = "ext4" })
	h.runUntilIdle()
	if f := h.store.TerminalFailureFor("v1", state.StageKey, v.Stage.Generation); f == nil || f.Kind != classified.KindDataLoss {
		t.Fatalf("final: got %+v, want DataLoss", f)
	}
	for _, c := range h.world.Calls() {
		if strings.HasPrefix(c, "mkfs") || strings.HasPrefix(c, "mount") {
			t.Errorf("called %s on a device that lost its filesystem", c)
		}
	}
	got, _ := h.store.Get("v1")
	if got == nil || got.Formatted != "ext4" || got.Stage != nil {
		t.Errorf("record: got %+v, want provenance kept and the stage rolled back", got)
	}
}

// TestBlkidErrorFailsClosed checks that a device whose image cannot be
// told blank is probed by blkid, and that blkid's failure formats nothing
// and mounts nothing.
func TestBlkidErrorFailsClosed(t *testing.T) {
	h := newHarness(t)
	staging, _ := h.volume("v1")
	h.world.failOn("blank", errors.New("I/O error"))
	h.world.failOn("blkid", errors.New("I/O error"))
	h.update("v1", func(v *state.Volume) { v.Stage = stageSpec(staging) })
	h.r.Pass(context.Background())
	h.r.wait()
	h.r.Pass(context.Background())
	h.r.wait()
	for _, c := range h.world.Calls() {
		if strings.HasPrefix(c, "mkfs") || strings.HasPrefix(c, "mount") {
			t.Errorf("called %s although blkid failed", c)
		}
	}
	if r, _ := h.store.Result("v1", state.StageKey); r.Err == nil || r.Ready {
		t.Errorf("result: got %+v, want a pending failure", r)
	}
}

// TestAttachedDeviceIsProbed checks that the image of a device attached
// before the stage (by a stage a crash interrupted) is not trusted to be
// blank, since writes through the device may not have reached it: blkid
// probes the device.
func TestAttachedDeviceIsProbed(t *testing.T) {
	h := newHarness(t)
	staging, _ := h.volume("v1")
	if _, err := h.world.Attach(h.world.Path("v1"), false); err != nil {
		t.Fatal(err)
	}
	h.update("v1", func(v *state.Volume) { v.Stage = stageSpec(staging) })
	h.runUntilIdle()
	calls := h.world.Calls()
	if slices.Contains(calls, "blank") || !slices.Contains(calls, "blkid") {
		t.Errorf("calls %v: want blkid, and no blank check of an attached image", calls)
	}
	if r, _ := h.store.Result("v1", state.StageKey); !r.Ready {
		t.Errorf("result: got %+v, want staged", r)
	}
}

func TestOneOperationPerVolumeParallelAcross(t *testing.T) {
	h := newHarness(t)
	sa, ta := h.volume("a")
	sb, _ := h.volume("b")
	release := make(chan struct{})
	h.world.holdOn("mount "+sa, release)
	h.update("a", func(v *state.Volume) {
		v.Stage = stageSpec(sa)
		v.Publishes = map[string]*state.Publish{ta: publishSpec()}
	})
	h.update("b", func(v *state.Volume) { v.Stage = stageSpec(sb) })
	ctx := context.Background()
	if n, _ := h.r.Pass(ctx); n != 2 {
		t.Fatalf("first pass started %d operations, want 2 (one per volume)", n)
	}
	// Volume a's stage is held; b's stage completes meanwhile.
	waitFor(t, h.world.started, "mount "+sa, "mount "+sb)
	if n, _ := h.r.Pass(ctx); n != 0 {
		t.Fatalf("pass while a is busy started %d operations, want 0", n)
	}
	close(release)
	h.runUntilIdle()
	if got := mountPaths(h.world); len(got) != 3 {
		t.Errorf("mounts: got %v, want a's staging and target and b's staging", got)
	}
}

// waitFor reads started calls until every one of want has started.
func waitFor(t *testing.T, ch <-chan string, want ...string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for len(want) > 0 {
		select {
		case got := <-ch:
			want = slices.DeleteFunc(want, func(w string) bool { return w == got })
		case <-timeout:
			t.Fatalf("calls %q never started", want)
		}
	}
}

func TestKicksCoalesce(t *testing.T) {
	h := newHarness(t)
	for range 100 {
		h.r.Kick()
	}
	if got := len(h.r.kick); got != 1 {
		t.Errorf("pending kicks: got %d, want 1", got)
	}
}

// TestKickSoon checks that KickSoon kicks once after its delay (on the
// injected clock) however often it is called meanwhile, and that a pass
// starting meanwhile serves it instead.
func TestKickSoon(t *testing.T) {
	h := newHarness(t)
	h.r.soonDelay = time.Millisecond
	for range 3 {
		h.r.KickSoon()
	}
	select {
	case <-h.r.kick:
		t.Fatal("kicked before the delay passed")
	case <-time.After(10 * time.Millisecond):
	}
	h.clock.Step(time.Millisecond)
	select {
	case <-h.r.kick:
	case <-time.After(10 * time.Second):
		t.Fatal("no kick after KickSoon")
	}
	h.r.soonMu.Lock()
	soon := h.r.soon
	h.r.soonMu.Unlock()
	if soon {
		t.Error("a KickSoon still waits after its kick")
	}

	h.r.soonDelay = time.Hour
	h.r.KickSoon()
	if _, err := h.r.Pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	h.clock.Step(time.Hour)
	h.r.soonMu.Lock()
	soon = h.r.soon
	h.r.soonMu.Unlock()
	if soon {
		t.Error("a pass that started after KickSoon did not serve it")
	}
	select {
	case <-h.r.kick:
		t.Error("kicked although a pass served the KickSoon")
	case <-time.After(20 * time.Millisecond): // the timer's function runs on its own goroutine
	}
}

// TestKickSoonWaitsForAPause checks that KickSoons coming one after
// another push their pass back by soonDelay each, but never more than
// soonMax after the first: a burst of operations' ends is verified by one
// pass rather than by passes back to back.
func TestKickSoonWaitsForAPause(t *testing.T) {
	h := newHarness(t)
	h.r.soonDelay, h.r.soonMax = 2*time.Millisecond, 5*time.Millisecond
	noKick := func(when string) {
		t.Helper()
		select {
		case <-h.r.kick:
			t.Fatalf("kicked %s", when)
		case <-time.After(20 * time.Millisecond): // the timer's function runs on its own goroutine
		}
	}
	h.r.KickSoon()
	for ms := 1; ms <= 4; ms++ {
		h.clock.Step(time.Millisecond)
		noKick(fmt.Sprintf("%d ms after the first KickSoon, with KickSoons every millisecond", ms))
		h.r.KickSoon()
	}
	h.clock.Step(time.Millisecond)
	select {
	case <-h.r.kick:
	case <-time.After(10 * time.Second):
		t.Fatal("no kick soonMax after the first KickSoon")
	}
}

func TestRunConvergesAndStops(t *testing.T) {
	h := newHarness(t)
	staging, target := h.volume("v1")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.r.Run(ctx); close(done) }()

	watch := h.store.Watch("v1")
	v := h.update("v1", func(v *state.Volume) {
		v.Stage = stageSpec(staging)
		v.Publishes = map[string]*state.Publish{target: publishSpec()}
	})
	h.r.Kick()
	deadline := time.After(10 * time.Second)
	for {
		if r, _ := h.store.Result("v1", state.PublishKey(target)); r.Ready && r.Generation == v.Publishes[target].Generation {
			break
		}
		select {
		case <-watch:
			watch = h.store.Watch("v1")
		case <-time.After(time.Millisecond):
			// The pass after an operation comes a moment later
			// (KickSoon), on the fake clock.
			h.clock.Step(time.Millisecond)
		case <-deadline:
			t.Fatal("publish never became ready")
		}
	}
	// The request is answered when its operation succeeds; readiness
	// comes with the pass after it, which finds nothing to do.
	for !h.r.Ready() {
		select {
		case <-time.After(time.Millisecond):
			h.clock.Step(time.Millisecond)
		case <-deadline:
			t.Fatal("Ready is false after convergence")
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestOrphanedDevicesAreReleased(t *testing.T) {
	h := newHarness(t)
	// Two devices of the data directory that no record stages: one mounted
	// inside the roots (a crash before the record), one mounted outside.
	ghost, err := h.world.Attach(h.world.Path("ghost"), false)
	if err != nil {
		t.Fatal(err)
	}
	h.world.setFs(h.world.Path("ghost"), "ext4")
	h.world.makeDirs("/k/old")
	if _, err := h.world.FormatAndMount(t.Context(), devices.Probe{Device: ghost}, "/k/old", "ext4", nil, nil); err != nil {
		t.Fatal(err)
	}
	foreign, _ := h.world.Attach(h.world.Path("foreign"), false)
	h.world.setFs(h.world.Path("foreign"), "ext4")
	h.world.FormatAndMount(t.Context(), devices.Probe{Device: foreign}, "/mnt/admin", "ext4", nil, nil)
	// A device of another directory is never ours.
	h.world.Attach("/elsewhere/disk.img", false)
	// A volume staged normally is left alone.
	staging, _ := h.volume("live")
	h.update("live", func(v *state.Volume) { v.Stage = stageSpec(staging) })
	h.runUntilIdle()

	loops := h.world.loopKeys()
	if want := []string{"/data/foreign.img", "/data/live.img", "/elsewhere/disk.img"}; !slices.Equal(loops, want) {
		t.Errorf("attached after release: got %v, want %v", loops, want)
	}
	if mounts, want := mountPaths(h.world), []string{"/mnt/admin", staging}; !slices.Equal(mounts, want) {
		t.Errorf("mounts after release: got %v, want %v", mounts, want)
	}
}

func TestImageAttachedTwiceIsNeverMounted(t *testing.T) {
	for _, inUse := range []bool{false, true} {
		t.Run(fmt.Sprintf("both devices mounted=%v", inUse), func(t *testing.T) {
			h := newHarness(t)
			staging, _ := h.volume("v1")
			h.world.setFs(h.world.Path("v1"), "ext4")
			// The image is attached twice; the plugin must not pick one and
			// mount the filesystem that the other device may also carry.
			h.world.Attach(h.world.Path("v1"), false)
			// The fake keys loops by backing file; a second key holds the
			// second device of the same image.
			second := host.Device{Device: "/dev/loop9", Dev: host.DevNum{Major: 7, Minor: 9}, BackingFile: h.world.Path("v1")}
			h.world.addLoop(h.world.Path("v1")+"#2", second)
			if inUse {
				// Both devices are mounted by someone: neither may go.
				first, _ := h.world.loop(h.world.Path("v1"))
				h.world.mountOutside(host.Mount{Path: "/mnt/one", Dev: first.Dev, Root: "/", Source: first.Device, FsType: "ext4"}, false)
				h.world.mountOutside(host.Mount{Path: "/mnt/two", Dev: second.Dev, Root: "/", Source: second.Device, FsType: "ext4"}, false)
			}
			h.update("v1", func(v *state.Volume) { v.Stage = stageSpec(staging) })
			h.runUntilIdle()
			mounted := slices.Contains(mountPaths(h.world), staging)
			r, _ := h.store.Result("v1", state.StageKey)
			if inUse {
				if mounted {
					t.Errorf("mounted with the image attached twice and both devices in use")
				}
				if r.Err == nil || !strings.Contains(r.Err.Message, "attached more than once") {
					t.Errorf("result: got %+v, want a failure naming the double attachment", r)
				}
				return
			}
			// An unmounted second device is detached, then the stage proceeds.
			if !mounted || !r.Ready || !slices.Contains(h.world.Calls(), "detach") {
				t.Errorf("mounted %v, result %+v, calls %v; want the idle second device detached and the stage made", mounted, r, h.world.Calls())
			}
		})
	}
}

func TestStageOptionsPassFlagsThrough(t *testing.T) {
	st := stageSpec("/s")
	st.MountFlags = []string{`context="system_u:object_r:container_file_t:s0:c1,c2"`, "noatime"}
	got := stageOptions(st, "ext4", false)
	want := []string{`context="system_u:object_r:container_file_t:s0:c1,c2"`, "noatime", "errors=remount-ro"}
	if !slices.Equal(got, want) {
		t.Errorf("ext4: got %q, want %q", got, want)
	}
	if got := stageOptions(st, "ext4", true); !slices.Equal(got, append([]string{want[0], want[1], "discard"}, want[2:]...)) {
		t.Errorf("thin ext4: got %q, want discard added", got)
	}
	if got := stageOptions(st, "btrfs", true); !slices.Contains(got, "discard=async") {
		t.Errorf("thin btrfs: got %q, want discard=async", got)
	}
	st.MountFlags = append(st.MountFlags, "nodiscard")
	if got := stageOptions(st, "xfs", true); slices.Contains(got, "discard") {
		t.Errorf("thin xfs with nodiscard: got %q, want no discard added", got)
	}
	st.ReadOnly = true
	if got := stageOptions(st, "xfs", true); !slices.Contains(got, "ro") || !slices.Contains(got, "nouuid") || slices.Contains(got, "errors=remount-ro") || slices.Contains(got, "discard") {
		t.Errorf("read-only xfs: got %q, want ro and nouuid and no ext4 option nor discard", got)
	}
}

// countingRecorder counts what the reconciler records.
type countingRecorder struct {
	mu      sync.Mutex
	ops     map[string]int
	passes  int
	last    []volstatus.VolumeStatus
	early   map[string]int
	repairs map[string]int
}

func (c *countingRecorder) OperationDone(action, result string, _ time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops[action+" "+result]++
}
func (c *countingRecorder) Repaired(action string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.repairs == nil {
		c.repairs = map[string]int{}
	}
	c.repairs[action]++
}
func (c *countingRecorder) EarlyStart(outcome string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.early == nil {
		c.early = map[string]int{}
	}
	c.early[outcome]++
}
func (c *countingRecorder) Frozen(time.Duration) {}
func (c *countingRecorder) PassDone(_ time.Duration, v []volstatus.VolumeStatus, _ int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.passes++
	c.last = v
}

func TestStatusAndRecorder(t *testing.T) {
	h := newHarness(t)
	rec := &countingRecorder{ops: map[string]int{}}
	h.r.cfg.Recorder = rec
	staging, target := h.volume("v1")
	h.update("v1", func(v *state.Volume) {
		v.Stage = stageSpec(staging)
		v.Publishes = map[string]*state.Publish{target: publishSpec()}
	})
	h.r.Pass(t.Context())
	h.r.wait()
	if s := h.r.Status(); len(s) != 1 || s[0].Phase != volstatus.PhaseSettingUp || s[0].PublishesDesired != 1 || s[0].PublishesActual != 0 {
		t.Errorf("status while setting up: got %+v", s)
	}
	h.runUntilIdle()
	s := h.r.Status()
	if len(s) != 1 || s[0].Phase != volstatus.PhaseReady || !s[0].StageReady || s[0].PublishesActual != 1 || s[0].SizeBytes != 64<<20 {
		t.Errorf("status when converged: got %+v", s)
	}
	if rec.ops["stage ok"] != 1 || rec.ops["publish ok"] != 1 || rec.passes < 3 || len(rec.last) != 1 {
		t.Errorf("recorded: ops %v, %d passes, last %v", rec.ops, rec.passes, rec.last)
	}
	h.world.failOn("unmount "+target, errors.New("EBUSY"))
	h.update("v1", func(v *state.Volume) { v.Publishes[target].Deleting = true })
	h.r.Pass(t.Context())
	h.r.wait()
	h.r.Pass(t.Context())
	if s := h.r.Status(); s[0].Phase != volstatus.PhaseFailing || s[0].LastError == "" || s[0].NextRetry.IsZero() {
		t.Errorf("status of a failing teardown: got %+v", s)
	}
	if rec.ops["unpublish error"] != 1 {
		t.Errorf("recorded: ops %v, want one failed unpublish", rec.ops)
	}
}

// TestStatusShowsDesiredIOLimits checks that a volume's status carries
// the IO limits its record asks for, and none once none are asked.
func TestStatusShowsDesiredIOLimits(t *testing.T) {
	h := newHarness(t)
	h.volume("v1")
	for _, tc := range []struct {
		name   string
		limits host.IOLimits
		want   *volstatus.IOLimits
	}{
		{"limited", host.IOLimits{ReadIOPS: 100, WriteBPS: 1 << 20}, &volstatus.IOLimits{ReadIOPS: 100, WriteBPS: 1 << 20}},
		{"every limit removed", host.IOLimits{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.update("v1", func(v *state.Volume) {
				v.Provisioning = state.ProvisionThick
				if err := v.RequestIOLimits(tc.limits); err != nil {
					t.Fatal(err)
				}
			})
			h.r.Pass(t.Context())
			h.r.wait()
			s := h.r.Status()
			if len(s) != 1 || !reflect.DeepEqual(s[0].IOLimitsDesired, tc.want) {
				t.Errorf("got %+v, want IO limits %+v", s, tc.want)
			}
		})
	}
}

// TestStaleObservationStartsNothing makes an operation finish between a
// pass's observation and its decisions: the pass must not act on the
// volume from that stale view (it would attach the image a second time).
func TestStaleObservationStartsNothing(t *testing.T) {
	h := newHarness(t)
	staging, _ := h.volume("v1")
	release := make(chan struct{})
	h.world.holdOn("attach", release)
	h.update("v1", func(v *state.Volume) { v.Stage = stageSpec(staging) })
	if n, _ := h.r.Pass(t.Context()); n != 1 {
		t.Fatalf("first pass started %d operations, want 1", n)
	}
	waitFor(t, h.world.started, "attach") // the stage is held before attaching
	h.world.afterObserve = func() {
		// The second pass has seen no device; now the stage attaches one,
		// mounts and ends.
		h.world.afterObserve = nil
		close(release)
		h.r.wait()
	}
	if n, _ := h.r.Pass(t.Context()); n != 0 {
		t.Errorf("a pass acting on an observation older than the last operation started %d operations", n)
	}
	h.r.wait()
	if attaches := strings.Count(strings.Join(h.world.Calls(), ","), "attach"); attaches != 1 {
		t.Errorf("attached %d times, want once", attaches)
	}
}

// TestStaleObservationReportsNothing runs a pass that observes the machine
// while a publish is under way and reports after it succeeded: that pass
// must not take back what the operation reported (ready, and the target
// usable), since its observation is older than the mount.
func TestStaleObservationReportsNothing(t *testing.T) {
	h := newHarness(t)
	staging, target := h.volume("v1")
	h.update("v1", func(v *state.Volume) { v.Stage = stageSpec(staging) })
	h.runUntilIdle()
	release := make(chan struct{})
	h.world.holdOn("bind "+target, release)
	v := h.update("v1", func(v *state.Volume) { v.Publishes = map[string]*state.Publish{target: publishSpec()} })
	if n, _ := h.r.Pass(t.Context()); n != 1 {
		t.Fatalf("first pass started %d operations, want 1", n)
	}
	waitFor(t, h.world.started, "bind "+target)
	h.world.afterObserve = func() {
		// The second pass has seen no bind mount; now the publish ends.
		h.world.afterObserve = nil
		close(release)
		h.r.wait()
	}
	if _, err := h.r.Pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if r, _ := h.store.Result("v1", state.PublishKey(target)); !r.Ready || r.Generation != v.Publishes[target].Generation {
		t.Errorf("publish result after a stale pass: got %+v, want ready", r)
	}
	if c := h.store.Condition("v1"); slices.Contains(c.Unusable, target) {
		t.Errorf("condition after a stale pass: got %+v, want %s usable", c, target)
	}
}

// TestIntentNewerThanObservationIsNotJudged writes an unstage while a pass
// observes the machine, just after the foreign mount that would refuse it
// is gone: the pass must not judge the new intent against the machine as it
// was (and refuse it for good).
func TestIntentNewerThanObservationIsNotJudged(t *testing.T) {
	h := newHarness(t)
	h.staged("v1")
	l, _ := h.world.loop(h.world.Path("v1"))
	h.world.mountOutside(host.Mount{Path: "/mnt/someone", Dev: l.Dev, Root: "/", Source: l.Device, FsType: "ext4"}, false)
	h.world.afterObserve = func() {
		// Someone unmounts their bind mount, then the kubelet unstages.
		h.world.afterObserve = nil
		h.world.unmountLast()
		h.update("v1", func(v *state.Volume) { v.Stage.Deleting = true })
	}
	h.runUntilIdle()
	h.runUntilIdle() // the kick that the request's write gives in production
	v, _ := h.store.Get("v1")
	if v.Stage != nil {
		t.Errorf("stage after the unstage: got %+v, want it torn down", v.Stage)
	}
	if f, ok := h.store.LastTerminalFailure("v1", state.StageKey); ok {
		t.Errorf("the unstage was refused: %+v", f.Err)
	}
}

// TestUnstageIsOneOperation checks that an unstage whose every step the
// operation can see done (the staging mount was the filesystem's only
// mount; the device is gone once detached) unmounts, detaches and forgets
// in the one operation a pass starts; and that one that cannot (a second
// mount stacked on the staging path) stops after the unmount and leaves the
// rest to the next pass's observation.
func TestUnstageIsOneOperation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stacked bool
		// wantCalls are the calls of the one pass after the withdrawal.
		wantCalls string
	}{
		{name: "only mount", wantCalls: "unmount %[1]s,detach"},
		{name: "stacked mount", stacked: true, wantCalls: "unmount %[1]s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			staging := h.staged("v1")
			if tc.stacked {
				if _, err := h.world.BindMount(staging, staging, nil); err != nil {
					t.Fatal(err)
				}
			}
			h.update("v1", func(v *state.Volume) { v.Stage.Deleting = true })
			n := len(h.world.Calls())
			h.r.wait()
			if _, err := h.r.Pass(context.Background()); err != nil {
				t.Fatal(err)
			}
			h.r.wait()
			if got, want := h.callsSince(n), fmt.Sprintf(tc.wantCalls, staging); got != want {
				t.Errorf("calls of the first pass: got %s, want %s", got, want)
			}
			v, err := h.store.Get("v1")
			if forgotten := err == nil && v.Stage == nil; forgotten == tc.stacked {
				t.Errorf("stage forgotten after one pass: got %v, want %v (record %+v)", forgotten, !tc.stacked, v)
			}
			h.runUntilIdle()
			if m, v := mountPaths(h.world), func() *state.Volume { v, _ := h.store.Get("v1"); return v }(); len(m) != 0 || len(h.world.loopKeys()) != 0 || v.Stage != nil {
				t.Errorf("after settling: mounts %v, loops %v, record %+v; want none and no stage", m, h.world.loopKeys(), v)
			}
		})
	}
}

// TestReleasePendingIsPolled withdraws a stage whose device was detached
// but is held by another user: nothing is planned for it, and the passes
// come back by themselves, sooner at first (the kernel clears the device
// at its last close and tells no one), then less often, up to the resync
// period; once the device is gone the stage is forgotten and the polling
// stops.
func TestReleasePendingIsPolled(t *testing.T) {
	h := newHarness(t)
	_, target := h.stagedAndPublished("v1")
	image := h.world.Path("v1")
	if _, err := h.store.Update("v1", func(v *state.Volume) error {
		v.Publishes[target].Deleting = true
		v.Stage.Deleting = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Unpublished and unmounted, the device detached while someone else
	// holds it.
	h.world.unmountAll()
	h.world.autoClear(image)
	h.runUntilIdle()
	if v, err := h.store.Get("v1"); err != nil || v.Stage == nil || len(v.Publishes) != 0 {
		t.Fatalf("with the device held: got %+v, %v; want the stage kept, the publish forgotten", v, err)
	}
	// NodeUnstageVolume's answer says what it waits for.
	v, _ := h.store.Get("v1")
	if res, ok := h.store.Result("v1", state.StageKey); !ok || res.Generation != v.Stage.Generation || !strings.Contains(res.Waiting, "stays attached until its last user closes it") {
		t.Errorf("the withdrawn stage's result: got %+v, %v; want it waiting for the device's last user", res, ok)
	}
	var waits []time.Duration
	for range 10 {
		if _, err := h.r.Pass(t.Context()); err != nil {
			t.Fatal(err)
		}
		waits = append(waits, h.r.wake.Sub(h.clock.Now()))
	}
	if waits[0] <= 0 || waits[0] > time.Second || waits[9] != DefaultResyncPeriod {
		t.Fatalf("waits between passes while the device is held: %v; want a short first one, growing to the resync period (%v)", waits, DefaultResyncPeriod)
	}
	for i := 1; i < len(waits); i++ {
		if waits[i] < waits[i-1] {
			t.Fatalf("waits between passes while the device is held: %v; want them growing", waits)
		}
	}
	// The last user lets go.
	h.world.detachOutside(image)
	h.runUntilIdle()
	if v, err := h.store.Get("v1"); err == nil && v.Stage != nil {
		t.Errorf("once the device is gone: the stage is still recorded: %+v", v.Stage)
	}
	if !h.r.wake.IsZero() || h.r.releasePoll != 0 {
		t.Errorf("once the device is gone: next pass due at %v, poll %v; want none", h.r.wake, h.r.releasePoll)
	}
}

// TestPublishWithoutItsParentFailsForGood publishes at a target whose
// parent (the kubelet's to create) is missing: the publish fails for good
// with FAILED_PRECONDITION naming the parent, though the mkdir that finds
// it missing comes first, and the stage stays.
func TestPublishWithoutItsParentFailsForGood(t *testing.T) {
	h := newHarness(t)
	staging, _ := h.volume("v1")
	target := "/k/missing-v1/mount"
	v := h.update("v1", func(v *state.Volume) {
		v.Stage = stageSpec(staging)
		v.Publishes = map[string]*state.Publish{target: publishSpec()}
	})
	h.runUntilIdle()

	f := h.store.TerminalFailureFor("v1", state.PublishKey(target), v.Publishes[target].Generation)
	if f == nil || f.Kind != classified.KindFailedPrecondition || !strings.Contains(f.Message, "parent of target path /k/missing-v1 does not exist") {
		t.Fatalf("final: got %+v, want FailedPrecondition naming the missing parent", f)
	}
	if got, want := mountPaths(h.world), []string{staging}; !slices.Equal(got, want) {
		t.Errorf("mounts: got %v, want %v", got, want)
	}
}

// TestReleaseWaitSaysOnlyWhatHoldsTheDevice: a withdrawn stage's answer
// blames the device's last user only when nothing of converge's holds it
// (no publish recorded, no mount whose owner is not told yet), and names
// a holder converge can see.
func TestReleaseWaitSaysOnlyWhatHoldsTheDevice(t *testing.T) {
	held := func() *actual { return &actual{loop: &host.Device{Device: "/dev/loop3", AutoClear: true}} }
	for _, tc := range []struct {
		name string
		pubs map[string]*state.Publish
		a    func(a *actual)
		want string // "" for no message
	}{
		{name: "another user", a: func(*actual) {}, want: "another mount namespace"},
		{name: "a publish still recorded", pubs: map[string]*state.Publish{"/t": publishSpec()}, a: func(*actual) {}},
		{name: "a mount not told yet", a: func(a *actual) { a.unknownMounts = []string{"/moved"} }},
		{name: "a mount converge can see", a: func(a *actual) { a.foreignMounts = []string{"/mnt/x"} }, want: "mounted at /mnt/x, which converge did not mount"},
		{name: "a raw block volume", a: func(a *actual) { a.block = true }, want: "the kubelet's own loop device"},
		{name: "not detached", a: func(a *actual) { a.loop.AutoClear = false }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &state.Volume{ID: "v1", Stage: &state.Stage{Deleting: true}, Publishes: tc.pubs}
			a := held()
			tc.a(a)
			got := releaseWait(v, a)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
