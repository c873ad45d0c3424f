package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/pkg/contract"
)

// controllerPolicy is deploy/components/node-volumes' second
// ValidatingAdmissionPolicy, which holds converge-controller's account to
// what it releases; its refusals name it.
const controllerPolicy = "converge-controller-releases-only"

// provisionerFinalizer is the finalizer external-provisioner puts on the
// volumes it provisions, which converge-controller takes off a volume it
// releases (pkg/nodeloss.ProvisionerFinalizer).
const provisionerFinalizer = "external-provisioner.volume.kubernetes.io/finalizer"

// TestControllerWritesOnlyWhatItReleases asks the API server, with the
// token of a converge-controller pod (a TokenRequest bound to the pod, as
// the kubelet makes it), for what root on that pod's node could do with
// it: a write of another driver's volume, a rebinding or a reclaim policy
// change of a converge volume, a delete of another driver's claim or of a
// pod that uses no claim, a delete with a grace of 0 of a running pod that
// uses a claim, and a Lease of another name are refused by the
// policy, not by RBAC (which allows every one of them); what a release
// does (a converge volume deleted and its provisioner's finalizer taken
// off, a converge claim and a pod that uses a claim deleted with its own
// grace) and its own
// Lease are accepted, and the controller keeps leading.
func TestControllerWritesOnlyWhatItReleases(t *testing.T) {
	ctx := context.Background()
	as := controllerPodClient(t)
	pvs := as.CoreV1().PersistentVolumes()
	claims, pods := as.CoreV1().PersistentVolumeClaims(ns), as.CoreV1().Pods(ns)
	leases := as.CoordinationV1().Leases(daemonSetNamespace)

	prefix := fmt.Sprintf("ctrlpol-%d-", time.Now().UnixNano()%100000)
	// Fixtures, made as the admin: another driver's volume and a converge
	// volume with external-provisioner's finalizer, both retained and
	// bound to nothing, so that nothing in the cluster acts on them.
	other := convergePV(prefix+"other", c.node)
	other.Spec.CSI.Driver = "other.csi.example.com"
	adminPV(t, other)
	conv := convergePV(prefix+"conv", c.node)
	conv.Finalizers = []string{provisionerFinalizer}
	provisionersLeave(conv)
	adminPV(t, conv)
	t.Cleanup(func() { unfinalize(t, conv.Name) })
	otherClaim := adminProvisionedClaim(t, prefix+"otherclaim", "other.csi.example.com")
	convClaim := adminProvisionedClaim(t, prefix+"convclaim", contract.DefaultDriverName)
	noClaimPod := adminPod(t, prefix+"noclaim", "")
	claimPod := adminPod(t, prefix+"claim", otherClaim)

	refused := func(name string, do func() error) {
		t.Run("refused: "+name, func(t *testing.T) {
			err := do()
			if err == nil {
				t.Fatalf("%s: accepted, want the policy %s to refuse it", name, controllerPolicy)
			}
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+controllerPolicy+"'") {
				t.Fatalf("%s: got %v, want the policy %s's refusal", name, err, controllerPolicy)
			}
			t.Logf("refused: %v", err)
		})
	}
	accepted := func(name string, do func() error) {
		t.Run("accepted: "+name, func(t *testing.T) {
			if err := do(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		})
	}
	// updateAs updates the volume called name as the controller's token
	// may (its ClusterRole has update, not patch: an update of the volume
	// read), with change made to it.
	updateAs := func(name string, change func(*corev1.PersistentVolume)) func() error {
		return func() error {
			return retry.RetryOnConflict(retry.DefaultRetry, func() error {
				pv, err := pvs.Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				change(pv)
				_, err = pvs.Update(ctx, pv, metav1.UpdateOptions{})
				return err
			})
		}
	}
	// unfinalizeAs takes the provisioner's finalizer off the volume called
	// name as release() does, with change made to it too.
	unfinalizeAs := func(name string, change func(*corev1.PersistentVolume)) func() error {
		return updateAs(name, func(pv *corev1.PersistentVolume) {
			pv.Finalizers = slices.DeleteFunc(pv.Finalizers, func(f string) bool { return f == provisionerFinalizer })
			change(pv)
		})
	}
	reclaimDelete := func(pv *corev1.PersistentVolume) {
		pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimDelete
	}

	refused("an update of another driver's volume", updateAs(other.Name, reclaimDelete))
	refused("a delete of another driver's volume", func() error {
		return pvs.Delete(ctx, other.Name, metav1.DeleteOptions{})
	})
	refused("a converge volume bound to another claim", updateAs(conv.Name, func(pv *corev1.PersistentVolume) {
		pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: "stolen"}
	}))
	refused("a converge volume's reclaim policy", updateAs(conv.Name, reclaimDelete))
	refused("the finalizer of a converge volume not being deleted", unfinalizeAs(conv.Name, func(*corev1.PersistentVolume) {}))
	refused("a delete of another driver's claim", func() error {
		return claims.Delete(ctx, otherClaim, metav1.DeleteOptions{})
	})
	refused("a delete of a pod that uses no claim", func() error {
		return pods.Delete(ctx, noClaimPod, metav1.DeleteOptions{})
	})
	refused("a Lease of another name", func() error {
		_, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: prefix + "lease"}}, metav1.CreateOptions{})
		return err
	})

	accepted("a delete of a converge volume", func() error {
		return pvs.Delete(ctx, conv.Name, metav1.DeleteOptions{})
	})
	refused("the finalizer taken off a converge volume being deleted, and its reclaim policy changed", unfinalizeAs(conv.Name, reclaimDelete))
	refused("the finalizer taken off a converge volume being deleted, and a label added", unfinalizeAs(conv.Name, func(pv *corev1.PersistentVolume) {
		pv.Labels = map[string]string{"converge.csi.dev/test": "stolen"}
	}))
	accepted("the provisioner's finalizer taken off a converge volume being deleted", unfinalizeAs(conv.Name, func(*corev1.PersistentVolume) {}))
	accepted("a delete of a converge claim", func() error {
		return claims.Delete(ctx, convClaim, metav1.DeleteOptions{})
	})
	refused("a delete of a pod that uses a claim, with a grace of 0", func() error {
		return pods.Delete(ctx, claimPod, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	accepted("a delete of a pod that uses a claim, with its own grace", func() error {
		return pods.Delete(ctx, claimPod, metav1.DeleteOptions{})
	})
	accepted("a create of its own Lease, which exists", func() error {
		_, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: controllerName}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil // admitted; the store found it there
		}
		return err
	})
	accepted("an update of its own Lease", func() error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			l, err := leases.Get(ctx, controllerName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
			return err
		})
	})
	t.Run("accepted: the controller keeps leading", func(t *testing.T) {
		first, err := c.client.CoordinationV1().Leases(daemonSetNamespace).Get(ctx, controllerName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		poll(t, time.Minute, "the controller's Lease renewed", func() (bool, string) {
			l, err := c.client.CoordinationV1().Leases(daemonSetNamespace).Get(ctx, controllerName, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			renewed := l.Spec.RenewTime != nil && first.Spec.RenewTime != nil && l.Spec.RenewTime.After(first.Spec.RenewTime.Time)
			return renewed && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "",
				fmt.Sprintf("holder %v, renewed %v", ptr.Deref(l.Spec.HolderIdentity, ""), l.Spec.RenewTime)
		})
	})
}

// controllerPodClient is a client with the token of a converge-controller
// pod: a TokenRequest bound to the pod, as the kubelet makes it.
func controllerPodClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	running := controllerPods(t)
	if len(running) == 0 {
		t.Fatal("no converge-controller pod")
	}
	client, u := podTokenClient(t, &running[0])
	if want := "system:serviceaccount:" + daemonSetNamespace + ":" + controllerName; u.Username != want {
		t.Fatalf("the pod's token is %s, want %s", u.Username, want)
	}
	return client
}

// adminProvisionedClaim creates, as the admin, a claim called name of a
// class that does not exist, annotated as kube-control-manager annotates a
// claim that driver provisions, to be deleted when the test ends, and
// returns its name.
func adminProvisionedClaim(t *testing.T, name, driver string) string {
	t.Helper()
	return adminClaimAnnotated(t, name, map[string]string{
		"volume.kubernetes.io/storage-provisioner":      driver,
		"volume.beta.kubernetes.io/storage-provisioner": driver,
	})
}

// adminPod creates, as the admin, a pause pod called name on the node,
// using claim when it is not "" (a claim that never binds: the pod waits),
// to be deleted when the test ends, and returns its name.
func adminPod(t *testing.T, name, claim string) string {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName:   c.node,
			Containers: []corev1.Container{{Name: "c", Image: pauseImage, ImagePullPolicy: corev1.PullNever}},
		},
	}
	if claim != "" {
		pod.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}
	}
	if _, err := c.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod %s: %v", name, err)
	}
	t.Cleanup(func() {
		err := c.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting pod %s: %v", name, err)
		}
	})
	return name
}

// unfinalize takes every finalizer off the PV called name as the admin,
// so that a PV a test deleted goes.
func unfinalize(t *testing.T, name string) {
	_, err := c.client.CoreV1().PersistentVolumes().Patch(context.Background(), name, types.MergePatchType,
		[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("taking the finalizers off %s: %v", name, err)
	}
}
