package nodeserver

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/rpcerr"
	"github.com/converge-csi/converge/pkg/state"
)

// fakeReconciler marks intents as the test says when asked to start.
type fakeReconciler struct {
	store *state.Store
	// onKick runs on every start; nil does nothing.
	onKick func()
}

func (f *fakeReconciler) Start(string) {
	if f.onKick != nil {
		f.onKick()
	}
}

const root = "/var/lib/kubelet"

func newServer(t *testing.T) (*Server, *state.Store, *fakeReconciler) {
	t.Helper()
	store, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	rec := &fakeReconciler{store: store}
	s, err := New(Config{
		Store: store, Kicker: rec, NodeID: "n1", Roots: []string{root}, MaxWait: 5 * time.Second,
		Stat:     func(context.Context, string) (host.Usage, error) { return host.Usage{TotalBytes: 1}, nil },
		Capacity: func(string) (int64, error) { return 64 << 20, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	return s, store, rec
}

// readyAll marks every live intent of id ready at its generation.
func readyAll(store *state.Store, id string) {
	v, err := store.Get(id)
	if err != nil {
		return
	}
	if v.Stage != nil && !v.Stage.Deleting {
		store.SetResult(id, state.StageKey, state.Result{Generation: v.Stage.Generation, Ready: true})
	}
	for t, p := range v.Publishes {
		if !p.Deleting {
			store.SetResult(id, state.PublishKey(t), state.Result{Generation: p.Generation, Ready: true})
		}
	}
}

var rwo = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

func stageReq(id string) *csi.NodeStageVolumeRequest {
	return &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: root + "/staging/" + id, VolumeCapability: rwo}
}

func TestConcurrentDuplicatesAllSucceed(t *testing.T) {
	s, store, _ := newServer(t)
	errs := make(chan error, 10)
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.NodeStageVolume(context.Background(), stageReq("v"))
			errs <- err
		}()
	}
	// Wait until the intent is recorded, then converge it once.
	for {
		ch := store.Watch("v")
		if _, err := store.Get("v"); err == nil {
			break
		}
		<-ch
	}
	readyAll(store, "v")
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("duplicate stage: got %v, want OK", err)
		}
	}
	if v, _ := store.Get("v"); v.Generation != 1 {
		t.Errorf("duplicates changed the record: generation %d, want 1", v.Generation)
	}
}

func TestSupersededRequestIsAborted(t *testing.T) {
	s, store, rec := newServer(t)
	rec.onKick = func() {
		// A later request withdraws the stage before it converges.
		go store.Update("v", func(v *state.Volume) error {
			if v.Stage != nil {
				v.Stage.Deleting = true
			}
			return nil
		})
	}
	_, err := s.NodeStageVolume(context.Background(), stageReq("v"))
	if rpcerr.Code(err) != codes.Aborted {
		t.Errorf("got %v, want Aborted", err)
	}
}

func TestTerminalFailureAnsweredAfterRollback(t *testing.T) {
	s, store, rec := newServer(t)
	rec.onKick = func() {
		go func() {
			v, _ := store.Get("v")
			gen := v.Stage.Generation
			store.SetTerminalFailure("v", state.StageKey, state.TerminalFailure{Generation: gen, Err: classified.Terminalf(classified.KindFailedPrecondition, "wrong filesystem")})
			store.Update("v", func(v *state.Volume) error { v.Stage.Deleting = true; return nil })
			store.Update("v", func(v *state.Volume) error { v.Stage = nil; return nil })
		}()
	}
	_, err := s.NodeStageVolume(context.Background(), stageReq("v"))
	if rpcerr.Code(err) != codes.FailedPrecondition || status.Convert(err).Message() != "wrong filesystem" {
		t.Errorf("got %v, want FailedPrecondition: wrong filesystem", err)
	}
	if _, gerr := store.Get("v"); gerr == nil {
		t.Error("answered before the rollback removed the stage")
	}
}

func TestChecks(t *testing.T) {
	s, store, _ := newServer(t)
	fail := classified.Terminalf(classified.KindNotFound, "gone")
	store.SetTerminalFailure("v", state.StageKey, state.TerminalFailure{Generation: 3, Err: fail})
	store.SetResult("v", state.StageKey, state.Result{Generation: 4, Ready: true})
	tests := []struct {
		name     string
		gen      int64
		stage    *state.Stage
		wantDone bool
		wantCode codes.Code
	}{
		{name: "pending", gen: 5, stage: &state.Stage{Generation: 5}, wantDone: false},
		{name: "ready", gen: 4, stage: &state.Stage{Generation: 4}, wantDone: true, wantCode: codes.OK},
		{name: "failed, rolling back", gen: 3, stage: &state.Stage{Generation: 6, Deleting: true}, wantDone: false},
		{name: "failed, rolled back", gen: 3, stage: nil, wantDone: true, wantCode: codes.NotFound},
		{name: "superseded", gen: 2, stage: &state.Stage{Generation: 7}, wantDone: true, wantCode: codes.Aborted},
		{name: "withdrawn by unstage", gen: 2, stage: &state.Stage{Generation: 7, Deleting: true}, wantDone: true, wantCode: codes.Aborted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			done, err, _ := s.setupCheck("v", state.StageKey, tc.gen, liveStage)(&state.Volume{ID: "v", Stage: tc.stage})
			if done != tc.wantDone {
				t.Fatalf("done: got %v, want %v", done, tc.wantDone)
			}
			if done && rpcerr.Code(err) != tc.wantCode {
				t.Errorf("code: got %v, want %s", err, tc.wantCode)
			}
		})
	}
}

func TestDeadlineKeepsTheIntent(t *testing.T) {
	s, store, _ := newServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	store.SetResult("v", state.StageKey, state.Result{Generation: 1, Err: classified.Errorf(classified.KindInternal, "device busy"), Attempts: 2})
	_, err := s.NodeStageVolume(ctx, stageReq("v"))
	if rpcerr.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	if v, gerr := store.Get("v"); gerr != nil || v.Stage == nil {
		t.Errorf("intent after deadline: got %v, %v; want it kept for the retry", v, gerr)
	}
}

func TestIntentConflicts(t *testing.T) {
	s, store, rec := newServer(t)
	rec.onKick = func() { readyAll(store, "v") }
	ctx := context.Background()
	if _, err := s.NodeStageVolume(ctx, stageReq("v")); err != nil {
		t.Fatal(err)
	}
	snsw := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER},
	}
	pub := func(target string, c *csi.VolumeCapability, ro bool) error {
		_, err := s.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
			VolumeId: "v", StagingTargetPath: root + "/staging/v", TargetPath: root + "/pods/" + target, VolumeCapability: c, Readonly: ro,
		})
		return err
	}
	if err := pub("a", snsw, false); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"second target of a single writer", pub("b", rwo, false), codes.FailedPrecondition},
		{"same target, other options", pub("a", snsw, true), codes.AlreadyExists},
		{"same target, same options", pub("a", snsw, false), codes.OK},
		{"unstage while published", func() error {
			_, err := s.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "v", StagingTargetPath: root + "/staging/v"})
			return err
		}(), codes.FailedPrecondition},
		{"unpublish of an unknown target", func() error {
			_, err := s.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: root + "/pods/zzz"})
			return err
		}(), codes.OK},
	}
	for _, tc := range tests {
		if got := rpcerr.Code(tc.err); got != tc.want {
			t.Errorf("%s: got %v, want %s", tc.name, tc.err, tc.want)
		}
	}
}

func TestBadInputRecordsNothing(t *testing.T) {
	s, store, _ := newServer(t)
	ctx := context.Background()
	flags := func(f ...string) *csi.VolumeCapability {
		return &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{MountFlags: f}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}
	}
	st := func(id, path string, c *csi.VolumeCapability) error {
		_, err := s.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: path, VolumeCapability: c})
		return err
	}
	pub := func(id, staging, target string) error {
		_, err := s.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwo})
		return err
	}
	good := root + "/staging/v"
	tests := []struct {
		name string
		err  error
	}{
		{"stage: empty ID", st("", good, rwo)},
		{"stage: slash in ID", st("a/b", good, rwo)},
		{"stage: dot-dot ID", st("..", good, rwo)},
		{"stage: path outside", st("v", "/etc", rwo)},
		{"stage: root itself", st("v", root, rwo)},
		{"stage: traversal", st("v", root+"/../../etc", rwo)},
		{"stage: no capability", st("v", good, nil)},
		{"stage: no access mode", st("v", good, &csi.VolumeCapability{AccessType: rwo.AccessType})},
		{"stage: remount flag", st("v", good, flags("remount"))},
		{"stage: comma in flag", st("v", good, flags("ro,bind"))},
		{"stage: newline in flag", st("v", good, flags("noatime\nbind"))},
		{"stage: path in flag", st("v", good, flags("data=/dev/sda"))},
		{"stage: unquoted label with comma", st("v", good, flags("context=a,b"))},
		{"publish: no target", pub("v", good, "")},
		{"publish: no staging", pub("v", "", root+"/pods/a")},
		{"publish: target equals staging", pub("v", good, good)},
		{"publish: target outside", pub("v", good, "/root/x")},
		{"stage: on-node-loss choice unknown", func() error {
			_, err := s.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: good, VolumeCapability: rwo,
				VolumeContext: map[string]string{contract.OnNodeLossKey: "delete"}})
			return err
		}()},
		{"publish: on-node-loss choice unknown", func() error {
			_, err := s.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "v", StagingTargetPath: good, TargetPath: root + "/pods/a", VolumeCapability: rwo,
				VolumeContext: map[string]string{contract.OnNodeLossKey: "delete"}})
			return err
		}()},
		{"unpublish: no target", func() error {
			_, err := s.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v"})
			return err
		}()},
		{"unstage: no path", func() error {
			_, err := s.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "v"})
			return err
		}()},
		{"stats: no path", func() error {
			_, err := s.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "v"})
			return err
		}()},
	}
	for _, tc := range tests {
		if got := rpcerr.Code(tc.err); got != codes.InvalidArgument {
			t.Errorf("%s: got %v, want InvalidArgument", tc.name, tc.err)
		}
	}
	if vols := store.List(); len(vols) != 0 {
		t.Errorf("bad requests recorded intents: %+v", vols)
	}
	// A quoted SELinux label with categories is allowed.
	if err := contract.CheckMountFlags([]string{`context="system_u:object_r:container_file_t:s0:c1,c2"`, "noatime"}); err != nil {
		t.Errorf("quoted label: %v", err)
	}
}

// TestOnNodeLossAttributeAccepted stages and publishes a volume whose PV
// carries the on-node-loss choice CreateVolume recorded: the kubelet passes
// it in the volume context of both.
func TestOnNodeLossAttributeAccepted(t *testing.T) {
	s, store, rec := newServer(t)
	rec.onKick = func() { readyAll(store, "v") }
	ctx := context.Background()
	vc := map[string]string{contract.OnNodeLossKey: "release"}
	if _, err := s.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: root + "/staging/v",
		VolumeCapability: rwo, VolumeContext: vc}); err != nil {
		t.Fatalf("stage: got %v, want OK", err)
	}
	if _, err := s.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "v", StagingTargetPath: root + "/staging/v",
		TargetPath: root + "/pods/a", VolumeCapability: rwo, VolumeContext: vc}); err != nil {
		t.Fatalf("publish: got %v, want OK", err)
	}
}

// TestStageOfAVolumeBeingDeleted checks that a volume whose image the
// controller is removing takes no stage intent: NOT_FOUND, nothing
// recorded.
func TestStageOfAVolumeBeingDeleted(t *testing.T) {
	s, store, _ := newServer(t)
	if _, err := store.Update("v1", func(v *state.Volume) error { return v.StartRemoval() }); err != nil {
		t.Fatal(err)
	}
	_, err := s.NodeStageVolume(t.Context(), stageReq("v1"))
	if rpcerr.Code(err) != codes.NotFound {
		t.Errorf("stage of a volume being deleted: %v, want NotFound", err)
	}
	if v, _ := store.Get("v1"); v == nil || v.Stage != nil || !v.Removing {
		t.Errorf("record after the refused stage: %+v", v)
	}
}

// TestBlockStageMarksTheVolumeRaw checks that a stage as a raw block
// device records, for good, that the volume may have been written raw
// (what its snapshots then say), whatever it was made for, while a stage
// as a filesystem records nothing of the kind: it proves nothing of what
// was written before it.
// rawBlock is a raw block device's capability, read-write on one node.
var rawBlock = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

func TestBlockStageMarksTheVolumeRaw(t *testing.T) {
	for _, tc := range []struct {
		name       string
		made       state.AccessType
		staged     *csi.VolumeCapability
		wantAccess state.AccessType
	}{
		{name: "made for a filesystem, staged raw", made: state.AccessMount, staged: rawBlock, wantAccess: state.AccessBlock},
		{name: "made before access was recorded, staged raw", staged: rawBlock, wantAccess: state.AccessBlock},
		{name: "made for a filesystem, staged so", made: state.AccessMount, staged: rwo, wantAccess: state.AccessMount},
		{name: "made before access was recorded, staged as a filesystem", staged: rwo, wantAccess: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, store, rec := newServer(t)
			if _, err := store.Update("v1", func(v *state.Volume) error {
				v.Provisioning, v.Access = state.ProvisionThick, tc.made
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			rec.onKick = func() { readyAll(store, "v1") }
			req := stageReq("v1")
			req.VolumeCapability = tc.staged
			if _, err := s.NodeStageVolume(t.Context(), req); err != nil {
				t.Fatal(err)
			}
			v, err := store.Get("v1")
			if err != nil {
				t.Fatal(err)
			}
			if v.Access != tc.wantAccess {
				t.Errorf("record after the stage: access %q, want %q", v.Access, tc.wantAccess)
			}
		})
	}
}

// TestBlockVolumeNeverMounted checks that a volume recorded as Block (made
// for a raw block device, or ever staged as one) is refused a filesystem
// stage with FAILED_PRECONDITION and records nothing, while a Block stage
// of it and a filesystem stage of a Filesystem volume go on.
func TestBlockVolumeNeverMounted(t *testing.T) {
	for _, tc := range []struct {
		name      string
		made      state.AccessType
		formatted bool
		staged    *csi.VolumeCapability
		want      codes.Code
	}{
		{name: "Block, staged as a filesystem", made: state.AccessBlock, staged: rwo, want: codes.FailedPrecondition},
		{name: "Block once formatted, staged as a filesystem", made: state.AccessBlock, formatted: true, staged: rwo, want: codes.FailedPrecondition},
		{name: "Block, staged raw", made: state.AccessBlock, staged: rawBlock, want: codes.OK},
		{name: "Filesystem, staged as a filesystem", made: state.AccessMount, staged: rwo, want: codes.OK},
		{name: "made before access was recorded, staged as a filesystem", staged: rwo, want: codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, store, rec := newServer(t)
			if _, err := store.Update("v1", func(v *state.Volume) error {
				v.Provisioning, v.Access = state.ProvisionThick, tc.made
				if tc.formatted {
					v.Formatted = "ext4"
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			rec.onKick = func() { readyAll(store, "v1") }
			req := stageReq("v1")
			req.VolumeCapability = tc.staged
			_, staged := s.NodeStageVolume(t.Context(), req)
			if got := rpcerr.Code(staged); got != tc.want {
				t.Fatalf("got %v, want %s", staged, tc.want)
			}
			v, err := store.Get("v1")
			if err != nil {
				t.Fatal(err)
			}
			if tc.want != codes.OK && (v.Stage != nil || !strings.Contains(staged.Error(), contract.AllowModeChangeKey)) {
				t.Errorf("refused: stage recorded %+v, message %q", v.Stage, staged)
			}
		})
	}
}

// syncGate is a store whose writes become durable only when the test says,
// and then fail with err.
type syncGate struct {
	*state.Store
	release chan struct{}
	synced  chan struct{}
	err     error
}

func (g *syncGate) UpdateUnsynced(id string, fn func(v *state.Volume) error) (*state.Volume, func() error, error) {
	v, durable, err := g.Store.UpdateUnsynced(id, fn)
	if err != nil {
		return nil, nil, err
	}
	return v, func() error {
		<-g.release
		defer close(g.synced)
		if err := durable(); err != nil {
			return err
		}
		return g.err
	}, nil
}

// TestIntentWorkOverlapsItsSync checks that a request kicks the
// reconciler before its intent is durable (the work overlaps the
// fdatasync), never answers before it is durable, and answers UNAVAILABLE,
// uncertain to the kubelet, when it cannot be made durable, even though
// the work was done.
func TestIntentWorkOverlapsItsSync(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{name: "durable", want: codes.OK},
		{name: "sync fails", err: fmt.Errorf("fdatasync: input/output error"), want: codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, store, rec := newServer(t)
			g := &syncGate{Store: store, release: make(chan struct{}), synced: make(chan struct{}), err: tc.err}
			s.cfg.Store = g
			kickedBeforeSync := make(chan bool, 1)
			rec.onKick = func() {
				select {
				case <-g.synced:
					kickedBeforeSync <- false
				default:
					kickedBeforeSync <- true
				}
				readyAll(store, "v1")
			}
			answered := make(chan error, 1)
			go func() {
				_, err := s.NodeStageVolume(context.Background(), stageReq("v1"))
				answered <- err
			}()
			if !<-kickedBeforeSync {
				t.Fatal("the reconciler was kicked only after the intent was durable")
			}
			select {
			case err := <-answered:
				t.Fatalf("answered %v before the intent was durable", err)
			default:
			}
			close(g.release)
			if got := rpcerr.Code(<-answered); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
