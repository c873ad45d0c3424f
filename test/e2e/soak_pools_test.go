package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/volstatus"
)

// The soak's accounting invariant: on each node, csi-node's store (what
// csi-node status lists), its pools' accounting (what each pool says it
// promised), the pools' files (an image per volume) and the API (the PVs
// of the node) agree.

// nodeStatus is what csi-node status -o json says on a node.
type nodeStatus struct {
	Pools   []volstatus.PoolStatus   `json:"pools"`
	Volumes []volstatus.VolumeStatus `json:"volumes"`
}

// status runs csi-node status -o json in n's converge pod.
func (n *kubeNode) status() (nodeStatus, error) {
	var st nodeStatus
	pod, err := n.driverPod(context.Background())
	if err != nil || pod == nil {
		return st, fmt.Errorf("the converge pod of %s: %v", n.node, err)
	}
	out, err := c.kubectl(context.Background(), "exec", "-n", daemonSetNamespace, pod.Name, "-c", "csi-node", "--", "csi-node", "status", "-o", "json")
	if err != nil {
		return st, fmt.Errorf("csi-node status on %s: %v: %s", n.node, err, tail(out, 5))
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return st, fmt.Errorf("csi-node status -o json on %s: %v", n.node, err)
	}
	return st, nil
}

// hostPath is where the test process finds path of the node's, a pool's
// directory under csi-node's state directory or the pools' root. A path
// is under a directory at a "/" only: the pools' root,
// /var/lib/converge-pools, begins with the state directory's name.
func (n *kubeNode) hostPath(path string) string {
	for _, d := range []struct{ node, host string }{{nodeStateDir, n.stateDir}, {nodePoolsDir, n.poolsDir}} {
		if within(path, d.node) {
			return d.host + strings.TrimPrefix(path, d.node)
		}
	}
	return n.ns.path(path)
}

// TestHostPathOfAPool: a pool under the pools' root is found there, not
// below the state directory's name (a soak once found pool fast's images
// at <state dir>-pools/fast, seven times in eight, as a map's order
// fell).
func TestHostPathOfAPool(t *testing.T) {
	n := &kubeNode{stateDir: "/run/s", poolsDir: "/run/p"}
	for path, want := range map[string]string{
		nodePoolsDir + "/fast":       "/run/p/fast",
		nodeStateDir + "/volumes":    "/run/s/volumes",
		nodeStateDir:                 "/run/s",
		nodePoolsDir + "/fast/a.img": "/run/p/fast/a.img",
	} {
		if got := n.hostPath(path); got != want {
			t.Errorf("hostPath(%s) = %s, want %s", path, got, want)
		}
	}
}

// poolsDisagree lists where n's store, pools, files and PVs disagree.
func (n *kubeNode) poolsDisagree() ([]string, error) {
	st, err := n.status()
	if err != nil {
		return nil, err
	}
	pvs, err := n.c.client.CoreV1().PersistentVolumes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []string
	sizes := map[string]int64{} // each volume csi-node lists, its size
	for _, v := range st.Volumes {
		sizes[v.ID] = v.SizeBytes
	}
	for _, pv := range pvs.Items {
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != contract.DefaultDriverName || nodeOf(&pv) != n.node {
			continue
		}
		h := pv.Spec.CSI.VolumeHandle
		if _, ok := sizes[h]; !ok {
			out = append(out, fmt.Sprintf("%s: PV %s's volume %s is not in csi-node's store", n.node, pv.Name, h))
		}
		delete(sizes, h)
	}
	for h := range sizes {
		out = append(out, fmt.Sprintf("%s: csi-node's store holds volume %s, which no PV names", n.node, h))
	}
	for _, p := range st.Pools {
		out = append(out, n.poolDisagrees(p, st.Volumes)...)
	}
	return out, nil
}

// poolDisagrees lists where pool p's accounting, the volumes csi-node
// lists in it, and the images in its directory disagree: an image for each
// volume, of the size of its device when it is attached (csi-node reports
// no size for one that is not), and what the pool says it promised, thick
// and thin, the sum of its volumes' images.
func (n *kubeNode) poolDisagrees(p volstatus.PoolStatus, volumes []volstatus.VolumeStatus) []string {
	if p.Error != "" {
		return []string{fmt.Sprintf("%s: pool %s cannot be read: %s", n.node, p.Name, p.Error)}
	}
	var out []string
	listed := map[string]volstatus.VolumeStatus{}
	for _, v := range volumes {
		if cmp.Or(v.Pool, "default") == p.Name {
			listed[v.ID] = v
		}
	}
	var thick, thin int64
	images, _ := filepath.Glob(filepath.Join(n.hostPath(p.Dir), "*.img"))
	for _, img := range images {
		id := strings.TrimSuffix(filepath.Base(img), ".img")
		fi, err := os.Stat(img)
		v, ok := listed[id]
		switch {
		case err != nil:
			out = append(out, fmt.Sprintf("%s: pool %s: %v", n.node, p.Name, err))
			continue
		case !ok:
			out = append(out, fmt.Sprintf("%s: pool %s holds image %s, of no volume csi-node lists there", n.node, p.Name, filepath.Base(img)))
			continue
		case v.SizeBytes != 0 && fi.Size() != v.SizeBytes:
			out = append(out, fmt.Sprintf("%s: pool %s: volume %s's device is %d bytes, its image %d", n.node, p.Name, id, v.SizeBytes, fi.Size()))
		}
		if v.Provisioning == "thin" {
			thin += fi.Size()
		} else {
			thick += fi.Size()
		}
		delete(listed, id)
	}
	for _, id := range slices.Sorted(maps.Keys(listed)) {
		out = append(out, fmt.Sprintf("%s: pool %s: volume %s has no image", n.node, p.Name, id))
	}
	if thick != p.ThickPromisedBytes || thin != p.ThinPromisedBytes {
		out = append(out, fmt.Sprintf("%s: pool %s promises %d thick and %d thin bytes, its images sum to %d and %d",
			n.node, p.Name, p.ThickPromisedBytes, p.ThinPromisedBytes, thick, thin))
	}
	return out
}

// poolsAgree waits up to a minute for every node's store, pools, images
// and PVs to agree (a change under way may be between them), and counts
// an invariant broken if they do not.
func (s *soakRun) poolsAgree(when string) {
	err := waitFor(s.ctx, time.Minute, nil, func() error {
		var all []string
		for _, n := range s.nodes {
			d, err := n.poolsDisagree()
			if err != nil {
				return err
			}
			all = append(all, d...)
		}
		if len(all) > 0 {
			return errors.New(strings.Join(all, "; "))
		}
		return nil
	})
	if err != nil {
		s.fail(&s.broken, "%s, the nodes' stores, pools, images and PVs disagree: %v", when, err)
	}
}
