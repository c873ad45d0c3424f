package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// snapshotterVersion is the external-snapshotter release the suite runs;
// test/e2e/snapshotter/go.mod pins the same one.
const snapshotterVersion = "v8.7.0"

// startSnapshots installs what the snapshot API needs in a cluster, as an
// operator does (external-snapshotter's documentation): its CRDs, and
// snapshot-controller with distributed snapshotting, which labels each
// VolumeSnapshotContent with its volume's node. Each node runs its own
// csi-snapshotter in its converge pod, as deploy/'s snapshots component
// adds it (daemonset.go).
func (c *cluster) startSnapshots(ctx context.Context) error {
	bin, err := c.buildTools(ctx, "external-snapshotter-"+snapshotterVersion, "snapshotter", "snapshot-controller, csi-snapshotter", "-s -w")
	if err != nil {
		return err
	}
	c.snapshotBin = bin
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/kubernetes-csi/external-snapshotter/client/v8")
	cmd.Dir = filepath.Join(c.repo, "test", "e2e", "snapshotter")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("finding the snapshot CRDs: %v: %s", err, out)
	}
	crds := filepath.Join(strings.TrimSpace(string(out)), "config", "crd")
	if _, err := c.kubectl(ctx, "apply", "-k", crds); err != nil {
		return err
	}
	if _, err := c.kubectl(ctx, "wait", "--for=condition=established", "--timeout=60s",
		"crd/volumesnapshots.snapshot.storage.k8s.io", "crd/volumesnapshotcontents.snapshot.storage.k8s.io",
		"crd/volumesnapshotclasses.snapshot.storage.k8s.io"); err != nil {
		return err
	}
	c.snapshotController, err = startProc(c.logs, "snapshot-controller", filepath.Join(bin, "snapshot-controller"),
		"--kubeconfig="+c.admin, "--leader-election=false", "--enable-distributed-snapshotting")
	return err
}
