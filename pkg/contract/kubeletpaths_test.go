package contract

import (
	"strings"
	"testing"
)

// TestBlockStatsTarget checks the kubelet's stats path of a raw block
// volume against the publish target it stands for.
func TestBlockStatsTarget(t *testing.T) {
	const csiDir = "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices"
	for _, tc := range []struct {
		name, path, want string
	}{
		{name: "the kubelet's map path", path: csiDir + "/pvc-1/dev/uid-1", want: csiDir + "/publish/pvc-1/uid-1"},
		{name: "the publish target itself", path: csiDir + "/publish/pvc-1/uid-1"},
		{name: "a staging path", path: csiDir + "/staging/pvc-1"},
		{name: "no dev directory", path: csiDir + "/pvc-1/data/uid-1"},
		{name: "another tree", path: "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pvc-1/dev/uid-1"},
		{name: "the dev directory", path: csiDir + "/pvc-1/dev/"},
		{name: "a pv named publish", path: csiDir + "/publish/dev/uid-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := BlockStatsTarget(tc.path)
			if got != tc.want || ok != (tc.want != "") {
				t.Errorf("BlockStatsTarget(%s): got %q, %v; want %q", tc.path, got, ok, tc.want)
			}
		})
	}
}

// TestBlockDeviceMapPath: the kubelet's map path of a raw block publish
// is the one BlockStatsTarget takes back to it; a filesystem target, or
// one outside the kubelet's layout, has none.
func TestBlockDeviceMapPath(t *testing.T) {
	const kubelet = "/var/lib/kubelet"
	const csiDir = kubelet + "/plugins/kubernetes.io/csi/volumeDevices"
	for _, tc := range []struct {
		name, target, want string
	}{
		{name: "a raw block publish", target: csiDir + "/publish/pvc-1/uid-1", want: csiDir + "/pvc-1/dev/uid-1"},
		{name: "a filesystem publish", target: kubelet + "/pods/uid-1/volumes/kubernetes.io~csi/pvc-1/mount"},
		{name: "another kubelet directory", target: "/other/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-1/uid-1"},
		{name: "not clean", target: csiDir + "/publish/pvc-1/../pvc-2/uid-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := BlockDeviceMapPath(kubelet, tc.target)
			if got != tc.want || ok != (tc.want != "") {
				t.Fatalf("BlockDeviceMapPath(%s): got %q, %v; want %q", tc.target, got, ok, tc.want)
			}
			if ok {
				if back, _ := BlockStatsTarget(got); back != tc.target {
					t.Errorf("BlockStatsTarget(%s): got %q, want %s", got, back, tc.target)
				}
			}
		})
	}
}

// TestPodOfTarget checks which publish targets name a pod: the kubelet's
// two layouts, and nothing else.
func TestPodOfTarget(t *testing.T) {
	const k = "/var/lib/kubelet"
	const uid = "6f1c2b9e-5a4d-4c3b-9e8f-0a1b2c3d4e5f"
	for _, tc := range []struct {
		name, kubelet, target, want string
	}{
		{name: "filesystem", kubelet: k, target: k + "/pods/" + uid + "/volumes/kubernetes.io~csi/pvc-1/mount", want: uid},
		{name: "block", kubelet: k, target: k + "/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-1/" + uid, want: uid},
		{name: "kubelet dir with a trailing slash", kubelet: k + "/", target: k + "/pods/" + uid + "/volumes/kubernetes.io~csi/pvc-1/mount", want: uid},
		{name: "static pod hash", kubelet: k, target: k + "/pods/0123456789abcdef0123456789abcdef/volumes/kubernetes.io~csi/pv/mount", want: "0123456789abcdef0123456789abcdef"},
		{name: "another kubelet dir", kubelet: "/data/kubelet", target: k + "/pods/" + uid + "/volumes/kubernetes.io~csi/pvc-1/mount"},
		{name: "a prefix of the kubelet dir", kubelet: k, target: k + "2/pods/" + uid + "/volumes/kubernetes.io~csi/pvc-1/mount"},
		{name: "not the mount directory", kubelet: k, target: k + "/pods/" + uid + "/volumes/kubernetes.io~csi/pvc-1/data"},
		{name: "another plugin's volume", kubelet: k, target: k + "/pods/" + uid + "/volumes/kubernetes.io~empty-dir/pvc-1/mount"},
		{name: "too deep", kubelet: k, target: k + "/pods/" + uid + "/volumes/kubernetes.io~csi/pvc-1/mount/x"},
		{name: "a staging path", kubelet: k, target: k + "/plugins/kubernetes.io/csi/converge.csi.dev/abc/globalmount"},
		{name: "block staging", kubelet: k, target: k + "/plugins/kubernetes.io/csi/volumeDevices/staging/pvc-1"},
		{name: "block map path", kubelet: k, target: k + "/plugins/kubernetes.io/csi/volumeDevices/pvc-1/dev/" + uid},
		{name: "uid with a dot", kubelet: k, target: k + "/pods/../volumes/kubernetes.io~csi/pvc-1/mount"},
		{name: "uid with an underscore", kubelet: k, target: k + "/pods/a_b/volumes/kubernetes.io~csi/pvc-1/mount"},
		{name: "uid too long", kubelet: k, target: k + "/pods/" + strings.Repeat("a", 65) + "/volumes/kubernetes.io~csi/pvc-1/mount"},
		{name: "empty uid", kubelet: k, target: k + "/pods//volumes/kubernetes.io~csi/pvc-1/mount"},
		{name: "not clean", kubelet: k, target: k + "/pods/" + uid + "/volumes/kubernetes.io~csi/./mount"},
		{name: "a test's own path", kubelet: k, target: "/tmp/x/target"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := PodOfTarget(tc.kubelet, tc.target)
			if got != tc.want || ok != (tc.want != "") {
				t.Errorf("PodOfTarget(%s, %s): got %q, %v; want %q", tc.kubelet, tc.target, got, ok, tc.want)
			}
		})
	}
}
