// Package monitoring checks what deploy/components/monitoring installs:
// the alerts with promtool (their syntax and their unit tests,
// rules_test.yaml), each alert's runbook in docs/operations.md, and that
// every query of the alerts and of the Grafana dashboard names a metric
// that csi-node or converge-controller exports, as a live /metrics shows.
package monitoring

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"sigs.k8s.io/yaml"

	"github.com/converge-csi/converge/pkg/metrics"
	"github.com/converge-csi/converge/pkg/volstatus"
	"github.com/converge-csi/converge/test/testenv"
	"github.com/converge-csi/converge/test/testenv/poll"
)

const component = "../../deploy/components/monitoring"

// componentFile is the component's one file of objects, generated from
// the chart's templates/monitoring.yaml (make manifests).
const componentFile = "monitoring.yaml"

// componentDocs returns the documents of componentFile that are objects
// of kind.
func componentDocs(t *testing.T, kind string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(component, componentFile))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var o struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("%s: %v", componentFile, err)
		}
		if o.Kind == kind {
			out = append(out, doc)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s holds no %s", componentFile, kind)
	}
	return out
}

// ruleFile is the groups of the PrometheusRules (csi-node's and
// converge-controller's), as promtool reads a rule file.
func ruleFile(t *testing.T) (groups []byte, alerts []alert) {
	t.Helper()
	// The groups as they are, every field kept (not through the struct).
	var all []any
	names := map[string]bool{}
	for _, doc := range componentDocs(t, "PrometheusRule") {
		var rule struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec struct {
				Groups []struct {
					Name  string  `json:"name"`
					Rules []alert `json:"rules"`
				} `json:"groups"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &rule); err != nil || rule.Kind != "PrometheusRule" {
			t.Fatalf("%s: %v (kind %q)", componentFile, err, rule.Kind)
		}
		names[rule.Metadata.Name] = true
		for _, g := range rule.Spec.Groups {
			alerts = append(alerts, g.Rules...)
		}
		var whole struct {
			Spec struct {
				Groups []any `json:"groups"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &whole); err != nil {
			t.Fatal(err)
		}
		all = append(all, whole.Spec.Groups...)
	}
	if !names["converge"] || !names["converge-controller"] || len(names) != 2 {
		t.Fatalf("%s holds the PrometheusRules %v, want converge and converge-controller", componentFile, names)
	}
	groups, err := yaml.Marshal(map[string]any{"groups": all})
	if err != nil {
		t.Fatal(err)
	}
	return groups, alerts
}

type alert struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// promtool is the path of promtool (hack/prometheus.sh).
func promtool(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("../../hack/prometheus.sh").Output()
	if err != nil {
		t.Fatalf("hack/prometheus.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// TestAlertRules checks the alerts with promtool, runs their unit tests,
// and checks that each has a severity, a unit test, and a runbook: a
// section of docs/operations.md its runbook_url points to.
func TestAlertRules(t *testing.T) {
	groups, alerts := ruleFile(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), groups, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("rules_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	tool := promtool(t)
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "rules_test.yaml"}} {
		cmd := exec.Command(tool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		} else {
			t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
		}
	}
	ops, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range alerts {
		if !slices.Contains([]string{"critical", "warning"}, a.Labels["severity"]) {
			t.Errorf("%s: severity %q", a.Alert, a.Labels["severity"])
		}
		if !bytes.Contains(tests, []byte("alertname: "+a.Alert+"\n")) {
			t.Errorf("%s has no unit test in rules_test.yaml", a.Alert)
		}
		anchor := strings.ToLower(a.Alert)
		if a.Annotations["runbook_url"] != "https://github.com/converge-csi/converge/blob/main/docs/operations.md#"+anchor {
			t.Errorf("%s: runbook_url %q", a.Alert, a.Annotations["runbook_url"])
		}
		if !bytes.Contains(ops, []byte("\n### "+a.Alert+"\n")) {
			t.Errorf("%s: docs/operations.md has no section ### %s (its runbook)", a.Alert, a.Alert)
		}
	}
}

// metricName finds the converge metrics a query names.
var metricName = regexp.MustCompile(`\bconverge_[a-z_]+\b`)

// dashboardQueries returns every query of the Grafana dashboard, and of
// its variables.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	// The dashboard as the component installs it: the chart's
	// files/converge.json in the ConfigMap converge-dashboard.
	var cm struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal([]byte(componentDocs(t, "ConfigMap")[0]), &cm); err != nil {
		t.Fatal(err)
	}
	b := []byte(cm.Data["converge.json"])
	if cm.Metadata.Name != "converge-dashboard" || len(b) == 0 {
		t.Fatalf("the ConfigMap %s holds no converge.json", cm.Metadata.Name)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("converge.json: %v", err)
	}
	var out []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			out = append(out, q.Expr)
		}
	}
	for _, v := range d.Templating.List {
		out = append(out, v.Definition)
	}
	return out
}

// onlyWhileSomethingIsWrong are the metrics whose series exist only while
// a volume is abnormal or a restore runs, once a repair was made, or for
// a volume whose class asks for IO limits: a healthy plugin's /metrics
// with a plain volume lacks them, and the plugin's registry is asked
// instead.
var onlyWhileSomethingIsWrong = []string{"converge_volume_conditions", "converge_restore_copied_bytes", "converge_repairs_total",
	"converge_volume_io_limit", "converge_volume_io_limit_applied"}

// TestQueriesNameExportedMetrics checks that every metric the dashboard
// and the alerts name is one that a live csi-node (with a volume staged,
// published and snapshotted) or a live converge-controller serves.
func TestQueriesNameExportedMetrics(t *testing.T) {
	served := map[string]bool{}
	for _, m := range liveNodeMetrics(t) {
		served[m] = true
	}
	for _, m := range liveControllerMetrics(t) {
		served[m] = true
	}
	described := registryMetrics(t)
	for _, m := range onlyWhileSomethingIsWrong {
		if !described[m] {
			t.Errorf("%s: csi-node's registry does not describe it", m)
		}
		served[m] = true
	}
	_, alerts := ruleFile(t)
	queries := map[string][]string{"the dashboard": dashboardQueries(t)}
	for _, a := range alerts {
		queries["alert "+a.Alert] = append(queries["alert "+a.Alert], a.Expr)
	}
	named := 0
	for where, qs := range queries {
		for _, q := range qs {
			for _, m := range metricName.FindAllString(q, -1) {
				named++
				if !served[m] {
					t.Errorf("%s names %s, which neither csi-node nor converge-controller serves: %s", where, m, q)
				}
			}
		}
	}
	if named < 30 {
		t.Errorf("the queries name %d metrics: too few to believe the parsing", named)
	}
}

// liveNodeMetrics runs csi-node with a volume staged, published and
// snapshotted, and returns the metric names its /metrics serves (a
// histogram's by its name, as its _bucket, _sum and _count lines too).
func liveNodeMetrics(t *testing.T) []string {
	t.Helper()
	p := testenv.New(t)
	p.Start()
	ctx := t.Context()
	resp, err := p.Controller().CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "mon", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{rwo}})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	staging := filepath.Join(p.Root, "staging")
	target := filepath.Join(p.Root, "pod", "mount")
	for _, d := range []string{staging, filepath.Dir(target)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Node().NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Node().NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	snap, err := p.Controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "mon-snap", SourceVolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	_, text := p.StatusGet("/metrics")
	// t.Context is cancelled before the clean-ups run.
	t.Cleanup(func() {
		ctx := context.Background()
		p.Controller().DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()})
		p.Node().NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		p.Node().NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	})
	return scrapedNames(text)
}

var rwo = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// liveControllerMetrics runs converge-controller against an API server
// that is not there (it serves its metrics while it tries to elect) and
// returns the metric names its /metrics serves.
func liveControllerMetrics(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "converge-controller")
	build := exec.Command("go", "build", "-o", bin, "./cmd/converge-controller")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building converge-controller: %v\n%s", err, out)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
users: [{name: none, user: {token: none}}]
current-context: none
`), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "--kubeconfig="+kubeconfig, "--http-address="+addr)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var names []string
	err = poll.Wait(context.Background(), 20*time.Second, 50*time.Millisecond, func() error {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		names = scrapedNames(string(b))
		return nil
	})
	if err != nil {
		t.Fatalf("converge-controller's /metrics: %v\n%s", err, log.String())
	}
	return names
}

// scrapedNames returns the metric names of a text exposition, each
// histogram's and summary's under its family's name too.
func scrapedNames(text string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "# TYPE ") {
			out = append(out, strings.Fields(line)[2])
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		out = append(out, name)
	}
	return out
}

// registryMetrics returns the names csi-node's metrics have once a
// volume is abnormal, a restore runs and a repair was made.
func registryMetrics(t *testing.T) map[string]bool {
	t.Helper()
	m := metrics.New()
	m.WatchPools(func() []volstatus.PoolStatus {
		return []volstatus.PoolStatus{{Name: "default", Restores: []volstatus.Restore{{VolumeID: "v", SnapshotID: "s"}}}}
	})
	limits := &volstatus.IOLimits{ReadIOPS: 100}
	m.PassDone(time.Millisecond, []volstatus.VolumeStatus{{ID: "v", Phase: volstatus.PhaseDegraded, Reason: "SpaceRanOut",
		PublishesDesired: 1, IOLimitsDesired: limits, IOLimitsApplied: limits}}, 0)
	m.Repaired("keep device")
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, f := range families {
		out[f.GetName()] = true
	}
	return out
}
