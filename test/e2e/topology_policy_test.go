package e2e

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/converge-csi/converge/pkg/contract"
)

// topologyPolicy is deploy/components/node-volumes' policy that holds a
// Node's converge topology label to the Node's own name.
const topologyPolicy = "converge-node-topology"

// TestNodeTopologyLabelIsItsOwnName labels the node, with its kubelet's
// own credentials (which NodeRestriction lets set any label of its Node
// outside kubernetes.io and k8s.io), as another node: the scheduler would
// then place there the pods of that node's volumes. The policy refuses it
// to the kubelet, in a patch of the Node and of its status, and to the
// admin; the label naming the node itself is accepted, and stays.
func TestNodeTopologyLabelIsItsOwnName(t *testing.T) {
	ctx := context.Background()
	kubelet := kubeletClient(t, c.kubeNode)
	label := func(value string) []byte {
		return []byte(`{"metadata":{"labels":{"` + contract.TopologyKey + `":"` + value + `"}}}`)
	}
	for _, tc := range []struct {
		name        string
		client      kubernetes.Interface
		subresource []string
	}{
		{"the kubelet, of its Node", kubelet, nil},
		{"the kubelet, of its Node's status", kubelet, []string{"status"}},
		{"the admin", c.client, nil},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			_, err := tc.client.CoreV1().Nodes().Patch(ctx, c.node, types.StrategicMergePatchType,
				label("elsewhere"), metav1.PatchOptions{}, tc.subresource...)
			wantRefusedBy(t, err, topologyPolicy)
		})
	}
	t.Run("accepted: the kubelet's label of its own name", func(t *testing.T) {
		if _, err := kubelet.CoreV1().Nodes().Patch(ctx, c.node, types.StrategicMergePatchType,
			label(c.node), metav1.PatchOptions{}); err != nil {
			t.Fatalf("labelling %s as itself: %v", c.node, err)
		}
	})
	node, err := c.client.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := node.Labels[contract.TopologyKey]; got != c.node {
		t.Errorf("%s's label %s after the refusals: %q, want its name", c.node, contract.TopologyKey, got)
	}
}

// wantRefusedBy fails unless err is the refusal of the named
// ValidatingAdmissionPolicy (not of RBAC, nor any other error).
func wantRefusedBy(t *testing.T, err error, policy string) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted, want the policy %s to refuse it", policy)
	}
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'") {
		t.Fatalf("got %v, want the policy %s's refusal", err, policy)
	}
	t.Logf("refused: %v", err)
}

// TestControllerRunsWhereKubeletsCannotDrawIt checks deploy/'s placement
// of converge-controller: its pods run on the node with the control
// plane's role alone, and a kubelet cannot give its own Node that role
// (NodeRestriction), so a node that is taken cannot draw the controller's
// token to it.
func TestControllerRunsWhereKubeletsCannotDrawIt(t *testing.T) {
	ctx := context.Background()
	pods, err := c.client.CoreV1().Pods(daemonSetNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + controllerName})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) == 0 {
		t.Fatalf("no pod of %s", controllerName)
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" && p.Spec.NodeName != c.node {
			t.Errorf("%s runs on %s, want only %s, the node with the role %s", p.Name, p.Spec.NodeName, c.node, controlPlaneRole)
		}
		// Where it runs now could be chance: the pod must require the role.
		var terms []corev1.NodeSelectorTerm
		if a := p.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
			terms = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		}
		if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 || terms[0].MatchExpressions[0].Key != controlPlaneRole ||
			terms[0].MatchExpressions[0].Operator != corev1.NodeSelectorOpExists {
			t.Errorf("%s's required node affinity %+v, want the one term %s Exists", p.Name, terms, controlPlaneRole)
		}
	}
	_, err = kubeletClient(t, c.kubeNode).CoreV1().Nodes().Patch(ctx, c.node, types.StrategicMergePatchType,
		[]byte(`{"metadata":{"labels":{"`+controlPlaneRole+`":"taken"}}}`), metav1.PatchOptions{})
	if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "is not allowed to modify labels") {
		t.Fatalf("the kubelet's label %s on its own Node: got %v, want NodeRestriction's refusal", controlPlaneRole, err)
	}
	t.Logf("refused: %v", err)
}

// kubeletClient is a client with node n's kubelet's own credentials.
func kubeletClient(t *testing.T, n *kubeNode) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", c.pki.path(n.identity+".kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client
}
