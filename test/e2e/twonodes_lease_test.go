package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/test/e2e/privilege"
)

// TestTwoNodesResizerLeaseHeldByItsHolder moves csi-resizer's leadership
// to the first node and asks the API server, with the second node's
// converge token, to take the Lease from the live leader, to name the
// leader's pod for a billion seconds, or to release it: the node policy
// refuses each, as it refuses the leader a billion-second renewal. The
// leader's own renewal is accepted, and its release is followed by a
// failover: a resizer, with its own node's token, takes the Lease.
func TestTwoNodesResizerLeaseHeldByItsHolder(t *testing.T) {
	b := secondNode(t)
	ctx := context.Background()
	moveResizerLease(t, c.kubeNode)
	leader, err := c.kubeNode.driverPod(ctx)
	if err != nil || leader == nil {
		t.Fatalf("%s's converge pod: %v, %v", c.node, leader, err)
	}
	other, err := b.driverPod(ctx)
	if err != nil || other == nil {
		t.Fatalf("%s's converge pod: %v, %v", b.node, other, err)
	}
	asA, asB := driverPodClient(t, c.kubeNode), driverPodClient(t, b)
	write := func(client kubernetes.Interface, change func(*coordinationv1.Lease)) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			l, err := client.CoordinationV1().Leases(daemonSetNamespace).Get(ctx, privilege.ResizerLease, metav1.GetOptions{})
			if err != nil {
				return err
			}
			change(l)
			_, err = client.CoordinationV1().Leases(daemonSetNamespace).Update(ctx, l, metav1.UpdateOptions{})
			return err
		})
	}
	hold := func(holder string, seconds int32) func(*coordinationv1.Lease) {
		return func(l *coordinationv1.Lease) {
			now := metav1.NewMicroTime(time.Now())
			l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = ptr.To(holder), ptr.To(seconds)
			l.Spec.RenewTime = &now
			if l.Spec.AcquireTime == nil {
				l.Spec.AcquireTime = &now
			}
		}
	}
	for _, tc := range []struct {
		name   string
		client kubernetes.Interface
		change func(*coordinationv1.Lease)
	}{
		{"the second node takes the Lease from the live leader", asB, hold(other.Name, 15)},
		{"the second node names the leader's pod for a billion seconds", asB, hold(leader.Name, 1_000_000_000)},
		{"the second node releases the leader's Lease", asB, hold("", 1)},
		{"the leader renews for a billion seconds", asA, hold(leader.Name, 1_000_000_000)},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			wantRefusedBy(t, write(tc.client, tc.change), nodeVolumesPolicy)
		})
	}
	t.Run("accepted: the leader's renewal", func(t *testing.T) {
		if err := write(asA, hold(leader.Name, 15)); err != nil {
			t.Fatalf("renewing as %s: %v", leader.Name, err)
		}
	})
	t.Run("accepted: the leader's release, and a failover", func(t *testing.T) {
		restarts := int32(-1)
		if pod, err := c.kubeNode.driverPod(ctx); err == nil && pod != nil {
			for _, s := range pod.Status.ContainerStatuses {
				if s.Name == "csi-resizer" {
					restarts = s.RestartCount
				}
			}
		}
		if restarts < 0 {
			t.Fatalf("no csi-resizer in %s's converge pod", c.node)
		}
		// The leader's resizer, its Lease gone, exits and is restarted.
		intendRestart(leader, "csi-resizer")
		if err := write(asA, hold("", 1)); err != nil {
			t.Fatalf("releasing as %s: %v", leader.Name, err)
		}
		if err := c.kubeNode.waitRestarted(ctx, "csi-resizer", restarts); err != nil {
			t.Fatalf("the resizer on %s after its release: %v", c.node, err)
		}
		poll(t, time.Minute, "a resizer takes the released Lease", func() (bool, string) {
			l, err := c.client.CoordinationV1().Leases(daemonSetNamespace).Get(ctx, privilege.ResizerLease, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			h := ptr.Deref(l.Spec.HolderIdentity, "")
			return h == leader.Name || h == other.Name, fmt.Sprintf("holder %q", h)
		})
	})
}
