package nodeserver

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/state"
)

// NodeGetVolumeStats reports the usage of a staged or published volume from
// a statfs bounded in time, and, with the VolumeCondition feature, its
// condition as the reconciler last saw it.
// It reads the store only, so it never waits behind an operation on the
// volume. An unknown volume, or a path that is neither its staging path nor
// one of its targets, is NOT_FOUND. While the volume is not mounted at the
// path, or its mount there is broken, the answer is UNAVAILABLE with what is
// wrong, since statfs there would measure another or a dead filesystem;
// with VolumeCondition, a broken one is answered with no usage and its
// condition, which the kubelet reports on the pod.
func (s *Server) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if err := contract.CheckID("volume", id, contract.Finds); err != nil {
		return nil, err
	}
	if path == "" {
		return nil, invalid("volume path is required")
	}
	v, err := s.cfg.Store.Get(id)
	if errors.Is(err, state.ErrNotFound) {
		return nil, notFound(id)
	}
	if err != nil {
		return nil, err
	}
	if v.Stage != nil && v.Stage.Access == state.AccessBlock {
		// The kubelet asks a raw block volume's stats at its own map
		// path of the pod, which stands for the pod's publish target.
		if t, ok := contract.BlockStatsTarget(path); ok && v.Publishes[t] != nil {
			path = t
		}
	}
	if err := liveAt(v, path); err != nil {
		return nil, err
	}
	// The result first, then the condition: a pass sets the condition
	// before its results, so a result of the intent's generation read
	// first means the condition read after it is that pass's or newer.
	// The other way round, a pass landing between the two reads would
	// pair an old condition (nothing unusable yet) with its result, and
	// statfs would measure the filesystem beneath the path.
	reported := s.reportedAt(v, path)
	cond := s.cfg.Store.Condition(id)
	if slices.Contains(cond.Unusable, path) {
		return s.unusable(id, path, cond)
	}
	if !reported {
		// Recorded, and not yet seen by a pass, so the condition does not
		// speak of it yet: statfs there would measure the filesystem
		// beneath the empty directory.
		return nil, classified.Errorf(classified.KindUnavailable, "volume %s is not usable at %s: %s", id, path, describe(state.Condition{}))
	}
	if v.Stage.Access == state.AccessBlock {
		// A raw device has a size and nothing else to report.
		size, err := s.cfg.Capacity(id)
		if err != nil {
			return nil, classified.Errorf(classified.KindInternal, "reading the size of volume %s: %w", id, err)
		}
		return s.withCondition(&csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: size}}}, cond), nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StatsTimeout)
	defer cancel()
	u, err := s.cfg.Stat(ctx, path)
	if err != nil {
		return nil, err
	}
	if err := s.stillLiveAt(v, path); err != nil {
		return nil, err
	}
	if now := s.cfg.Store.Condition(id); slices.Contains(now.Unusable, path) {
		return s.unusable(id, path, now)
	}
	return s.withCondition(&csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: u.TotalBytes, Available: u.AvailableBytes, Used: u.UsedBytes},
		{Unit: csi.VolumeUsage_INODES, Total: u.TotalInodes, Available: u.FreeInodes, Used: u.UsedInodes},
	}}, cond), nil
}

// reportedAt reports whether a pass has reported on v's intent at path
// (live, as liveAt checked) in its current generation: the volume's
// condition, which a pass sets before its results, then speaks of the
// path.
func (s *Server) reportedAt(v *state.Volume, path string) bool {
	key, gen := intentAt(v, path)
	r, ok := s.cfg.Store.Result(v.ID, key)
	return ok && r.Generation == gen
}

// stillLiveAt refuses a measure of path taken from the record v once the
// volume has moved on while statfs ran (the caller reads the condition
// again after it too). A withdrawal (NodeUnstageVolume,
// an unpublish, a forgotten publish's) is recorded before anything
// unmounts the path, and a pass marks a path unusable in the condition
// before it unmounts it for a repair; either comes before the next pass
// reports, so the result and condition read before statfs may still
// vouch for a path unmounted beneath it. Read again after statfs, they
// catch every unmount that began before statfs ran, short of one undone
// again (a repair finished) within it.
func (s *Server) stillLiveAt(v *state.Volume, path string) error {
	now, err := s.cfg.Store.Get(v.ID)
	if errors.Is(err, state.ErrNotFound) {
		return notFound(v.ID)
	}
	if err != nil {
		return err
	}
	if err := liveAt(now, path); err != nil {
		return err
	}
	_, was := intentAt(v, path)
	if _, gen := intentAt(now, path); gen != was {
		return classified.Errorf(classified.KindUnavailable, "volume %s changed at %s while it was measured", v.ID, path)
	}
	return nil
}

// unusable answers stats at path, which cond says is unusable: no usage,
// and why, where the kubelet reads volume conditions (it turns them into
// an event on the pod); UNAVAILABLE with the reason otherwise.
func (s *Server) unusable(id, path string, cond state.Condition) (*csi.NodeGetVolumeStatsResponse, error) {
	if cond.Abnormal && s.cfg.VolumeCondition {
		return s.withCondition(&csi.NodeGetVolumeStatsResponse{}, cond), nil
	}
	return nil, classified.Errorf(classified.KindUnavailable, "volume %s is not usable at %s: %s", id, path, describe(cond))
}

// intentAt names v's intent at path (live, as liveAt checked), its
// result's key and its generation.
func intentAt(v *state.Volume, path string) (key state.IntentKey, gen int64) {
	if p := v.Publishes[path]; p != nil {
		return state.PublishKey(path), p.Generation
	}
	return state.StageKey, v.Stage.Generation
}

// liveAt refuses, as NOT_FOUND, a path that is neither the volume's
// staging path nor one of its targets, or whose intent is being withdrawn.
func liveAt(v *state.Volume, path string) error {
	if st := v.Stage; st != nil && !st.Deleting && st.Path == path {
		return nil
	}
	if p := v.Publishes[path]; p != nil && !p.Deleting {
		return nil
	}
	return classified.Errorf(classified.KindNotFound, "volume %s is not staged or published at %s", v.ID, path)
}

// describe renders a condition for a message, as UTF-8 (a message can
// name paths, which are any bytes; protobuf strings must be UTF-8).
func describe(c state.Condition) string {
	if !c.Abnormal {
		return "the reconciler has not mounted it yet"
	}
	return strings.ToValidUTF8(string(c.Reason)+": "+c.Message, "\uFFFD")
}
