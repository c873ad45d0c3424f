package nodeserver

import (
	"testing"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/state"
)

// TestLiveAt owns "the live stage or a live publish, else NOT_FOUND" that
// NodeGetVolumeStats and NodeExpandVolume ask of a volume path.
func TestLiveAt(t *testing.T) {
	v := &state.Volume{ID: "v", Stage: &state.Stage{Path: "/k/s"}, Publishes: map[string]*state.Publish{
		"/k/t1": {}, "/k/t2": {Deleting: true}}}
	for path, live := range map[string]bool{"/k/s": true, "/k/t1": true, "/k/t2": false, "/k/other": false} {
		err := liveAt(v, path)
		if live != (err == nil) || err != nil && state.AsError(err).Kind != state.KindNotFound {
			t.Errorf("%s: got %v, want live %t (else NotFound)", path, err, live)
		}
	}
	v.Stage.Deleting = true
	if err := liveAt(v, "/k/s"); err == nil {
		t.Error("a stage being withdrawn: got live, want NotFound")
	}
}

// TestCheckAttributes owns what the node accepts of a PV's volume
// attributes: the keys CreateVolume and static PVs write, the on-node-loss
// choice only with a value converge-controller knows.
func TestCheckAttributes(t *testing.T) {
	for _, tc := range []struct {
		name string
		vc   map[string]string
		want string
	}{
		{name: "none", vc: nil},
		{name: "what CreateVolume writes", vc: map[string]string{contract.MkfsOptionsKey: "-b 4096", contract.OnNodeLossKey: "release", "storage.kubernetes.io/csiProvisionerIdentity": "x"}},
		{name: "retain", vc: map[string]string{contract.OnNodeLossKey: "retain"}},
		{name: "a static PV's device", vc: map[string]string{contract.DeviceKey: "/dev/disk/by-id/x"}},
		{name: "an on-node-loss choice converge does not know", vc: map[string]string{contract.OnNodeLossKey: "delete"},
			want: `volume attribute converge.csi.dev/on-node-loss: unknown value "delete": want "retain" or "release"`},
		{name: "an unknown key", vc: map[string]string{"converge.csi.dev/on-node-los": "release"},
			want: `unknown volume attributes: "converge.csi.dev/on-node-los"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkAttributes(tc.vc)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("got %v, want none", err)
			case tc.want != "" && (err == nil || err.Error() != tc.want || state.AsError(err).Kind != state.KindInvalidArgument):
				t.Errorf("got %v, want InvalidArgument %q", err, tc.want)
			}
		})
	}
}
