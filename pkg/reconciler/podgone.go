package reconciler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/state"
)

// A raw block publish the kubelet forgot. The kubelet tears a pod's block
// volume down in two steps: it removes its own links to the device in the
// pod's directories first, then calls NodeUnpublishVolume. If that call
// fails (csi-node down) and the kubelet restarts, it cannot reconstruct
// the volume (it reconstructs block volumes from those links: kubernetes
// #85476), so it forgets it: it removes the pod's directory and never
// calls NodeUnpublishVolume nor NodeUnstageVolume. The publish and the
// stage would stay for good, the device bound and attached, and the
// volume's deletion refused ("is staged"). A filesystem publish has no
// such gap: its mount stays in the pod's directory, from which the kubelet
// reconstructs it and unpublishes it.
//
// The kubelet makes a pod's directory (<kubelet-dir>/pods/<uid>) before it
// sets up any of its volumes, and removes it only once it holds none of
// them: a block publish whose pod's directory is gone is one the kubelet
// no longer has. The reconciler withdraws it as the kubelet's
// NodeUnpublishVolume would have, and with it the stage when no other
// publish is left on it (state.WithdrawOrphanedPublish); the usual
// teardown follows. A kubelet that does come back to it finds both
// calls answered at once, and a new pod's NodeStageVolume stages the
// volume again.

// podsGone returns, for each live raw block publish of v at a path of the
// kubelet's layout, the directory of its pod when that directory is gone
// and the kubelet's pods directory is there (a kubelet directory that is
// missing or not the kubelet's says nothing of any pod). Any other
// failure to look says nothing either.
func (r *Reconciler) podsGone(v *state.Volume) map[string]string {
	var gone map[string]string
	for t, p := range v.Publishes {
		if p.Deleting || p.Access != state.AccessBlock {
			continue
		}
		uid, ok := contract.PodOfTarget(r.cfg.KubeletDir, t)
		if !ok {
			continue
		}
		pods := filepath.Join(r.cfg.KubeletDir, "pods")
		dir := filepath.Join(pods, uid)
		if err := r.cfg.Paths.CheckDir(dir); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := r.cfg.Paths.CheckDir(pods); err != nil {
			continue
		}
		if gone == nil {
			gone = map[string]string{}
		}
		gone[t] = dir
	}
	return gone
}

// orphanedPublishes returns the withdrawal of each raw block publish of v
// whose pod is gone (a.podsGone).
func orphanedPublishes(v *state.Volume, a *actual) []action {
	var acts []action
	for _, t := range v.Targets() {
		if dir, ok := a.podsGone[t]; ok {
			acts = append(acts, action{kind: actWithdrawOrphan, target: t, generation: v.Publishes[t].Generation,
				reason: fmt.Sprintf("its pod's directory %s is gone: the kubelet forgot this raw block publish and will not unpublish it", dir)})
		}
	}
	return acts
}

// withdrawOrphan records the withdrawal of the raw block publish at
// act.target, and of the stage under it when no other publish is left.
func (r *Reconciler) withdrawOrphan(ctx context.Context, v *state.Volume, act action) error {
	stage := false
	_, err := r.cfg.Store.Update(v.ID, func(cur *state.Volume) error {
		stage, _ = cur.WithdrawOrphanedPublish(act.target, act.generation)
		return nil
	})
	if err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Withdrew a raw block publish whose pod is gone, as the kubelet's unpublish would have", "stageWithdrawn", stage)
	return nil
}
