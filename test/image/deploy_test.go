package image

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestOperationsMatchesDeploy checks the "Install" section of
// docs/operations.md against deploy/: every image with its tag, every
// csi-node argument, and the CSIDriver and StorageClass settings it
// describes must be the ones the manifests hold, so the section cannot
// drift from what kubectl apply -k deploy/ installs.
func TestOperationsMatchesDeploy(t *testing.T) {
	section := docSection(t, "../../docs/operations.md", "## Install")
	daemonset := readFile(t, "../../deploy/daemonset.yaml")
	var want []string
	for _, m := range regexp.MustCompile(`(?m)^\s+image: (\S+:\S+)$`).FindAllStringSubmatch(daemonset, -1) {
		// csi-node's own tag is the chart's appVersion, which
		// deploy/kustomization.yaml's images: sets (test/e2e/chart checks
		// the two agree); the sidecars' are pinned here alone.
		if !strings.HasPrefix(m[1], "ghcr.io/converge-csi/csi-node:") {
			want = append(want, m[1])
		}
	}
	if len(want) < 3 {
		t.Fatalf("found %d pinned images in daemonset.yaml, want the three sidecars", len(want))
	}
	// The csi-node container's arguments, up to the next container.
	csiNode := daemonset[strings.Index(daemonset, "- name: csi-node"):strings.Index(daemonset, "- name: node-driver-registrar")]
	for _, m := range regexp.MustCompile(`(?m)^\s+- (--?[a-z-]+=\S+)$`).FindAllStringSubmatch(csiNode, -1) {
		want = append(want, m[1])
	}
	for _, m := range regexp.MustCompile(`(?m)^\s+(cpu|memory): (\S+)$`).FindAllStringSubmatch(csiNode, -1) {
		want = append(want, m[2])
	}
	for _, f := range []string{"csidriver.yaml", "storageclass.yaml"} {
		for _, m := range regexp.MustCompile(`(?m)^\s*([a-zA-Z0-9./-]+: [A-Za-z0-9]+)$`).FindAllStringSubmatch(readFile(t, "../../deploy/"+f), -1) {
			if !strings.HasPrefix(m[1], "apiVersion:") && !strings.HasPrefix(m[1], "kind:") && !strings.HasPrefix(m[1], "name:") && !strings.HasPrefix(m[1], "provisioner:") && !strings.HasPrefix(m[1], "app.kubernetes.io/") {
				want = append(want, m[1])
			}
		}
	}
	for _, w := range want {
		if !strings.Contains(section, w) {
			t.Errorf("deploy/ has %q; the Install section of docs/operations.md does not say it", w)
		}
	}
	t.Logf("%d settings of deploy/ checked: %s", len(want), strings.Join(want, ", "))
}

// docSection returns the section of the document at path under heading,
// up to the next heading of the same level.
func docSection(t *testing.T, path, heading string) string {
	t.Helper()
	doc := readFile(t, path)
	i := strings.Index(doc, heading+"\n")
	if i < 0 {
		t.Fatalf("%s has no %q section", path, heading)
	}
	rest := doc[i+len(heading):]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
