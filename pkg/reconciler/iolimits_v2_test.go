package reconciler

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
)

// v2Limits are limits whose io.max line is as long as the line that lifts
// every limit (3 digits for each "max"): the test's io.max is a plain file,
// which a write of a line overwrites in place, where the kernel's would
// take it as a whole.
var v2Limits = host.IOLimits{ReadIOPS: 200, WriteIOPS: 100}

// TestIOLimitsV2HoldThePodsCgroup checks, through devices.CgroupIO on a
// cgroup v2 tree laid out as the kubelet lays it out with each of its
// cgroup drivers, the working path (this machine kind cannot mount the v2
// io controller): a limited volume's publish writes its rule into the
// pod's io.max (v2 throttles hierarchically: the pod's cgroup holds its
// containers), a rule edited from outside is set back in one pass and
// counts one repair, and the unpublish lifts it.
func TestIOLimitsV2HoldThePodsCgroup(t *testing.T) {
	const uid = "0b5c8f1e-32c4-4b7a-9d1e-8a2f6c3d4e5f"
	for _, driver := range []struct{ name, pod string }{
		{"systemd", filepath.Join("kubepods.slice", "kubepods-burstable.slice", "kubepods-burstable-pod"+strings.ReplaceAll(uid, "-", "_")+".slice")},
		{"cgroupfs", filepath.Join("kubepods", "burstable", "pod"+uid)},
	} {
		t.Run(driver.name, func(t *testing.T) {
			h := newHarness(t)
			rec := &countingRecorder{ops: map[string]int{}}
			h.r.cfg.Recorder = rec
			root := t.TempDir()
			pod := filepath.Join(root, driver.pod)
			if err := os.MkdirAll(filepath.Join(pod, "container-1"), 0o755); err != nil {
				t.Fatal(err)
			}
			cg, target := h.v2PodPublish(uid, root, map[string]string{filepath.Join(driver.pod, "io.max"): ""}, &v2Limits)
			dev := h.dev("v1")
			ioMax := filepath.Join(pod, "io.max")
			rule := func() host.IOLimits {
				t.Helper()
				l, err := cg.Throttle(pod, dev)
				if err != nil {
					t.Fatal(err)
				}
				return l
			}
			if got := rule(); got != v2Limits {
				b, _ := os.ReadFile(ioMax)
				t.Fatalf("the pod's rule after the publish: got %v (io.max %q), want %v", got, b, v2Limits)
			}
			if _, err := os.Stat(filepath.Join(pod, "container-1", "io.max")); !os.IsNotExist(err) {
				t.Errorf("a container's cgroup got an io.max (%v): v2 holds the pod as a whole", err)
			}

			line := fmt.Sprintf("%d:%d rbps=max wbps=max riops=5 wiops=max\n", dev.Major, dev.Minor)
			if err := os.WriteFile(ioMax, []byte(line), 0o644); err != nil {
				t.Fatal(err)
			}
			h.pass()
			if got := rule(); got != v2Limits {
				t.Errorf("the rule edited from outside, after one pass: got %v, want %v", got, v2Limits)
			}
			if n := rec.repairs["set io limits"]; n != 1 {
				t.Errorf("repairs: got %d, want 1", n)
			}

			h.update("v1", func(v *state.Volume) { v.RequestUnpublish(target) })
			h.runUntilIdle()
			if got := rule(); !got.IsZero() {
				t.Errorf("the pod's rule after the unpublish: got %v, want none", got)
			}
			if v, _ := h.store.Get("v1"); v.Publishes[target] != nil {
				t.Errorf("publish after unpublish: got %+v, want forgotten", v.Publishes[target])
			}
		})
	}
}
