package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// snapshotterVersion is the external-snapshotter release the suite runs;
// test/e2e/snapshotter/go.mod pins the same one.
const snapshotterVersion = "v8.7.0"

// snapshotCRDs are the CRDs of external-snapshotter's client/config/crd:
// the snapshot kinds and their group kinds, whose v1 both
// snapshot-controller and csi-snapshotter List at start-up, turning group
// snapshots off for their run, with only a warning, when they cannot.
var snapshotCRDs = []string{
	"crd/volumesnapshots.snapshot.storage.k8s.io", "crd/volumesnapshotcontents.snapshot.storage.k8s.io",
	"crd/volumesnapshotclasses.snapshot.storage.k8s.io",
	"crd/volumegroupsnapshots.groupsnapshot.storage.k8s.io", "crd/volumegroupsnapshotcontents.groupsnapshot.storage.k8s.io",
	"crd/volumegroupsnapshotclasses.groupsnapshot.storage.k8s.io",
}

// snapshotControllerAccount is the ServiceAccount external-snapshotter's
// deploy/kubernetes/snapshot-controller/rbac-snapshot-controller.yaml
// binds its rules to; the run's snapshot-controller authenticates with a
// client certificate of that account's user name.
const snapshotControllerAccount = "system:serviceaccount:kube-system:snapshot-controller"

// snapshotControllerNodes is the rule upstream's RBAC leaves commented
// out, "only when using distributed snapshotting": snapshot-controller
// finds a volume's node among the Nodes to label its contents.
const snapshotControllerNodes = `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: snapshot-controller-distributed
rules:
  - apiGroups: [""]
    resources: ["nodes"]
    verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: snapshot-controller-distributed
subjects:
  - kind: ServiceAccount
    name: snapshot-controller
    namespace: kube-system
roleRef:
  kind: ClusterRole
  name: snapshot-controller-distributed
  apiGroup: rbac.authorization.k8s.io
`

// startSnapshots installs what the snapshot API needs in a cluster, as an
// operator does (external-snapshotter's documentation): its CRDs, the
// group snapshot ones included, and snapshot-controller with distributed
// snapshotting, which labels each VolumeSnapshotContent with its volume's
// node, under the release's own RBAC (rbac-snapshot-controller.yaml, its
// group snapshot rules included) and the nodes rule it leaves for
// distributed snapshotting. Each node runs its own csi-snapshotter in its
// converge pod, as deploy/'s snapshots component adds it (daemonset.go).
// Group snapshots need no switch: v8.7.0's CSIVolumeGroupSnapshot feature
// gate is GA and on.
func (c *cluster) startSnapshots(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}",
		"github.com/kubernetes-csi/external-snapshotter/client/v8", "github.com/kubernetes-csi/external-snapshotter/v8")
	cmd.Dir = filepath.Join(c.repo, "test", "e2e", "snapshotter")
	out, err := cmd.CombinedOutput()
	dirs := strings.Fields(string(out))
	if err != nil || len(dirs) != 2 {
		return fmt.Errorf("finding the snapshot CRDs and RBAC: %v: %s", err, out)
	}
	crds := filepath.Join(dirs[0], "config", "crd")
	if _, err := c.kubectl(ctx, "apply", "-k", crds); err != nil {
		return err
	}
	if _, err := c.kubectl(ctx, append([]string{"wait", "--for=condition=established", "--timeout=60s"}, snapshotCRDs...)...); err != nil {
		return err
	}
	if _, err := c.kubectl(ctx, "apply", "-f", filepath.Join(dirs[1], "deploy", "kubernetes", "snapshot-controller", "rbac-snapshot-controller.yaml")); err != nil {
		return err
	}
	nodes := filepath.Join(c.dir, "snapshot-controller-nodes.yaml")
	if err := os.WriteFile(nodes, []byte(snapshotControllerNodes), 0o644); err != nil {
		return err
	}
	if _, err := c.kubectl(ctx, "apply", "-f", nodes); err != nil {
		return err
	}
	if err := c.issue("snapshot-controller", snapshotControllerAccount, nil); err != nil {
		return err
	}
	c.snapshotController, err = startProc(c.logs, "snapshot-controller", filepath.Join(filepath.Dir(c.sidecarBin("csi-snapshotter")), "snapshot-controller"),
		"--kubeconfig="+c.pki.path("snapshot-controller.kubeconfig"), "--leader-election=false", "--enable-distributed-snapshotting")
	return err
}
