package nodeserver

import (
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/converge-csi/converge/pkg/rpcerr"
	"github.com/converge-csi/converge/pkg/state"
)

// TestAlphaFeaturesOffByDefault checks that a server of default config
// advertises neither alpha node capability and refuses the alpha RPC, and
// that each feature turns its own on.
func TestAlphaFeaturesOffByDefault(t *testing.T) {
	s, _, _ := newServer(t)
	caps := func() []csi.NodeServiceCapability_RPC_Type {
		resp, err := s.NodeGetCapabilities(t.Context(), &csi.NodeGetCapabilitiesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var types []csi.NodeServiceCapability_RPC_Type
		for _, c := range resp.GetCapabilities() {
			types = append(types, c.GetRpc().GetType())
		}
		return types
	}
	for _, alpha := range []csi.NodeServiceCapability_RPC_Type{rpcVolumeCondition, csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH} {
		if slices.Contains(caps(), alpha) {
			t.Errorf("default capabilities: got %v, want no %d", caps(), alpha)
		}
	}
	if _, err := s.NodeGetVolumeHealth(t.Context(), &csi.NodeGetVolumeHealthRequest{VolumeId: "v"}); rpcerr.Code(err) != codes.Unimplemented {
		t.Errorf("NodeGetVolumeHealth by default: got %v, want UNIMPLEMENTED", err)
	}

	s.cfg.VolumeCondition = true
	if got := caps(); !slices.Contains(got, rpcVolumeCondition) || slices.Contains(got, csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH) {
		t.Errorf("with VolumeCondition: got %v, want VOLUME_CONDITION (4) alone of the two", got)
	}
	s.cfg.VolumeCondition, s.cfg.VolumeHealth = false, true
	if got := caps(); slices.Contains(got, rpcVolumeCondition) || !slices.Contains(got, csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH) {
		t.Errorf("with VolumeHealth: got %v, want GET_VOLUME_HEALTH alone of the two", got)
	}
}

// TestStatsCarryTheCondition checks NodeGetVolumeStats' answer as a
// client of CSI v1.3-v1.12 reads it: with VolumeCondition on, every answer
// has a volume_condition (field 2), abnormal with the reason when the
// volume is, and a broken mount is answered with its condition and no
// usage instead of UNAVAILABLE. Off, there is no field 2.
func TestStatsCarryTheCondition(t *testing.T) {
	s, store, _ := newServer(t)
	staging := root + "/staging/v"
	recordFulfilled(t, store, staging, root+"/pods/p/mount")
	lost := state.Condition{Abnormal: true, Health: state.Inaccessible, Reason: "StagingMountMissing", Message: "nothing is mounted", Unusable: []string{staging}}
	readOnly := state.Condition{Abnormal: true, Health: state.Degraded, Reason: "FilesystemReadOnly", Message: "went read-only"}
	tests := []struct {
		name      string
		feature   bool
		cond      state.Condition
		wantCode  codes.Code
		wantUsage bool
		want      *oldCondition // nil: no field 2
	}{
		{name: "off, healthy", cond: state.Condition{}, wantUsage: true},
		{name: "off, read-only", cond: readOnly, wantUsage: true},
		{name: "off, mount lost", cond: lost, wantCode: codes.Unavailable},
		{name: "healthy", feature: true, cond: state.Condition{}, wantUsage: true, want: &oldCondition{}},
		{name: "read-only", feature: true, cond: readOnly, wantUsage: true, want: &oldCondition{abnormal: true, message: "FilesystemReadOnly: went read-only"}},
		{name: "mount lost", feature: true, cond: lost, want: &oldCondition{abnormal: true, message: "StagingMountMissing: nothing is mounted"}},
		{name: "not mounted yet", feature: true, cond: state.Condition{Unusable: []string{staging}}, wantCode: codes.Unavailable},
		// A path is any bytes; the kubelet's decoder refuses a string
		// that is not UTF-8, and with it the whole answer.
		{name: "message not UTF-8", feature: true, cond: state.Condition{Abnormal: true, Health: state.Degraded, Reason: "FilesystemReadOnly", Message: "also at /mnt/\xff"},
			wantUsage: true, want: &oldCondition{abnormal: true, message: "FilesystemReadOnly: also at /mnt/\uFFFD"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s.cfg.VolumeCondition = tc.feature
			store.SetCondition("v", tc.cond)
			resp, err := s.NodeGetVolumeStats(t.Context(), &csi.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: staging})
			if rpcerr.Code(err) != tc.wantCode {
				t.Fatalf("got %v, want %v", err, tc.wantCode)
			}
			if err != nil {
				return
			}
			if got := len(resp.GetUsage()) > 0; got != tc.wantUsage {
				t.Errorf("usage: got %v, want usage %t", resp.GetUsage(), tc.wantUsage)
			}
			wire, err := proto.Marshal(resp)
			if err != nil {
				t.Fatal(err)
			}
			got := readOldCondition(t, wire)
			switch {
			case tc.want == nil && got != nil:
				t.Errorf("got volume_condition %+v, want none", *got)
			case tc.want != nil && got == nil:
				t.Errorf("got no volume_condition, want %+v", *tc.want)
			case tc.want != nil && *got != *tc.want:
				t.Errorf("got volume_condition %+v, want %+v", *got, *tc.want)
			}
		})
	}
}

// oldCondition is CSI v1.3-v1.12's VolumeCondition.
type oldCondition struct {
	abnormal bool
	message  string
}

// readOldCondition decodes field 2 of a NodeGetVolumeStatsResponse's wire
// form, as CSI v1.3-v1.12 define it; nil when it is absent.
func readOldCondition(t *testing.T, b []byte) *oldCondition {
	t.Helper()
	var found *oldCondition
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Fatalf("bad tag: %v", protowire.ParseError(n))
		}
		b = b[n:]
		if num != 2 {
			n = protowire.ConsumeFieldValue(num, typ, b)
			b = b[n:]
			continue
		}
		msg, n := protowire.ConsumeBytes(b)
		if n < 0 || typ != protowire.BytesType {
			t.Fatalf("field 2 is not a message")
		}
		b = b[n:]
		found = &oldCondition{}
		for len(msg) > 0 {
			f, ft, m := protowire.ConsumeTag(msg)
			msg = msg[m:]
			switch {
			case f == 1 && ft == protowire.VarintType:
				v, m := protowire.ConsumeVarint(msg)
				found.abnormal, msg = protowire.DecodeBool(v), msg[m:]
			case f == 2 && ft == protowire.BytesType:
				v, m := protowire.ConsumeString(msg)
				found.message, msg = v, msg[m:]
			default:
				t.Fatalf("unexpected field %d in VolumeCondition", f)
			}
		}
	}
	return found
}
