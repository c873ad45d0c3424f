package peers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	yaml3 "go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// LocalPathVersion is the local-path-provisioner release the run installs;
// ../localpath/go.mod pins the same one, and its manifest names it.
const LocalPathVersion = "v0.0.30"

// LocalPathInstall is local-path-provisioner's manifest as the run applies
// it, and the images it asks for, as containerd names them.
type LocalPathInstall struct {
	Manifest    []byte
	Image       string // the provisioner's (its Deployment's container)
	HelperImage string // its helper pod's, which makes and removes a volume's directory
}

// separator is what separates the documents of the release's manifest.
const separator = "\n---\n"

// LocalPath is upstream, the release's manifest, with the paths of every
// entry of its config.json's nodePathMap replaced by nodePath: the
// release's /opt/local-path-provisioner is one directory for every run on
// the machine, which no run's clean-up would remove, while nodePath is the
// run's own. Every other document stays byte for byte the release's, and
// the ConfigMap keeps its other keys. A manifest without that ConfigMap,
// its nodePathMap, or the Deployment is refused: another release's layout
// would otherwise be applied with the release's path, or with images the
// run did not build.
func LocalPath(upstream []byte, nodePath string) (LocalPathInstall, error) {
	var out LocalPathInstall
	docs := strings.Split(string(upstream), separator)
	config := -1
	for i, d := range docs {
		var head struct {
			Kind     string
			Metadata struct{ Name string }
		}
		if err := yaml.Unmarshal([]byte(d), &head); err != nil {
			return out, fmt.Errorf("document %d: %w", i, err)
		}
		switch {
		case head.Kind == "ConfigMap" && head.Metadata.Name == "local-path-config":
			edited, helper, err := localPathConfig(d, nodePath)
			if err != nil {
				return out, fmt.Errorf("ConfigMap local-path-config: %w", err)
			}
			docs[i], out.HelperImage, config = edited, helper, i
		case head.Kind == "Deployment":
			var dep appsv1.Deployment
			if err := yaml.Unmarshal([]byte(d), &dep); err != nil {
				return out, fmt.Errorf("Deployment: %w", err)
			}
			if len(dep.Spec.Template.Spec.Containers) == 0 {
				return out, errors.New("the Deployment has no container")
			}
			out.Image = containerdName(dep.Spec.Template.Spec.Containers[0].Image)
		}
	}
	if config < 0 {
		return out, errors.New("no ConfigMap local-path-config")
	}
	if out.Image == "" {
		return out, errors.New("no Deployment")
	}
	out.Manifest = []byte(strings.Join(docs, separator))
	return out, nil
}

// localPathConfig is the ConfigMap doc with its config.json's node paths
// replaced by nodePath, and the image of the helper pod it defines. Only
// config.json changes: the document is edited as a YAML tree, so that
// its other keys keep their text.
func localPathConfig(doc, nodePath string) (string, string, error) {
	var root yaml3.Node
	if err := yaml3.Unmarshal([]byte(doc), &root); err != nil {
		return "", "", err
	}
	data := lookup(root.Content[0], "data")
	configJSON, helperYAML := lookup(data, "config.json"), lookup(data, "helperPod.yaml")
	if configJSON == nil || helperYAML == nil {
		return "", "", errors.New("no config.json or helperPod.yaml")
	}
	var config map[string]json.RawMessage
	if err := json.Unmarshal([]byte(configJSON.Value), &config); err != nil {
		return "", "", fmt.Errorf("config.json: %w", err)
	}
	var nodes []map[string]json.RawMessage
	if err := json.Unmarshal(config["nodePathMap"], &nodes); err != nil || len(nodes) == 0 {
		return "", "", fmt.Errorf("no nodePathMap in config.json (%v)", err)
	}
	paths, err := json.Marshal([]string{nodePath})
	if err != nil {
		return "", "", err
	}
	for _, n := range nodes {
		n["paths"] = paths
	}
	if config["nodePathMap"], err = json.Marshal(nodes); err != nil {
		return "", "", err
	}
	edited, err := json.MarshalIndent(config, "", "  ")
	if err != nil {
		return "", "", err
	}
	configJSON.Value = string(edited)

	var helper corev1.Pod
	if err := yaml.Unmarshal([]byte(helperYAML.Value), &helper); err != nil {
		return "", "", fmt.Errorf("helperPod.yaml: %w", err)
	}
	if len(helper.Spec.Containers) == 0 {
		return "", "", errors.New("helperPod.yaml has no container")
	}
	var b bytes.Buffer
	enc := yaml3.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&root); err != nil {
		return "", "", err
	}
	edited = b.Bytes()
	if !strings.HasSuffix(doc, "\n") {
		edited = bytes.TrimSuffix(edited, []byte("\n"))
	}
	return string(edited), containerdName(helper.Spec.Containers[0].Image), nil
}

// lookup is the value of key in the mapping node m, or nil.
func lookup(m *yaml3.Node, key string) *yaml3.Node {
	if m == nil || m.Kind != yaml3.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// containerdName is the full name under which the kubelet asks containerd
// for the image ref names (the CRI's normalisation, as Docker's): an image
// without a registry is Docker Hub's, under library/ when it has no
// repository path, and one without a tag or digest is its latest.
func containerdName(ref string) string {
	first, _, hasSlash := strings.Cut(ref, "/")
	if !hasSlash {
		ref = "docker.io/library/" + ref
	} else if !strings.ContainsAny(first, ".:") && first != "localhost" {
		ref = "docker.io/" + ref
	}
	last := ref[strings.LastIndex(ref, "/")+1:]
	if !strings.ContainsAny(last, ":@") {
		ref += ":latest"
	}
	return ref
}
