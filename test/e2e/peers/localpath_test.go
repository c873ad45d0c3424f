package peers

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// localPathDir holds the module that pins the release and its manifest.
var localPathDir = filepath.Join("..", "localpath")

func readManifest(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(localPathDir, "local-path-storage.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// configMapData is the data of the manifest's document of kind ConfigMap
// named local-path-config, and that document's index.
func configMapData(t *testing.T, docs []string) (map[string]string, int) {
	t.Helper()
	for i, d := range docs {
		var cm struct {
			Kind     string
			Metadata struct{ Name string }
			Data     map[string]string
		}
		if err := yaml.Unmarshal([]byte(d), &cm); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		if cm.Kind == "ConfigMap" && cm.Metadata.Name == "local-path-config" {
			return cm.Data, i
		}
	}
	t.Fatal("no ConfigMap local-path-config")
	return nil, 0
}

// The run's manifest is the release's but for the node path of its
// config.json, which names the run's own directory.
func TestLocalPath(t *testing.T) {
	upstream := readManifest(t)
	const path = "/tmp/converge-e2e-1234/local-path"
	got, err := LocalPath(upstream, path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(got.Manifest), "/opt/local-path-provisioner") {
		t.Errorf("the manifest still names the release's node path /opt/local-path-provisioner:\n%s", got.Manifest)
	}
	docs, upDocs := strings.Split(string(got.Manifest), "\n---\n"), strings.Split(string(upstream), "\n---\n")
	if len(docs) != len(upDocs) {
		t.Fatalf("got %d documents, want the release's %d", len(docs), len(upDocs))
	}
	data, at := configMapData(t, docs)
	upData, _ := configMapData(t, upDocs)
	for i := range docs {
		if i != at && docs[i] != upDocs[i] {
			t.Errorf("document %d changed:\n%s\nwant the release's:\n%s", i, docs[i], upDocs[i])
		}
	}
	for k, v := range upData {
		if k != "config.json" && data[k] != v {
			t.Errorf("the ConfigMap's %s is %q, want the release's %q", k, data[k], v)
		}
	}
	var config struct {
		NodePathMap []struct {
			Node  string   `json:"node"`
			Paths []string `json:"paths"`
		} `json:"nodePathMap"`
	}
	if err := json.Unmarshal([]byte(data["config.json"]), &config); err != nil {
		t.Fatalf("config.json: %v\n%s", err, data["config.json"])
	}
	if len(config.NodePathMap) != 1 || config.NodePathMap[0].Node != "DEFAULT_PATH_FOR_NON_LISTED_NODES" ||
		!reflect.DeepEqual(config.NodePathMap[0].Paths, []string{path}) {
		t.Errorf("config.json's nodePathMap is %+v, want the release's one entry for every node with paths [%s]", config.NodePathMap, path)
	}
	if want := "docker.io/rancher/local-path-provisioner:" + LocalPathVersion; got.Image != want {
		t.Errorf("got image %q, want %q", got.Image, want)
	}
	if want := "docker.io/library/busybox:latest"; got.HelperImage != want {
		t.Errorf("got helper image %q, want %q", got.HelperImage, want)
	}
}

// A manifest that LocalPath cannot change as it means to is refused, not
// applied with the release's path: another release's, say.
func TestLocalPathRefuses(t *testing.T) {
	upstream := string(readManifest(t))
	for _, c := range []struct{ name, manifest, want string }{
		{"no ConfigMap", strings.Replace(upstream, "metadata:\n  name: local-path-config", "metadata:\n  name: other", 1), "no ConfigMap local-path-config"},
		{"no node path", strings.Replace(upstream, `"nodePathMap"`, `"otherMap"`, 1), "no nodePathMap"},
		{"no Deployment", strings.Replace(upstream, "kind: Deployment", "kind: StatefulSet", 1), "no Deployment"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := LocalPath([]byte(c.manifest), "/x")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got error %v, want one saying %q", err, c.want)
			}
		})
	}
}

// The module builds the release the run names.
func TestLocalPathVersionIsPinned(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(localPathDir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "\tgithub.com/rancher/local-path-provisioner " + LocalPathVersion + " "; !strings.Contains(string(b), want) {
		t.Errorf("../localpath/go.mod does not require local-path-provisioner %s:\n%s", LocalPathVersion, b)
	}
	if !strings.HasPrefix(string(readManifest(t)), "# deploy/local-path-storage.yaml of github.com/rancher/local-path-provisioner "+LocalPathVersion+" ") {
		t.Errorf("the manifest's first line does not say it is release %s's", LocalPathVersion)
	}
}

func TestContainerdName(t *testing.T) {
	for _, c := range []struct{ ref, want string }{
		{"busybox", "docker.io/library/busybox:latest"},
		{"busybox:1.37", "docker.io/library/busybox:1.37"},
		{"rancher/local-path-provisioner:v0.0.30", "docker.io/rancher/local-path-provisioner:v0.0.30"},
		{"registry.k8s.io/pause:3.10.2", "registry.k8s.io/pause:3.10.2"},
		{"localhost/a", "localhost/a:latest"},
		{"127.0.0.1:5000/a/b", "127.0.0.1:5000/a/b:latest"},
		{"quay.io/a/b@sha256:0123", "quay.io/a/b@sha256:0123"},
	} {
		if got := containerdName(c.ref); got != c.want {
			t.Errorf("containerdName(%q): got %q, want %q", c.ref, got, c.want)
		}
	}
}
