package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/test/e2e/standin"
)

// TestSidecarImagesRefuseUnknownFlags runs each sidecar's image, the
// releases built here and the registrar's stand-in, in a pod with a flag
// no release defines: each must exit 2 naming it, as the flag package of
// the real sidecars does, so that a flag deploy/ passes that its release
// lacks fails the deployment.
func TestSidecarImagesRefuseUnknownFlags(t *testing.T) {
	var images []string
	for _, s := range sidecars {
		images = append(images, s.image())
	}
	for _, s := range standin.Releases {
		images = append(images, standInImage(s))
	}
	var ctrs []corev1.Container
	for i, image := range images {
		ctrs = append(ctrs, corev1.Container{Name: fmt.Sprintf("c%d", i), Image: image, ImagePullPolicy: corev1.PullNever,
			Args: []string{"--csi-address=/csi/csi.sock", "--no-such-flag=1"}})
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sidecar-flags"},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](5), Containers: ctrs},
	}
	ctx := context.Background()
	if _, err := c.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePod(t, pod.Name) })
	var statuses []corev1.ContainerStatus
	poll(t, 2*time.Minute, "every container of "+pod.Name+" ended", func() (bool, string) {
		p, err := c.client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		statuses = p.Status.ContainerStatuses
		for _, s := range statuses {
			if s.State.Terminated == nil {
				return false, fmt.Sprintf("%s: %+v%s", s.Name, s.State, podEvents(pod.Name))
			}
		}
		return len(statuses) == len(images), podEvents(pod.Name)
	})
	for i, image := range images {
		for _, s := range statuses {
			if s.Name != fmt.Sprintf("c%d", i) {
				continue
			}
			log := logsOf(pod.Name, s.Name)
			if s.State.Terminated.ExitCode != 2 || !strings.Contains(log, "no-such-flag") {
				t.Errorf("%s with --no-such-flag: exit code %d, log %q; want 2 naming the flag", image, s.State.Terminated.ExitCode, log)
			}
		}
	}
}
