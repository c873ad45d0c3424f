package nodeserver

import (
	"context"
	"errors"
	"strings"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/state"
)

// healthTypes maps the plugin's health classes to CSI's.
var healthTypes = map[state.Health]csi.VolumeHealthErrorType{
	state.Degraded:     csi.VolumeHealthErrorType_DEGRADED,
	state.Inaccessible: csi.VolumeHealthErrorType_INACCESSIBLE,
	state.DataLost:     csi.VolumeHealthErrorType_DATA_LOSS,
}

// NodeGetVolumeHealth reports the health of a volume as the reconciler last
// observed it: no entry when it is healthy or not yet looked at, one entry
// naming the problem otherwise. The Kubernetes v1.37 kubelet (its
// CSIVolumeHealth gate on) calls it and copies each entry into the pod's
// status.volumeHealth; the API server refuses that whole status update if a
// message is longer than maxHealthMessage, so a longer one is cut there. It reads memory only and never blocks. A
// volume whose stage was just refused and rolled back for lost data is
// reported DATA_LOSS (CSI lets a CO ask about a volume it failed to stage);
// any other volume without a record on this node is NOT_FOUND. Without the
// VolumeHealth feature it is UNIMPLEMENTED. The paths,
// optional in CSI, are not needed since the record names them.
func (s *Server) NodeGetVolumeHealth(_ context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	if !s.cfg.VolumeHealth {
		return nil, classified.Errorf(classified.KindUnimplemented, "NodeGetVolumeHealth is alpha in CSI v1.13: csi-node serves it with --feature-gates=VolumeHealth=true")
	}
	id := req.GetVolumeId()
	if err := contract.CheckID("volume", id, contract.Finds); err != nil {
		return nil, err
	}
	if v, err := s.cfg.Store.Get(id); errors.Is(err, state.ErrNotFound) || err == nil && !v.HasNodeIntent() {
		if f, ok := s.cfg.Store.LastTerminalFailure(id, state.StageKey); ok {
			if c, ok := state.LostFilesystem(f.Err); ok {
				return healthAnswer(id, c), nil
			}
		}
		return nil, classified.Errorf(classified.KindNotFound, "volume %s not found on this node", id)
	} else if err != nil {
		return nil, err
	}
	return healthAnswer(id, s.cfg.Store.Condition(id)), nil
}

// healthAnswer renders condition c of volume id: no entry when it is
// normal, one entry naming the problem otherwise.
func healthAnswer(id string, c state.Condition) *csi.NodeGetVolumeHealthResponse {
	h := &csi.VolumeHealth{VolumeId: id}
	if c.Abnormal {
		h.HealthStatuses = append(h.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{
			Status: healthTypes[c.Health], Reason: string(c.Reason), Message: healthMessage(c.Message),
		})
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: h}
}

// maxHealthMessage is the longest message, in bytes, of a pod's
// status.volumeHealth condition in Kubernetes v1.37 (k8s.io/api core/v1
// VolumeHealthCondition, +k8s:maxBytes=1024). A condition's message names
// paths and mounts that are not converge's to bound.
const maxHealthMessage = 1024

// healthMessage cuts m to at most maxHealthMessage bytes, on a character
// boundary, ending in "..." when cut. Bytes that are not UTF-8 (a path or
// a tool's output can hold any) become U+FFFD first: protobuf refuses to
// marshal a string that is not UTF-8, which would fail the whole answer.
func healthMessage(m string) string {
	m = strings.ToValidUTF8(m, "\uFFFD")
	if len(m) <= maxHealthMessage {
		return m
	}
	const more = "..."
	cut := maxHealthMessage - len(more)
	for cut > 0 && !utf8.RuneStart(m[cut]) {
		cut--
	}
	return m[:cut] + more
}
