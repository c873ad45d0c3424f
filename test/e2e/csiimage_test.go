package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestCSINodeImage runs the image the harness built from the Dockerfile in
// a pod, as the kubelet runs it: its entry point is csi-node, stamped with
// the version the build stage passes; and the tools csi-node runs are on
// the image's PATH.
func TestCSINodeImage(t *testing.T) {
	image := csiNodeImageName + ":" + csiNodeImageTag
	tools := "mount umount blkid blockdev losetup fsck e2fsck mkfs.ext4 resize2fs mkfs.xfs xfs_growfs xfs_repair mkfs.btrfs btrfs"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "csi-node-image"},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Containers: []corev1.Container{
				{Name: "version", Image: image, ImagePullPolicy: corev1.PullNever, Args: []string{"--version"}},
				{Name: "tools", Image: image, ImagePullPolicy: corev1.PullNever,
					Command: []string{"sh", "-c", "for t in " + tools + "; do command -v $t || { echo missing $t; exit 1; }; done"}},
			},
		},
	}
	ctx := context.Background()
	if _, err := c.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePod(t, pod.Name) })
	poll(t, 2*time.Minute, "pod "+pod.Name+" done", func() (bool, string) {
		p, err := c.client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.Status.Phase == corev1.PodFailed {
			t.Fatalf("pod %s failed: %v%s\n%s", pod.Name, p.Status.ContainerStatuses, podEvents(pod.Name), logsOf(pod.Name, "tools"))
		}
		return p.Status.Phase == corev1.PodSucceeded, string(p.Status.Phase) + podEvents(pod.Name)
	})
	if got := strings.TrimSpace(logsOf(pod.Name, "version")); got != csiNodeImageTag {
		t.Errorf("csi-node --version in the image: got %q, want %q", got, csiNodeImageTag)
	}
	if got := logsOf(pod.Name, "tools"); strings.Count(got, "/") < len(strings.Fields(tools)) {
		t.Errorf("tools in the image: got\n%s", got)
	}
}

// logsOf returns the log of a container of a pod in the test namespace.
func logsOf(pod, container string) string {
	b, err := c.client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(context.Background())
	if err != nil {
		return "logs: " + err.Error()
	}
	return string(b)
}
