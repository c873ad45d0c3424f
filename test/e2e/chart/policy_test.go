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
// admission policies must hold the node DaemonSet's and the Deployment's
// own service accounts (their names are the release's), and none the node
// agent's, which writes nothing but events (SECURITY.md); each binding
// must name its policy, and nodeVolumesPolicy.enabled=false must leave
// them out; the alert on the node policy's refusals must name it.
func TestNodeVolumesPolicyHoldsTheReleasesAccount(t *testing.T) {
	objs := objects(t, renderAs(t, "other", "storage", nil), false)
	var accounts, agents, policies []string
	conditions := map[string]string{} // policy: its match conditions
	bound := map[string]bool{}
	for _, o := range objs {
		spec, _ := o["spec"].(map[string]any)
		name, _ := o["metadata"].(map[string]any)["name"].(string)
		switch o["kind"] {
		case "DaemonSet", "Deployment":
			sa, _ := spec["template"].(map[string]any)["spec"].(map[string]any)["serviceAccountName"].(string)
			if strings.HasSuffix(name, "-node-agent") {
				agents = append(agents, sa)
				continue
			}
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
	if !slices.Equal(agents, []string{"other-converge-node-agent"}) {
		t.Errorf("got the node agent's service accounts %q, want [other-converge-node-agent]", agents)
	}
	for _, sa := range agents {
		for policy, condition := range conditions {
			if strings.Contains(condition, sa) {
				t.Errorf("policy %q holds the node agent's account %s, which writes only events: %s", policy, sa, condition)
			}
		}
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

// TestControllerPlacement renders converge-controller's placement: by
// default, and from values without trustedNodeLabel (a release upgraded
// with --reuse-values, whose values lack what the new chart adds), on the
// control plane's role, tolerating its taints with the tolerations given;
// on another label, without them; with "", anywhere.
func TestControllerPlacement(t *testing.T) {
	const role = "node-role.kubernetes.io/control-plane"
	extra := []any{map[string]any{"key": "dedicated", "operator": "Exists"}}
	for _, tc := range []struct {
		name        string
		controller  map[string]any
		key         string   // the required affinity's key, "" none
		tolerations []string // the keys tolerated
	}{
		{"default", nil, role, []string{role, "node-role.kubernetes.io/master"}},
		{"no trustedNodeLabel, as --reuse-values gives", map[string]any{"trustedNodeLabel": nil}, role, []string{role, "node-role.kubernetes.io/master"}},
		{"default, with a toleration of its own", map[string]any{"tolerations": extra}, role, []string{role, "node-role.kubernetes.io/master", "dedicated"}},
		{"an admin's label", map[string]any{"trustedNodeLabel": "node-restriction.kubernetes.io/converge-controller", "tolerations": extra},
			"node-restriction.kubernetes.io/converge-controller", []string{"dedicated"}},
		{"anywhere", map[string]any{"trustedNodeLabel": ""}, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var vals map[string]any
			if tc.controller != nil {
				vals = map[string]any{"controller": tc.controller}
			}
			var spec map[string]any
			for _, o := range objects(t, renderAs(t, "converge", "kube-system", vals), true) {
				if o["kind"] == "Deployment" {
					spec = o["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
				}
			}
			if spec == nil {
				t.Fatal("no Deployment rendered")
			}
			var key string
			affinity, _ := spec["affinity"].(map[string]any)
			if na, ok := affinity["nodeAffinity"].(map[string]any); ok {
				terms := na["requiredDuringSchedulingIgnoredDuringExecution"].(map[string]any)["nodeSelectorTerms"].([]any)
				e := terms[0].(map[string]any)["matchExpressions"].([]any)[0].(map[string]any)
				key, _ = e["key"].(string)
				if len(terms) != 1 || e["operator"] != "Exists" {
					t.Errorf("node affinity %v, want one term, key Exists", na)
				}
			}
			if key != tc.key {
				t.Errorf("required node affinity on %q, want %q", key, tc.key)
			}
			var tolerated []string
			tols, _ := spec["tolerations"].([]any)
			for _, tol := range tols {
				tolerated = append(tolerated, tol.(map[string]any)["key"].(string))
			}
			if !slices.Equal(tolerated, tc.tolerations) {
				t.Errorf("tolerations of %q, want %q", tolerated, tc.tolerations)
			}
		})
	}
}
