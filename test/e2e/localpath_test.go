package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/converge-csi/converge/test/e2e/peers"
)

// useLocalPath installs local-path-provisioner for the test, and takes it
// away when the test ends unless another test still uses it.
func useLocalPath(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	if err := c.installLocalPath(ctx); err != nil {
		t.Fatalf("installing local-path-provisioner: %v", err)
	}
	t.Logf("local-path-provisioner %s installed in %.1fs", peers.LocalPathVersion, time.Since(start).Seconds())
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := c.kubectl(ctx, "-n", localPathNamespace, "logs", "deployment/local-path-provisioner", "--tail=40")
			t.Logf("local-path-provisioner's log:\n%s", logs)
		}
		start := time.Now()
		if err := c.uninstallLocalPath(ctx); err != nil {
			t.Errorf("uninstalling local-path-provisioner: %v", err)
		}
		t.Logf("local-path-provisioner uninstalled in %.1fs", time.Since(start).Seconds())
	})
}

// local-path-provisioner runs beside converge as its docs install it, and
// serves a claim of its class as a user would use it: a pod writes a file
// to the claim and reads it back, and the file is in the claim's directory
// under the run's node path on the node; once pod and claim are deleted,
// its helper pod removes that directory. A smoke test of the installation
// that issue 72's comparison runs on.
func testLocalPathProvisioner(t *testing.T) {
	useLocalPath(t)
	ctx := context.Background()
	const name = "local-path"
	claimOf(t, name, fs, rwo, volumeSize, localPathClass)
	pod := startPod(t, podSpec{name: name, claims: []string{name}})
	token := "written by " + string(pod.UID)
	mustExec(t, pod.Name, fmt.Sprintf("echo %q > %s/f && sync", token, dataDir))
	if got := mustExec(t, pod.Name, "cat "+dataDir+"/f"); got != token {
		t.Fatalf("the pod read %q back, want %q", got, token)
	}

	pvc, err := c.client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := c.client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pv.Spec.HostPath == nil {
		t.Fatalf("volume %s is not a hostPath, local-path's default: %+v", pv.Name, pv.Spec.PersistentVolumeSource)
	}
	dir := pv.Spec.HostPath.Path
	t.Logf("claim %s: volume %s at %s on the node", name, pv.Name, dir)
	if filepath.Dir(dir) != c.localPathDir() {
		t.Fatalf("the claim's directory is %s, want one in the run's node path %s", dir, c.localPathDir())
	}
	if b, err := os.ReadFile(c.ns.path(filepath.Join(dir, "f"))); err != nil || string(b) != token+"\n" {
		t.Fatalf("the node's %s/f holds %q (%v), want what the pod wrote, %q", dir, b, err, token+"\n")
	}

	deletePod(t, pod.Name)
	if err := c.client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete PVC %s: %v", name, err)
	}
	poll(t, 2*time.Minute, "volume "+pv.Name+" deleted", func() (bool, string) {
		_, err := c.client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	if _, err := os.Stat(c.ns.path(dir)); !os.IsNotExist(err) {
		t.Errorf("the claim's directory %s is still on the node once its volume is deleted (%v)", dir, err)
	}
}
