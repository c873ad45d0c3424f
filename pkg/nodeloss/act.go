package nodeloss

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
)

// Event reasons.
const (
	ReasonNodeLossPending = "NodeLossPending"
	ReasonNodeLost        = "NodeLost"
	ReasonReleaseRefused  = "ReleaseRefused"
	ReasonClaimReleased   = "ClaimReleased"
	ReasonPodDeleted      = "PodDeleted"
	ReasonVolumeReleased  = "VolumeReleased"
	// ReasonNodeBack (Normal) follows a warning of a node loss once the
	// node is back.
	ReasonNodeBack = "NodeBack"
)

// act carries out a: each action is idempotent and made against the object
// it was decided on (a UID precondition), so that an object made again
// meanwhile is never the one deleted. An object already gone is done.
func act(ctx context.Context, client kubernetes.Interface, events record.EventRecorder, a Action) error {
	warn := func(reason string, objs ...runtime.Object) {
		for _, o := range objs {
			events.Event(o, corev1.EventTypeWarning, reason, a.Why)
		}
	}
	both := []runtime.Object{a.Volume}
	if a.Claim != nil {
		both = append(both, a.Claim)
	}
	var err error
	switch a.Kind {
	case Pending:
		warn(ReasonNodeLossPending, both...)
	case Retained:
		warn(ReasonNodeLost, both...)
	case Kept:
		warn(ReasonReleaseRefused, both...)
	case DeleteClaim:
		err = client.CoreV1().PersistentVolumeClaims(a.Claim.Namespace).Delete(ctx, a.Claim.Name, deleteExactly(a.Claim.UID, nil))
		if err == nil {
			warn(ReasonClaimReleased, both...)
		}
	case DeletePod:
		// With the pod's own grace, never 0: the pod GC force-deletes the
		// pods of a Node that is gone and the terminating pods of a node
		// out of service, whose kubelets will not confirm; and a grace of
		// 0, which skips the kubelet, is what converge-controller's policy
		// refuses its token, so that a taken token cannot force pods off
		// running nodes.
		err = client.CoreV1().Pods(a.Pod.Namespace).Delete(ctx, a.Pod.Name, deleteExactly(a.Pod.UID, nil))
		if err == nil {
			warn(ReasonPodDeleted, a.Pod)
		}
	case Release:
		err = release(ctx, client, a.Volume)
		if err == nil {
			warn(ReasonVolumeReleased, a.Volume)
		}
	}
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// deleteExactly is a deletion of the object with uid and no other, in
// grace seconds (nil: the object's own).
func deleteExactly(uid types.UID, grace *int64) metav1.DeleteOptions {
	return metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}, GracePeriodSeconds: grace}
}

// release deletes pv and takes the provisioner's finalizer off it; the
// PersistentVolume protection controller takes its own off, as the volume
// is bound to nothing.
func release(ctx context.Context, client kubernetes.Interface, pv *corev1.PersistentVolume) error {
	pvs := client.CoreV1().PersistentVolumes()
	if pv.DeletionTimestamp == nil {
		if err := pvs.Delete(ctx, pv.Name, deleteExactly(pv.UID, nil)); err != nil {
			return err
		}
	}
	cur, err := pvs.Get(ctx, pv.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && cur.UID != pv.UID) {
		return nil // gone already
	}
	if err != nil {
		return err
	}
	if !slices.Contains(cur.Finalizers, ProvisionerFinalizer) {
		return nil
	}
	// Every copy, as converge-controller's admission policy allows.
	cur.Finalizers = slices.DeleteFunc(cur.Finalizers, func(f string) bool { return f == ProvisionerFinalizer })
	_, err = pvs.Update(ctx, cur, metav1.UpdateOptions{})
	return err
}
