package nodeserver

import (
	"context"

	"github.com/converge-csi/converge/pkg/state"
)

// AskSnapshot records the intent to take snapshot id of volume source and
// kicks the reconciler; it returns the intent's generation once the intent
// is durable. group, when not nil, is the group snapshot whose intent
// source keeps as its leader. An intent already recorded is kept as it
// is. A volume being deleted is NOT_FOUND.
func (s *Server) AskSnapshot(source, id string, group *state.GroupIntent) (int64, error) {
	v, err := s.record(source, func(v *state.Volume) error { return v.RequestSnapshot(id, group) })
	if err != nil {
		return 0, err
	}
	return v.Snapshots[id].Generation, nil
}

// AwaitSnapshot waits until the reconciler has taken snapshot id of volume
// source, asked for at generation gen, and answers its final when it failed
// for good. When the wait ends first, the snapshot goes on being taken and
// the answer is DEADLINE_EXCEEDED (or CANCELED).
func (s *Server) AwaitSnapshot(ctx context.Context, source, id string, gen int64) error {
	release, err := s.admit()
	if err != nil {
		return err
	}
	defer release()
	key := state.SnapshotKey(id)
	return s.wait(ctx, source, func(v *state.Volume) (bool, error, string) {
		if in := v.Snapshots[id]; in != nil && in.Generation == gen {
			_, pending := s.progress(source, key, gen)
			return false, nil, pending
		}
		if final := s.cfg.Store.TerminalFailureFor(source, key, gen); final != nil {
			return true, final, ""
		}
		return true, nil, ""
	})
}
