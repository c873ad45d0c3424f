package reconciler

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/reconciler/claim"
	"github.com/converge-csi/converge/pkg/state"
	"github.com/converge-csi/converge/pkg/volstatus"
)

// firstReleasePoll is how soon a pass looks again at a device that waits
// for its last user to go (actual.releasePending); while one waits, the
// wait doubles from pass to pass, up to the resync period.
const firstReleasePoll = 100 * time.Millisecond

// Pass observes the machine once, publishes the result of every intent,
// and starts the first action of each volume that needs one and is not
// busy or backing off. It returns the number of operations started, or the
// error that kept it from observing. Teardowns are started before set-ups.
func (r *Reconciler) Pass(ctx context.Context) (int, error) {
	r.wake = time.Time{}
	// This pass serves any KickSoon made before it.
	r.soonMu.Lock()
	r.soon = false
	r.soonMu.Unlock()
	start := r.cfg.Clock.Now()
	epoch := r.claims.Epoch()

	// Observe. Intents first, then the machine: the observation must be at
	// least as new as the intents it is compared with. The other way round,
	// an intent written during the observation would be judged against a
	// machine as it was before, say, a mount was removed, and could be
	// refused for good.
	vols := r.cfg.Store.List()
	obs, err := r.cfg.Observer.Observe()
	if err != nil {
		return 0, err
	}
	// Plan.
	seen, plans := r.plan(vols, obs)
	r.learnDevices(plans, seen, epoch)
	r.pollReleases(seen)
	// Report.
	statuses := make([]volstatus.VolumeStatus, 0, len(seen))
	for _, s := range seen {
		stale := r.claims.ReleasedSince(s.v.ID, epoch)
		if !stale {
			// A failure counts while its action is planned: not once its
			// intent changed, was withdrawn or was fulfilled otherwise.
			r.exec.prune(s.v.ID, s.acts)
		}
		statuses = append(statuses, r.report(ctx, s.v, s.a, stale))
	}
	r.forgetGone(vols, plans, epoch)
	// Start.
	started := r.startPlans(ctx, plans, seen, epoch)

	slices.SortFunc(statuses, func(a, b volstatus.VolumeStatus) int { return strings.Compare(a.ID, b.ID) })
	r.statusMu.Lock()
	r.status = statuses
	r.statusMu.Unlock()
	r.cfg.Recorder.PassDone(r.cfg.Clock.Since(start), statuses, r.exec.inBackoff())
	return started, nil
}

// plan is the next action of one volume, with the record and the actual
// state it was decided on.
type plan struct {
	v   *state.Volume
	a   *actual
	act action
	// acts are all the actions the volume needs, act first (seen only).
	acts []action
}

// plan derives the actual state of every recorded volume from obs (seen,
// with the actions each needs) and returns, for each volume and each
// orphaned device that needs one, its next action.
func (r *Reconciler) plan(vols []*state.Volume, obs *host.Observation) (seen, plans []plan) {
	hasStage := make(map[string]bool, len(vols))
	for _, v := range vols {
		hasStage[v.ID] = v.Stage != nil
	}
	for id, a := range orphans(obs, r.cfg.Pools, hasStage) {
		plans = append(plans, plan{v: &state.Volume{ID: id}, a: a, act: action{kind: actRelease, reason: "no stage references the device"}})
	}
	for _, v := range vols {
		s := r.planVolume(v, obs, true)
		seen = append(seen, s)
		if len(s.acts) > 0 {
			plans = append(plans, plan{v: v, a: s.a, act: s.acts[0]})
		}
	}
	return seen, plans
}

// planVolume derives v's actual state from obs and the actions v needs:
// the one decision of what a volume needs, whether a full pass or a
// request's early start (Start) asks. Only a full pass (full) looks for
// raw block publishes the kubelet forgot: that needs the kubelet's own
// binds, which an early start's observation does not read (podsGone).
func (r *Reconciler) planVolume(v *state.Volume, obs *host.Observation, full bool) plan {
	name, home := r.poolOf(v)
	a := observeVolume(v, home.Image(v.ID), obs, r.cfg.Observer.CheckMount, r.cfg.Roots, r.staticDevice(v))
	a.home, a.pool, a.poolName = home, obs.Pool(name), name
	a.poolGuard = home.Guard().Threshold(a.pool.Total)
	a.snapshotsTaken = takenSnapshots(v, home)
	a.io = r.observeIO(v, a)
	if full {
		a.podsGone = r.podsGone(v, a, obs)
	}
	return plan{v: v, a: a, acts: diff(v, a)}
}

// forgetGone drops what the reconciler keeps of volumes that are neither
// recorded nor planned for any more.
func (r *Reconciler) forgetGone(vols []*state.Volume, plans []plan, epoch claim.Epoch) {
	ids := make(map[string]bool, len(vols)+len(plans))
	for _, v := range vols {
		ids[v.ID] = true
	}
	for _, p := range plans {
		ids[p.v.ID] = true
	}
	keep := func(id string) bool { return ids[id] }
	r.exec.forget(keep)
	r.claims.Forget(keep, epoch)
	for id := range r.reported {
		if !ids[id] {
			delete(r.reported, id)
		}
	}
	r.fulfilledMu.Lock()
	for id := range r.fulfilled {
		if !ids[id] {
			delete(r.fulfilled, id)
		}
	}
	for id := range r.ioHeld {
		if !ids[id] {
			delete(r.ioHeld, id)
		}
	}
	r.fulfilledMu.Unlock()
	r.cgroupsMissingMu.Lock()
	for id := range r.cgroupsMissing {
		if !ids[id] {
			delete(r.cgroupsMissing, id)
		}
	}
	for id := range r.clearsFailed {
		if !ids[id] {
			delete(r.clearsFailed, id)
		}
	}
	for id := range r.podsMissing {
		if !ids[id] {
			delete(r.podsMissing, id)
		}
	}
	r.cgroupsMissingMu.Unlock()
}

// startPlans starts the planned actions that are not blocked, teardowns
// first, and notes in r.wake the earliest end of a backoff in the way.
func (r *Reconciler) startPlans(ctx context.Context, plans, seen []plan, epoch claim.Epoch) int {
	started := 0
	var byID map[string]plan
	for _, teardown := range []bool{true, false} {
		for _, p := range plans {
			if p.act.kind.spec().teardown != teardown {
				continue
			}
			if p.act.kind == actTakeGroupSnapshot {
				if byID == nil {
					byID = plansByID(seen)
				}
				var free bool
				if p.act.members, free = r.groupMembers(p, byID, epoch); !free {
					continue
				}
			}
			c, h, retryAt := r.take(p.v.ID, p.act, epoch)
			if h != notHeld {
				r.wakeBy(retryAt)
				continue
			}
			r.startOp(ctx, c, p.v, p.a, p.act, r.afterOp)
			started++
		}
	}
	return started
}

// wakeBy makes the next pass come by t at the latest (a zero t: no
// change).
func (r *Reconciler) wakeBy(t time.Time) {
	if !t.IsZero() && (r.wake.IsZero() || t.Before(r.wake)) {
		r.wake = t
	}
}

// pollReleases makes a pass come soon when a withdrawn stage's device
// waits for its last user: the kernel clears it at the last close and
// tells no one, and the unstage answers only once a pass sees it gone.
// The wait doubles while a device waits, so that one held for good costs
// a pass per resync period.
func (r *Reconciler) pollReleases(seen []plan) {
	for _, s := range seen {
		if st := s.v.Stage; st != nil && st.Deleting && s.a.releasePending() {
			r.releasePoll = min(max(firstReleasePoll, 2*r.releasePoll), r.cfg.ResyncPeriod)
			r.wakeBy(r.cfg.Clock.Now().Add(r.releasePoll))
			return
		}
	}
	r.releasePoll = 0
}

// staticDevice resolves the device of a static volume; nil when v is not
// one, or its device is not there now (the stage then says why).
func (r *Reconciler) staticDevice(v *state.Volume) *host.Device {
	if v.Stage == nil || v.Stage.Device == "" || r.cfg.Static == nil {
		return nil
	}
	l, err := r.cfg.Static.Resolve(v.Stage.Device)
	if err != nil {
		return nil
	}
	return &l
}
