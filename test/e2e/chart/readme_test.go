package chart

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/strvals"
)

// readmeCommand returns the README's one shell command that starts with
// prefix (readmeCommands).
func readmeCommand(t *testing.T, prefix string) []string {
	t.Helper()
	found := readmeCommands(t, prefix)
	if len(found) != 1 {
		t.Fatalf("the README has %d commands starting %q, want one: %q", len(found), prefix, found)
	}
	return found[0]
}

// readmeCommands returns the README's shell commands that start with
// prefix as whole words (docker build, not docker buildx build), their
// continuation lines joined, their comments dropped, their placeholder
// registry made a real name.
func readmeCommands(t *testing.T, prefix string) [][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	var found [][]string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line)+" ", prefix+" ") {
			line, _, _ = strings.Cut(line, " #")
			found = append(found, strings.Fields(strings.ReplaceAll(line, "<registry>", "registry.example")))
		}
	}
	return found
}

// TestReadmeHelmInstall runs the README's helm install as the helm command
// would read it: the release, chart, namespace and values it names install
// csi-node's image as the image the README builds, into the objects the
// drift test compares with deploy/.
func TestReadmeHelmInstall(t *testing.T) {
	var args []string
	release := 0
	for _, cmd := range readmeCommands(t, "helm install") {
		if len(cmd) > 3 && strings.HasPrefix(cmd[3], ".run/release/") {
			readmeReleaseInstall(t, cmd)
			release++
			continue
		}
		if args != nil {
			t.Fatalf("the README has two helm installs of a chart not in .run/release: %q and %q", args, cmd)
		}
		args = cmd
	}
	if release != 1 || args == nil {
		t.Fatalf("the README has %d helm installs of make release's chart and %q of charts/converge, want one of each", release, args)
	}
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

// TestReadmeKubectlInstall runs the README's kubectl install as written,
// from a checkout's root, but for its kubectl apply: the kustomization it
// writes beside the checkout renders deploy/'s objects with csi-node's
// image the one the README builds, whose tag is the chart's appVersion,
// and nothing else changed; and nothing is written into the checkout.
func TestReadmeKubectlInstall(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repo, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var block string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		if strings.Contains(m[1], "kubectl apply -k") {
			if block != "" {
				t.Fatal("the README has two blocks with kubectl apply -k")
			}
			block = m[1]
		}
	}
	script, apply, ok := strings.Cut(block, "kubectl apply -k ")
	if !ok || strings.Contains(script, "kubectl") {
		t.Fatalf("the README's kubectl install is not a kustomization written, then applied:\n%s", block)
	}
	// A checkout inside a directory of the test's own, with a copy of
	// deploy/: a block that edited deploy/ edits the copy, never the
	// repository.
	beside := t.TempDir()
	checkout := filepath.Join(beside, "converge")
	if err := os.CopyFS(filepath.Join(checkout, "deploy"), os.DirFS(deploy)); err != nil {
		t.Fatal(err)
	}
	before := dirDigest(t, filepath.Join(checkout, "deploy"))
	cmd := exec.Command("sh", "-eu", "-c", strings.ReplaceAll(script, "<registry>", "registry.example"))
	cmd.Dir, cmd.Env = checkout, append(os.Environ(), "PWD="+checkout)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the README's kubectl install: %v\n%s", err, out)
	}
	if dirDigest(t, filepath.Join(checkout, "deploy")) != before {
		t.Errorf("the README's kubectl install changed deploy/ in the checkout")
	}
	dir := filepath.Join(checkout, strings.TrimSpace(apply))
	if !strings.HasPrefix(filepath.Clean(dir), beside+"/") || strings.HasPrefix(filepath.Clean(dir), checkout+"/") {
		t.Fatalf("the README applies %s, not a kustomization beside the checkout", strings.TrimSpace(apply))
	}
	got := objects(t, buildKustomization(t, dir), false)
	want := objects(t, kustomize(t, nil), false)
	built := readmeCommand(t, "docker build")
	if _, tag, _ := strings.Cut(built[3], ":"); tag != loadChart(t).Metadata.AppVersion {
		t.Errorf("the README's tag %s is not the chart's appVersion %s", tag, loadChart(t).Metadata.AppVersion)
	}
	images := 0
	for key, o := range want {
		for _, path := range [][]string{{"spec", "template", "spec", "containers"}, {"spec", "template", "spec", "initContainers"}} {
			ctrs, _ := dig(o, path...).([]any)
			for _, c := range ctrs {
				c := c.(map[string]any)
				if img, _ := c["image"].(string); strings.HasPrefix(img, "ghcr.io/converge-csi/csi-node:") {
					c["image"] = built[3]
					images++
				}
			}
		}
		if !reflect.DeepEqual(got[key], o) {
			t.Errorf("%s: the README's kustomization renders it otherwise than deploy/ with the README's image", key)
		}
	}
	if images == 0 || len(got) != len(want) {
		t.Errorf("the README's kustomization: %d objects, deploy/ %d, csi-node's image in %d containers", len(got), len(want), images)
	}
}

// dirDigest is every file's path and content under dir, in order.
func dirDigest(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		fmt.Fprintf(&b, "%s\n%s\n", p, data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
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
	// The release's sed (docs/releasing.md, step 2) takes -dev off
	// every version of the commands: none may say another.
	dev := regexp.MustCompile(`[0-9]+\.[0-9]+\.[0-9]+-dev`)
	for _, doc := range []string{"README.md", "docs/operations.md"} {
		b, err := os.ReadFile(filepath.Join(repo, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range dev.FindAllString(string(b), -1) {
			if v != ch.Version {
				t.Errorf("%s says version %s, the chart %s", doc, v, ch.Version)
			}
		}
	}
}

// sidecarNeeds is the oldest Kubernetes minor each release line of the
// kubernetes-csi sidecars that deploy/ and the chart name runs on, as its
// upstream says: the README's Compatibility table where it is right, the
// release notes' "Urgent Upgrade Notes" where a release raised it. A new
// major version of a sidecar fails TestKubeVersionFitsTheSidecars until
// its line is added here.
var sidecarNeeds = map[string]struct {
	doc  string // the sidecar's name in docs/operations.md
	kube string // the oldest Kubernetes minor it runs on
}{
	// README: Min K8s Version 1.13.
	"csi-node-driver-registrar:v2": {"node-driver-registrar", "1.13"},
	// CHANGELOG-6.0: "needs Kubernetes 1.34.0+", storage/v1
	// VolumeAttributesClass.
	"csi-provisioner:v6": {"csi-provisioner", "1.34"},
	// CHANGELOG-2.0: "needs Kubernetes 1.34.0+", storage/v1
	// VolumeAttributesClass.
	"csi-resizer:v2": {"csi-resizer", "1.34"},
	// README: Min K8s Version 1.20 (the v1 snapshot CRDs).
	"csi-snapshotter:v8": {"csi-snapshotter", "1.20"},
}

// apiNeeds is the Kubernetes minor in which each kind the chart or
// deploy/ installs became GA in the version they use; kinds of CRDs the
// cluster brings (VolumeSnapshotClass, VolumeGroupSnapshotClass,
// PodMonitor, PrometheusRule) need none. A kind not listed fails the
// test.
var apiNeeds = map[string]string{
	"v1 ConfigMap":                                    "",
	"v1 ServiceAccount":                               "",
	"apps/v1 DaemonSet":                               "1.9",
	"apps/v1 Deployment":                              "1.9",
	"rbac.authorization.k8s.io/v1 ClusterRole":        "1.8",
	"rbac.authorization.k8s.io/v1 ClusterRoleBinding": "1.8",
	"rbac.authorization.k8s.io/v1 Role":               "1.8",
	"rbac.authorization.k8s.io/v1 RoleBinding":        "1.8",
	"storage.k8s.io/v1 CSIDriver":                     "1.18",
	"storage.k8s.io/v1 StorageClass":                  "1.6",
	// The PodDisruptionBudget's unhealthyPodEvictionPolicy: GA in 1.31.
	"policy/v1 PodDisruptionBudget":                                    "1.31",
	"admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy":        "1.30",
	"admissionregistration.k8s.io/v1 ValidatingAdmissionPolicyBinding": "1.30",
	"snapshot.storage.k8s.io/v1 VolumeSnapshotClass":                   "",
	"groupsnapshot.storage.k8s.io/v1 VolumeGroupSnapshotClass":         "",
	"monitoring.coreos.com/v1 PodMonitor":                              "",
	"monitoring.coreos.com/v1 PrometheusRule":                          "",
}

// TestKubeVersionFitsTheSidecars checks that the chart's kubeVersion is
// the oldest Kubernetes that every sidecar image and every kind the chart
// and deploy/ install (every choice turned on) runs on, and that the
// README, docs/operations.md's Compatibility and deploy/README.md say that
// same version and name the sidecars' versions. A kubeVersion lower than
// the sidecars' installs on a cluster where the provisioner and resizer
// cannot work.
func TestKubeVersionFitsTheSidecars(t *testing.T) {
	all := map[string]any{"snapshots": map[string]any{"enabled": true}, "monitoring": map[string]any{"enabled": true}}
	manifest, err := render(t, all)
	if err != nil {
		t.Fatal(err)
	}
	objs := objects(t, manifest, false)
	for k, o := range objects(t, kustomize(t, []string{"snapshots", "monitoring"}), false) {
		objs["deploy/ "+k] = o
	}
	need, why := "1.0", "nothing"
	raise := func(v, what string) {
		if v != "" && minorOf(t, v) > minorOf(t, need) {
			need, why = v, what
		}
	}
	ops, err := os.ReadFile(filepath.Join(repo, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, compat, _ := strings.Cut(string(ops), "\n### Compatibility\n")
	compat, _, _ = strings.Cut(compat, "\n#")
	compat = strings.Join(strings.Fields(compat), " ")
	images := 0
	for k, o := range objs {
		gvk := fmt.Sprint(o["apiVersion"], " ", o["kind"])
		v, ok := apiNeeds[gvk]
		if !ok {
			t.Errorf("%s: no Kubernetes version known for %s; add it to apiNeeds", k, gvk)
		}
		raise(v, gvk)
		for _, img := range regexp.MustCompile(`registry\.k8s\.io/sig-storage/([a-z-]+):(v[0-9]+)([0-9.]*)`).FindAllStringSubmatch(fmt.Sprint(o), -1) {
			images++
			s, ok := sidecarNeeds[img[1]+":"+img[2]]
			if !ok {
				t.Errorf("%s runs %s:%s%s, whose Kubernetes needs are not in sidecarNeeds", k, img[1], img[2], img[3])
				continue
			}
			raise(s.kube, img[1]+":"+img[2])
			if !strings.Contains(compat, s.doc+" "+img[2]+img[3]) {
				t.Errorf("docs/operations.md's Compatibility does not name %s %s%s", s.doc, img[2], img[3])
			}
		}
	}
	if images < 8 {
		t.Fatalf("found %d sidecar images in the chart and deploy/, want at least 8 (four each)", images)
	}
	t.Logf("the oldest Kubernetes everything runs on: %s (%s)", need, why)
	if got, want := loadChart(t).Metadata.KubeVersion, ">="+need+".0-0"; got != want {
		t.Errorf("the chart's kubeVersion is %q; %s needs %q", got, why, want)
	}
	said := "Kubernetes " + need + " or later"
	for file, text := range map[string]string{"README.md": "", "docs/operations.md Compatibility": compat, "deploy/README.md": ""} {
		if text == "" {
			b, err := os.ReadFile(filepath.Join(repo, file))
			if err != nil {
				t.Fatal(err)
			}
			text = string(b)
		}
		text = strings.Join(strings.Fields(text), " ")
		if !strings.Contains(text, said) {
			t.Errorf("%s does not say %q", file, said)
		}
		for _, m := range regexp.MustCompile(`Kubernetes 1\.[0-9]+ or later`).FindAllString(text, -1) {
			if m != said {
				t.Errorf("%s says %q, want %q", file, m, said)
			}
		}
	}
}

// minorOf is the minor of a Kubernetes version 1.N.
func minorOf(t *testing.T, v string) int {
	t.Helper()
	major, minor, ok := strings.Cut(v, ".")
	n, err := strconv.Atoi(minor)
	if !ok || major != "1" || err != nil {
		t.Fatalf("Kubernetes version %q: want 1.N", v)
	}
	return n
}

// dig returns the value at path in o, nil where the path ends early.
func dig(o map[string]any, path ...string) any {
	var v any = o
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// readmeReleaseInstall checks the README's install from make release's
// files: the image archive it imports and the chart it installs are the
// names make release gives them (package dist), and the chart's own
// values, without a --set, run the image that archive holds.
func readmeReleaseInstall(t *testing.T, cmd []string) {
	t.Helper()
	ch := loadChart(t).Metadata
	if want := ".run/release/converge-" + ch.Version + ".tgz"; cmd[3] != want || len(cmd) != 6 || cmd[2] != releaseName || cmd[4] != "-n" || cmd[5] != namespace {
		t.Errorf("the README installs %q, want helm install %s %s -n %s", cmd, releaseName, want, namespace)
	}
	imports := readmeCommands(t, "ctr -n k8s.io images import")
	archive := ".run/release/csi-node_" + ch.AppVersion + "_linux_amd64.oci.tar"
	if len(imports) != 1 || len(imports[0]) != 6 || imports[0][5] != archive {
		t.Errorf("the README imports %q, want the archive make release makes, %s", imports, archive)
	}
	manifest, err := render(t, map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	if image := "ghcr.io/converge-csi/csi-node:" + ch.AppVersion; !strings.Contains(manifest, "image: "+image+"\n") {
		t.Errorf("the chart's own values do not run %s, the image make release names", image)
	}
}
