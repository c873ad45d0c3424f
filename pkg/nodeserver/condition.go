package nodeserver

import (
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/converge-csi/converge/pkg/state"
)

// The volume condition of CSI v1.3 to v1.12, which v1.13 (the version
// converge is built on) removed: the node capability VOLUME_CONDITION and
// NodeGetVolumeStatsResponse's field volume_condition. Kubelets up to
// v1.36 are built on CSI v1.9 and read only these to report a volume's
// health, so csi-node writes them by their wire numbers. (The v1.37
// kubelet reads NodeGetVolumeHealth instead, health.go.)
const (
	// rpcVolumeCondition is NodeServiceCapability.RPC.Type VOLUME_CONDITION.
	rpcVolumeCondition csi.NodeServiceCapability_RPC_Type = 4
	// statsConditionField is NodeGetVolumeStatsResponse.volume_condition,
	// a message VolumeCondition{bool abnormal = 1; string message = 2}.
	statsConditionField protowire.Number = 2
	conditionAbnormal   protowire.Number = 1
	conditionMessage    protowire.Number = 2
)

// withCondition adds the volume's condition to a stats answer when the
// VolumeCondition feature is on: CSI v1.3-v1.12 require the field in
// every answer of a plugin with the capability, so a healthy volume gets
// one too (abnormal false, no message).
func (s *Server) withCondition(resp *csi.NodeGetVolumeStatsResponse, c state.Condition) *csi.NodeGetVolumeStatsResponse {
	if !s.cfg.VolumeCondition {
		return resp
	}
	var cond []byte
	if c.Abnormal {
		cond = protowire.AppendTag(cond, conditionAbnormal, protowire.VarintType)
		cond = protowire.AppendVarint(cond, protowire.EncodeBool(true))
		cond = protowire.AppendTag(cond, conditionMessage, protowire.BytesType)
		cond = protowire.AppendString(cond, describe(c))
	}
	field := protowire.AppendTag(nil, statsConditionField, protowire.BytesType)
	field = protowire.AppendBytes(field, cond)
	resp.ProtoReflect().SetUnknown(field)
	return resp
}
