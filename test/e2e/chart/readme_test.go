package chart

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/strvals"
)

// readmeCommand returns the README's shell command that starts with
// prefix as whole words (docker build, not docker buildx build), its
// continuation lines joined, its placeholder registry made a real name.
func readmeCommand(t *testing.T, prefix string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	var found []string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line)+" ", prefix+" ") {
			found = append(found, strings.ReplaceAll(line, "<registry>", "registry.example"))
		}
	}
	if len(found) != 1 {
		t.Fatalf("the README has %d commands starting %q, want one: %q", len(found), prefix, found)
	}
	return strings.Fields(found[0])
}

// TestReadmeHelmInstall runs the README's helm install as the helm command
// would read it: the release, chart, namespace and values it names install
// csi-node's image as the image the README builds, into the objects the
// drift test compares with deploy/.
func TestReadmeHelmInstall(t *testing.T) {
	args := readmeCommand(t, "helm install")
	vals := map[string]any{}
	var rest []string
	for i := 2; i < len(args); i++ {
		switch args[i] {
		case "--set":
			i++
			if err := strvals.ParseInto(args[i], vals); err != nil {
				t.Fatalf("--set %s: %v", args[i], err)
			}
		case "-n", "--namespace":
			i++
			if args[i] != namespace {
				t.Errorf("the README installs into %s, the drift test into %s", args[i], namespace)
			}
		default:
			rest = append(rest, args[i])
		}
	}
	if len(rest) != 2 || rest[0] != releaseName || rest[1] != "charts/converge" {
		t.Fatalf("helm install %v: want release %s of charts/converge", rest, releaseName)
	}
	manifest, err := render(t, vals)
	if err != nil {
		t.Fatalf("the README's values: %v", err)
	}
	built := readmeCommand(t, "docker build")
	if !strings.Contains(manifest, "image: "+built[3]+"\n") {
		t.Errorf("the README's install does not run the image it builds, %s", built[3])
	}
}

// TestReadmeKubectlInstall checks that the README's kustomize edit names
// the image deploy/ sets, with the tag the README builds and the chart
// defaults to.
func TestReadmeKubectlInstall(t *testing.T) {
	args := readmeCommand(t, "(cd deploy && kustomize edit set image")
	from, to, ok := strings.Cut(strings.TrimSuffix(args[len(args)-1], ")"), "=")
	if !ok {
		t.Fatalf("kustomize edit set image %s", args[len(args)-1])
	}
	b, err := os.ReadFile(filepath.Join(deploy, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^  - name: ` + regexp.QuoteMeta(from) + `$`).Match(b) {
		t.Errorf("deploy/kustomization.yaml sets no image %s", from)
	}
	built := readmeCommand(t, "docker build")
	if to != built[3] {
		t.Errorf("the README builds %s and kustomizes %s", built[3], to)
	}
	if _, tag, _ := strings.Cut(to, ":"); tag != loadChart(t).Metadata.AppVersion {
		t.Errorf("the README's tag %s is not the chart's appVersion %s", tag, loadChart(t).Metadata.AppVersion)
	}
}

// TestVersionsAgree checks that one release version is said everywhere:
// the Dockerfile's default VERSION (its image's version label), the
// chart's appVersion and version, the image the README builds and the
// build argument it passes; and that the image's source label is the
// chart's home.
func TestVersionsAgree(t *testing.T) {
	ch := loadChart(t).Metadata
	b, err := os.ReadFile(filepath.Join(repo, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	dockerfile := string(b)
	args := regexp.MustCompile(`(?m)^ARG VERSION=(\S+)$`).FindAllStringSubmatch(dockerfile, -1)
	if len(args) == 0 {
		t.Fatal("the Dockerfile declares no VERSION")
	}
	for _, a := range args {
		if a[1] != ch.AppVersion {
			t.Errorf("the Dockerfile's VERSION defaults to %s, the chart's appVersion is %s", a[1], ch.AppVersion)
		}
	}
	if !strings.Contains(dockerfile, `org.opencontainers.image.version="${VERSION}"`) {
		t.Error("the image's version label is not its VERSION")
	}
	if !strings.Contains(dockerfile, `org.opencontainers.image.source="`+ch.Home+`"`) {
		t.Errorf("the image's source label is not the chart's home, %s", ch.Home)
	}
	if "v"+ch.Version != ch.AppVersion {
		t.Errorf("the chart's version %s and appVersion %s differ", ch.Version, ch.AppVersion)
	}
	built := readmeCommand(t, "docker build")
	if _, tag, _ := strings.Cut(built[3], ":"); tag != ch.AppVersion || !slices.Contains(built, "VERSION="+ch.AppVersion) {
		t.Errorf("the README builds %v; want the tag and VERSION %s", built, ch.AppVersion)
	}
}
