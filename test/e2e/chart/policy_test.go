package chart

import (
	"slices"
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
// admission policies must hold the DaemonSet's and the Deployment's own
// service accounts (their names are the release's), each binding must
// name its policy, and nodeVolumesPolicy.enabled=false must leave them
// out; the alert on the node policy's refusals must name it.
func TestNodeVolumesPolicyHoldsTheReleasesAccount(t *testing.T) {
	objs := objects(t, renderAs(t, "other", "storage", nil), false)
	var accounts, policies []string
	conditions := map[string]string{} // policy: its match conditions
	bound := map[string]bool{}
	for _, o := range objs {
		spec, _ := o["spec"].(map[string]any)
		name, _ := o["metadata"].(map[string]any)["name"].(string)
		switch o["kind"] {
		case "DaemonSet", "Deployment":
			sa, _ := spec["template"].(map[string]any)["spec"].(map[string]any)["serviceAccountName"].(string)
			accounts = append(accounts, sa)
		case "ValidatingAdmissionPolicy":
			policies = append(policies, name)
			matches, _ := spec["matchConditions"].([]any) // the topology policy holds every writer
			for _, c := range matches {
				conditions[name] += c.(map[string]any)["expression"].(string)
			}
		case "ValidatingAdmissionPolicyBinding":
			policy, _ := spec["policyName"].(string)
			bound[policy] = true
		}
	}
	if len(accounts) != 2 || len(conditions) < 2 {
		t.Fatalf("got service accounts %q and policies %v, want two accounts and a policy for each", accounts, conditions)
	}
	for _, sa := range accounts {
		held := false
		for policy, condition := range conditions {
			if strings.Contains(condition, "endsWith(':"+sa+"')") && strings.Contains(condition, "startsWith('system:serviceaccount:')") {
				held = true
				if !bound[policy] {
					t.Errorf("no binding names policy %q, which holds %s", policy, sa)
				}
			}
		}
		if !held {
			t.Errorf("no policy's match conditions (%v) hold the service account %s", conditions, sa)
		}
	}
	for _, p := range policies {
		if !bound[p] {
			t.Errorf("no binding names policy %q", p)
		}
	}
	if !slices.Contains(policies, "other-converge-node-topology") {
		t.Errorf("policies %q, want other-converge-node-topology among them", policies)
	}
	// The alert on the node policy's refusals counts this release's policy.
	var policy string
	for p := range conditions {
		if strings.HasSuffix(p, "-node-own-volumes") {
			policy = p
		}
	}
	monitored := objects(t, renderAs(t, "other", "storage", map[string]any{"monitoring": map[string]any{"enabled": true}}), false)
	var expr string
	for _, o := range monitored {
		if o["kind"] == "PrometheusRule" {
			if e, ok := alertsOf(o)["ConvergeNodeWriteRefused"]; ok {
				expr = e
			}
		}
	}
	release := strings.TrimSuffix(policy, "-node-own-volumes")
	if want := `policy=~"` + policy + "|" + release + "-node-snapshots|" + release + `-node-topology"`; !strings.Contains(expr, want) || strings.Contains(expr, `"converge-node-own-volumes`) {
		t.Errorf("ConvergeNodeWriteRefused's expression %q, want it on %s only", expr, want)
	}

	off := renderAs(t, "other", "storage", map[string]any{"nodeVolumesPolicy": map[string]any{"enabled": false}})
	for k := range objects(t, off, false) {
		if strings.HasPrefix(k, "ValidatingAdmissionPolicy") {
			t.Errorf("nodeVolumesPolicy.enabled=false rendered %s", k)
		}
	}
}
