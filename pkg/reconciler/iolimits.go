package reconciler

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
)

// A volume's IO limits (state.Volume.IOLimits) hold the IO of the pods
// that publish it: the record asks for limits at a generation; a pass
// observes, for each pod a publish target names (contract.PodOfTarget),
// the rules in force for the volume's device in each of that pod's
// cgroups (ioActual); diff plans the rules of a live publish's pod set
// where they differ, before the publish's bind mount, and those of a
// withdrawn publish's pod removed, before its unpublish forgets which pod
// it was (tried once, so that it never holds the unpublish:
// clearIOLimits); and the intent state.IOLimitsKey is fulfilled once
// every live publish's pod that has a cgroup holds exactly the limits
// asked for.
//
// The rules go only into the cgroups of pods that publish the volume.
// csi-node's own mkfs, fsck and resize run in csi-node's cgroup, which is
// never one of them, and are not throttled.

// ioActual is what a pass saw of a volume's IO limits: for each pod that
// a publish of the record names, the rules in force for the volume's
// device in its cgroups.
type ioActual struct {
	// unavailable says why this node cannot apply IO limits (no io
	// controller); "" when it can.
	unavailable string
	// podOf maps each recorded target that names a pod to its UID.
	podOf map[string]string
	// pods holds what was seen of each pod, by UID.
	pods map[string]*podIO
	// unknown lists the live targets that name no pod: paths of neither
	// of the kubelet's layouts, whose pod is not guessed.
	unknown []string
}

// podIO is what a pass saw of one pod's cgroups.
type podIO struct {
	// cgroups maps each cgroup of the pod that needs the rules to the
	// rules in force there for the volume's device.
	cgroups map[string]host.IOLimits
	// missing is true when the pod has no cgroup: its containers are not
	// made yet (the kubelet makes the pod's cgroup before it mounts its
	// volumes; a test harness or a static pod may not), or it is gone, or
	// it is not where it is looked for (missingWhy says where that was).
	missing bool
	// missingWhy says where the pod's cgroup was looked for, when missing.
	missingWhy string
	// missingFor is how long a live publish's pod has been seen missing,
	// by the reconciler's clock: past cgroupMissingGrace it is no longer
	// the moment before the kubelet makes the cgroup.
	missingFor time.Duration
	// err says why the pod's cgroups or their rules could not be read.
	err string
	// drifted lists, sorted, the cgroups of the pod that were seen holding
	// the volume's IO limits at the generation asked for and hold other
	// rules now (Reconciler.ioHeld): a drift, whose repair is counted.
	drifted []string
	// notEnabled says why some cgroups of the pod, although they are
	// there, are left out of cgroups: the io controller is not enabled in
	// them (devices.ErrIONotEnabled), so the pod's IO is not limited there
	// and nothing can be written until it is; "" when none is so.
	notEnabled string
	// clearFailed is true when a clear of the volume's rules from the
	// pod's cgroups, for a withdrawn publish, was tried and failed
	// (clearIOLimits): the pod's withdrawn publishes are unpublished
	// without another.
	clearFailed bool
}

// holds reports whether every cgroup of a pod seen holds exactly l; a
// cgroup without the io controller is none seen (see notEnabled).
func (p *podIO) holds(l host.IOLimits) bool {
	for _, got := range p.cgroups {
		if got != l {
			return false
		}
	}
	return true
}

// observeIO reads the rules in force for the volume's device in the
// cgroups of the pods its publishes name; nil for a volume whose record
// never asked for limits, which costs nothing.
func (r *Reconciler) observeIO(v *state.Volume, a *actual) *ioActual {
	if v.IOLimits == nil {
		return nil
	}
	io := &ioActual{podOf: map[string]string{}, pods: map[string]*podIO{}}
	if r.cfg.Throttler == nil {
		io.unavailable = r.cfg.NoThrottler
		return io
	}
	for _, t := range v.Targets() {
		uid, ok := contract.PodOfTarget(r.cfg.KubeletDir, t)
		if !ok {
			if !v.Publishes[t].Deleting {
				io.unknown = append(io.unknown, t)
			}
			continue
		}
		io.podOf[t] = uid
		if a.loop != nil && io.pods[uid] == nil {
			io.pods[uid] = r.observePod(uid, a.loop.Dev)
		}
	}
	r.timeMissingCgroups(v, io)
	r.findFailedClears(v, io)
	r.findDrifts(v, io)
	return io
}

// findFailedClears sets clearFailed of each observed pod whose rules a
// clear failed to remove (clearIOLimits), and forgets the pods that no
// withdrawn publish of v names any more: a pod withdrawn again later is
// tried again.
func (r *Reconciler) findFailedClears(v *state.Volume, io *ioActual) {
	r.cgroupsMissingMu.Lock()
	defer r.cgroupsMissingMu.Unlock()
	failed := r.clearsFailed[v.ID]
	if len(failed) == 0 {
		return
	}
	withdrawn := map[string]bool{}
	for t, p := range v.Publishes {
		if uid, ok := io.podOf[t]; ok && p.Deleting {
			withdrawn[uid] = true
		}
	}
	for uid := range failed {
		if !withdrawn[uid] {
			delete(failed, uid)
		} else if p := io.pods[uid]; p != nil {
			p.clearFailed = true
		}
	}
	if len(failed) == 0 {
		delete(r.clearsFailed, v.ID)
	}
}

// findDrifts sets each observed pod's drifted: its cgroups that were seen
// holding v's IO limits at the generation asked for (ioHeld, noted by
// noteIOLimitsHeld) and hold other rules now.
func (r *Reconciler) findDrifts(v *state.Volume, io *ioActual) {
	want, gen := v.WantsIOLimits(), v.IOLimits.Generation
	r.fulfilledMu.Lock()
	defer r.fulfilledMu.Unlock()
	held := r.ioHeld[v.ID]
	for _, p := range io.pods {
		for d, l := range p.cgroups {
			if g, ok := held[d]; ok && g == gen && l != want {
				p.drifted = append(p.drifted, d)
			}
		}
		slices.Sort(p.drifted)
	}
}

// cgroupMissingGrace is how long a live publish's pod may have no cgroup
// found before the volume reports it (IOLimitsNotApplied): the kubelet
// makes a pod's cgroup before it mounts the pod's volumes, so a cgroup
// not there at the publish is there a moment later, or a pass or two
// later on a slow node; one still not found after a minute is not being
// looked for where the kubelet makes it (--cgroup-root, a cgroupRoot
// deeper than the search, cgroupsPerQOS off).
const cgroupMissingGrace = time.Minute

// timeMissingCgroups notes, by the reconciler's clock, since when each
// pod of v's live publishes has had no cgroup found, and sets its
// missingFor; a pod found, or no longer published, is forgotten, so that
// it starts again from 0.
func (r *Reconciler) timeMissingCgroups(v *state.Volume, io *ioActual) {
	now := r.cfg.Clock.Now()
	r.cgroupsMissingMu.Lock()
	defer r.cgroupsMissingMu.Unlock()
	prev, next := r.cgroupsMissing[v.ID], map[string]time.Time{}
	for _, t := range v.Targets() {
		p := io.pod(t)
		if v.Publishes[t].Deleting || p == nil || !p.missing {
			continue
		}
		uid := io.podOf[t]
		since, ok := prev[uid]
		if !ok {
			since = now
		}
		next[uid] = since
		p.missingFor = now.Sub(since)
	}
	if len(next) == 0 {
		delete(r.cgroupsMissing, v.ID)
		return
	}
	r.cgroupsMissing[v.ID] = next
}

// observePod reads the rules in force for dev in each cgroup of pod uid.
// A cgroup removed meanwhile (a container that stopped) is passed over;
// one that is there without the rules' file (the io controller not
// enabled in it) is noted (notEnabled), never taken for one gone: the
// pod's IO is not limited there, which its volume's condition reports.
func (r *Reconciler) observePod(uid string, dev host.DevNum) *podIO {
	dirs, err := r.cfg.Throttler.PodCgroups(uid)
	switch {
	case errors.Is(err, devices.ErrPodCgroupNotFound):
		return &podIO{missing: true, missingWhy: err.Error()}
	case err != nil:
		return &podIO{err: err.Error()}
	}
	p := &podIO{cgroups: make(map[string]host.IOLimits, len(dirs))}
	for _, d := range dirs {
		l, err := r.cfg.Throttler.Throttle(d, dev)
		switch {
		case errors.Is(err, devices.ErrCgroupGone):
			continue
		case errors.Is(err, devices.ErrIONotEnabled):
			if p.notEnabled == "" {
				p.notEnabled = err.Error()
			}
			continue
		case err != nil:
			return &podIO{err: err.Error()}
		}
		p.cgroups[d] = l
	}
	if len(p.cgroups) == 0 && p.notEnabled == "" {
		p.missing, p.missingWhy = true, fmt.Sprintf("the cgroups of pod %s went away while they were read", uid)
	}
	return p
}

// pod returns what was seen of the pod of target; nil when the target
// names none, the volume asks no limits, or its device is not attached.
func (io *ioActual) pod(target string) *podIO {
	if io == nil {
		return nil
	}
	return io.pods[io.podOf[target]]
}

// podLimited reports whether the publish at target may answer as far as
// its IO limits go: its pod holds the limits asked for in every cgroup,
// or there is nothing to wait for (no limits asked, no pod cgroup yet,
// limits this node cannot apply or read, which the volume's condition
// reports; a cgroup without the io controller likewise).
func podLimited(v *state.Volume, a *actual, target string) bool {
	p := a.io.pod(target)
	return p == nil || p.missing || p.err != "" || p.holds(v.WantsIOLimits())
}

// ioLimitsReady reports whether v's IO limits are fulfilled: every live
// publish names a pod, which has a cgroup, each of which holds exactly
// the limits asked for; also when nothing publishes the volume.
func ioLimitsReady(v *state.Volume, a *actual) bool {
	return ioLimitsWait(v, a) == ""
}

// ioLimitsWait says what v's IO limits wait for; "" once they are in
// force.
func ioLimitsWait(v *state.Volume, a *actual) string {
	io := a.io
	if io == nil {
		return ""
	}
	want := v.WantsIOLimits()
	for _, t := range v.Targets() {
		if v.Publishes[t].Deleting {
			continue
		}
		p := io.pod(t)
		switch {
		case io.unavailable != "" && !want.IsZero():
			return "this node cannot apply IO limits: " + io.unavailable
		case io.unavailable != "":
			continue
		case slices.Contains(io.unknown, t):
			return fmt.Sprintf("target %s to name a pod (it is not laid out as the kubelet's below --kubelet-dir)", t)
		case p == nil:
			return fmt.Sprintf("the device of volume %s to be attached", v.ID)
		case p.missing:
			return fmt.Sprintf("the cgroup of pod %s, which publishes volume %s at %s", io.podOf[t], v.ID, t)
		case p.err != "":
			return fmt.Sprintf("reading the cgroups of pod %s: %s", io.podOf[t], p.err)
		case p.notEnabled != "" && !want.IsZero():
			return fmt.Sprintf("the io controller to be enabled in the cgroups of pod %s: %s", io.podOf[t], p.notEnabled)
		case !p.holds(want):
			return fmt.Sprintf("IO limits %s to be set in the cgroups of pod %s", want, io.podOf[t])
		}
	}
	return ""
}

// ioLimitSteps returns the steps that hold the cgroups of the pods that
// publish v to its IO limits, one per pod: the rules set in each cgroup
// of a live publish's pod whose rules differ from the limits asked for
// (zero limits remove them), a pod of a withdrawn publish being left to
// ioLimitRemovals. A pod with no cgroup needs nothing until it has one.
// The step's target is the pod's first target.
func ioLimitSteps(v *state.Volume, a *actual) []action {
	io := a.io
	if io == nil || io.unavailable != "" || a.loop == nil {
		return nil
	}
	want := v.WantsIOLimits()
	var acts []action
	done := map[string]bool{}
	for _, t := range v.Targets() {
		uid, p := io.podOf[t], io.pod(t)
		if v.Publishes[t].Deleting || p == nil || p.missing || done[uid] {
			continue
		}
		done[uid] = true
		if p.err != "" || !p.holds(want) {
			// A repair only where a cgroup seen holding the limits lost
			// them: a new container's cgroup lacks them as a matter of
			// course, and its first rules are no drift.
			act := action{kind: actSetIOLimits, target: t, generation: v.IOLimits.Generation, drift: len(p.drifted) > 0,
				reason: fmt.Sprintf("pod %s is to be held to %s", uid, want)}
			if act.drift {
				act.reason = fmt.Sprintf("cgroups %s of pod %s held %s and lost or changed them", strings.Join(p.drifted, ", "), uid, want)
			}
			acts = append(acts, act)
		}
	}
	return acts
}

// ioLimitRemovals returns the steps that remove the rules for v's device
// from the cgroups of the pod of each withdrawn publish that has them,
// unless a live publish names the same pod: a loop device's number is
// reused by the next volume attached, and a rule left behind would
// throttle that volume's IO. They come before the unpublish, which
// forgets the target and with it which pod it was. A pod whose clear was
// tried and failed (podIO.clearFailed) gets none: its unpublish goes
// ahead.
func ioLimitRemovals(v *state.Volume, a *actual) []action {
	io := a.io
	if io == nil || a.loop == nil {
		return nil
	}
	live := map[string]bool{}
	for t, p := range v.Publishes {
		if !p.Deleting {
			live[io.podOf[t]] = true
		}
	}
	var acts []action
	done := map[string]bool{}
	for _, t := range v.Targets() {
		uid, p := io.podOf[t], io.pod(t)
		if !v.Publishes[t].Deleting || p == nil || p.missing || p.clearFailed || live[uid] || done[uid] {
			continue
		}
		done[uid] = true
		if p.err != "" || !p.holds(host.IOLimits{}) {
			acts = append(acts, action{kind: actClearIOLimits, target: t, generation: v.Publishes[t].Generation,
				reason: fmt.Sprintf("publish withdrawn; pod %s still holds IO limits for %s", uid, a.loop.Device)})
		}
	}
	return acts
}

// applyIOLimits makes the rules for the volume's device in every cgroup
// of the pod of target equal l, cgroups made since the observation
// included. A pod with no cgroup (any more) needs nothing, nor does a
// cgroup gone meanwhile. A cgroup that cannot be written fails it, once
// every other cgroup of the pod is written.
func (r *Reconciler) applyIOLimits(a *actual, target string, l host.IOLimits) error {
	uid := a.io.podOf[target]
	dirs, err := r.cfg.Throttler.PodCgroups(uid)
	if errors.Is(err, devices.ErrPodCgroupNotFound) {
		return nil
	}
	if err != nil {
		return classified.Errorf(classified.KindInternal, "finding the cgroups of pod %s: %w", uid, err)
	}
	var errs []error
	for _, d := range dirs {
		// A cgroup without the io controller can be given nothing; the
		// volume's condition says so (podIO.notEnabled), and failing here
		// would only hold back the publish or the unpublish.
		err := r.cfg.Throttler.SetThrottle(d, a.loop.Dev, l)
		if err != nil && !errors.Is(err, devices.ErrCgroupGone) && !errors.Is(err, devices.ErrIONotEnabled) {
			errs = append(errs, fmt.Errorf("cgroup %s: %w", d, err))
		}
	}
	if len(errs) > 0 {
		return classified.Errorf(classified.KindInternal, "setting IO limits %s for %s in the cgroups of pod %s: %w", l, a.loop.Device, uid, errors.Join(errs...))
	}
	return nil
}

// clearIOLimits removes the rules for v's device from every cgroup of
// the pod of the withdrawn publish at target that can be written. It is
// tried once: when it fails, the pod is noted (clearsFailed) and the
// publish is unpublished without another try, the failure logged and
// counted (a terminal failure of "clear io limits"). A publish answers
// without limits when its pod's cgroups cannot be read or written; its
// unpublish, the same pod's, must not then wait for ever, the pod
// Terminating meanwhile. Retrying would rarely help: what fails to read
// or write a pod's cgroups (permissions, the layout, an io controller
// gone) does not pass in a backoff. What is left costs little: a cgroup
// gone needs no clear, a rule dies with its pod's cgroup when the kubelet
// removes it, pod cgroups are named by the pod's UID and never reused,
// and the rules of every cgroup that could be written are removed.
func (r *Reconciler) clearIOLimits(ctx context.Context, v *state.Volume, a *actual, target string) error {
	err := r.applyIOLimits(a, target, host.IOLimits{})
	if err == nil {
		return nil
	}
	uid := a.io.podOf[target]
	r.cgroupsMissingMu.Lock()
	if r.clearsFailed[v.ID] == nil {
		r.clearsFailed[v.ID] = map[string]bool{}
	}
	r.clearsFailed[v.ID][uid] = true
	r.cgroupsMissingMu.Unlock()
	klog.FromContext(ctx).Error(err, "Cannot remove a withdrawn publish's IO limits; unpublishing without them: the rules stay in the pod's cgroups until the kubelet removes them",
		"volumeID", v.ID, "targetPath", target, "pod", uid, "device", a.loop.Device)
	return classified.Terminalf(classified.KindInternal, "removing the IO limits of volume %s from pod %s, whose publish at %s is withdrawn (unpublished without them): %w", v.ID, uid, target, err)
}

// ioProblem says why v's IO limits cannot be held, for its condition:
// this node cannot apply them, a live publish names no pod, its pod's
// cgroups cannot be read or lack the io controller, or none of them has
// been found for cgroupMissingGrace; "" otherwise. Zero limits need
// nothing.
func ioProblem(v *state.Volume, a *actual) string {
	io := a.io
	if io == nil || v.WantsIOLimits().IsZero() || !hasLivePublish(v) {
		return ""
	}
	want := v.WantsIOLimits()
	if io.unavailable != "" {
		return fmt.Sprintf("volume %s asks for IO limits (%s) that this node cannot apply: %s; its pods' IO is not limited", v.ID, want, io.unavailable)
	}
	if len(io.unknown) > 0 {
		return fmt.Sprintf("volume %s asks for IO limits (%s), and its targets %s are not laid out as the kubelet's below --kubelet-dir: no pod is known to hold to them",
			v.ID, want, strings.Join(io.unknown, ", "))
	}
	for _, uid := range slices.Sorted(maps.Keys(io.pods)) {
		if p := io.pods[uid]; p.err != "" {
			return fmt.Sprintf("volume %s asks for IO limits (%s), and the cgroups of pod %s cannot be read: %s", v.ID, want, uid, p.err)
		}
	}
	for _, uid := range slices.Sorted(maps.Keys(io.pods)) {
		if p := io.pods[uid]; p.notEnabled != "" {
			return fmt.Sprintf("volume %s asks for IO limits (%s) that pod %s does not hold: %s; its IO is not limited until then", v.ID, want, uid, p.notEnabled)
		}
	}
	for _, t := range v.Targets() {
		if p := io.pod(t); !v.Publishes[t].Deleting && p != nil && p.missing && p.missingFor >= cgroupMissingGrace {
			return fmt.Sprintf("volume %s asks for IO limits (%s), and no cgroup of pod %s, which publishes it at %s, has been found for %s (%s): check that --cgroup-root is the hierarchy the kubelet's cgroupRoot is in, within the depth searched, and that the kubelet runs with cgroupsPerQOS; its IO is not limited",
				v.ID, want, io.podOf[t], t, p.missingFor.Round(time.Second), p.missingWhy)
		}
	}
	return ""
}

// hasLivePublish reports whether v has a publish that is not withdrawn.
func hasLivePublish(v *state.Volume) bool {
	for _, p := range v.Publishes {
		if !p.Deleting {
			return true
		}
	}
	return false
}

// ioLimitsApplied returns the limits in force for v's device in every
// cgroup of every pod of its live publishes: for each count, its value
// where all of them agree, else 0 (not in force everywhere); nil when no
// such cgroup was seen.
func ioLimitsApplied(v *state.Volume, a *actual) *host.IOLimits {
	if a.io == nil {
		return nil
	}
	var out *host.IOLimits
	for t, pub := range v.Publishes {
		p := a.io.pod(t)
		if pub.Deleting || p == nil || p.err != "" {
			continue
		}
		cgroups := slices.Collect(maps.Values(p.cgroups))
		if p.notEnabled != "" {
			// Not in force there: no limit holds everywhere.
			cgroups = append(cgroups, host.IOLimits{})
		}
		for _, l := range cgroups {
			if out == nil {
				c := l
				out = &c
				continue
			}
			out.ReadIOPS = agree(out.ReadIOPS, l.ReadIOPS)
			out.WriteIOPS = agree(out.WriteIOPS, l.WriteIOPS)
			out.ReadBPS = agree(out.ReadBPS, l.ReadBPS)
			out.WriteBPS = agree(out.WriteBPS, l.WriteBPS)
		}
	}
	return out
}

func agree(a, b uint64) uint64 {
	if a != b {
		return 0
	}
	return a
}
