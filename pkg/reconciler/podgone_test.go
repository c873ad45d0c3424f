package reconciler

import (
	"strings"
	"testing"
	"time"

	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
)

// blockPodTarget makes the kubelet's directories of pod uid's raw block
// publish of id (below the harness's kubelet directory, /k): the pod's
// directory and the publish directory of the volume, and returns the
// target.
func (h *harness) blockPodTarget(id, uid string) string {
	dir := "/k/plugins/kubernetes.io/csi/volumeDevices/publish/pv-" + id
	h.world.makeDirs("/k/pods", "/k/pods/"+uid, dir)
	return dir + "/" + uid
}

// publishedBlock stages id as a raw block volume and publishes it at
// each target, and settles.
func (h *harness) publishedBlock(id string, targets ...string) {
	h.t.Helper()
	staging, _ := h.volume(id)
	h.update(id, func(v *state.Volume) {
		v.Stage = stageSpec(staging)
		v.Stage.Access = state.AccessBlock
		v.Publishes = map[string]*state.Publish{}
		for _, t := range targets {
			p := publishSpec()
			p.Access = state.AccessBlock
			v.Publishes[t] = p
		}
	})
	h.runUntilIdle()
	for _, t := range targets {
		if !h.world.isMounted(t) {
			h.t.Fatalf("%s: not published", t)
		}
	}
}

// removeDir removes directory path from the fake world, whatever it holds,
// as the kubelet removes a pod's directory it is done with.
func (w *fakeWorld) removeDir(path string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.dirs, path)
}

// isMounted reports whether anything is mounted at path.
func (w *fakeWorld) isMounted(path string) bool {
	_, ok := w.topMount(path)
	return ok
}

// TestForgottenBlockPublishIsWithdrawn: the kubelet forgets a raw block
// volume whose pod it deleted while csi-node was down (it cannot
// reconstruct one whose links it removed), removes the pod's directory,
// and never unpublishes it. Once a pod's directory has been gone for
// podGoneGrace, its publish is withdrawn and unpublished; the stage
// stays for other pods (the volume's deletion withdraws it).
func TestForgottenBlockPublishIsWithdrawn(t *testing.T) {
	h := newHarness(t)
	gone, kept := h.blockPodTarget("v", "uid-gone"), h.blockPodTarget("v", "uid-kept")
	h.publishedBlock("v", gone, kept)

	h.world.removeDir("/k/pods/uid-gone")
	h.runUntilIdle()
	h.clock.Step(podGoneGrace - time.Second)
	h.runUntilIdle()
	if !h.world.isMounted(gone) {
		t.Fatalf("withdrawn %s before its pod's directory was gone for %s", gone, podGoneGrace)
	}
	h.clock.Step(time.Second)
	h.runUntilIdle()
	v, err := h.store.Get("v")
	if err != nil {
		t.Fatal(err)
	}
	if v.Publishes[gone] != nil || v.Publishes[kept] == nil || v.Stage == nil || v.Stage.Deleting {
		t.Fatalf("one of two pods gone: got publishes %v, stage %+v; want the other pod's publish and the stage kept", v.Targets(), v.Stage)
	}
	if h.world.isMounted(gone) || !h.world.isMounted(kept) {
		t.Fatalf("mounts: %v; want %s unmounted and %s kept", mountPaths(h.world), gone, kept)
	}
	if _, ok := h.world.loop(h.world.Path("v")); !ok {
		t.Fatal("the device was detached: the stage is the volume's deletion's to withdraw")
	}
}

// TestBlockPublishKeptWhileTheKubeletHasIt: a raw block publish whose
// pod's directory is missing is kept while the kubelet binds the device
// for the pod (a pod set up while the node's network is not ready gets
// its directory only after NodePublishVolume), while the kubelet's pods
// directory itself is missing (a pods filesystem not mounted), and a
// filesystem publish (whose mount the kubelet reconstructs) is never
// withdrawn, nor one at a path of no kubelet layout.
func TestBlockPublishKeptWhileTheKubeletHasIt(t *testing.T) {
	h := newHarness(t)
	mapped := "/k/plugins/kubernetes.io/csi/volumeDevices/publish/pv-v/uid-new"
	h.world.makeDirs("/k/pods", "/k/plugins/kubernetes.io/csi/volumeDevices/publish/pv-v")
	noPods := h.blockPodTarget("v", "uid-nopods")
	other := "/k/elsewhere/v"
	h.world.makeDirs("/k/elsewhere")
	h.publishedBlock("v", mapped, noPods, other)
	// The kubelet binds the device for uid-new; uid-nopods' directory is
	// there until the pods directory goes.
	h.world.mountOutside(host.Mount{Path: "/k/plugins/kubernetes.io/csi/volumeDevices/pv-v/dev/uid-new", Source: "udev", FsType: "devtmpfs", Root: "/loop"}, true)
	n := len(h.world.Calls())
	for range 3 {
		h.runUntilIdle()
		h.clock.Step(podGoneGrace)
	}
	h.runUntilIdle()
	if got := h.callsSince(n); strings.Contains(got, "unmount") {
		t.Fatalf("the device bound by the kubelet: got calls %s, want none", got)
	}
	h.world.removeDir("/k/pods/uid-nopods")
	h.world.removeDir("/k/pods")
	for range 3 {
		h.runUntilIdle()
		h.clock.Step(podGoneGrace)
	}
	h.runUntilIdle()
	if v, _ := h.store.Get("v"); v == nil || len(v.Publishes) != 3 || v.Stage.Deleting {
		t.Fatalf("the kubelet's pods directory missing: got %+v, want every publish and the stage kept", v)
	}

	h2 := newHarness(t)
	fsTarget := h2.podTarget("f", "uid-2")
	staging, _ := h2.volume("f")
	h2.update("f", func(v *state.Volume) {
		v.Stage = stageSpec(staging)
		v.Publishes = map[string]*state.Publish{fsTarget: publishSpec()}
	})
	h2.runUntilIdle()
	h2.world.removeDir("/k/pods/uid-2")
	for range 3 {
		h2.runUntilIdle()
		h2.clock.Step(podGoneGrace)
	}
	if v, _ := h2.store.Get("f"); v == nil || v.Publishes[fsTarget] == nil || v.Publishes[fsTarget].Deleting {
		t.Fatalf("a filesystem publish whose pod's directory is gone: got %+v, want it kept", v)
	}
}

// TestEarlyStartLeavesForgottenPublishes: a request's early start never
// withdraws a raw block publish whose pod's directory is missing, however
// long: its observation does not read the kubelet's binds of the device,
// which only a pass sees.
func TestEarlyStartLeavesForgottenPublishes(t *testing.T) {
	h := newHarness(t)
	target := h.blockPodTarget("v", "uid-1")
	h.publishedBlock("v", target)
	h.startEarly()
	h.world.removeDir("/k/pods/uid-1")
	for range 3 {
		h.r.Start("v")
		h.r.wait()
		h.clock.Step(podGoneGrace)
	}
	if v, _ := h.store.Get("v"); v == nil || v.Publishes[target] == nil || v.Publishes[target].Deleting || !h.world.isMounted(target) {
		t.Fatalf("after early starts alone: got %+v, mounted %v; want the publish kept", v, h.world.isMounted(target))
	}
}
