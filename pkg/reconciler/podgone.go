package reconciler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/host"
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
// volume's deletion refused. A filesystem publish has no such gap: its
// mount stays in the pod's directory, from which the kubelet reconstructs
// it and unpublishes it.
//
// The kubelet removes a pod's directory (<kubelet-dir>/pods/<uid>) only
// once it holds none of its volumes; it makes it before it sets up its
// filesystem volumes, but for a raw block volume possibly only just after
// NodePublishVolume, as it maps the device into the pod (a pod set up
// while the node's network is not ready). While it has the device mapped,
// it binds it at a path of its own, which it removes before its
// NodeUnpublishVolume. So a raw block publish in place, whose pod's
// directory has stayed missing for podGoneGrace and which the kubelet no
// longer binds, is one the kubelet no longer has: the reconciler
// withdraws it, as the kubelet's NodeUnpublishVolume would have, and the
// usual unpublish follows. A kubelet that does come back to it finds its
// call answered at once. The stage is left: the kubelet may still stage
// the volume for another pod, and takes a stage it asked for as made for
// good; the volume's deletion withdraws a stage left without publishes
// (state.WithdrawIdleStage), since a deleted volume serves no pod.

// podGoneGrace is how long a raw block publish's pod directory must stay
// missing before the publish is withdrawn: far past the moment between a
// NodePublishVolume and the kubelet's mapping that makes the directory,
// and past the kubelet's longest backoff (2 minutes 2 seconds) between two
// tries of that mapping. A forgotten volume's deletion waits for it (the
// deletion refuses while the publish is there), so it is no longer than
// that.
const podGoneGrace = 3 * time.Minute

// podsGone returns, for each live raw block publish of v in place
// (a.published) at a path of the kubelet's layout whose pod's directory
// has been missing for podGoneGrace, that directory. A publish whose
// device the kubelet still binds for the pod (contract.BlockDeviceMapPath:
// it removes that bind before its NodeUnpublishVolume) is the kubelet's
// whatever its directories say, as is every publish while the kubelet's
// pods directory is missing (a kubelet directory that is not the
// kubelet's, or a pods filesystem not mounted, says nothing of any pod).
// It notes when each was first seen missing, and forgets those seen
// otherwise; any failure to look says nothing. A full pass alone calls it
// (planVolume): an early start's observation reads no bind of the
// kubelet's.
func (r *Reconciler) podsGone(v *state.Volume, a *actual, obs *host.Observation) map[string]string {
	now := r.cfg.Clock.Now()
	missing := map[string]string{}
	for t, p := range v.Publishes {
		if p.Deleting || p.Access != state.AccessBlock || !a.published(t) {
			continue
		}
		uid, ok := contract.PodOfTarget(r.cfg.KubeletDir, t)
		mapped, okMap := contract.BlockDeviceMapPath(r.cfg.KubeletDir, t)
		if !ok || !okMap {
			continue
		}
		if _, held := obs.MountAt(mapped); held {
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
		missing[t] = dir
	}
	r.cgroupsMissingMu.Lock()
	defer r.cgroupsMissingMu.Unlock()
	prev, next := r.podsMissing[v.ID], map[string]time.Time{}
	var gone map[string]string
	for t, dir := range missing {
		since, ok := prev[t]
		if !ok {
			since = now
		}
		next[t] = since
		if now.Sub(since) >= podGoneGrace {
			if gone == nil {
				gone = map[string]string{}
			}
			gone[t] = dir
		}
	}
	if len(next) == 0 {
		delete(r.podsMissing, v.ID)
	} else {
		r.podsMissing[v.ID] = next
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
				reason: fmt.Sprintf("its pod's directory %s has been gone for %s: the kubelet forgot this raw block publish and will not unpublish it", dir, podGoneGrace)})
		}
	}
	return acts
}

// withdrawOrphan records the withdrawal of the raw block publish at
// act.target, if it is still the one of act's generation.
func (r *Reconciler) withdrawOrphan(ctx context.Context, v *state.Volume, act action) error {
	withdrawn := false
	_, err := r.cfg.Store.Update(v.ID, func(cur *state.Volume) error {
		withdrawn = cur.WithdrawPublish(act.target, act.generation)
		return nil
	})
	if err == nil && withdrawn {
		klog.FromContext(ctx).Info("Withdrew a raw block publish whose pod is gone, as the kubelet's unpublish would have")
	}
	return err
}
