package chart

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	kubefake "helm.sh/helm/v4/pkg/kube/fake"
	release "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	"helm.sh/helm/v4/pkg/strvals"
)

// docsCommand returns docs/operations.md's shell command that starts with
// prefix, its continuation lines joined, its placeholders made values.
func docsCommand(t *testing.T, prefix string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	var found []string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), prefix) {
			found = append(found, strings.ReplaceAll(line, "<new>", "v0.2.0"))
		}
	}
	if len(found) != 1 {
		t.Fatalf("docs/operations.md has %d commands starting %q, want one: %q", len(found), prefix, found)
	}
	return strings.Fields(found[0])
}

// TestUpgradeRollsOutNewDefaults runs, through the Helm SDK, the upgrade
// that docs/operations.md documents, from a release installed with a
// user's values by a chart whose registrar image default is older, to
// the chart of today: the user's values stay (csi-node's repository and
// log level), the new tag it sets is taken, and the chart's new default
// (the registrar's image) rolls out. --reuse-values, which the docs used
// to show, keeps the old chart's default instead, and an upgrade with
// --set alone loses the user's values: the test shows both, the reasons
// the docs name the command they do.
func TestUpgradeRollsOutNewDefaults(t *testing.T) {
	const oldRegistrar = "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.16.0"
	newRegistrar := loadChart(t).Values["sidecars"].(map[string]any)["registrar"].(map[string]any)["image"].(string)
	if newRegistrar == oldRegistrar {
		t.Fatalf("the chart's registrar is %s already", oldRegistrar)
	}
	userValues := map[string]any{"csiNode": map[string]any{"image": map[string]any{"repository": "registry.example/csi-node"}, "logLevel": 4}}

	documented := docsCommand(t, "helm upgrade")
	for _, tc := range []struct {
		name                 string
		args                 []string
		wantUser, wantNewDef bool
	}{
		{name: "the docs' command", args: documented, wantUser: true, wantNewDef: true},
		{name: "--reuse-values", args: []string{"helm", "upgrade", "converge", "charts/converge", "-n", "kube-system", "--reuse-values", "--set", "csiNode.image.tag=v0.2.0"}, wantUser: true},
		{name: "--set alone", args: []string{"helm", "upgrade", "converge", "charts/converge", "-n", "kube-system", "--set", "csiNode.image.tag=v0.2.0"}, wantNewDef: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := memoryConfig(t)
			old := loadChart(t)
			old.Values["sidecars"].(map[string]any)["registrar"].(map[string]any)["image"] = oldRegistrar
			install := action.NewInstall(cfg)
			install.ReleaseName, install.Namespace = releaseName, namespace
			if _, err := install.Run(old, userValues); err != nil {
				t.Fatalf("installing the old chart: %v", err)
			}

			upgrade := action.NewUpgrade(cfg)
			vals := map[string]any{}
			var rest []string
			for i := 2; i < len(tc.args); i++ {
				switch a := tc.args[i]; a {
				case "--set":
					i++
					if err := strvals.ParseInto(tc.args[i], vals); err != nil {
						t.Fatalf("--set %s: %v", tc.args[i], err)
					}
				case "-n", "--namespace":
					i++
					upgrade.Namespace = tc.args[i]
				case "--reuse-values":
					upgrade.ReuseValues = true
				case "--reset-then-reuse-values":
					upgrade.ResetThenReuseValues = true
				default:
					if strings.HasPrefix(a, "-") {
						t.Fatalf("%v: the test does not know %s", tc.args, a)
					}
					rest = append(rest, a)
				}
			}
			if len(rest) != 2 || rest[0] != releaseName || rest[1] != "charts/converge" || upgrade.Namespace != namespace {
				t.Fatalf("%v: want release %s of charts/converge in %s", tc.args, releaseName, namespace)
			}
			ch, err := loader.Load(chartDir)
			if err != nil {
				t.Fatal(err)
			}
			rel, err := upgrade.Run(releaseName, ch, vals)
			if err != nil {
				t.Fatalf("%v: %v", tc.args, err)
			}
			manifest := rel.(*release.Release).Manifest
			user := strings.Contains(manifest, "image: registry.example/csi-node:v0.2.0\n") && strings.Contains(manifest, "- -v=4\n")
			newDef := strings.Contains(manifest, "image: "+newRegistrar+"\n")
			oldDef := strings.Contains(manifest, "image: "+oldRegistrar+"\n")
			if user != tc.wantUser {
				t.Errorf("%v: the user's csi-node repository and log level with the new tag: %v, want %v", tc.args, user, tc.wantUser)
			}
			if newDef != tc.wantNewDef || oldDef == tc.wantNewDef {
				t.Errorf("%v: the registrar of the new chart %v, of the old %v; want the new one %v", tc.args, newDef, oldDef, tc.wantNewDef)
			}
		})
	}
}

// memoryConfig is a Helm SDK configuration whose releases live in memory
// and whose cluster is the e2e suite's Kubernetes, doing nothing.
func memoryConfig(t *testing.T) *action.Configuration {
	t.Helper()
	v, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	caps := *common.DefaultCapabilities
	caps.KubeVersion = *v
	return &action.Configuration{
		Releases:     storage.Init(driver.NewMemory()),
		KubeClient:   &kubefake.PrintingKubeClient{Out: io.Discard},
		Capabilities: &caps,
	}
}
