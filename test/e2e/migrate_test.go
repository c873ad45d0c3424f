package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/pkg/contract"
)

// The example that moves a claim of local-path-provisioner to converge,
// and the names in it a user edits: the local-path claim it copies, the
// converge claim it makes and its Job, named after that claim.
const (
	migrateExample = "migrate-from-local-path.yaml"
	localPathClaim = "app-data"
	migratedClaim  = "app-data-converge"
	migrateJob     = "migrate-app-data-converge"
)

// localPathSize is the old claim's size, as large as the example's new
// claim (docs/migrating.md asks for at least the old size); the test's
// files take a few KiB of it.
const localPathSize = "256Mi"

// migratedFiles is what the reader of the converge claim prints of the
// files the writer made in the local-path claim (stat's name, mode and
// owner, then the file's content and the link's target): the volume's
// root as local-path-provisioner's setup script makes it (mkdir -m 0777),
// a file and a directory of other owners and modes, a symbolic link.
const migratedFiles = `/data 777 0:0
/data/hello 640 1000:2000
/data/sub 750 33:33
moved from local-path
../hello`

// migrateFromLocalPath checks docs/examples/migrate-from-local-path.yaml,
// applied with apply in the examples' namespace. It first makes the claim
// the example moves as local-path-provisioner v0.0.37 makes one
// (provisioner.go; its setup script makes the directory with mode 0777
// before the PV): a PV of class local-path, a hostPath of type
// DirectoryOrCreate at <base>/<pv>_<namespace>_<claim>, pinned to the node
// by kubernetes.io/hostname. Its base is a directory of the run's, not
// /opt/local-path-provisioner, and its reclaim policy Retain: local-path's
// Delete is carried out by its provisioner, which does not run here, so
// the test removes the directory itself. A pod writes files into it; the
// example, applied as written, must then complete its Job, its converge
// claim be made on the old volume's node, and a pod of that claim read the
// files with their content, modes and owners. The old claim, its PV and
// the directory are removed when t ends.
func migrateFromLocalPath(t *testing.T, apply func(string)) {
	ctx := context.Background()
	pvName := "pvc-local-path-" + localPathClaim
	base := filepath.Join(c.dir, "local-path-provisioner")
	dir := filepath.Join(base, strings.Join([]string{pvName, examplesNamespace, localPathClaim}, "_"))
	const writer, reader = "local-path-writer", "migrated-reader"
	t.Cleanup(func() { removeLocalPathClaim(t, pvName, base, writer, reader) })

	if err := os.MkdirAll(c.ns.path(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(c.ns.path(dir), 0o777); err != nil {
		t.Fatal(err)
	}
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName, Annotations: map[string]string{
			"pv.kubernetes.io/provisioned-by":      "rancher.io/local-path",
			"local.path.provisioner/selected-node": c.node,
		}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(localPathSize)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{rwo},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "local-path",
			VolumeMode:                    ptr.To(fs),
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &dirOrCreate},
			},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: hostnameLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{c.node}}},
			}}}},
			ClaimRef: &corev1.ObjectReference{APIVersion: "v1", Kind: "PersistentVolumeClaim", Namespace: examplesNamespace, Name: localPathClaim},
		},
	}
	if _, err := c.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	old := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: localPathClaim},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: ptr.To("local-path"),
			VolumeName:       pvName,
			AccessModes:      []corev1.PersistentVolumeAccessMode{rwo},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(localPathSize)}},
		},
	}
	if _, err := c.client.CoreV1().PersistentVolumeClaims(examplesNamespace).Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runToEnd(t, writer, localPathClaim, "printf 'moved from local-path\\n' > /data/hello && chown 1000:2000 /data/hello && chmod 640 /data/hello"+
		" && mkdir /data/sub && chown 33:33 /data/sub && chmod 750 /data/sub && ln -s ../hello /data/sub/link")
	if b, err := os.ReadFile(c.ns.path(filepath.Join(dir, "hello"))); err != nil || string(b) != "moved from local-path\n" {
		t.Fatalf("the writer's file in the old volume's directory on the node: %q, %v; want what it wrote", b, err)
	}

	// The workload is stopped (the writer ended); the example moves its claim.
	apply(migrateExample)
	poll(t, 3*time.Minute, "Job "+migrateJob+" complete", func() (bool, string) {
		j, err := c.client.BatchV1().Jobs(examplesNamespace).Get(ctx, migrateJob, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, cond := range j.Status.Conditions {
			if cond.Status != corev1.ConditionTrue {
				continue
			}
			switch cond.Type {
			case batchv1.JobComplete:
				return true, ""
			case batchv1.JobFailed:
				t.Fatalf("Job %s failed: %s: %s\n%s", migrateJob, cond.Reason, cond.Message, jobLog(migrateJob))
			}
		}
		return false, fmt.Sprintf("active %d, conditions %v%s", j.Status.Active, j.Status.Conditions, eventsIn(examplesNamespace, migrateJob, migratedClaim))
	})
	t.Logf("the example's Job: %s", jobLog(migrateJob))

	pvc, err := c.client.CoreV1().PersistentVolumeClaims(examplesNamespace).Get(ctx, migratedClaim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	newPV, err := c.client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the converge claim's PV %q: %v", pvc.Spec.VolumeName, err)
	}
	if newPV.Spec.CSI == nil || newPV.Spec.CSI.Driver != contract.DefaultDriverName {
		t.Fatalf("claim %s's PV %s is not converge's: %+v", migratedClaim, newPV.Name, newPV.Spec.PersistentVolumeSource)
	}
	if got := nodeOf(newPV); got != c.node {
		t.Errorf("the converge claim was made on node %q, want the old volume's, %q", got, c.node)
	}
	got := runToEnd(t, reader, migratedClaim, "stat -c '%n %a %u:%g' /data /data/hello /data/sub && cat /data/hello && readlink /data/sub/link")
	if got != migratedFiles {
		t.Errorf("the converge claim holds, as its reader prints it:\n%s\nwant:\n%s", got, migratedFiles)
	}
}

// runToEnd runs command in a pod of its own, name, in the examples'
// namespace, with claim mounted at /data; it waits for the pod to end and
// returns its log. A pod that failed fails t.
func runToEnd(t *testing.T, name, claim, command string) string {
	t.Helper()
	ctx := context.Background()
	spec := podSpecOf(podSpec{claims: []string{claim}, command: "set -e; " + command})
	spec.RestartPolicy = corev1.RestartPolicyNever
	pods := c.client.CoreV1().Pods(examplesNamespace)
	if _, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	log := func() string {
		b, err := pods.GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return "logs: " + err.Error()
		}
		return strings.TrimSpace(string(b))
	}
	poll(t, 2*time.Minute, "pod "+examplesNamespace+"/"+name+" done", func() (bool, string) {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.Status.Phase == corev1.PodFailed {
			t.Fatalf("pod %s failed: %s%s", name, log(), eventsIn(examplesNamespace, name))
		}
		return p.Status.Phase == corev1.PodSucceeded, string(p.Status.Phase) + eventsIn(examplesNamespace, name)
	})
	return log()
}

// jobLog is the log of the Job's pod, to show what it copied or why it
// failed.
func jobLog(job string) string {
	out, err := c.kubectl(context.Background(), "logs", "-n", examplesNamespace, "job/"+job)
	if err != nil {
		return fmt.Sprintf("logs of job/%s: %v", job, err)
	}
	return strings.TrimSpace(out)
}

// eventsIn is the events of namespace about objects whose names start with
// one of prefixes (a Job's pods are named after it), to explain a wait.
func eventsIn(namespace string, prefixes ...string) string {
	evs, err := c.client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return ""
	}
	var b strings.Builder
	for _, e := range evs.Items {
		if hasPrefix(e.InvolvedObject.Name, prefixes) {
			fmt.Fprintf(&b, "\n    event %s %s/%s %s: %s", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
	return b.String()
}

// removeLocalPathClaim deletes the pods, the Job, the old claim and its
// PV, waits for the PV to be gone (no pod uses the directory then), and
// removes the directories under base, also when that wait fails. What is
// not there is skipped; the examples' namespace takes the rest.
func removeLocalPathClaim(t *testing.T, pvName, base string, pods ...string) {
	ctx := context.Background()
	defer func() {
		if err := os.RemoveAll(c.ns.path(base)); err != nil {
			t.Errorf("removing the local-path directories: %v", err)
		}
	}()
	for _, p := range pods {
		if err := c.client.CoreV1().Pods(examplesNamespace).Delete(ctx, p, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting pod %s: %v", p, err)
		}
	}
	if err := c.client.BatchV1().Jobs(examplesNamespace).Delete(ctx, migrateJob, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("deleting Job %s: %v", migrateJob, err)
	}
	if err := c.client.CoreV1().PersistentVolumeClaims(examplesNamespace).Delete(ctx, localPathClaim, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("deleting claim %s: %v", localPathClaim, err)
	}
	if err := c.client.CoreV1().PersistentVolumes().Delete(ctx, pvName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("deleting PV %s: %v", pvName, err)
	}
	poll(t, 2*time.Minute, "PV "+pvName+" gone", func() (bool, string) {
		_, err := c.client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err) + eventsIn(examplesNamespace, localPathClaim, migrateJob)
	})
}
