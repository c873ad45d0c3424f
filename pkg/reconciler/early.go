package reconciler

import (
	"context"
	"errors"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/locks"
	"github.com/converge-csi/converge/pkg/reconciler/claim"
	"github.com/converge-csi/converge/pkg/state"
)

// A request's early start.
//
// A request that records an intent asks for its volume's next step at once
// (Start), rather than for the next full pass: the step is decided from an
// observation of that volume made after the intent was recorded, by the
// same planVolume and diff a pass runs, and taken through the volume's
// claim the way a pass takes it (take), so that one operation at most runs
// per volume whoever started it. The full pass keeps everything else: the
// volumes no request names (orphaned devices, repairs, backoffs that end),
// the group snapshots, which hold several volumes, the results and
// conditions of every intent, and the check, after the fact, of what early
// starts did.
//
// It observes through Observer.ObserveVolume rather than the pass's
// Observe, because a request's step must not wait for nor pay a read of
// the whole mount table and every loop device; what only that read finds
// (a device not known yet) is left to the pass.
//
// The rules that span volumes (docs/architecture.md, "Early starts", says
// how each is kept), and the tests that fail when one is broken:
//   - One operation per volume: TestPassWaitsForAnEarlyStartedOperation,
//     TestEarlyStartWaitsForItsVolume, and pkg/reconciler/claim's tests.
//   - No decision on an observation older than an operation that ended:
//     TestEarlyStartLooksAgainAfterAnOperationEndsDuringItsObservation
//     (TestStaleObservationStartsNothing for a pass).
//   - An orphaned device is released only by a pass, through the volume's
//     claim: TestOrphanedDeviceIsReleasedOnlyByAPass.
//   - A stage before its publishes, and a volume's publishes torn down
//     before its stage: TestEarlyStartLeavesTheStageToThePass,
//     TestEarlyStartTearsDownPublishesBeforeTheStage.
//   - A group snapshot starts only from a pass, and waits for its members'
//     own work: TestEarlyStartLeavesAGroupSnapshotToThePass,
//     TestEarlyStartOfAMemberWaitsForItsGroup,
//     TestGroupYieldsToItsMembersOwnWork.
//   - A stage sees every device attached to the image, so it starts only
//     from a pass (earlyKind): TestEarlyStartLeavesTheStageToThePass.
//
// TestEarlyStartAndPassNeverOverlap runs them all at once.

// earlyTries bounds how often an early start observes again when an
// operation of its volume finished during its observation.
const earlyTries = 3

// early is the state of the early starts.
type early struct {
	// run guards ctx: early starts hold it for reading while they start
	// an operation, and Run's end takes it to stop them, so that no
	// operation starts once Run waits for them.
	run locks.RWMutex
	ctx context.Context

	// mu guards devices and pending. It may be held while the claims'
	// (claim.Set) is taken, never the other way round.
	mu locks.Mutex
	// devices maps a volume to the loop devices last found attached to
	// its image (by a pass, or by its stage's attach): the devices its
	// early start reads, rather than every device of the machine.
	devices map[string][]string
	// pending holds the volumes whose early start found an operation of
	// theirs running: they are started again when it ends.
	pending map[string]bool
}

func newEarly() early {
	return early{devices: map[string][]string{}, pending: map[string]bool{}}
}

// Start asks for volume id's next step to start now, from a fresh
// observation of the volume, rather than at the next pass; the request that
// recorded an intent of id calls it. Before start-up reconstruction has
// finished, or when the volume's next step is not one an early start takes
// (a stage, a group snapshot, a volume with no device known, nothing to do,
// a backoff), it asks for a pass instead (Kick). The operation runs on the
// caller's goroutine: Start returns once it is done, and the request's
// answer does not wait for that.
func (r *Reconciler) Start(id string) { r.start(id, false) }

// restart is Start for a volume whose early start found an operation of
// it running, called at that operation's end. When it finds nothing to do
// (the volume converged, its record forgotten by a last teardown or left
// idle by it), the pass has nothing to take but the check of what the
// operation did, which the operation's end asked for already (KickSoon):
// it kicks no pass more. Any other step left to the pass is kicked at
// once, as Start does.
func (r *Reconciler) restart(id string) { r.start(id, true) }

func (r *Reconciler) start(id string, restarted bool) {
	run, why := r.claimEarly(id)
	switch {
	case why == nothingToDo:
		r.cfg.Recorder.EarlyStart(EarlyNothingToDo)
	case why != "":
		r.cfg.Recorder.EarlyStart(EarlyLeftToPass)
	case run == nil:
		r.cfg.Recorder.EarlyStart(EarlyWaited)
	default:
		r.cfg.Recorder.EarlyStart(EarlyStarted)
	}
	if why != "" {
		klog.Background().V(4).Info("Leaving the volume's step to the next pass", "volumeID", id, "reason", why)
		if restarted && why == nothingToDo {
			r.KickSoon()
		} else {
			r.Kick()
		}
		return
	}
	if run != nil {
		// On this goroutine, the request's own: a goroutine more would
		// be one more to schedule on a small node's CPUs, where the
		// request, back from its fdatasync, waits for one.
		run()
	}
}

// claimEarly decides and claims volume id's next step. run is the
// operation to run, or nil when one of the volume's runs and the volume is
// started again when it ends; why says, when not empty, why the step is
// left to the pass. The operation is counted before Run can stop
// (early.run), so that Run waits for it.
func (r *Reconciler) claimEarly(id string) (run func(), why string) {
	r.early.run.RLock()
	defer r.early.run.RUnlock()
	ctx := r.early.ctx
	if ctx == nil || ctx.Err() != nil || !r.ready.Load() {
		return nil, "start-up reconstruction has not finished, or the reconciler stops"
	}
	for range earlyTries {
		epoch := r.claims.Epoch()
		p, why := r.planEarly(id)
		if why != "" {
			return nil, why
		}
		act := p.acts[0]
		var c *claim.Claim
		var h hold
		if earlyKind(act.kind) {
			c, h, _ = r.take(id, act, epoch)
		} else if h = holdOf(r.claims.State(id, epoch)); h == notHeld {
			// A step the pass takes, on a volume no operation holds and
			// none changed since the record was read. One that finished
			// since (a stage that recorded its provenance) is looked at
			// again, as a claim would; one that runs starts it again.
			return nil, "the pass takes " + act.String()
		}
		// A step the pass takes, planned from an observation made while
		// an operation of the volume runs, is looked at again when it
		// ends, as any step of a busy volume.
		switch h {
		case notHeld:
			return r.beginOp(ctx, c, p.v, p.a, act, r.afterOp), ""
		case heldRunning:
			r.early.setPending(id)
			if r.claims.State(id, epoch) == claim.Running || !r.early.takePending(id) {
				// The running operation's end starts it again.
				return nil, ""
			}
			// It ended meanwhile, without seeing the mark: look again.
		case heldStale:
			// An operation ended during the observation: look again.
		default:
			return nil, act.String() + " waits out its backoff"
		}
	}
	return nil, "operations of the volume kept ending during its observation"
}

// planEarly reads volume id's record, observes the volume for its early
// start and returns what it needs; why says, when not empty, why that is
// nothing an early start takes. The caller reads the epoch before.
func (r *Reconciler) planEarly(id string) (p plan, why string) {
	v, err := r.cfg.Store.Get(id)
	if errors.Is(err, state.ErrNotFound) {
		// Forgotten whole (its last teardown done).
		return plan{}, nothingToDo
	}
	if err != nil {
		return plan{}, err.Error()
	}
	if idle(v) {
		return plan{}, nothingToDo
	}
	obs, err := r.observeFor(v)
	if err != nil {
		return plan{}, err.Error()
	}
	if p = r.planVolume(v, obs, false); len(p.acts) == 0 {
		return plan{}, nothingToDo
	}
	return p, ""
}

// nothingToDo is why an early start that found its volume converged
// leaves it to the pass (which reports its intents' results).
const nothingToDo = "nothing to do"

// idle reports whether v's record holds nothing diff acts on, whatever is
// observed: no stage, no publish, no snapshot, no freeze (its
// provisioning and provenance kept after its last teardown). An orphaned
// device of its image is released by a pass alone. Said before any
// observation: the restart after a volume's last unstage found its device
// gone and, leaving the step to the pass for want of a device, kicked a
// pass at once, 10-15 passes more in a teardown of 100 volumes.
func idle(v *state.Volume) bool {
	return !v.HasNodeIntent() && len(v.Snapshots) == 0 && v.Frozen == ""
}

// earlyKind reports whether an early start takes an action of kind k.
// A group snapshot holds several volumes: the pass, which sees them all,
// starts it. A stage mounts the volume's filesystem: it must see every
// device attached to the image (two devices would let one filesystem be
// mounted twice, which corrupts it), and an early start reads only those
// it knows of, so the pass, which reads every one, starts it too.
func earlyKind(k actionKind) bool {
	return k != actTakeGroupSnapshot && k != actStage
}

// observeFor observes the machine for v's early start: the loop devices
// last found attached to v's image (or a static volume's device), the
// mounts of their filesystems and what is mounted at v's staging path and
// targets, read anew. It fails (errNoDevicesKnown) when no device is
// known, or none of those known is attached to the image any more, and
// the pass decides.
func (r *Reconciler) observeFor(v *state.Volume) (*host.Observation, error) {
	static := v.Stage != nil && v.Stage.Device != ""
	loops := r.early.devicesOf(v.ID)
	if len(loops) == 0 && !static {
		return nil, errNoDevicesKnown
	}
	var devs []host.DevNum
	if d := r.staticDevice(v); d != nil {
		devs = append(devs, d.Dev)
	}
	paths := make([]string, 0, 1+len(v.Publishes))
	if v.Stage != nil {
		paths = append(paths, v.Stage.Path)
	}
	for t := range v.Publishes {
		paths = append(paths, t)
	}
	obs, err := r.cfg.Observer.ObserveVolume(loops, devs, paths)
	if err != nil {
		return nil, err
	}
	_, home := r.poolOf(v)
	if !static && len(obs.LoopsFor(home.Image(v.ID))) == 0 {
		return nil, errNoDevicesKnown
	}
	return obs, nil
}

// errNoDevicesKnown: the loop devices of a volume's image are not known
// (none attached when a pass last looked, and no attach since), or none of
// those known is attached to it any more. Finding them means reading every
// loop device of the machine, a full observation: that is left to the
// pass, which a request then asks for. A first stage is so decided; its
// mkfs takes far longer than the pass it waits for, and a burst of stages
// shares one pass rather than each observing every device.
var errNoDevicesKnown = errors.New("no loop device of the volume's image is known")

// afterOp starts again, at the end of an operation, the volumes it held
// whose early start found it running.
func (r *Reconciler) afterOp(id string, act action) {
	for _, held := range act.volumes(id) {
		if r.early.takePending(held) {
			// On a goroutine of its own: on this one, a volume asked
			// for again and again would nest each operation in the
			// end of the one before, and a group's members would
			// start one after the other.
			r.exec.spawn(func() { r.restart(held) })
		}
	}
}

// learnDevices keeps, for each volume a pass saw or planned for (orphaned
// devices included), the loop devices attached to its image, as the pass
// observed them at epoch. A volume the pass saw none for keeps those it
// had when an operation of it ran since epoch: a stage that attached its
// device after the observation noted it (noteDevice), and the pass must not
// forget it, or the publish that follows would wait for the next pass.
func (r *Reconciler) learnDevices(plans, seen []plan, epoch claim.Epoch) {
	devs := make(map[string][]string, len(seen))
	for _, ps := range [][]plan{seen, plans} {
		for _, p := range ps {
			if a := p.a; a.loop != nil && !a.static {
				devs[p.v.ID] = append([]string{a.loop.Device}, a.extraLoops...)
			}
		}
	}
	r.early.mu.Lock()
	defer r.early.mu.Unlock()
	for id, old := range r.early.devices {
		if _, ok := devs[id]; !ok && r.claims.State(id, epoch) != claim.Free {
			devs[id] = old
		}
	}
	r.early.devices = devs
}

// noteDevice records that dev was just attached to volume id's image.
func (r *Reconciler) noteDevice(id, dev string) {
	r.early.mu.Lock()
	defer r.early.mu.Unlock()
	r.early.devices[id] = []string{dev}
}

func (e *early) open(ctx context.Context) {
	e.run.Lock()
	defer e.run.Unlock()
	e.ctx = ctx
}

// close stops the early starts; the ones under way have started their
// operations when it returns.
func (e *early) close() {
	e.run.Lock()
	defer e.run.Unlock()
	e.ctx = nil
}

func (e *early) devicesOf(id string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.devices[id]
}

func (e *early) setPending(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pending[id] = true
}

// takePending clears id's mark and reports whether it was set.
func (e *early) takePending(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	was := e.pending[id]
	delete(e.pending, id)
	return was
}
