package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
)

// examplesNamespace is where testExamples applies docs/examples.
const examplesNamespace = "converge-examples"

// testExamples applies each file of docs/examples as written (kubectl
// apply -f, in a namespace of its own): the README's first claim, a raw
// block claim, a snapshot and its restore, a group snapshot, each pod
// running and each snapshot ready; a claim of each example StorageClass,
// used by a pod; and the move of a local-path-provisioner claim, its data
// read back from converge (migrateFromLocalPath). Every file is applied,
// and the README's first claim is the example's. Deleting the namespace
// then takes every volume and snapshot with it.
func testExamples(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(c.repo, "docs", "examples")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".yaml") {
			files = append(files, e.Name())
		}
	}
	readme, err := os.ReadFile(filepath.Join(c.repo, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(filepath.Join(dir, "first-claim.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, body, _ := strings.Cut(string(first), "\napiVersion:"); !strings.Contains(string(readme), "```yaml\napiVersion:"+body+"```") {
		t.Errorf("the README's first claim is not docs/examples/first-claim.yaml (less its comment)")
	}

	var classes []string
	t.Cleanup(func() { removeExamples(t, dir, classes) })
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: examplesNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	applied := map[string]bool{}
	apply := func(file string) {
		t.Helper()
		if _, err := c.kubectl(ctx, "apply", "-n", examplesNamespace, "-f", filepath.Join(dir, file)); err != nil {
			t.Fatal(err)
		}
		applied[file] = true
	}
	for _, f := range files {
		if strings.HasPrefix(f, "storageclass-") || strings.HasPrefix(f, "volumesnapshotclass-") {
			apply(f)
			if strings.HasPrefix(f, "storageclass-") {
				classes = append(classes, f)
			}
		}
	}
	apply("first-claim.yaml")
	apply("block-claim.yaml")
	waitRunningIn(t, examplesNamespace, "writer")
	// As the example says: its snapshot is taken once writer wrote
	// /data/hello, which a running container may not have yet.
	poll(t, time.Minute, "writer's /data/hello", func() (bool, string) {
		out, err := c.kubectl(ctx, "exec", "-n", examplesNamespace, "writer", "-c", "c", "--", "cat", "/data/hello")
		return err == nil && strings.Contains(out, "UTC"), fmt.Sprintf("%q, %v", out, err)
	})
	apply("snapshot-and-restore.yaml")
	apply("group-snapshot.yaml")
	waitRunningIn(t, examplesNamespace, "raw-user")
	waitRunningIn(t, examplesNamespace, "reader")
	// Its container prints the file once it runs: a moment after it is
	// Running.
	poll(t, time.Minute, "the restored claim's /data/hello, as the reader prints it", func() (bool, string) {
		out, err := c.kubectl(ctx, "logs", "-n", examplesNamespace, "reader")
		return err == nil && strings.Contains(out, "UTC"), fmt.Sprintf("%q, %v", out, err)
	})
	waitRunningIn(t, examplesNamespace, "db")
	ioLimitsExample(t, apply)
	poll(t, 3*time.Minute, "the example's VolumeGroupSnapshot db-group ready", func() (bool, string) {
		o, err := c.dynamic.Resource(volumeGroupSnapshots).Namespace(examplesNamespace).Get(ctx, "db-group", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ready, _, _ := unstructured.NestedBool(o.Object, "status", "readyToUse")
		return ready, fmt.Sprint(o.Object["status"])
	})

	// A claim of each example class, used by a pod.
	for _, f := range classes {
		class := strings.TrimSuffix(strings.TrimPrefix(f, "storageclass-"), ".yaml")
		sc, err := c.client.StorageV1().StorageClasses().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		name := ""
		for _, s := range sc.Items {
			if b, _ := os.ReadFile(filepath.Join(dir, f)); strings.Contains(string(b), "\n  name: "+s.Name+"\n") {
				name = s.Name
			}
		}
		if name == "" {
			t.Fatalf("%s: no StorageClass of it in the cluster", f)
		}
		claim := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "of-" + class},
			Spec: corev1.PersistentVolumeClaimSpec{
				StorageClassName: &name,
				AccessModes:      []corev1.PersistentVolumeAccessMode{rwo},
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("256Mi")}},
			},
		}
		if _, err := c.client.CoreV1().PersistentVolumeClaims(examplesNamespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		spec := podSpecOf(podSpec{claims: []string{claim.Name}, command: "echo ok > " + dataDir + "/f && sleep 1d"})
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "of-" + class}, Spec: spec}
		if _, err := c.client.CoreV1().Pods(examplesNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range classes {
		waitRunningIn(t, examplesNamespace, "of-"+strings.TrimSuffix(strings.TrimPrefix(f, "storageclass-"), ".yaml"))
	}
	// Applied once the claim it moves exists and holds data.
	migrateFromLocalPath(t, apply)
	for _, f := range files {
		if !applied[f] {
			t.Errorf("docs/examples/%s is not applied by the test", f)
		}
	}
}

// removeExamples deletes the examples' namespace, its pods first at once,
// and waits for every volume and snapshot content of it to be gone; then
// deletes the example classes.
func removeExamples(t *testing.T, dir string, classes []string) {
	ctx := context.Background()
	pods := c.client.CoreV1().Pods(examplesNamespace)
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{}); err != nil {
		t.Errorf("deleting the examples' pods: %v", err)
	}
	if err := c.client.CoreV1().Namespaces().Delete(ctx, examplesNamespace, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("deleting namespace %s: %v", examplesNamespace, err)
	}
	poll(t, 5*time.Minute, "namespace "+examplesNamespace+", its volumes and snapshot contents gone", func() (bool, string) {
		var left []string
		if _, err := c.client.CoreV1().Namespaces().Get(ctx, examplesNamespace, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			left = append(left, "the namespace")
		}
		pvs, err := c.client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, pv := range pvs.Items {
			if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == examplesNamespace {
				left = append(left, "PV "+pv.Name)
			}
		}
		contents, err := c.dynamic.Resource(snapshotContents).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, o := range contents.Items {
			if ns, _, _ := unstructured.NestedString(o.Object, "spec", "volumeSnapshotRef", "namespace"); ns == examplesNamespace {
				left = append(left, "VolumeSnapshotContent "+o.GetName())
			}
		}
		groups, err := c.dynamic.Resource(volumeGroupSnapshotContents).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, o := range groups.Items {
			if ns, _, _ := unstructured.NestedString(o.Object, "spec", "volumeGroupSnapshotRef", "namespace"); ns == examplesNamespace {
				left = append(left, "VolumeGroupSnapshotContent "+o.GetName())
			}
		}
		slices.Sort(left)
		return len(left) == 0, strings.Join(left, ", ")
	})
	for _, f := range append(classes, "volumesnapshotclass-velero.yaml", "io-limits.yaml") {
		if _, err := c.kubectl(ctx, "delete", "--ignore-not-found", "-f", filepath.Join(dir, f)); err != nil {
			t.Errorf("deleting %s: %v", f, err)
		}
	}
}

// ioLimitsExample applies io-limits.yaml: its claim is made with the
// class io-slow (the provisioner makes no claim of a class for a driver
// without MODIFY_VOLUME, which csi-node advertises by default), and
// switched as the file's comment says, to io-unlimited, while its pod
// runs.
func ioLimitsExample(t *testing.T, apply func(string)) {
	t.Helper()
	ctx := context.Background()
	apply("io-limits.yaml")
	waitRunningIn(t, examplesNamespace, "limited-user")
	claims := c.client.CoreV1().PersistentVolumeClaims(examplesNamespace)
	current := func(want string) {
		t.Helper()
		poll(t, 2*time.Minute, "claim limited's current class "+want, func() (bool, string) {
			pvc, err := claims.Get(ctx, "limited", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			got := ptr.Deref(pvc.Status.CurrentVolumeAttributesClassName, "")
			return got == want && pvc.Status.ModifyVolumeStatus == nil, fmt.Sprintf("current %q, modify %+v", got, pvc.Status.ModifyVolumeStatus)
		})
	}
	current("io-slow")
	b, err := os.ReadFile(filepath.Join(c.repo, "docs", "examples", "io-limits.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var patch string
	for _, l := range strings.Split(string(b), "\n") {
		if _, cmd, ok := strings.Cut(l, "#   kubectl patch "); ok {
			patch = "kubectl patch " + cmd
		}
	}
	// kubectl patch pvc limited -p '{...}', the JSON without spaces.
	args := strings.Fields(patch)
	if len(args) != 6 || args[1] != "patch" || args[4] != "-p" {
		t.Fatalf("io-limits.yaml's comment gives no kubectl patch of the claim: %q", patch)
	}
	args[5] = strings.Trim(args[5], "'")
	if _, err := c.kubectl(ctx, append([]string{"-n", examplesNamespace}, args[1:]...)...); err != nil {
		t.Fatal(err)
	}
	current("io-unlimited")
}
