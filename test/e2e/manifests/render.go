package manifests

import (
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	release "helm.sh/helm/v4/pkg/release/v1"
	"sigs.k8s.io/yaml"
)

// deploy/ installs as the README's helm install does: release converge in
// kube-system, on the e2e suite's Kubernetes.
const (
	ReleaseName = "converge"
	Namespace   = "kube-system"
	KubeVersion = "v1.37.2"
)

// HelmLabels are the labels Helm's conventions add that an object applied
// with kubectl must not carry: a later helm install would take the object
// for another release's.
var HelmLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}

// A doc is one object of a rendered chart.
type doc struct {
	template string         // the template's file name, e.g. daemonset.yaml
	text     string         // its YAML without Helm's bookkeeping, comments kept
	obj      map[string]any // text parsed
}

// key names the object by kind, namespace and name.
func (d doc) key() string {
	meta, _ := d.obj["metadata"].(map[string]any)
	return fmt.Sprintf("%s %v/%v", d.obj["kind"], meta["namespace"], meta["name"])
}

// Render renders the chart in chartDir as helm install -n kube-system
// converge would, with vals over its defaults, and returns Helm's
// manifest: the schema's refusals and the templates' failures are its
// errors.
func Render(chartDir string, vals map[string]any) (string, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return "", err
	}
	install := action.NewInstall(&action.Configuration{})
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName, install.Namespace, install.Replace = ReleaseName, Namespace, true
	v, err := common.ParseKubeVersion(KubeVersion)
	if err != nil {
		return "", err
	}
	install.KubeVersion = v
	rel, err := install.Run(ch, vals)
	if err != nil {
		return "", err
	}
	return rel.(*release.Release).Manifest, nil
}

// source is the header Helm writes above each object of a manifest.
var source = regexp.MustCompile(`(?m)^---\n# Source: [^/\n]+/templates/(\S+)\n`)

// sep separates the objects of a template's output, as Helm splits them.
var sep = regexp.MustCompile(`(?m)^---[ \t]*`)

// renderDocs renders the chart with vals into its objects, each without
// Helm's bookkeeping, in the order of the templates' text (helm install's
// manifest sorts them by kind). It fails unless they are the objects of
// helm install's manifest, each from the template its # Source: header
// names, and if the text edit that takes the bookkeeping out does not give
// the objects that DropHelmObject gives.
func renderDocs(chartDir string, vals map[string]any) ([]doc, error) {
	manifest, err := Render(chartDir, vals)
	if err != nil {
		return nil, err
	}
	installed := map[string]int{} // template and text of each object
	heads := source.FindAllStringSubmatchIndex(manifest, -1)
	if len(heads) == 0 || strings.TrimSpace(manifest[:heads[0][0]]) != "" {
		return nil, fmt.Errorf("the manifest does not start with a # Source: header:\n%.200s", manifest)
	}
	for i, h := range heads {
		end := len(manifest)
		if i+1 < len(heads) {
			end = heads[i+1][0]
		}
		installed[manifest[h[2]:h[3]]+"\n"+strings.TrimSpace(manifest[h[1]:end])]++
	}
	templates, err := renderTemplates(chartDir, vals)
	if err != nil {
		return nil, err
	}
	var docs []doc
	for _, tmpl := range slices.Sorted(maps.Keys(templates)) {
		for _, raw := range sep.Split(templates[tmpl], -1) {
			raw = strings.TrimSpace(raw)
			if raw == "" {
				continue
			}
			if k := tmpl + "\n" + raw; installed[k] > 0 {
				installed[k]--
			} else {
				return nil, fmt.Errorf("%s renders an object helm install does not:\n%s", tmpl, raw)
			}
			raw += "\n"
			var want map[string]any
			if err := yaml.UnmarshalStrict([]byte(raw), &want); err != nil {
				return nil, fmt.Errorf("%s: %w", tmpl, err)
			}
			if want == nil {
				continue
			}
			DropHelmObject(want)
			text := stripHelm(raw)
			var got map[string]any
			if err := yaml.UnmarshalStrict([]byte(text), &got); err != nil {
				return nil, fmt.Errorf("%s without Helm's labels: %w in:\n%s", tmpl, err, text)
			}
			if !reflect.DeepEqual(got, want) {
				return nil, fmt.Errorf("%s: the text without Helm's labels is not the object without them:\n%s\nwant:\n%v", tmpl, text, want)
			}
			docs = append(docs, doc{template: tmpl, text: text, obj: got})
		}
	}
	for k, n := range installed {
		if n > 0 {
			return nil, fmt.Errorf("helm install installs an object the templates do not render:\n%s", k)
		}
	}
	return docs, nil
}

// renderTemplates renders each template of the chart as helm install does
// (its schema checks vals), and returns the output of those that make
// objects by file name (daemonset.yaml).
func renderTemplates(chartDir string, vals map[string]any) (map[string]string, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, err
	}
	caps := common.DefaultCapabilities.Copy()
	v, err := common.ParseKubeVersion(KubeVersion)
	if err != nil {
		return nil, err
	}
	caps.KubeVersion = *v
	opts := common.ReleaseOptions{Name: ReleaseName, Namespace: Namespace, Revision: 1, IsInstall: true}
	values, err := util.ToRenderValuesWithSchemaValidation(ch, vals, opts, caps, false)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, values)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	prefix := ch.Name() + "/templates/"
	for name, text := range files {
		base := strings.TrimPrefix(name, prefix)
		if base == name || strings.Contains(base, "/") || !strings.HasSuffix(base, ".yaml") {
			continue // NOTES.txt, _helpers.tpl
		}
		out[base] = text
	}
	return out, nil
}

var (
	// helmLine is a line of one of HelmLabels or of a helm.sh/ or
	// meta.helm.sh/ annotation.
	helmLine = regexp.MustCompile(`^\s+(?:(?:` + labelAlternatives() + `)|(?:meta\.)?helm\.sh/[^:\s]+): .*$`)
	// mapKey is a line that opens a block map of labels or annotations.
	mapKey = regexp.MustCompile(`^(\s*)(?:labels|annotations|matchLabels):\s*$`)
)

func labelAlternatives() string {
	var alt []string
	for _, l := range HelmLabels {
		alt = append(alt, regexp.QuoteMeta(l))
	}
	return strings.Join(alt, "|")
}

// stripHelm takes the lines of Helm's labels and annotations out of a
// rendered object, and then the labels: and annotations: keys left empty.
func stripHelm(text string) string {
	var kept []string
	for _, l := range strings.Split(text, "\n") {
		if !helmLine.MatchString(l) {
			kept = append(kept, l)
		}
	}
	var out []string
	for i, l := range kept {
		if m := mapKey.FindStringSubmatch(l); m != nil {
			next := ""
			if i+1 < len(kept) {
				next = kept[i+1]
			}
			if len(next)-len(strings.TrimLeft(next, " ")) <= len(m[1]) {
				continue
			}
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// DropHelmObject removes Helm's bookkeeping from a rendered object: its
// labels (HelmLabels) and helm.sh/ annotations, in the object's metadata
// and its pod template's, and app.kubernetes.io/instance from the
// selectors of the DaemonSet, the Deployment, the PodDisruptionBudget and
// the PodMonitors (so that two releases never select each other's pods).
// Maps it leaves empty go too.
func DropHelmObject(o map[string]any) {
	meta, _ := o["metadata"].(map[string]any)
	dropHelm(meta)
	spec, _ := o["spec"].(map[string]any)
	switch o["kind"] {
	case "DaemonSet", "Deployment":
		dropSelector(spec)
		if tmpl, ok := spec["template"].(map[string]any); ok {
			m, _ := tmpl["metadata"].(map[string]any)
			dropHelm(m)
		}
	case "PodMonitor", "PodDisruptionBudget":
		dropSelector(spec)
	}
}

func dropSelector(spec map[string]any) {
	sel, _ := spec["selector"].(map[string]any)
	if ml, ok := sel["matchLabels"].(map[string]any); ok {
		delete(ml, "app.kubernetes.io/instance")
	}
}

// dropHelm removes Helm's labels and annotations from meta, and the maps
// that it leaves empty.
func dropHelm(meta map[string]any) {
	if labels, ok := meta["labels"].(map[string]any); ok {
		for _, l := range HelmLabels {
			delete(labels, l)
		}
		if len(labels) == 0 {
			delete(meta, "labels")
		}
	}
	if ann, ok := meta["annotations"].(map[string]any); ok {
		for a := range ann {
			if strings.HasPrefix(a, "helm.sh/") || strings.HasPrefix(a, "meta.helm.sh/") {
				delete(ann, a)
			}
		}
		if len(ann) == 0 {
			delete(meta, "annotations")
		}
	}
}
