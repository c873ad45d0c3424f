package reconciler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
	"github.com/converge-csi/converge/pkg/status"
)

// soonDelay is how long KickSoon waits for a pass to start by itself. A
// client's next call on a volume (the kubelet's publish after its stage)
// has its intent recorded about 1 ms after the answer before it; a
// verifying pass that starts just before that intent makes the call wait
// for a second pass (seen in every publish of a trace at 1 ms). At 3 ms
// the call's own pass starts first and serves the verification too.
const soonDelay = 3 * time.Millisecond

// repeatedFailures is how many failures in a row of one operation make a
// volume DEGRADED: one or two are the ordinary retries of a busy node.
const repeatedFailures = 3

// firstReleasePoll is how soon a pass looks again at a device that waits
// for its last user to go (actual.releasePending); while one waits, the
// wait doubles from pass to pass, up to the resync period.
const firstReleasePoll = 100 * time.Millisecond

// Reconciler converges the actual state to the desired state.
type Reconciler struct {
	cfg   Config
	exec  *executor
	kick  chan struct{}
	ready atomic.Bool
	// wake is when the next pass is due by itself: the earliest end of a
	// backoff, or a look again at a device waiting for its last user (zero
	// for none). releasePoll is the current wait for such a device (zero
	// while none waits). Only the goroutine running passes uses them.
	wake        time.Time
	releasePoll time.Duration
	// reported maps a volume to the reason of the abnormal condition last
	// logged for it; only the goroutine running passes uses it.
	reported map[string]string
	// soonMu guards soon, which is true while a KickSoon waits.
	soonMu sync.Mutex
	soon   bool
	// soonDelay is how long KickSoon waits (the tests change it).
	soonDelay time.Duration
	// statusMu guards status, the volumes as of the last pass.
	statusMu sync.Mutex
	status   []status.VolumeStatus

	// fulfilled maps a volume and intent to the generation at which the
	// intent was last seen fulfilled, so that a mount lost later is told
	// from one not made yet; only the goroutine running passes uses it.
	fulfilled map[string]map[state.IntentKey]int64
}

// New validates cfg, fills defaults and returns a Reconciler.
func New(cfg Config) (*Reconciler, error) {
	if cfg.Store == nil || cfg.Observer == nil || cfg.Loops == nil || cfg.Filesystems == nil ||
		cfg.Paths == nil || cfg.Images == nil || cfg.ImagePromise == nil || cfg.Snapshots == nil {
		return nil, errors.New("reconciler: store, observer, loops, filesystems, paths, images, grower and snapshots are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Recorder == nil {
		cfg.Recorder = noRecorder{}
	}
	if cfg.ResyncPeriod <= 0 {
		cfg.ResyncPeriod = DefaultResyncPeriod
	}
	if cfg.FastWorkers <= 0 {
		cfg.FastWorkers = DefaultFastWorkers
	}
	if cfg.SlowWorkers <= 0 {
		cfg.SlowWorkers = DefaultSlowWorkers
	}
	if cfg.BackoffInitial <= 0 {
		cfg.BackoffInitial = DefaultBackoffInitial
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = DefaultBackoffMax
	}
	return &Reconciler{
		cfg:       cfg,
		exec:      newExecutor(cfg.Clock, cfg.FastWorkers, cfg.SlowWorkers, cfg.BackoffInitial, cfg.BackoffMax),
		kick:      make(chan struct{}, 1),
		soonDelay: soonDelay,
		reported:  map[string]string{},
		fulfilled: map[string]map[state.IntentKey]int64{},
	}, nil
}

// Kick asks for a pass as soon as possible. Kicks coalesce: any number of
// kicks before the next pass cause one pass.
func (r *Reconciler) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// KickSoon asks for a pass within soonDelay; a pass that starts meanwhile,
// for any reason, serves it. It is for what follows the plugin's own work
// (an operation's end, the mount table changing under it), which needs a
// pass but not at once: the request just answered, and its client, get the
// CPU first on a small node, and the completions and mount events of a
// burst share one pass rather than each starting its own. Requests kick at
// once.
func (r *Reconciler) KickSoon() {
	r.soonMu.Lock()
	defer r.soonMu.Unlock()
	if r.soon {
		return
	}
	r.soon = true
	r.cfg.Clock.AfterFunc(r.soonDelay, func() {
		r.soonMu.Lock()
		soon := r.soon
		r.soon = false
		r.soonMu.Unlock()
		if soon {
			r.Kick()
		}
	})
}

// Ready reports whether start-up reconstruction has finished: a pass found
// nothing to start and no operation running (operations waiting out a
// backoff do not hold readiness back).
func (r *Reconciler) Ready() bool { return r.ready.Load() }

// Run reconciles until ctx ends, then waits for running operations to
// finish and returns. Mounts are left in place.
func (r *Reconciler) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("reconciler")
	ctx = klog.NewContext(ctx, logger)
	ticker := r.cfg.Clock.NewTicker(r.cfg.ResyncPeriod)
	defer ticker.Stop()
	var timer clock.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		r.exec.wait()
		logger.V(2).Info("Reconciler stopped")
	}()
	for {
		started, err := r.Pass(ctx)
		if err != nil {
			logger.Error(err, "Cannot observe the machine; skipping pass")
		}
		if !r.ready.Load() && err == nil && started == 0 && r.exec.idle() {
			r.ready.Store(true)
			logger.Info("Start-up reconstruction finished")
		}
		var wakeC <-chan time.Time
		if timer != nil {
			timer.Stop()
			timer = nil
		}
		if !r.wake.IsZero() {
			timer = r.cfg.Clock.NewTimer(r.wake.Sub(r.cfg.Clock.Now()))
			wakeC = timer.C()
		}
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-ticker.C():
		case <-wakeC:
		}
	}
}

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
	epoch := r.exec.epoch()

	// Observe. Intents first, then the machine: the observation must be at
	// least as new as the intents it is compared with. The other way round,
	// an intent written during the observation would be judged against a
	// machine as it was before, say, a mount was removed, and could be
	// refused for good.
	vols := r.cfg.Store.List()
	snap, err := r.cfg.Observer.Observe()
	if err != nil {
		return 0, err
	}
	// Plan.
	seen, plans := r.plan(vols, snap)
	r.pollReleases(seen)
	// Report.
	statuses := make([]status.VolumeStatus, 0, len(seen))
	for _, s := range seen {
		stale := r.exec.stale(s.v.ID, epoch)
		if !stale {
			// A failure counts while its action is planned: not once its
			// intent changed, was withdrawn or was fulfilled otherwise.
			r.exec.prune(s.v.ID, s.acts)
		}
		statuses = append(statuses, r.publishResults(ctx, s.v, s.a, stale))
	}
	r.forgetGone(vols, plans)
	// Start.
	started := r.startPlans(ctx, plans, epoch)

	slices.SortFunc(statuses, func(a, b status.VolumeStatus) int { return strings.Compare(a.ID, b.ID) })
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

// plan derives the actual state of every recorded volume from snap (seen,
// with the actions each needs) and returns, for each volume and each
// orphaned device that needs one, its next action.
func (r *Reconciler) plan(vols []*state.Volume, snap *host.Snapshot) (seen, plans []plan) {
	staged := make(map[string]bool, len(vols))
	for _, v := range vols {
		staged[v.ID] = v.Stage != nil
	}
	for id, a := range orphans(snap, r.cfg.Images, staged) {
		plans = append(plans, plan{v: &state.Volume{ID: id}, a: a, act: action{kind: actRelease, reason: "no stage references the device"}})
	}
	for _, v := range vols {
		a := observeVolume(v, r.cfg.Images.Path(v.ID), snap, r.cfg.Observer.CheckMount, r.cfg.Roots, r.staticDevice(v))
		a.pool = snap.Pool()
		a.poolGuard = r.cfg.PoolGuard.Threshold(a.pool.Total)
		a.snapshotsTaken = r.takenSnapshots(v)
		acts := diff(v, a)
		seen = append(seen, plan{v: v, a: a, acts: acts})
		if len(acts) > 0 {
			plans = append(plans, plan{v: v, a: a, act: acts[0]})
		}
	}
	return seen, plans
}

// forgetGone drops what the reconciler keeps of volumes that are neither
// recorded nor planned for any more.
func (r *Reconciler) forgetGone(vols []*state.Volume, plans []plan) {
	ids := make(map[string]bool, len(vols)+len(plans))
	for _, v := range vols {
		ids[v.ID] = true
	}
	for _, p := range plans {
		ids[p.v.ID] = true
	}
	r.exec.forget(func(id string) bool { return ids[id] })
	for id := range r.reported {
		if !ids[id] {
			delete(r.reported, id)
		}
	}
	for id := range r.fulfilled {
		if !ids[id] {
			delete(r.fulfilled, id)
		}
	}
}

// startPlans starts the planned actions that are not blocked, teardowns
// first, and notes in r.wake the earliest end of a backoff in the way.
func (r *Reconciler) startPlans(ctx context.Context, plans []plan, epoch uint64) int {
	started := 0
	for _, teardown := range []bool{true, false} {
		for _, p := range plans {
			if p.act.kind.spec().teardown != teardown {
				continue
			}
			busy, retryAt := r.exec.blocked(p.v.ID, p.act, epoch)
			if busy {
				r.wakeBy(retryAt)
				continue
			}
			r.startOp(ctx, p.v, p.a, p.act)
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
func (r *Reconciler) staticDevice(v *state.Volume) *host.Loop {
	if v.Stage == nil || v.Stage.Device == "" || r.cfg.Static == nil {
		return nil
	}
	l, err := r.cfg.Static.Resolve(v.Stage.Device)
	if err != nil {
		return nil
	}
	return &l
}

// publishResults reports, for each live intent of v, whether it is
// fulfilled and, if not, its latest failure or what it waits for; and the
// volume's condition, logged at each change. It returns v's status. An
// observation older than v's last finished operation (stale) reports
// nothing: that operation reported what it did, which such an observation
// may not show.
func (r *Reconciler) publishResults(ctx context.Context, v *state.Volume, a *actual, stale bool) status.VolumeStatus {
	seen := r.fulfilled[v.ID]
	if seen == nil {
		seen = map[state.IntentKey]int64{}
		r.fulfilled[v.ID] = seen
	}
	lost := func(key state.IntentKey, gen int64) bool { return seen[key] == gen }
	cond := r.withFailures(v, condition(v, a, lost))
	if stale {
		return r.volumeStatus(v, a, cond)
	}
	report := func(key state.IntentKey, gen int64, ready bool) {
		if ready {
			seen[key] = gen
		} else if seen[key] != gen {
			delete(seen, key)
		}
		res := state.Result{Generation: gen, Ready: ready}
		if !ready {
			if f := r.exec.lastFailure(v.ID, key, gen); f != nil {
				res.Err, res.Attempts, res.NextRetry = f.err, f.attempts, f.next
			} else if cond.Abnormal {
				res.Waiting = cond.Message
			}
		}
		r.cfg.Store.SetResult(v.ID, key, res)
	}
	if st := v.Stage; st != nil {
		report(state.StageKey, st.Generation, !st.Deleting && stageReady(v, a))
	}
	healthy := stageReady(v, a) && !cond.Abnormal
	for t, p := range v.Publishes {
		ready := publishReady(v, a, t)
		report(state.PublishKey(t), p.Generation, ready)
		healthy = healthy && ready
	}
	if e := v.Expand; e != nil {
		report(state.ExpandKey, e.Generation, expandReady(v, a))
	}
	for id, s := range v.Snapshots {
		// Fulfilled when it is forgotten: only its failures are reported.
		report(state.SnapshotKey(id), s.Generation, false)
	}
	if healthy {
		r.exec.healthy(v.ID)
	}
	r.cfg.Store.SetCondition(v.ID, cond)
	r.logCondition(klog.FromContext(ctx), v.ID, cond)
	return r.volumeStatus(v, a, cond)
}

// withFailures adds to the condition of a live stage what its operations'
// failures say: a lost filesystem (DATA_LOSS), a growth that keeps failing,
// or any operation failing repeatedly (DEGRADED).
func (r *Reconciler) withFailures(v *state.Volume, cond state.Condition) state.Condition {
	st := v.Stage
	if st == nil || st.Deleting {
		return cond
	}
	if f := r.exec.lastFailure(v.ID, state.StageKey, st.Generation); f != nil && f.err.Kind == state.KindDataLoss {
		cond.Abnormal, cond.Health, cond.Reason, cond.Message = true, state.DataLost, "FilesystemMissing", f.err.Message
		return cond
	}
	f := r.exec.latestFailure(v.ID)
	if f == nil || cond.Abnormal {
		return cond
	}
	switch {
	case f.act.key() == state.ExpandKey && f.final:
		cond.Abnormal, cond.Health, cond.Reason = true, state.Degraded, "GrowFailed"
		cond.Message = fmt.Sprintf("%s of volume %s failed (%s); tried again when the expansion is asked for again; its mounts and data are untouched",
			f.act, v.ID, f.err.Message)
	case f.act.key() == state.ExpandKey:
		cond.Abnormal, cond.Health, cond.Reason = true, state.Degraded, "GrowFailed"
		cond.Message = fmt.Sprintf("growing volume %s failed %d times (%s); retrying at %s; its mounts are untouched",
			v.ID, f.attempts, f.err.Message, f.next.Format(time.RFC3339))
	case f.attempts >= repeatedFailures:
		cond.Abnormal, cond.Health, cond.Reason = true, state.Degraded, "OperationFailing"
		cond.Message = fmt.Sprintf("%s of volume %s failed %d times in a row (%s); retrying at %s",
			f.act, v.ID, f.attempts, f.err.Message, f.next.Format(time.RFC3339))
	}
	return cond
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

// startOp runs the operation for act in the executor.
func (r *Reconciler) startOp(ctx context.Context, v *state.Volume, a *actual, act action) {
	spec := act.kind.spec()
	logger := klog.FromContext(ctx).WithValues("volumeID", v.ID, "action", spec.name)
	if act.target != "" {
		logger = logger.WithValues("targetPath", act.target)
	}
	logger.V(2).Info("Starting operation", "reason", act.reason, "generation", act.generation)
	// A stage or publish of an intent already seen fulfilled makes again
	// what was lost.
	repairing := spec.fulfils && act.generation != 0 && r.fulfilled[v.ID][act.key()] == act.generation
	begin := r.cfg.Clock.Now()
	op := func() outcome { return outcomeOf(act, spec.run(ctx, r, v, a, act), repairing) }
	r.exec.start(ctx, v.ID, act, op, func(out outcome, f *failure) {
		if out.err == nil && (repairing || spec.counted) {
			r.cfg.Recorder.Repaired(spec.name)
		}
		r.cfg.Recorder.OperationDone(spec.name, out.result(), r.cfg.Clock.Since(begin))
		r.carryOut(logger, v, act, out, f)
	})
}
