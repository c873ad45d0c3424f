package reconciler

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/locks"
	"github.com/converge-csi/converge/pkg/reconciler/claim"
	"github.com/converge-csi/converge/pkg/state"
	"github.com/converge-csi/converge/pkg/volstatus"
)

// soonDelay is how long KickSoon waits for a pass to start by itself: the
// pass that verifies what an operation did and takes the volume's next
// step. Requests start their own steps (early.go); a stage, the pass's,
// is followed by the kubelet's publish a moment after its answer, and a
// verifying pass that started just before that intent made the publish
// wait for a second pass when publishes were the pass's too. This delay
// keeps the two apart and costs a burst nothing measurable
// (docs/performance.md, "Figures behind the code's choices").
const soonDelay = 3 * time.Millisecond

// soonMax bounds how long KickSoon's pass waits while KickSoons keep
// coming: each pushes the pass back by soonDelay, so that a burst of
// operations ending one after another (a teardown of a hundred volumes
// ends one every half millisecond) is verified by a pass every soonMax
// rather than by passes back to back, each reading the whole mount table
// and every loop device while the burst's unmounts wait for the same
// kernel locks.
const soonMax = 30 * time.Millisecond

// Reconciler converges the actual state to the desired state.
type Reconciler struct {
	cfg  Config
	exec *executor
	// claims holds the volumes operations run on: the one way a pass and
	// an early start take a volume (take).
	claims *claim.Set
	kick   chan struct{}
	ready  atomic.Bool
	// wake is when the next pass is due by itself: the earliest end of a
	// backoff, or a look again at a device waiting for its last user (zero
	// for none). releasePoll is the current wait for such a device (zero
	// while none waits). Only the goroutine running passes uses them.
	wake        time.Time
	releasePoll time.Duration
	// reported maps a volume to the reason of the abnormal condition last
	// logged for it; only the goroutine running passes uses it.
	reported map[string]contract.Reason
	// soonMu guards soon, which is true while a KickSoon waits, soonFirst,
	// when the first of the KickSoons it serves came, and soonTimer.
	soonMu    locks.Mutex
	soon      bool
	soonFirst time.Time
	soonTimer clock.Timer
	// soonDelay and soonMax are how long KickSoon waits (the tests change
	// them).
	soonDelay, soonMax time.Duration
	// statusMu guards status, the volumes as of the last pass.
	statusMu locks.Mutex
	status   []volstatus.VolumeStatus

	// fulfilledMu guards fulfilled, which maps a volume and intent to the
	// generation at which the intent was last seen fulfilled, so that a
	// mount lost later is told from one not made yet. Passes write it;
	// early starts read it.
	// It guards ioHeld too, which maps a volume and a cgroup of the pods
	// of its live publishes to the generation of the IO limits that
	// cgroup was last seen holding: a cgroup that loses them at that
	// generation drifted (action.drift); one never seen holding them is
	// new.
	fulfilledMu locks.Mutex
	fulfilled   map[string]map[state.IntentKey]int64
	ioHeld      map[string]map[string]int64

	// cgroupsMissingMu guards cgroupsMissing, which maps a volume and the
	// UID of a pod of its live publishes to when an observation first
	// found no cgroup of that pod (observeIO). Passes and early starts
	// write it; it is taken alone, never with another lock.
	// It guards clearsFailed too, which holds, for a volume, the UIDs of
	// the pods of its withdrawn publishes whose IO limits a clear failed
	// to remove (clearIOLimits): their unpublishes go ahead without
	// another try.
	// It guards podsMissing too, which maps a volume and the target of
	// one of its live raw block publishes to when an observation first
	// found that publish's pod directory missing (podsGone).
	cgroupsMissingMu locks.Mutex
	cgroupsMissing   map[string]map[string]time.Time
	clearsFailed     map[string]map[string]bool
	podsMissing      map[string]map[string]time.Time

	// early is what a request's early start (Start) needs: see early.go.
	early early
}

// New validates cfg, fills defaults and returns a Reconciler.
func New(cfg Config) (*Reconciler, error) {
	if cfg.Store == nil || cfg.Observer == nil || cfg.Loops == nil || cfg.Filesystems == nil ||
		cfg.Paths == nil || len(cfg.Pools) == 0 {
		return nil, errors.New("reconciler: store, observer, loops, filesystems, paths and pools are required")
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
		exec:      newExecutor(cfg.Clock, cfg.FastWorkers, cfg.SlowWorkers, cfg.BackoffInitial, cfg.BackoffMax, cfg.spawn),
		claims:    claim.NewSet(),
		kick:      make(chan struct{}, 1),
		soonDelay: soonDelay,
		soonMax:   soonMax,
		reported:  map[string]contract.Reason{},
		fulfilled: map[string]map[state.IntentKey]int64{},
		ioHeld:    map[string]map[string]int64{},
		early:     newEarly(),

		cgroupsMissing: map[string]map[string]time.Time{},
		clearsFailed:   map[string]map[string]bool{},
		podsMissing:    map[string]map[string]time.Time{},
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

// KickSoon asks for a pass once KickSoons pause for soonDelay, and at most
// soonMax after the first of them; a pass that starts meanwhile, for any
// reason, serves it. It is for what follows the plugin's own work (an
// operation's end, the mount table changing under it), which needs a pass
// but not at once: the request just answered, and its client, get the CPU
// first on a small node, and the completions and mount events of a burst
// share one pass rather than each starting its own. Requests kick at once.
func (r *Reconciler) KickSoon() {
	r.soonMu.Lock()
	defer r.soonMu.Unlock()
	now := r.cfg.Clock.Now()
	if !r.soon {
		r.soon, r.soonFirst = true, now
		if r.soonTimer != nil {
			r.soonTimer.Stop()
		}
		r.soonTimer = r.cfg.Clock.AfterFunc(r.soonDelay, r.soonDue)
		return
	}
	r.soonTimer.Reset(min(r.soonDelay, max(0, r.soonFirst.Add(r.soonMax).Sub(now))))
}

// soonDue kicks the pass KickSoon waits for, unless a pass served it.
func (r *Reconciler) soonDue() {
	r.soonMu.Lock()
	soon := r.soon
	r.soon = false
	r.soonMu.Unlock()
	if soon {
		r.Kick()
	}
}

// Ready reports whether start-up reconstruction has finished: a pass found
// nothing to start and no operation running (operations waiting out a
// backoff do not hold readiness back).
func (r *Reconciler) Ready() bool { return r.ready.Load() }

// wait blocks until every operation started has ended.
func (r *Reconciler) wait() { r.exec.wait() }

// Run reconciles until ctx ends, then waits for running operations to
// finish and returns. Mounts are left in place.
func (r *Reconciler) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("reconciler")
	ctx = klog.NewContext(ctx, logger)
	ticker := r.cfg.Clock.NewTicker(r.cfg.ResyncPeriod)
	defer ticker.Stop()
	var timer clock.Timer
	r.early.open(ctx)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		r.early.close()
		r.wait()
		logger.V(2).Info("Reconciler stopped")
	}()
	for {
		started, err := r.Pass(ctx)
		if err != nil {
			logger.Error(err, "Cannot observe the machine; skipping pass")
		}
		if !r.ready.Load() && err == nil && started == 0 && r.claims.Idle() {
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
