package devices

import (
	"errors"
	"os"
	"slices"
	"testing"

	"k8s.io/klog/v2"
)

// Features as the probes report them, for the tests of judgeKernel.
var (
	testMountSetattr = KernelFeature{Name: "mount_setattr", Since: KernelVersion{5, 12}, Required: true}
	testLoopConfig   = KernelFeature{Name: "LOOP_CONFIGURE", Since: KernelVersion{5, 8}, Required: true}
	testFsopen       = KernelFeature{Name: "fsopen", Since: KernelVersion{5, 2}, Required: true}
	testStatmount    = KernelFeature{Name: "listmount and statmount", Since: KernelVersion{6, 13}, Without: "the whole mount table is read"}
)

func TestJudgeKernel(t *testing.T) {
	for _, tc := range []struct {
		name     string
		release  string
		missing  []KernelFeature // of testLoopConfig, testMountSetattr, testFsopen, testStatmount, in that order
		want     string          // the error; "" for none
		optional []string
	}{
		{
			name:    "everything there",
			release: "6.18.44-fc-v657",
		},
		{
			name:     "an optional feature missing starts",
			release:  "6.1.0-13-amd64",
			missing:  []KernelFeature{testStatmount},
			optional: []string{"listmount and statmount"},
		},
		{
			name:     "old kernel, newest named first",
			release:  "5.4.0-42-generic",
			missing:  []KernelFeature{testLoopConfig, testMountSetattr, testStatmount},
			want:     "kernel 5.4.0-42-generic lacks mount_setattr (Linux 5.12), LOOP_CONFIGURE (Linux 5.8): converge needs Linux 5.12 or later",
			optional: []string{"listmount and statmount"},
		},
		{
			name:    "the minimum is the newest required feature's, missing or not",
			release: "4.19.0",
			missing: []KernelFeature{testFsopen},
			want:    "kernel 4.19.0 lacks fsopen (Linux 5.2): converge needs Linux 5.12 or later",
		},
		{
			name:    "refused by a recent enough kernel",
			release: "6.8.0-31-generic",
			missing: []KernelFeature{testMountSetattr},
			want:    "kernel 6.8.0-31-generic refuses mount_setattr (Linux 5.12) though it is recent enough: a seccomp profile or a security module blocks the call, and csi-node must run privileged and unconfined",
		},
		{
			name:    "lacking one and refusing another",
			release: "5.10.0",
			missing: []KernelFeature{testLoopConfig, testMountSetattr},
			want:    "kernel 5.10.0 lacks mount_setattr (Linux 5.12): converge needs Linux 5.12 or later; and refuses LOOP_CONFIGURE (Linux 5.8) though it is recent enough: a seccomp profile or a security module blocks the call, and csi-node must run privileged and unconfined",
		},
		{
			name:    "a release that cannot be read lacks",
			release: "unknown",
			missing: []KernelFeature{testLoopConfig},
			want:    "kernel unknown lacks LOOP_CONFIGURE (Linux 5.8): converge needs Linux 5.12 or later",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var results []probeResult
			for _, f := range []KernelFeature{testLoopConfig, testMountSetattr, testFsopen, testStatmount} {
				results = append(results, probeResult{feature: f, present: !slices.Contains(tc.missing, f)})
			}
			optional, err := judgeKernel(tc.release, results)
			got := ""
			if err != nil {
				got = err.Error()
				var ke *KernelError
				if !errors.As(err, &ke) {
					t.Errorf("got error %T, want *KernelError", err)
				}
			}
			if got != tc.want {
				t.Errorf("got error\n%q, want\n%q", got, tc.want)
			}
			var names []string
			for _, f := range optional {
				names = append(names, f.Name)
			}
			if !slices.Equal(names, tc.optional) {
				t.Errorf("got optional missing %q, want %q", names, tc.optional)
			}
		})
	}
}

func TestKernelVersionHeldBy(t *testing.T) {
	for _, tc := range []struct {
		release string
		v       KernelVersion
		want    bool
	}{
		{"5.12.0", KernelVersion{5, 12}, true},
		{"5.12-rc1", KernelVersion{5, 12}, true},
		{"5.11.22-generic", KernelVersion{5, 12}, false},
		{"5.2.0", KernelVersion{5, 12}, false}, // 2 < 12, not "2" > "12"
		{"6.1.0", KernelVersion{5, 12}, true},
		{"4.19.0", KernelVersion{5, 2}, false},
		{"6.12.9", KernelVersion{6, 13}, false},
		{"10.0", KernelVersion{6, 13}, true},
		{"garbage", KernelVersion{5, 2}, false},
	} {
		if got := tc.v.heldBy(tc.release); got != tc.want {
			t.Errorf("KernelVersion %s heldBy(%q): got %v, want %v", tc.v, tc.release, got, tc.want)
		}
	}
}

// TestKernelMinimumIs512 pins the minimum that docs/operations.md#kernel
// states: the newest of the required features.
func TestKernelMinimumIs512(t *testing.T) {
	var minimum KernelVersion
	for _, p := range kernelProbes {
		if p.Required && p.Since.compare(minimum) > 0 {
			minimum = p.Since
		}
	}
	if want := (KernelVersion{5, 12}); minimum != want {
		t.Errorf("got minimum %s, want %s", minimum, want)
	}
}

// TestKernelProbesFindEverything probes this machine's kernel (6.13 or
// later): every feature, required or optional, is found, and no probe
// fails to tell.
func TestKernelProbesFindEverything(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for the mount API and loop devices")
	}
	if !kernelAtLeast(6, 13) {
		t.Skipf("kernel %s predates some optional features", kernelRelease())
	}
	for _, p := range kernelProbes {
		present, err := p.probe()
		if err != nil || !present {
			t.Errorf("%s (Linux %s): got present %v, error %v; want present", p.Name, p.Since, present, err)
		}
	}
	if err := CheckKernel(klog.Background()); err != nil {
		t.Errorf("CheckKernel: got %v, want nil", err)
	}
}
