package reconciler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"k8s.io/klog/v2"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/reconciler/claim"
	"github.com/converge-csi/converge/pkg/state"
)

// GroupCopyLimit is the most data a group snapshot copies while its
// members' filesystems are frozen, in a pool whose filesystem cannot
// share blocks (reflink): there the copy takes time in proportion to the
// data, and every write to every member waits meanwhile. A reflink
// copies nothing, whatever the size.
const GroupCopyLimit = 1 << 30

// plansByID indexes what the pass saw by volume ID.
func plansByID(seen []plan) map[string]plan {
	byID := make(map[string]plan, len(seen))
	for _, s := range seen {
		byID[s.v.ID] = s
	}
	return byID
}

// groupMembers returns the volumes the group snapshot p.act takes besides
// its leader p.v, with what the pass saw of them, and whether they are all
// free for it now: none runs an operation or finished one since the
// observation, and none is recorded frozen (its thaw comes first). A
// member the store has no record of has nothing staged: it is copied as
// it is.
func (r *Reconciler) groupMembers(p plan, byID map[string]plan, epoch claim.Epoch) ([]member, bool) {
	in := p.v.Snapshots[p.act.target]
	if in == nil || in.Group == nil {
		return nil, false
	}
	var ms []member
	for _, id := range in.Group.VolumeIDs() {
		if id == p.v.ID {
			continue
		}
		if r.claims.State(id, epoch) != claim.Free {
			return nil, false
		}
		s, ok := byID[id]
		if !ok {
			s = plan{v: &state.Volume{ID: id}, a: &actual{home: p.a.home}}
		}
		if s.v.Frozen != "" || r.ownWorkFirst(s, epoch) {
			return nil, false
		}
		ms = append(ms, member{v: s.v, a: s.a})
	}
	return ms, true
}

// ownWorkFirst reports whether member s has work of its own that may start
// now and is no snapshot (its stage, a publish, a teardown, a repair): that
// goes first, and the group waits for the next pass, so that a queue of
// groups cannot hold back what the kubelet waits for.
func (r *Reconciler) ownWorkFirst(s plan, epoch claim.Epoch) bool {
	if len(s.acts) == 0 {
		return false
	}
	switch next := s.acts[0]; next.kind {
	case actTakeSnapshot, actForgetSnapshot, actTakeGroupSnapshot:
		return false
	default:
		h, _ := r.held(s.v.ID, next, epoch)
		return h == notHeld
	}
}

// groupMember is one volume of a group snapshot being taken, and the ID
// of its snapshot.
type groupMember struct {
	member
	snapshot string
}

// takeGroupSnapshot takes the group snapshot that v, its leader, keeps
// under act.target, so that every member's snapshot holds what was
// written up to one instant (write-order consistency): it writes out every
// member in use, freezes their filesystems in volume ID order, copies
// their images, and thaws them in reverse order; then it copies the
// members nothing writes (not staged, or read-only), which the operation
// holds meanwhile, so nothing can start writing them. Each freeze is
// recorded first (freeze), so that a crash thaws every member at the next
// pass. A failure of any member thaws every one and removes the members
// already copied: the group is whole or absent; so is what a crash left,
// which every attempt removes before anything else.
func (r *Reconciler) takeGroupSnapshot(ctx context.Context, v *state.Volume, a *actual, act action) error {
	in := v.Snapshots[act.target]
	if in == nil || in.Group == nil {
		return nil // forgotten meanwhile
	}
	g, home := in.Group, a.home
	if err := removeLeftovers(home, g); err != nil {
		return err
	}
	ms, err := checkGroup(v, a, act, g)
	if err != nil {
		return err
	}
	if err := checkGroupCopy(home, ms); err != nil {
		return err
	}
	inUse, idle := splitInUse(ms)
	// Every member in use written out, frozen and recorded so, then
	// copied; nothing writes to the others, which the operation holds.
	var copied []string
	var now time.Time
	ran := false
	cerr, berr, frozenFor := r.frozenWhile(members(inUse), func() (err error) {
		ran = true
		// gofail: var reconcilerGroupAfterFreeze struct{}
		now = r.cfg.Clock.Now()
		copied, err = r.copyGroup(ctx, home, g.ID, inUse, now)
		return err
	})
	if !ran {
		return berr // nothing copied, and every member thawed
	}
	if cerr == nil {
		var more []string
		more, cerr = r.copyGroup(ctx, home, g.ID, idle, now)
		copied = append(copied, more...)
	}
	if cerr != nil {
		return errors.Join(removeCopied(home, copied, cerr), berr)
	}
	if berr != nil {
		// Taken whole; the next pass thaws what is still frozen.
		return berr
	}
	klog.FromContext(ctx).V(2).Info("Took group snapshot", "groupSnapshotID", g.ID, "volumes", len(ms), "frozen", len(inUse), "frozenFor", frozenFor)
	// Taken and thawed; the group's intent is not yet forgotten.
	// gofail: var reconcilerGroupAfterTake struct{}
	return r.recordKernelState(v.ID, func(cur *state.Volume) error {
		cur.ForgetSnapshot(act.target, act.generation)
		return nil
	})
}

// splitInUse splits the group's members into those in use, whose
// filesystems are frozen for the copy (freezes), and those nothing writes.
func splitInUse(ms []groupMember) (inUse, idle []groupMember) {
	for _, m := range ms {
		if freezes(m.v, m.a) {
			inUse = append(inUse, m)
		} else {
			idle = append(idle, m)
		}
	}
	return inUse, idle
}

// members are the members of ms.
func members(ms []groupMember) []member {
	out := make([]member, len(ms))
	for i, m := range ms {
		out[i] = m.member
	}
	return out
}

// removeCopied removes the members' snapshots copied (their IDs) of a
// group whose copy failed with cerr, so that the group is whole or
// absent, and returns cerr with whatever removal failed.
func removeCopied(home Pool, copied []string, cerr error) error {
	for _, id := range copied {
		if err := home.DeleteSnapshot(id); err != nil {
			cerr = errors.Join(cerr, fmt.Errorf("removing snapshot %s of the failed group: %w", id, err))
		}
	}
	return cerr
}

// removeLeftovers removes the members of g that an attempt a crash
// stopped copied, at another instant than the next attempt's.
func removeLeftovers(home Pool, g *state.GroupIntent) error {
	for _, id := range g.VolumeIDs() {
		snap := g.Members[id]
		if taken, err := home.Taken(snap); err != nil || !taken {
			continue
		}
		if err := home.DeleteSnapshot(snap); err != nil {
			return fmt.Errorf("removing what an earlier attempt left of snapshot %s: %w", snap, err)
		}
	}
	return nil
}

// freezeAll freezes the filesystems of ms, written out already, in their
// order, and returns the thaw of them all (in reverse order) and when the
// first froze. When one fails, those frozen are thawed.
func (r *Reconciler) freezeAll(ms []member) (thawAll func() error, at time.Time, err error) {
	var thaws []func() error
	thawAll = func() error {
		var errs []error
		for i := len(thaws) - 1; i >= 0; i-- {
			errs = append(errs, thaws[i]())
		}
		return errors.Join(errs...)
	}
	for _, m := range ms {
		thaw, frozen, err := r.freeze(m.v, m.a)
		if err != nil {
			return nil, time.Time{}, errors.Join(err, thawAll())
		}
		if thaw != nil {
			thaws = append(thaws, thaw)
			if at.IsZero() {
				at = frozen
			}
		}
	}
	return thawAll, at, nil
}

// copyGroup copies each member's image to its snapshot, all stamped with
// the time now and the group's ID, and returns the snapshots made, which
// are all of them unless err.
func (r *Reconciler) copyGroup(ctx context.Context, home Pool, group string, ms []groupMember, now time.Time) (copied []string, err error) {
	for _, m := range ms {
		of := devices.SnapshotOf{Source: m.v.ID, FsType: m.v.Formatted, Access: string(m.v.WrittenAs()), Group: group}
		_, err := home.Take(ctx, m.snapshot, home.Image(m.v.ID), of, now)
		if err := takeRefused(err, m.snapshot, m.v.ID, group); err != nil {
			return copied, err
		}
		copied = append(copied, m.snapshot)
		// This member copied.
		// gofail: var reconcilerGroupAfterCopy struct{}
	}
	return copied, nil
}

// checkGroup returns the members of group g, whose leader is v, in
// volume ID order, each with its snapshot's ID, or why they cannot be
// taken together: a member on a block device of its own (it has no image
// to copy), in another pool than the leader's (a copy shares blocks only
// within one filesystem), or staged as a raw block device (nothing can
// freeze it, so its writes would not stop at the instant).
func checkGroup(v *state.Volume, a *actual, act action, g *state.GroupIntent) ([]groupMember, error) {
	all := append([]member{{v: v, a: a}}, act.members...)
	byID := make(map[string]member, len(all))
	for _, m := range all {
		byID[m.v.ID] = m
	}
	var ms []groupMember
	for _, id := range g.VolumeIDs() {
		m, ok := byID[id]
		if !ok {
			return nil, fmt.Errorf("group snapshot %s: member volume %s was not observed", g.ID, id)
		}
		switch {
		case m.v.Removing:
			return nil, classified.Terminalf(classified.KindNotFound, "volume %s of group snapshot %s is being deleted", id, g.ID)
		case m.a.static:
			return nil, staticRefused(m.v, g.ID)
		case m.v.Stage != nil && state.PoolOf(m.v) != state.PoolOf(v):
			return nil, classified.Terminalf(classified.KindFailedPrecondition, "volume %s is in pool %s and volume %s in pool %s: a group snapshot takes volumes of one pool", v.ID, state.PoolOf(v), id, state.PoolOf(m.v))
		case liveStage(m.v, m.a) && m.a.block:
			return nil, classified.Terminalf(classified.KindFailedPrecondition, "volume %s of group snapshot %s is staged as a raw block device at %s: nothing can freeze its writes, so it cannot be taken at one instant with the others; take it when it is not in use, or alone", id, g.ID, m.v.Stage.Path)
		}
		ms = append(ms, groupMember{member: m, snapshot: g.Members[id]})
	}
	return ms, nil
}

// checkGroupCopy refuses a group snapshot that would hold its members
// frozen for a long copy: in a pool that cannot reflink, the data of the
// members that are frozen (written through a staged filesystem) must not
// exceed GroupCopyLimit.
func checkGroupCopy(home Pool, ms []groupMember) error {
	if home.CopyMode() == devices.CopyReflink {
		return nil
	}
	var total int64
	for _, m := range ms {
		if !freezes(m.v, m.a) {
			continue
		}
		n, err := home.ImageAllocated(m.v.ID)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		total += n
	}
	if total > GroupCopyLimit {
		return classified.Terminalf(classified.KindFailedPrecondition, "the group's volumes in use hold %d bytes, and their pool's filesystem cannot share blocks (reflink): the copy would keep every member frozen for the whole copy; the most a group copies frozen in such a pool is %d bytes; use a pool on xfs with reflink or btrfs", total, int64(GroupCopyLimit))
	}
	return nil
}
