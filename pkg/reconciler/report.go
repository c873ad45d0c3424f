package reconciler

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/state"
	"github.com/converge-csi/converge/pkg/volstatus"
)

// report reports, for each live intent of v, whether it is
// fulfilled and, if not, its latest failure or what it waits for; and the
// volume's condition, logged at each change. It returns v's volstatus. An
// observation older than v's last finished operation (stale) reports
// nothing: that operation reported what it did, which such an observation
// may not show.
func (r *Reconciler) report(ctx context.Context, v *state.Volume, a *actual, stale bool) volstatus.VolumeStatus {
	r.fulfilledMu.Lock()
	defer r.fulfilledMu.Unlock()
	seen := r.fulfilled[v.ID]
	if seen == nil {
		seen = map[state.IntentKey]int64{}
		r.fulfilled[v.ID] = seen
	}
	lost := func(key state.IntentKey, gen int64) bool { return seen[key] == gen }
	cond := condition(v, a, lost, r.exec.latestFailure(v.ID))
	if stale {
		return r.volumeStatus(v, a, cond)
	}
	// The condition comes before the results: a result of an intent's
	// generation tells NodeGetVolumeStats that the condition speaks of
	// its path.
	r.cfg.Store.SetCondition(v.ID, cond)
	r.logCondition(klog.FromContext(ctx), v.ID, cond)
	result := func(key state.IntentKey, gen int64, ready bool) {
		if ready {
			seen[key] = gen
		} else if seen[key] != gen {
			delete(seen, key)
		}
		r.cfg.Store.SetResult(v.ID, key, r.result(v, a, cond, key, gen, ready))
	}
	if st := v.Stage; st != nil {
		result(state.StageKey, st.Generation, !st.Deleting && stageReady(v, a))
	}
	healthy := stageReady(v, a) && !cond.Abnormal
	for t, p := range v.Publishes {
		ready := publishReady(v, a, t)
		result(state.PublishKey(t), p.Generation, ready)
		healthy = healthy && ready
	}
	if e := v.Expand; e != nil {
		result(state.ExpandKey, e.Generation, expandReady(v, a))
	}
	if l := v.IOLimits; l != nil {
		result(state.IOLimitsKey, l.Generation, ioLimitsReady(v, a))
	}
	if held := noteIOLimitsHeld(r.ioHeld[v.ID], v, a); len(held) > 0 {
		r.ioHeld[v.ID] = held
	} else {
		delete(r.ioHeld, v.ID)
	}
	for id, s := range v.Snapshots {
		// Fulfilled when it is forgotten: only its failures are reported.
		result(state.SnapshotKey(id), s.Generation, false)
	}
	if healthy {
		r.exec.healthy(v.ID)
	}
	return r.volumeStatus(v, a, cond)
}

// result is the result of v's intent key at generation gen: ready, or
// its latest failure, or what it waits for (an abnormal condition's
// message, a device's last user, a pod's cgroup).
func (r *Reconciler) result(v *state.Volume, a *actual, cond state.Condition, key state.IntentKey, gen int64, ready bool) state.Result {
	res := state.Result{Generation: gen, Ready: ready}
	if ready {
		return res
	}
	switch f := r.exec.lastFailure(v.ID, key, gen); {
	case f != nil:
		res.Err, res.Attempts, res.NextRetry = f.err, f.attempts, f.next
	case cond.Abnormal:
		res.Waiting = cond.Message
	case key == state.StageKey:
		res.Waiting = releaseWait(v, a)
	case key == state.IOLimitsKey:
		res.Waiting = ioLimitsWait(v, a)
	}
	return res
}

// releaseWait says what a withdrawn stage waits for when nothing of
// converge's holds its device any more (no publish recorded, no mount of
// an owner not told yet: unstageWhenFree's other reasons) and the device
// was detached but stays attached while another user holds it open: the
// kernel lets it go at that user's last close and tells no one, so the
// passes poll for it (TestReleasePendingIsPolled). "" for anything else.
// NodeUnstageVolume's answer, until then, says so rather than that it
// waits for the reconciler.
func releaseWait(v *state.Volume, a *actual) string {
	if v.Stage == nil || !v.Stage.Deleting || !a.releasePending() || len(v.Publishes) > 0 || len(a.unknownMounts) > 0 {
		return ""
	}
	who := "a mount of it in another mount namespace, or a process holding it open (docs/troubleshooting.md)"
	switch {
	case len(a.foreignMounts) > 0:
		who = "it is mounted at " + strings.Join(a.foreignMounts, ", ") + ", which converge did not mount"
	case a.block:
		who = "for a raw block volume, usually the kubelet's own loop device over the device, which goes at the unpublish; " + who
	}
	return fmt.Sprintf("loop device %s of volume %s is detached and stays attached until its last user closes it: %s", a.loop.Device, v.ID, who)
}

// logCondition logs when a volume's reason changes; the failures behind it
// log each retry.
func (r *Reconciler) logCondition(logger klog.Logger, id string, cond state.Condition) {
	switch prev := r.reported[id]; {
	case cond.Abnormal && prev != cond.Reason:
		logger.Info("Volume is abnormal", "volumeID", id, "reason", cond.Reason, "message", cond.Message)
		r.reported[id] = cond.Reason
	case !cond.Abnormal && prev != "":
		logger.Info("Volume is back to normal", "volumeID", id, "was", prev)
		delete(r.reported, id)
	}
}

// noteIOLimitsHeld returns the notes of which cgroups of the pods of
// v's live publishes hold its IO limits, from the previous notes (held)
// and what a pass saw: a cgroup that holds them is noted at their
// generation; one that does not keeps its note, so that setting them
// again at that generation is known as the repair of a drift
// (findDrifts); a cgroup not seen, or of a pod whose cgroups could not be
// read, is forgotten, as are all of them when v asks for no limits. A
// cgroup never seen holding them (a new container's) gets no note until
// it does.
func noteIOLimitsHeld(held map[string]int64, v *state.Volume, a *actual) map[string]int64 {
	if v.IOLimits == nil || a.io == nil {
		return nil
	}
	want, gen := v.WantsIOLimits(), v.IOLimits.Generation
	next := map[string]int64{}
	for t, pub := range v.Publishes {
		p := a.io.pod(t)
		if pub.Deleting || p == nil || p.err != "" {
			continue
		}
		for d, l := range p.cgroups {
			if l == want {
				next[d] = gen
			} else if g, ok := held[d]; ok {
				next[d] = g
			}
		}
	}
	return next
}
