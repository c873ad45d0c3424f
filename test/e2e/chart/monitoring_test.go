package chart

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// monitoringKinds are the kinds of the monitoring objects: a Prometheus
// Operator selects PodMonitors and PrometheusRules by label and
// namespace, Grafana's sidecar the dashboard's ConfigMap.
var monitoringKinds = map[string]bool{"PodMonitor": true, "PrometheusRule": true, "ConfigMap": true}

// alertsOf are the names of the alerts of a PrometheusRule, each with its
// expression.
func alertsOf(o map[string]any) map[string]string {
	out := map[string]string{}
	spec, _ := o["spec"].(map[string]any)
	groups, _ := spec["groups"].([]any)
	for _, g := range groups {
		rules, _ := g.(map[string]any)["rules"].([]any)
		for _, r := range rules {
			r := r.(map[string]any)
			out[fmt.Sprint(r["alert"])] = fmt.Sprint(r["expr"])
		}
	}
	return out
}

// checkMonitoring checks the monitoring objects among objs: want of them
// (by kind), each in namespace ns with labels; the PodMonitors selecting
// pods of podNamespace (no namespaceSelector where it is their own);
// converge-controller's PodMonitor and alerts (any alert on a
// converge_controller_ metric) there exactly when controller is, and
// csi-node's always; and no selector of converge's workloads changed.
func checkMonitoring(t *testing.T, objs map[string]map[string]any, ns, podNamespace string, labels map[string]string, controller bool) {
	t.Helper()
	count := map[string]int{}
	alerts := map[string]string{}
	ctrlMonitor := false
	for k, o := range objs {
		meta := o["metadata"].(map[string]any)
		kind := fmt.Sprint(o["kind"])
		if kind == "DaemonSet" || kind == "Deployment" || kind == "PodDisruptionBudget" {
			for l := range labels {
				if strings.Contains(fmt.Sprint(o["spec"].(map[string]any)["selector"]), l+":") {
					t.Errorf("%s: the monitoring labels reached its selector %v", k, o["spec"].(map[string]any)["selector"])
				}
			}
		}
		if !monitoringKinds[kind] {
			continue
		}
		count[kind]++
		if meta["namespace"] != ns {
			t.Errorf("%s: namespace %v, want %s", k, meta["namespace"], ns)
		}
		have, _ := meta["labels"].(map[string]any)
		for l, v := range labels {
			if have[l] != v {
				t.Errorf("%s: label %s=%v, want %s", k, l, have[l], v)
			}
		}
		switch kind {
		case "PodMonitor":
			sel, ok := o["spec"].(map[string]any)["namespaceSelector"]
			want := fmt.Sprintf("map[matchNames:[%s]]", podNamespace)
			if podNamespace == ns && ok {
				t.Errorf("%s: namespaceSelector %v in the pods' own namespace", k, sel)
			}
			if podNamespace != ns && fmt.Sprint(sel) != want {
				t.Errorf("%s: namespaceSelector %v, want %s", k, sel, want)
			}
			if strings.Contains(fmt.Sprint(o["spec"]), "controller") {
				ctrlMonitor = true
			}
		case "PrometheusRule":
			for a, e := range alertsOf(o) {
				alerts[a] = e
			}
		}
	}
	wantMonitors, wantRules := 1, 1
	if controller {
		wantMonitors, wantRules = 2, 2
	}
	if count["PodMonitor"] != wantMonitors || count["PrometheusRule"] != wantRules || count["ConfigMap"] != 1 {
		t.Errorf("monitoring objects %v, want %d PodMonitors, %d PrometheusRules, one ConfigMap", count, wantMonitors, wantRules)
	}
	if ctrlMonitor != controller {
		t.Errorf("a PodMonitor of converge-controller: %v, want %v", ctrlMonitor, controller)
	}
	ctrlAlerts := 0
	for a, e := range alerts {
		if strings.Contains(e, "converge_controller_") {
			ctrlAlerts++
			if !controller {
				t.Errorf("alert %s (%s) without converge-controller", a, e)
			}
		}
	}
	if controller && ctrlAlerts < 3 {
		t.Errorf("%d alerts of converge-controller among %v, want its three", ctrlAlerts, alerts)
	}
	if _, ok := alerts["ConvergeVolumeDataLoss"]; !ok {
		t.Errorf("csi-node's alerts are missing: %v", alerts)
	}
}

// TestMonitoringFitsTheOperator checks that the monitoring objects take
// the labels and the namespace a Prometheus Operator selects on, and that
// converge-controller's alerts exist only where it is installed: in the
// chart through monitoring.labels, monitoring.namespace and
// controller.enabled; in deploy/ through the overlays deploy/README.md
// shows (kustomize's labels; the patches that delete the controller's
// monitoring), rendered as written there.
func TestMonitoringFitsTheOperator(t *testing.T) {
	release := map[string]string{"release": "kube-prometheus-stack"}
	for _, tc := range []struct {
		name       string
		vals       map[string]any
		ns         string
		labels     map[string]string
		controller bool
	}{
		{name: "defaults", vals: map[string]any{}, ns: namespace, controller: true},
		{name: "labels", vals: map[string]any{"labels": map[string]any{"release": "kube-prometheus-stack"}}, ns: namespace, labels: release, controller: true},
		{name: "labels and namespace", vals: map[string]any{"labels": map[string]any{"release": "kube-prometheus-stack"}, "namespace": "monitoring"},
			ns: "monitoring", labels: release, controller: true},
		{name: "without the controller", vals: map[string]any{"namespace": "monitoring"}, ns: "monitoring"},
	} {
		t.Run("chart, "+tc.name, func(t *testing.T) {
			tc.vals["enabled"] = true
			manifest, err := render(t, map[string]any{"monitoring": tc.vals, "controller": map[string]any{"enabled": tc.controller}})
			if err != nil {
				t.Fatal(err)
			}
			checkMonitoring(t, objects(t, manifest, false), tc.ns, namespace, tc.labels, tc.controller)
		})
	}

	overlays := readmeOverlays(t)
	t.Run("deploy/, labels", func(t *testing.T) {
		checkMonitoring(t, objects(t, buildOverlay(t, overlays[0]), false), namespace, namespace, release, true)
	})
	t.Run("deploy/, without the controller", func(t *testing.T) {
		// The overlay of the labels, with the README's patches and the
		// deletion of the controller's Deployment.
		overlay := overlays[0] + overlays[1] + `  - patch: |-
      $patch: delete
      apiVersion: apps/v1
      kind: Deployment
      metadata:
        name: converge-controller
        namespace: kube-system
`
		checkMonitoring(t, objects(t, buildOverlay(t, overlay), false), namespace, namespace, release, false)
	})
}

// readmeOverlays are the YAML blocks of deploy/README.md's Monitoring
// section: the overlay that labels the monitoring objects, then the
// patches that leave the controller's monitoring out.
func readmeOverlays(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(deploy, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Monitoring\n")
	if !ok {
		t.Fatal("deploy/README.md has no Monitoring section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var out []string
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(section, -1) {
		out = append(out, m[1])
	}
	if len(out) != 2 {
		t.Fatalf("deploy/README.md's Monitoring has %d YAML blocks, want the overlay and the controller's patches", len(out))
	}
	return out
}

// buildOverlay builds a kustomization written as beside deploy/ (naming
// it ../deploy) as kubectl apply -k would.
func buildOverlay(t *testing.T, kustomization string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "overlay")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(deploy)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, abs)
	if err != nil {
		t.Fatal(err)
	}
	kustomization = strings.ReplaceAll(kustomization, "../deploy", rel)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	return buildKustomization(t, dir)
}
