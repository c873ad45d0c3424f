package nodeserver

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/rpcerr"
	"github.com/converge-csi/converge/pkg/state"
)

// recordFulfilled records volume v staged at staging and published at
// target, both fulfilled by the reconciler, whose pass reported them.
func recordFulfilled(t *testing.T, store *state.Store, staging, target string) {
	t.Helper()
	v, err := store.Update("v", func(v *state.Volume) error {
		v.Stage = &state.Stage{Path: staging, Access: state.AccessMount, AccessMode: "SINGLE_NODE_WRITER"}
		v.Publishes = map[string]*state.Publish{target: {Access: state.AccessMount, AccessMode: "SINGLE_NODE_WRITER"}}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	store.SetResult("v", state.StageKey, state.Result{Generation: v.Stage.Generation, Ready: true})
	store.SetResult("v", state.PublishKey(target), state.Result{Generation: v.Publishes[target].Generation, Ready: true})
}

// TestStatsBeforeTheFirstPass checks that a path whose intent is recorded
// and not yet seen by a pass has no stats (UNAVAILABLE), though the
// condition does not speak of it yet: statfs there would measure the
// filesystem beneath.
func TestStatsBeforeTheFirstPass(t *testing.T) {
	s, store, _ := newServer(t)
	staging, target := root+"/staging/v", root+"/pods/p/mount"
	recordFulfilled(t, store, staging, target)
	if _, err := store.Update("v", func(v *state.Volume) error {
		v.Publishes[target+"2"] = &state.Publish{Access: state.AccessMount, AccessMode: "SINGLE_NODE_WRITER"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]codes.Code{staging: codes.OK, target: codes.OK, target + "2": codes.Unavailable} {
		_, err := s.NodeGetVolumeStats(t.Context(), &csi.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: path})
		if rpcerr.Code(err) != want {
			t.Errorf("stats at %s: got %v, want %v", path, err, want)
		}
	}
}

func TestStatsAndHealthFollowTheCondition(t *testing.T) {
	s, store, _ := newServer(t)
	s.cfg.VolumeHealth = true
	ctx := t.Context()
	staging, target := root+"/staging/v", root+"/pods/p/mount"
	recordFulfilled(t, store, staging, target)
	stats := func(path string) error {
		_, err := s.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: path})
		return err
	}
	health := func() []*csi.VolumeHealth_VolumeHealthEntry {
		t.Helper()
		resp, err := s.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: "v"})
		if err != nil {
			t.Fatalf("health: %v", err)
		}
		return resp.GetVolumeHealth().GetHealthStatuses()
	}

	tests := []struct {
		name          string
		cond          state.Condition
		stagingCode   codes.Code
		targetCode    codes.Code
		wantStatus    csi.VolumeHealthErrorType
		wantInMessage string
	}{
		{name: "healthy", cond: state.Condition{}, stagingCode: codes.OK, targetCode: codes.OK},
		{
			name:        "staging mount lost",
			cond:        state.Condition{Abnormal: true, Health: state.Inaccessible, Reason: "StagingMountMissing", Message: "nothing is mounted", Unusable: []string{staging, target}},
			stagingCode: codes.Unavailable, targetCode: codes.Unavailable,
			wantStatus: csi.VolumeHealthErrorType_INACCESSIBLE, wantInMessage: "StagingMountMissing",
		},
		{
			name:        "filesystem shut down",
			cond:        state.Condition{Abnormal: true, Health: state.Inaccessible, Reason: "FilesystemUnusable", Message: "shut down", Unusable: []string{staging, target}},
			stagingCode: codes.Unavailable, targetCode: codes.Unavailable,
			wantStatus: csi.VolumeHealthErrorType_INACCESSIBLE, wantInMessage: "FilesystemUnusable",
		},
		{
			name:        "read-only after errors still has usage",
			cond:        state.Condition{Abnormal: true, Health: state.Degraded, Reason: "FilesystemReadOnly", Message: "went read-only"},
			stagingCode: codes.OK, targetCode: codes.OK,
			wantStatus: csi.VolumeHealthErrorType_DEGRADED,
		},
		{
			name:        "staging path taken, the pod still served",
			cond:        state.Condition{Abnormal: true, Health: state.Degraded, Reason: "StagingPathTaken", Message: "another mount", Unusable: []string{staging}},
			stagingCode: codes.Unavailable, targetCode: codes.OK,
			wantStatus: csi.VolumeHealthErrorType_DEGRADED, wantInMessage: "StagingPathTaken",
		},
		{
			name:        "publish being made",
			cond:        state.Condition{Unusable: []string{target}},
			stagingCode: codes.OK, targetCode: codes.Unavailable,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			store.SetCondition("v", tc.cond)
			if err := stats(staging); rpcerr.Code(err) != tc.stagingCode {
				t.Errorf("stats at staging: got %v, want %v", err, tc.stagingCode)
			}
			err := stats(target)
			if rpcerr.Code(err) != tc.targetCode {
				t.Errorf("stats at target: got %v, want %v", err, tc.targetCode)
			}
			if err != nil && !strings.Contains(err.Error(), tc.wantInMessage) {
				t.Errorf("stats message: got %q, want it to contain %q", err, tc.wantInMessage)
			}
			entries := health()
			if !tc.cond.Abnormal {
				if len(entries) != 0 {
					t.Errorf("health: got %v, want no entry", entries)
				}
				return
			}
			if len(entries) != 1 || entries[0].Status != tc.wantStatus || entries[0].Reason != string(tc.cond.Reason) {
				t.Errorf("health: got %v, want one %v entry with reason %s", entries, tc.wantStatus, tc.cond.Reason)
			}
		})
	}

	if _, err := s.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: "unknown"}); rpcerr.Code(err) != codes.NotFound {
		t.Errorf("health of an unknown volume: got %v, want NotFound", err)
	}
	if _, err := s.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{}); rpcerr.Code(err) != codes.InvalidArgument {
		t.Errorf("health without an ID: got %v, want InvalidArgument", err)
	}
}

func TestHealthOfAVolumeRolledBackForDataLoss(t *testing.T) {
	s, store, _ := newServer(t)
	s.cfg.VolumeHealth = true
	store.SetTerminalFailure("gone", state.StageKey, state.TerminalFailure{Generation: 3, Err: classified.Terminalf(classified.KindDataLoss, "volume gone was formatted ext4 but no filesystem is found")})
	resp, err := s.NodeGetVolumeHealth(t.Context(), &csi.NodeGetVolumeHealthRequest{VolumeId: "gone"})
	if err != nil {
		t.Fatal(err)
	}
	if e := resp.GetVolumeHealth().GetHealthStatuses(); len(e) != 1 || e[0].GetStatus() != csi.VolumeHealthErrorType_DATA_LOSS ||
		e[0].GetReason() != "FilesystemMissing" || e[0].GetMessage() != "volume gone was formatted ext4 but no filesystem is found" {
		t.Errorf("got %v, want one DATA_LOSS entry, FilesystemMissing, with the failure's message", e)
	}
	store.SetTerminalFailure("other", state.StageKey, state.TerminalFailure{Generation: 1, Err: classified.Terminalf(classified.KindFailedPrecondition, "holds xfs")})
	if _, err := s.NodeGetVolumeHealth(t.Context(), &csi.NodeGetVolumeHealthRequest{VolumeId: "other"}); rpcerr.Code(err) != codes.NotFound {
		t.Errorf("a volume refused for another reason: got %v, want NotFound", err)
	}
}

// TestHealthMessageFitsThePodStatus checks that a condition whose message
// is longer than a pod's status.volumeHealth takes (1024 bytes in
// Kubernetes v1.37, whose kubelet copies it there and whose API server
// refuses the whole status update otherwise) is cut to fit, on a character
// boundary, for a recorded volume and for one rolled back for data loss;
// a message that fits is kept whole.
func TestHealthMessageFitsThePodStatus(t *testing.T) {
	s, store, _ := newServer(t)
	s.cfg.VolumeHealth = true
	staging, target := root+"/staging/v", root+"/pods/p/mount"
	recordFulfilled(t, store, staging, target)
	// Paths of three-byte characters, so that 1024 bytes fall inside one.
	long := "volume v: cannot be remounted while it is also mounted at " + strings.Repeat("/mnt/ö€", 200)
	message := func(id string) string {
		t.Helper()
		resp, err := s.NodeGetVolumeHealth(t.Context(), &csi.NodeGetVolumeHealthRequest{VolumeId: id})
		if err != nil {
			t.Fatal(err)
		}
		e := resp.GetVolumeHealth().GetHealthStatuses()
		if len(e) != 1 {
			t.Fatalf("%s: got %v, want one entry", id, e)
		}
		return e[0].GetMessage()
	}
	check := func(id, got, want string) {
		t.Helper()
		if len(got) > 1024 || !utf8.ValidString(got) || !strings.HasSuffix(got, "...") || !strings.HasPrefix(want, strings.TrimSuffix(got, "...")) || len(got) < 1020 {
			t.Errorf("%s: got a message of %d bytes (valid UTF-8: %t): %q; want the start of the %d-byte one, within 1024 bytes, ending in ...",
				id, len(got), utf8.ValidString(got), got, len(want))
		}
	}
	store.SetCondition("v", state.Condition{Abnormal: true, Health: state.Inaccessible, Reason: "FilesystemUnusable", Message: long, Unusable: []string{staging, target}})
	check("v", message("v"), long)
	store.SetTerminalFailure("gone", state.StageKey, state.TerminalFailure{Generation: 1, Err: classified.Terminalf(classified.KindDataLoss, "%s", long)})
	check("gone", message("gone"), long)

	fits := strings.Repeat("x", 1024)
	store.SetCondition("v", state.Condition{Abnormal: true, Health: state.Degraded, Reason: "FilesystemReadOnly", Message: fits})
	if got := message("v"); got != fits {
		t.Errorf("a message of 1024 bytes came back as %d bytes: %q", len(got), got)
	}

	// A path that is not UTF-8 (a directory name is any bytes): the
	// answer must still marshal, as gRPC will.
	store.SetCondition("v", state.Condition{Abnormal: true, Health: state.Degraded, Reason: "FilesystemReadOnly", Message: "also mounted at /mnt/\xff\xfe"})
	resp, err := s.NodeGetVolumeHealth(t.Context(), &csi.NodeGetVolumeHealthRequest{VolumeId: "v"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := proto.Marshal(resp); err != nil {
		t.Errorf("the answer for a message that is not UTF-8 does not marshal: %v", err)
	}
}
