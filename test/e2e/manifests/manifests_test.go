package manifests

import (
	"strings"
	"testing"
)

const daemonSet = `apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: converge-node
  namespace: kube-system
spec:
  template:
    spec:
      containers:
        - name: csi-node
          args: [-v=2]
          volumeMounts:
            - name: dev
              mountPath: /dev
      volumes:
        - name: dev
          hostPath:
            path: /dev
`

// TestStrategicPatch checks that a component's patch holds what it adds
// or changes, with the names that find it, and that a removal fails.
func TestStrategicPatch(t *testing.T) {
	for _, tc := range []struct {
		name, on, want, err string
	}{
		{name: "the same", on: daemonSet},
		{name: "a container added", on: strings.Replace(daemonSet, "      volumes:", "        # Beside csi-node.\n        - name: snapshotter\n          image: s\n      volumes:", 1),
			want: "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: converge-node\n  namespace: kube-system\nspec:\n  template:\n    spec:\n      containers:\n        # Beside csi-node.\n        - name: snapshotter\n          image: s\n"},
		{name: "a mount added", on: strings.Replace(daemonSet, "              mountPath: /dev\n", "              mountPath: /dev\n            - name: sel\n              mountPath: /sel\n", 1),
			want: "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: converge-node\n  namespace: kube-system\nspec:\n  template:\n    spec:\n      containers:\n        - name: csi-node\n          volumeMounts:\n            - name: sel\n              mountPath: /sel\n"},
		{name: "an argument changed", on: strings.Replace(daemonSet, "[-v=2]", "[-v=4]", 1),
			want: "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: converge-node\n  namespace: kube-system\nspec:\n  template:\n    spec:\n      containers:\n        - name: csi-node\n          args: [-v=4]\n"},
		{name: "a volume removed", on: daemonSet[:strings.Index(daemonSet, "      volumes:")], err: "volumes is removed"},
		{name: "a container removed", on: strings.Replace(daemonSet, "name: csi-node", "name: other", 1), err: "[csi-node] is removed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := strategicPatch(daemonSet, tc.on)
			switch {
			case tc.err != "":
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("got %v, want an error naming %s", err, tc.err)
				}
			case err != nil:
				t.Fatal(err)
			case string(got) != tc.want:
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

// TestStripHelm checks that Helm's labels and annotations go, the maps
// they leave empty with them, and the comments stay.
func TestStripHelm(t *testing.T) {
	in := `# A comment that stays.
metadata:
  name: x
  labels:
    app.kubernetes.io/part-of: converge
    helm.sh/chart: converge-0.2.0
    app.kubernetes.io/instance: converge
  annotations:
    helm.sh/resource-policy: keep
spec: {}
`
	want := `# A comment that stays.
metadata:
  name: x
  labels:
    app.kubernetes.io/part-of: converge
spec: {}
`
	if got := stripHelm(in); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}
