package chart

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/converge-csi/converge/test/e2e/manifests"
)

var (
	repo     = filepath.Join("..", "..", "..")
	chartDir = filepath.Join(repo, "charts", "converge")
	deploy   = filepath.Join(repo, "deploy")
)

// Both install into kube-system, the chart as release "converge" (README:
// helm install converge charts/converge -n kube-system), into a cluster of
// the e2e suite's Kubernetes: as make manifests renders deploy/.
const (
	releaseName = manifests.ReleaseName
	namespace   = manifests.Namespace
	kubeVersion = manifests.KubeVersion
)

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// render renders the chart as helm template does, with vals over its
// defaults; the error is the SDK's, schema violations included.
func render(t *testing.T, vals map[string]any) (string, error) {
	t.Helper()
	return renderIn(t, namespace, vals)
}

// renderIn is render into namespace ns (helm install -n ns).
func renderIn(t *testing.T, ns string, vals map[string]any) (string, error) {
	t.Helper()
	return renderRelease(t, releaseName, ns, vals)
}

// renderRelease renders the chart as helm template does for release name
// in namespace ns, with vals over its defaults.
func renderRelease(t *testing.T, name, ns string, vals map[string]any) (string, error) {
	t.Helper()
	install := action.NewInstall(&action.Configuration{})
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName, install.Namespace, install.Replace = name, ns, true
	v, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	install.KubeVersion = v
	rel, err := install.Run(loadChart(t), vals)
	if err != nil {
		return "", err
	}
	return rel.(*release.Release).Manifest, nil
}

// TestLint runs the Helm SDK's linter over the chart, strict (warnings
// fail too), with its defaults and with every choice turned on.
func TestLint(t *testing.T) {
	for name, vals := range map[string]map[string]any{
		"defaults": nil,
		"all on":   {"snapshots": map[string]any{"enabled": true}, "selinux": map[string]any{"enabled": true}, "storageClass": map[string]any{"isDefault": true, "mkfsOptions": "-m 0"}},
	} {
		t.Run(name, func(t *testing.T) {
			lint := action.NewLint()
			lint.Strict, lint.Namespace = true, namespace
			v, err := common.ParseKubeVersion(kubeVersion)
			if err != nil {
				t.Fatal(err)
			}
			lint.KubeVersion = v
			res := lint.Run([]string{chartDir}, vals)
			for _, m := range res.Messages {
				t.Logf("%s", m)
			}
			if len(res.Errors) > 0 {
				t.Errorf("lint: %v", res.Errors)
			}
		})
	}
}

// TestSchemaRefusesWrongValues checks that values.schema.json refuses a
// wrong type, an unknown key (a typo) and a value outside its choices,
// naming the offending value, and accepts what the README shows.
func TestSchemaRefusesWrongValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals map[string]any
		want string // "" for accepted
	}{
		{name: "README's values", vals: map[string]any{
			"csiNode":   map[string]any{"image": map[string]any{"repository": "registry.example/csi-node", "tag": "v0.1.0"}, "logLevel": 4, "thinOverprovisioningRatio": 2, "poolGuard": "10%"},
			"snapshots": map[string]any{"enabled": true}}},
		{name: "wrong type", vals: map[string]any{"csiNode": map[string]any{"logLevel": "4"}}, want: "logLevel"},
		{name: "unknown key", vals: map[string]any{"csiNode": map[string]any{"loglevel": 4}}, want: "loglevel"},
		{name: "unknown top-level key", vals: map[string]any{"snapshot": map[string]any{"enabled": true}}, want: "snapshot"},
		{name: "not a choice", vals: map[string]any{"storageClass": map[string]any{"provisioning": "lazy"}}, want: "provisioning"},
		{name: "relative directory", vals: map[string]any{"csiNode": map[string]any{"kubeletDir": "var/lib/kubelet"}}, want: "kubeletDir"},
		{name: "pool guard", vals: map[string]any{"csiNode": map[string]any{"poolGuard": "lots"}}, want: "poolGuard"},
		{name: "ratio below 1", vals: map[string]any{"csiNode": map[string]any{"thinOverprovisioningRatio": 0.5}}, want: "thinOverprovisioningRatio"},
		{name: "a pool called default", vals: map[string]any{"pools": []any{map[string]any{"name": "default"}}}, want: "pools"},
		{name: "a pool's bad name", vals: map[string]any{"pools": []any{map[string]any{"name": "Fast"}}}, want: "pools"},
		{name: "a pool with a directory of its own", vals: map[string]any{"pools": []any{map[string]any{"name": "fast", "dir": "/mnt/a"}}}, want: "dir"},
		{name: "an on-node-loss converge does not know", vals: map[string]any{"storageClass": map[string]any{"onNodeLoss": "delete"}}, want: "onNodeLoss"},
		{name: "a grace that is no duration", vals: map[string]any{"controller": map[string]any{"deletedNodeGrace": "60"}}, want: "deletedNodeGrace"},
		{name: "no replica", vals: map[string]any{"controller": map[string]any{"replicas": 0}}, want: "replicas"},
		{name: "a class name that is no DNS name", vals: map[string]any{"extraStorageClasses": []any{map[string]any{"name": "x\n---\nkind: Secret"}}}, want: "name"},
		{name: "a further class without a name", vals: map[string]any{"extraStorageClasses": []any{map[string]any{"fsType": "xfs"}}}, want: "name"},
		{name: "a further class that would make itself", vals: map[string]any{"extraStorageClasses": []any{map[string]any{"name": "x", "create": false}}}, want: "create"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, tc.vals)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("got %v, want the values accepted", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %v, want a schema error naming %s", err, tc.want)
			}
		})
	}
}

// variants are the choices deploy/ offers as kustomize components, and
// the chart's values that make the same choice.
var variants = []struct {
	name       string
	components []string
	vals       map[string]any
}{
	{name: "default"},
	{name: "snapshots", components: []string{"snapshots"}, vals: map[string]any{"snapshots": map[string]any{"enabled": true}}},
	{name: "selinux", components: []string{"selinux"}, vals: map[string]any{"selinux": map[string]any{"enabled": true}}},
	{name: "snapshots and selinux", components: []string{"snapshots", "selinux"},
		vals: map[string]any{"snapshots": map[string]any{"enabled": true}, "selinux": map[string]any{"enabled": true}}},
	{name: "monitoring", components: []string{"monitoring"}, vals: map[string]any{"monitoring": map[string]any{"enabled": true}}},
}

// kustomize builds deploy/ with components, as kubectl apply -k of an
// overlay naming them would.
func kustomize(t *testing.T, components []string) string {
	t.Helper()
	return kustomizeInto(t, "", components)
}

// buildKustomization builds the kustomization in dir as kubectl apply -k
// would.
func buildKustomization(t *testing.T, dir string) string {
	t.Helper()
	out, err := manifests.Kustomize(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		b, _ := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
		t.Fatalf("%v in:\n%s", err, b)
	}
	return out
}

// objects parses a multi-document manifest into its objects by
// kind/namespace/name (manifests.Objects: the kinds unknown to
// kustomize's schema without a namespace, the named lists sorted);
// fromChart drops Helm's bookkeeping first, as make manifests does
// (manifests.DropHelmObject).
func objects(t *testing.T, manifest string, fromChart bool) map[string]map[string]any {
	t.Helper()
	out, err := manifests.Objects(manifest, fromChart)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// union lists the keys of both maps, sorted.
func union(a, b map[string]map[string]any) []string {
	seen := map[string]bool{}
	for k := range a {
		seen[k] = true
	}
	for k := range b {
		seen[k] = true
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// TestValuesReachTheObjects checks that each value an operator sets lands
// where csi-node and the kubelet read it.
func TestValuesReachTheObjects(t *testing.T) {
	manifest, err := render(t, map[string]any{
		"csiNode": map[string]any{
			"image":    map[string]any{"repository": "registry.example/csi-node", "tag": "v9"},
			"logLevel": 5, "kubeletDir": "/data/kubelet", "stateDir": "/data/converge", "httpPort": 9900,
			"thinOverprovisioningRatio": 2.5, "poolGuard": "2Gi", "maxVolumes": 40,
			"featureGates": map[string]any{"VolumeHealth": true, "VolumeCondition": true},
			"extraArgs":    []any{"--max-requests=100"},
		},
		"storageClass":        map[string]any{"name": "fast", "isDefault": true, "provisioning": "thin", "fsType": "xfs", "mkfsOptions": "-m reflink=1", "pool": "nvme", "onNodeLoss": "release"},
		"controller":          map[string]any{"replicas": 3, "logLevel": 4, "httpPort": 9901, "deletedNodeGrace": "5m", "extraArgs": []any{"--resync-period=1m"}, "priorityClassName": "storage-high"},
		"nodeSelector":        map[string]any{"storage": "local"},
		"extraStorageClasses": []any{map[string]any{"name": "converge-thin", "provisioning": "thin"}, map[string]any{"name": "converge-plain", "onNodeLoss": "", "mkfsOptions": ""}},
		"snapshots": map[string]any{"enabled": true, "volumeSnapshotClass": map[string]any{
			"labels":      map[string]any{"velero.io/csi-volumesnapshot-class": "true"},
			"annotations": map[string]any{"snapshot.storage.kubernetes.io/is-default-class": "true"},
		}},
		"sidecars": map[string]any{
			"provisioner": map[string]any{"pullPolicy": "Always", "extraArgs": []any{"--worker-threads=4"}},
			"resizer":     map[string]any{"image": "mirror.example/csi-resizer:v2.3.0", "extraArgs": []any{"--workers=2"}},
		},
		"pools":     []any{map[string]any{"name": "nvme", "ratio": 2, "guard": "10%"}, map[string]any{"name": "hdd"}},
		"poolsRoot": "/mnt/pools",
	})
	if err != nil {
		t.Fatal(err)
	}
	objs := objects(t, manifest, false)
	ds := objs["DaemonSet kube-system/converge-node"]
	pod := ds["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	node := pod["containers"].([]any)[0].(map[string]any)
	args := fmt.Sprint(node["args"])
	for _, want := range []string{"--endpoint=unix:///data/kubelet/plugins/converge.csi.dev/csi.sock", "--state-dir=/data/converge",
		"--kubelet-dir=/data/kubelet", "--http-address=:9900", "-v=5", "--thin-overprovisioning-ratio=2.5", "--pool-guard=2Gi",
		"--max-volumes=40", "--feature-gates=VolumeCondition=true,VolumeHealth=true", "--max-requests=100",
		"--pool=nvme=/mnt/pools/nvme,guard=10%,ratio=2", "--pool=hdd=/mnt/pools/hdd"} {
		if !strings.Contains(args, want) {
			t.Errorf("csi-node's args %s lack %s", args, want)
		}
	}
	if node["image"] != "registry.example/csi-node:v9" {
		t.Errorf("csi-node's image: got %v", node["image"])
	}
	for _, want := range []string{"/data/kubelet/plugins/converge.csi.dev", "/data/kubelet/plugins_registry", "/data/converge",
		"map[hostPath:map[path:/mnt/pools type:DirectoryOrCreate] name:pools]"} {
		if !strings.Contains(fmt.Sprint(pod["volumes"]), want) {
			t.Errorf("volumes %v lack %s", pod["volumes"], want)
		}
	}
	if mounts := fmt.Sprint(node["volumeMounts"]); !strings.Contains(mounts, "map[mountPath:/mnt/pools mountPropagation:HostToContainer name:pools]") {
		t.Errorf("csi-node's mounts %s lack the pools' root", mounts)
	}
	if !strings.Contains(fmt.Sprint(pod["containers"]), "--kubelet-registration-path=/data/kubelet/plugins/converge.csi.dev/csi.sock") {
		t.Error("the registrar registers the socket at the default kubelet directory")
	}
	// Helm merges a map value with the default's: Linux nodes still.
	if fmt.Sprint(pod["nodeSelector"]) != "map[kubernetes.io/os:linux storage:local]" {
		t.Errorf("nodeSelector: got %v", pod["nodeSelector"])
	}
	sidecars := map[string]map[string]any{}
	for _, ctr := range pod["containers"].([]any) {
		ctr := ctr.(map[string]any)
		sidecars[ctr["name"].(string)] = ctr
	}
	if p := sidecars["csi-provisioner"]; p["imagePullPolicy"] != "Always" || !strings.HasSuffix(fmt.Sprint(p["args"]), " --worker-threads=4]") {
		t.Errorf("csi-provisioner: pull policy %v, args %v; want Always, --worker-threads=4 last", p["imagePullPolicy"], p["args"])
	}
	if r := sidecars["csi-resizer"]; r["image"] != "mirror.example/csi-resizer:v2.3.0" || r["imagePullPolicy"] != nil || !strings.HasSuffix(fmt.Sprint(r["args"]), " --workers=2]") {
		t.Errorf("csi-resizer: image %v, pull policy %v, args %v; want the mirror's, none, --workers=2 last", r["image"], r["imagePullPolicy"], r["args"])
	}
	// A further class: its own name and provisioning, the rest
	// storageClass's, and not the default.
	if thin := objs["StorageClass /converge-thin"]; thin == nil {
		t.Error("no StorageClass converge-thin")
	} else if got := fmt.Sprint(thin["parameters"]); got != "map[converge.csi.dev/mkfsOptions:-m reflink=1 converge.csi.dev/on-node-loss:release converge.csi.dev/pool:nvme converge.csi.dev/provisioning:thin csi.storage.k8s.io/fstype:xfs]" || fmt.Sprint(thin["metadata"].(map[string]any)["annotations"]) != "<nil>" {
		t.Errorf("StorageClass converge-thin: parameters %s, annotations %v", got, thin["metadata"].(map[string]any)["annotations"])
	}
	// "" is the driver's default, not storageClass's value.
	if plain := objs["StorageClass /converge-plain"]; plain == nil {
		t.Error("no StorageClass converge-plain")
	} else if got := fmt.Sprint(plain["parameters"]); got != "map[converge.csi.dev/pool:nvme converge.csi.dev/provisioning:thin csi.storage.k8s.io/fstype:xfs]" {
		t.Errorf("StorageClass converge-plain: parameters %s, want storageClass's but no on-node-loss nor mkfs options", got)
	}
	vsc := objs["VolumeSnapshotClass /converge"]
	if vsc == nil {
		t.Fatalf("no VolumeSnapshotClass converge among %v", union(objs, nil))
	}
	meta := vsc["metadata"].(map[string]any)
	if labels := meta["labels"].(map[string]any); labels["velero.io/csi-volumesnapshot-class"] != "true" || labels["app.kubernetes.io/part-of"] != "converge" {
		t.Errorf("the VolumeSnapshotClass's labels: %v; want Velero's beside the chart's", labels)
	}
	if fmt.Sprint(meta["annotations"]) != "map[snapshot.storage.kubernetes.io/is-default-class:true]" {
		t.Errorf("the VolumeSnapshotClass's annotations: %v", meta["annotations"])
	}
	ctrlPod := objs["Deployment kube-system/converge-controller"]["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	if ctrlPod["priorityClassName"] != "storage-high" || fmt.Sprint(ctrlPod["nodeSelector"]) != "map[kubernetes.io/os:linux]" {
		t.Errorf("converge-controller's priorityClassName %v, nodeSelector %v; want storage-high, Linux nodes", ctrlPod["priorityClassName"], ctrlPod["nodeSelector"])
	}
	sc := objs["StorageClass /fast"]
	if sc == nil {
		t.Fatalf("no StorageClass fast among %v", union(objs, nil))
	}
	if got := fmt.Sprint(sc["parameters"]); got != "map[converge.csi.dev/mkfsOptions:-m reflink=1 converge.csi.dev/on-node-loss:release converge.csi.dev/pool:nvme converge.csi.dev/provisioning:thin csi.storage.k8s.io/fstype:xfs]" {
		t.Errorf("StorageClass parameters: got %s", got)
	}
	if ann := sc["metadata"].(map[string]any)["annotations"]; fmt.Sprint(ann) != "map[storageclass.kubernetes.io/is-default-class:true]" {
		t.Errorf("StorageClass annotations: got %v, want it the default", ann)
	}
	ctrl := objs["Deployment kube-system/converge-controller"]
	if ctrl == nil {
		t.Fatalf("no converge-controller among %v", union(objs, nil))
	}
	cspec := ctrl["spec"].(map[string]any)
	c := cspec["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	if got := fmt.Sprint(cspec["replicas"], " ", c["image"], " ", c["args"]); got != "3 registry.example/csi-node:v9 [--v=4 --identity=$(POD_NAME) --http-address=:9901 --deleted-node-grace=5m --resync-period=1m]" {
		t.Errorf("converge-controller: replicas, image and args %s", got)
	}
	// Without the controller, none of its objects.
	manifest, err = render(t, map[string]any{"controller": map[string]any{"enabled": false}})
	if err != nil {
		t.Fatal(err)
	}
	for k := range objects(t, manifest, false) {
		if strings.Contains(k, "controller") {
			t.Errorf("controller.enabled false renders %s", k)
		}
	}
}

// TestControllerDisruptionBudget checks that, in the chart with several
// replicas and in deploy/, a PodDisruptionBudget lets one
// converge-controller replica at a time be evicted, counted from the
// Deployment's replicas (maxUnavailable rather than minAvailable 1, which
// would refuse every eviction of a lone replica), selecting exactly the
// Deployment's pods; and that the chart with one replica installs no
// budget: one replica has no other to hand the Lease to, and it is what a
// one-node cluster sets so that kubectl drain is never held.
func TestControllerDisruptionBudget(t *testing.T) {
	chart := func(replicas int) func() string {
		return func() string {
			m, err := render(t, map[string]any{"controller": map[string]any{"replicas": replicas}})
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
	}
	for _, tc := range []struct {
		name     string
		manifest func() string
		budget   bool
	}{
		{"deploy/", func() string { return kustomize(t, nil) }, true},
		{"chart", func() string {
			m, err := render(t, nil)
			if err != nil {
				t.Fatal(err)
			}
			return m
		}, true},
		{"chart, three replicas", chart(3), true},
		{"chart, one replica", chart(1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := objects(t, tc.manifest(), false)
			pdb := objs["PodDisruptionBudget kube-system/converge-controller"]
			dep := objs["Deployment kube-system/converge-controller"]
			if dep == nil {
				t.Fatalf("no Deployment among %v", union(objs, nil))
			}
			if !tc.budget {
				if pdb != nil {
					t.Errorf("one replica: a PodDisruptionBudget %v, want none", pdb["spec"])
				}
				return
			}
			if pdb == nil {
				t.Fatalf("no PodDisruptionBudget among %v", union(objs, nil))
			}
			spec := pdb["spec"].(map[string]any)
			if fmt.Sprint(spec["maxUnavailable"], " ", spec["minAvailable"], " ", spec["unhealthyPodEvictionPolicy"]) != "1 <nil> AlwaysAllow" {
				t.Errorf("the budget: got %v, want maxUnavailable 1, no minAvailable, unhealthy pods always evictable", spec)
			}
			dspec := dep["spec"].(map[string]any)
			if got, want := fmt.Sprint(spec["selector"]), fmt.Sprint(dspec["selector"]); got != want {
				t.Errorf("the budget selects %s, the Deployment %s", got, want)
			}
			podLabels := dspec["template"].(map[string]any)["metadata"].(map[string]any)["labels"].(map[string]any)
			for k, v := range spec["selector"].(map[string]any)["matchLabels"].(map[string]any) {
				if podLabels[k] != v {
					t.Errorf("the budget selects %s=%v, the controller's pods have %v", k, v, podLabels)
				}
			}
		})
	}
}

// TestGroupSnapshotClassValues checks that the VolumeGroupSnapshotClass
// takes its name and deletion policy from the values, and that create:
// false leaves it out (a cluster whose group CRDs serve no v1), the
// VolumeSnapshotClass and csi-snapshotter's rules staying.
func TestGroupSnapshotClassValues(t *testing.T) {
	for _, tc := range []struct {
		name  string
		class map[string]any
		want  string // the class's key, "" for none
	}{
		{name: "defaults", class: map[string]any{}, want: "VolumeGroupSnapshotClass /converge"},
		{name: "named, retained", class: map[string]any{"name": "db", "deletionPolicy": "Retain"}, want: "VolumeGroupSnapshotClass /db"},
		{name: "not created", class: map[string]any{"create": false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			manifest, err := render(t, map[string]any{"snapshots": map[string]any{"enabled": true, "volumeGroupSnapshotClass": tc.class}})
			if err != nil {
				t.Fatal(err)
			}
			objs := objects(t, manifest, true)
			var got []string
			for k := range objs {
				if strings.HasPrefix(k, "VolumeGroupSnapshotClass ") {
					got = append(got, k)
				}
			}
			switch {
			case tc.want == "" && len(got) > 0:
				t.Errorf("got %v, want no VolumeGroupSnapshotClass", got)
			case tc.want != "" && (len(got) != 1 || got[0] != tc.want):
				t.Errorf("got %v, want %s", got, tc.want)
			case tc.want != "":
				policy := "Delete"
				if p, ok := tc.class["deletionPolicy"]; ok {
					policy = p.(string)
				}
				if c := objs[tc.want]; c["driver"] != "converge.csi.dev" || c["deletionPolicy"] != policy {
					t.Errorf("%s: driver %v, deletionPolicy %v, want converge.csi.dev, %s", tc.want, c["driver"], c["deletionPolicy"], policy)
				}
			}
			if objs["VolumeSnapshotClass /converge"] == nil || objs["ClusterRole /converge-snapshotter"] == nil {
				t.Errorf("the VolumeSnapshotClass or csi-snapshotter's ClusterRole is missing: %v", union(objs, nil))
			}
		})
	}
	if _, err := render(t, map[string]any{"snapshots": map[string]any{"enabled": true, "volumeGroupSnapshotClass": map[string]any{"deletionPolicy": "Keep"}}}); err == nil {
		t.Error("deletionPolicy Keep: got no error from the schema")
	}
}
