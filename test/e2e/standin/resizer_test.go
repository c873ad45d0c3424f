package standin

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// resizerOf reads argv as the resizer's stand-in does.
func resizerOf(t *testing.T, argv []string) (resizerConfig, error) {
	t.Helper()
	release, _ := releaseNamed("csi-resizer")
	a, err := parseArgs(release, resizerFlags, argv)
	if err != nil {
		t.Fatal(err)
	}
	return newResizerConfig(a)
}

// TestResizerLeaderElection: with deploy/'s --leader-election=true and
// --leader-election-namespace, the resizer works only once elected, on
// the Lease external-resizer names (external-resizer-<driver>) in that
// namespace; with --leader-election=false (the release's default) it
// works at once. Without the namespace the stand-in refuses to elect (the
// release would take its service account's).
func TestResizerLeaderElection(t *testing.T) {
	cfg, err := resizerOf(t, deployArgs(t, "csi-resizer", "--leader-election-namespace="+ns))
	if err != nil {
		t.Fatal(err)
	}
	r := newResizer(cfg, fake.NewClientset(), nil, &bytes.Buffer{})
	lock := cfg.lease(fake.NewClientset(), "me")
	if r.leads.Load() || lock.LeaseMeta.Name != "external-resizer-converge-csi-dev" || lock.LeaseMeta.Namespace != ns || lock.Identity() != "me" {
		t.Errorf("--leader-election=true: leads %v, Lease %s/%s for %s; want not leading until elected on %s/external-resizer-converge-csi-dev",
			r.leads.Load(), lock.LeaseMeta.Namespace, lock.LeaseMeta.Name, lock.Identity(), ns)
	}

	cfg, err = resizerOf(t, deployArgs(t, "csi-resizer", "--leader-election=false"))
	if err != nil {
		t.Fatal(err)
	}
	if r := newResizer(cfg, fake.NewClientset(), nil, &bytes.Buffer{}); cfg.elect || !r.leads.Load() {
		t.Errorf("--leader-election=false: elect %v, leads %v; want leading at once", cfg.elect, r.leads.Load())
	}

	if _, err := resizerOf(t, without(deployArgs(t, "csi-resizer"), "--leader-election-namespace")); err == nil ||
		!strings.Contains(err.Error(), "--leader-election-namespace") {
		t.Errorf("--leader-election=true without a namespace: got %v, want refused", err)
	}
}

// TestResizerTimeout: ControllerExpandVolume gets --timeout, which deploy/
// leaves at the release's default, 10s.
func TestResizerTimeout(t *testing.T) {
	cfg, err := resizerOf(t, deployArgs(t, "csi-resizer"))
	if err != nil {
		t.Fatal(err)
	}
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv"},
		Spec: corev1.PersistentVolumeSpec{Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: DriverName, VolumeHandle: "v", FSType: "ext4"}}}}
	pvc := claim("c", "late", here)
	pvc.Spec.VolumeName = pv.Name
	pvc.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("2Gi")
	pvc.Status = corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}
	d := startDriver(t)
	log := &bytes.Buffer{}
	r := newResizer(cfg, fake.NewClientset(pv, pvc), csi.NewControllerClient(d.conn(t)), log)
	if err := r.resize(context.Background()); err != nil {
		t.Fatal(err)
	}
	calls := d.called("ControllerExpandVolume")
	if want := 10 * time.Second; len(calls) != 1 || !within(calls[0].left, want) {
		t.Errorf("ControllerExpandVolume: %v; want one call given %v", calls, want)
	}
}
