package e2e

import (
	"context"
	"fmt"
	"strings"
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
// converge token, to name the leader's pod for a billion seconds, to
// release the leader's Lease, or to hold it itself for a billion seconds:
// the node policy refuses each, as it refuses the leader a billion-second
// renewal. The leader's own renewal is accepted; and a failover, the
// second node taking the Lease as its own pod for csi-resizer's 15 s,
// works: the first node's resizer steps down, and the second node's,
// which renews with its own token, leads.
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
		{"the second node names the leader's pod for a billion seconds", asB, hold(leader.Name, 1_000_000_000)},
		{"the second node releases the leader's Lease", asB, hold("", 1)},
		{"the second node holds the Lease for a billion seconds", asB, hold(other.Name, 1_000_000_000)},
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
	t.Run("accepted: a failover to the second node", func(t *testing.T) {
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
		if err := write(asB, hold(other.Name, 15)); err != nil {
			t.Fatalf("taking the Lease as %s: %v", other.Name, err)
		}
		if err := c.kubeNode.waitRestarted(ctx, "csi-resizer", restarts); err != nil {
			t.Fatalf("the resizer on %s after losing its Lease: %v", c.node, err)
		}
		poll(t, time.Minute, "the resizer on "+b.node+" leads", func() (bool, string) {
			tail := b.containerLogTail("csi-resizer", 20)
			return strings.Contains(tail, resizerLeading), tail
		})
		// It renews with its own node's token, through the policy.
		first, err := c.client.CoordinationV1().Leases(daemonSetNamespace).Get(ctx, privilege.ResizerLease, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		poll(t, time.Minute, "the second node's resizer renews its Lease", func() (bool, string) {
			l, err := c.client.CoordinationV1().Leases(daemonSetNamespace).Get(ctx, privilege.ResizerLease, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			h := ptr.Deref(l.Spec.HolderIdentity, "")
			renewed := l.Spec.RenewTime != nil && first.Spec.RenewTime != nil && l.Spec.RenewTime.After(first.Spec.RenewTime.Time)
			return h == other.Name && renewed, fmt.Sprintf("holder %q, renewed %v", h, renewed)
		})
	})
}
