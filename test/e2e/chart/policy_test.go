package chart

import (
	"strings"
	"testing"
)

// renderAs renders the chart as helm template does for release name in
// namespace ns, with vals over its defaults.
func renderAs(t *testing.T, name, ns string, vals map[string]any) string {
	t.Helper()
	out, err := renderRelease(t, name, ns, vals)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestNodeVolumesPolicyHoldsTheReleasesAccount renders the chart as a
// release not called converge, in a namespace not kube-system: the
// admission policy must hold the DaemonSet's own service account (its
// name is the release's), its binding must name it, and
// nodeVolumesPolicy.enabled=false must leave both out; the alert on its
// refusals must name it.
func TestNodeVolumesPolicyHoldsTheReleasesAccount(t *testing.T) {
	objs := objects(t, renderAs(t, "other", "storage", nil), false)
	var sa, condition, policy, bound string
	for _, o := range objs {
		spec, _ := o["spec"].(map[string]any)
		name, _ := o["metadata"].(map[string]any)["name"].(string)
		switch o["kind"] {
		case "DaemonSet":
			sa, _ = spec["template"].(map[string]any)["spec"].(map[string]any)["serviceAccountName"].(string)
		case "ValidatingAdmissionPolicy":
			policy = name
			for _, c := range spec["matchConditions"].([]any) {
				condition += c.(map[string]any)["expression"].(string)
			}
		case "ValidatingAdmissionPolicyBinding":
			bound, _ = spec["policyName"].(string)
		}
	}
	if sa == "" || policy == "" {
		t.Fatalf("got service account %q and policy %q, want both rendered", sa, policy)
	}
	if !strings.Contains(condition, "endsWith(':"+sa+"')") || !strings.Contains(condition, "startsWith('system:serviceaccount:')") {
		t.Errorf("the policy's match conditions %q do not hold the DaemonSet's service account %s", condition, sa)
	}
	if bound != policy {
		t.Errorf("the binding names policy %q, want %q", bound, policy)
	}
	// The alert on the policy's refusals counts this release's policy.
	monitored := objects(t, renderAs(t, "other", "storage", map[string]any{"monitoring": map[string]any{"enabled": true}}), false)
	var expr string
	for _, o := range monitored {
		if o["kind"] == "PrometheusRule" {
			if e, ok := alertsOf(o)["ConvergeNodeWriteRefused"]; ok {
				expr = e
			}
		}
	}
	if want := `policy="` + policy + `"`; !strings.Contains(expr, want) || strings.Contains(expr, `policy="converge-node-own-volumes"`) {
		t.Errorf("ConvergeNodeWriteRefused's expression %q, want it on %s only", expr, want)
	}

	off := renderAs(t, "other", "storage", map[string]any{"nodeVolumesPolicy": map[string]any{"enabled": false}})
	for k := range objects(t, off, false) {
		if strings.HasPrefix(k, "ValidatingAdmissionPolicy") {
			t.Errorf("nodeVolumesPolicy.enabled=false rendered %s", k)
		}
	}
}
