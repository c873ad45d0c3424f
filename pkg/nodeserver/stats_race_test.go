package nodeserver

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/rpcerr"
	"github.com/converge-csi/converge/pkg/state"
)

// passAfterCondition is a store on which a pass lands right after the
// stats call reads the volume's condition: it sets the condition (the
// staging path unusable), then the stage's result, as a pass does.
type passAfterCondition struct {
	*state.Store
	pass func()
}

func (p *passAfterCondition) Condition(id string) state.Condition {
	c := p.Store.Condition(id)
	if p.pass != nil {
		p.pass()
		p.pass = nil
	}
	return c
}

// stagedStore is a store holding volume v, a thick filesystem staged at
// its staging path, and nothing reported on it.
func stagedStore(t *testing.T) (*state.Store, *state.Volume, string) {
	t.Helper()
	store, err := state.Open(t.TempDir() + "/state.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	staging := root + "/staging/v"
	v, err := store.Update("v", func(v *state.Volume) error {
		v.Provisioning = state.ProvisionThick
		v.Stage = &state.Stage{Path: staging, Access: state.AccessMount}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return store, v, staging
}

// TestStatsNeverPairAnOldConditionWithANewResult checks that a pass
// landing in the middle of NodeGetVolumeStats never lets it statfs a path
// the pass found unusable: TestRequestFlood once saw OK for a volume never
// mounted.
func TestStatsNeverPairAnOldConditionWithANewResult(t *testing.T) {
	store, v, staging := stagedStore(t)
	racing := &passAfterCondition{Store: store, pass: func() {
		store.SetCondition("v", state.Condition{Abnormal: true, Health: state.Degraded, Reason: contract.Reason("StagingMountMissing"),
			Message: "not mounted yet", Unusable: []string{staging}})
		store.SetResult("v", state.StageKey, state.Result{Generation: v.Stage.Generation, Waiting: "the device is not attached yet"})
	}}
	statted := false
	s, err := New(Config{
		Store: racing, Kicker: &fakeReconciler{}, NodeID: "n1", Roots: []string{root}, MaxWait: 5 * time.Second,
		Stat: func(context.Context, string) (host.Usage, error) {
			statted = true
			return host.Usage{TotalBytes: 1}, nil
		},
		Capacity: func(string) (int64, error) { return 64 << 20, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.NodeGetVolumeStats(t.Context(), &csi.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: staging})
	if racing.pass != nil {
		t.Fatal("the pass never landed: the stats call read no condition, and the test tested nothing")
	}
	if rpcerr.Code(err) != codes.Unavailable || statted {
		t.Errorf("stats while a pass lands: %v (statfs run: %v); want UNAVAILABLE, no statfs", err, statted)
	}
}

// TestStatsRefuseAMeasureTheRecordOutlived checks that NodeGetVolumeStats
// answers no usage that statfs took while a withdrawal or a repair began:
// each is recorded (the record, the condition) before anything unmounts
// the path, and the pass that reports on it comes later, so statfs may
// have measured the directory beneath it.
func TestStatsRefuseAMeasureTheRecordOutlived(t *testing.T) {
	for _, tc := range []struct {
		name       string
		during     func(v *state.Volume)
		conditions bool // the server answers volume conditions
		want       codes.Code
	}{
		{"nothing changed", nil, false, codes.OK},
		{"withdrawn", func(v *state.Volume) { v.Stage.Deleting = true }, false, codes.NotFound},
		{"a new generation", func(v *state.Volume) { v.Stage.Generation++ }, false, codes.Unavailable},
		{"a repair began", nil, false, codes.Unavailable},
		{"a repair began, conditions answered", nil, true, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, v, staging := stagedStore(t)
			store.SetResult("v", state.StageKey, state.Result{Generation: v.Stage.Generation, Ready: true})
			statted := false
			s, err := New(Config{
				Store: store, Kicker: &fakeReconciler{}, NodeID: "n1", Roots: []string{root}, MaxWait: 5 * time.Second, VolumeCondition: tc.conditions,
				Stat: func(context.Context, string) (host.Usage, error) {
					statted = true
					switch {
					case tc.during != nil:
						if _, err := store.Update("v", func(v *state.Volume) error { tc.during(v); return nil }); err != nil {
							t.Error(err)
						}
					case strings.HasPrefix(tc.name, "a repair began"):
						// What a pass does before it unmounts the path to
						// repair its filesystem.
						store.SetCondition("v", state.Condition{Abnormal: true, Health: state.Degraded, Reason: contract.Reason("FilesystemShutDown"),
							Message: "repairing", Unusable: []string{staging}})
					}
					return host.Usage{TotalBytes: 1}, nil
				},
				Capacity: func(string) (int64, error) { return 64 << 20, nil },
			})
			if err != nil {
				t.Fatal(err)
			}
			resp, err := s.NodeGetVolumeStats(t.Context(), &csi.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: staging})
			if tc.conditions && err == nil && (len(resp.GetUsage()) != 0 || len(resp.ProtoReflect().GetUnknown()) == 0) {
				t.Errorf("stats as a repair began: %v; want no usage, and the condition", resp)
			}
			if !statted {
				t.Fatalf("statfs never ran (%v): the test tested nothing", err)
			}
			if got := rpcerr.Code(err); got != tc.want {
				t.Errorf("stats while the record moved on: %v; want %s", err, tc.want)
			}
		})
	}
}
