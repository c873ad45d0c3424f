package integration

import (
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-csi/converge/test/testenv"
)

// tree lists every file and directory under dir with its size, leaving out
// the store file, whose pages bbolt may touch on any read.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Name() == "state.db" || d.Type()&fs.ModeSocket != 0 {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		size := info.Size()
		if d.IsDir() {
			size = 0
		}
		out = append(out, path+" "+info.Mode().String()+" "+strings.Repeat("+", int(min(size, 1))))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

func diffTrees(before, after []string) (added, removed []string) {
	in := func(xs []string, x string) bool { i := sort.SearchStrings(xs, x); return i < len(xs) && xs[i] == x }
	for _, a := range after {
		if !in(before, a) {
			added = append(added, a)
		}
	}
	for _, b := range before {
		if !in(after, b) {
			removed = append(removed, b)
		}
	}
	return added, removed
}

// TestAttackTable sends hostile requests to every RPC of the real binary.
// Each gets its exact code, and afterwards nothing is mounted, attached,
// created or removed anywhere under the test's directory (roots, data
// directory, and a directory outside the roots that symlinks point to).
func TestAttackTable(t *testing.T) {
	p := testenv.New(t, testenv.VolumeHealth)
	p.Start()
	volA := create(t, p, "vol-a")
	n, c := p.Node(), p.Controller()
	staging := mkdir(t, filepath.Join(p.Root, "staging-a"))
	pod := mkdir(t, filepath.Join(p.Root, "pod-a"))
	target := filepath.Join(pod, "mount")
	outside := mkdir(t, filepath.Join(p.Dir, "outside"))
	link := filepath.Join(p.Root, "link")
	must(t, "symlink", os.Symlink(outside, link))
	fileLink := filepath.Join(pod, "mount-link")
	must(t, "symlink", os.Symlink(filepath.Join(outside, "mount"), fileLink))

	flags := func(f ...string) *csi.VolumeCapability {
		return &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{MountFlags: f}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}
	}
	mode := func(m csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability { return mountCap("", m) }
	block := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	noAccessType := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	stageReq := func(id, path string, cp *csi.VolumeCapability) func() error {
		return func() error {
			_, err := n.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: path, VolumeCapability: cp})
			return err
		}
	}
	stageCtx := func(vc map[string]string) func() error {
		return func() error {
			_, err := n.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: volA, StagingTargetPath: staging, VolumeCapability: rwo, VolumeContext: vc})
			return err
		}
	}
	publishReq := func(id, stg, tgt string, cp *csi.VolumeCapability) func() error {
		return func() error {
			_, err := n.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: stg, TargetPath: tgt, VolumeCapability: cp})
			return err
		}
	}
	unpublishReq := func(id, tgt string) func() error {
		return func() error {
			_, err := n.NodeUnpublishVolume(ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: tgt})
			return err
		}
	}
	unstageReq := func(id, path string) func() error {
		return func() error {
			_, err := n.NodeUnstageVolume(ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: path})
			return err
		}
	}
	statsReq := func(id, path string) func() error {
		return func() error {
			_, err := n.NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: path})
			return err
		}
	}
	createReq := func(name string, size int64, params map[string]string, caps ...*csi.VolumeCapability) func() error {
		return func() error {
			_, err := c.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, Parameters: params, VolumeCapabilities: caps})
			return err
		}
	}
	expandReq := func(id, path string, size int64) func() error {
		return func() error {
			_, err := n.NodeExpandVolume(ctx(t), &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: path, CapacityRange: &csi.CapacityRange{RequiredBytes: size}})
			return err
		}
	}
	long := strings.Repeat("a", 129)
	deep := p.Root + "/" + strings.Repeat("d/", 2100) + "x"

	cases := []struct {
		name string
		call func() error
		want codes.Code
	}{
		// Identifiers.
		{"stage: empty ID", stageReq("", staging, rwo), codes.InvalidArgument},
		{"stage: traversal in ID", stageReq("../vol-a", staging, rwo), codes.InvalidArgument},
		{"stage: ID is dot", stageReq(".", staging, rwo), codes.InvalidArgument},
		{"stage: ID is dot-dot", stageReq("..", staging, rwo), codes.InvalidArgument},
		{"stage: slash in ID", stageReq("a/b", staging, rwo), codes.InvalidArgument},
		{"stage: NUL in ID", stageReq("vol-a\x00x", staging, rwo), codes.InvalidArgument},
		{"stage: 129-byte ID", stageReq(long, staging, rwo), codes.InvalidArgument},
		{"stage: non-ASCII ID", stageReq("völ", staging, rwo), codes.InvalidArgument},
		{"stage: space in ID", stageReq("vol a", staging, rwo), codes.InvalidArgument},
		{"stage: unknown volume", stageReq("no-such-volume", staging, rwo), codes.NotFound},
		// Paths.
		{"stage: empty path", stageReq(volA, "", rwo), codes.InvalidArgument},
		{"stage: relative path", stageReq(volA, "pods/staging-a", rwo), codes.InvalidArgument},
		{"stage: dot-dot in path", stageReq(volA, staging+"/../staging-a", rwo), codes.InvalidArgument},
		{"stage: trailing slash", stageReq(volA, staging+"/", rwo), codes.InvalidArgument},
		{"stage: double slash", stageReq(volA, p.Root+"//staging-a", rwo), codes.InvalidArgument},
		{"stage: outside the roots", stageReq(volA, outside, rwo), codes.InvalidArgument},
		{"stage: /etc", stageReq(volA, "/etc", rwo), codes.InvalidArgument},
		{"stage: the root itself", stageReq(volA, p.Root, rwo), codes.InvalidArgument},
		{"stage: sibling sharing the root's prefix", stageReq(volA, p.Root+"-evil/x", rwo), codes.InvalidArgument},
		{"stage: NUL in path", stageReq(volA, staging+"\x00/x", rwo), codes.InvalidArgument},
		{"stage: path over PATH_MAX", stageReq(volA, deep, rwo), codes.InvalidArgument},
		{"stage: symlinked component", stageReq(volA, filepath.Join(link, "x"), rwo), codes.InvalidArgument},
		{"stage: path is a symlink", stageReq(volA, link, rwo), codes.InvalidArgument},
		{"stage: missing directory", stageReq(volA, filepath.Join(p.Root, "nowhere"), rwo), codes.FailedPrecondition},
		// Capabilities and parameters.
		{"stage: no capability", stageReq(volA, staging, nil), codes.InvalidArgument},
		{"stage: no access type", stageReq(volA, staging, noAccessType), codes.InvalidArgument},
		{"stage: no access mode", stageReq(volA, staging, &csi.VolumeCapability{AccessType: rwo.AccessType}), codes.InvalidArgument},
		{"stage: multi-node mode", stageReq(volA, staging, mode(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)), codes.InvalidArgument},
		{"stage: unknown fs type", stageReq(volA, staging, mountCap("ntfs", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)), codes.InvalidArgument},
		{"stage: fs type with a space", stageReq(volA, staging, mountCap("ext4 ", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)), codes.InvalidArgument},
		{"stage: fs type as mount option", stageReq(volA, staging, mountCap("ext4,loop", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)), codes.InvalidArgument},
		{"stage: flag bind", stageReq(volA, staging, flags("bind")), codes.InvalidArgument},
		{"stage: flag rbind", stageReq(volA, staging, flags("rbind")), codes.InvalidArgument},
		{"stage: flag remount", stageReq(volA, staging, flags("remount")), codes.InvalidArgument},
		{"stage: flag move", stageReq(volA, staging, flags("move")), codes.InvalidArgument},
		{"stage: flag loop", stageReq(volA, staging, flags("loop=/dev/loop7")), codes.InvalidArgument},
		{"stage: helper option", stageReq(volA, staging, flags("helper=/bin/sh")), codes.InvalidArgument},
		{"stage: x-mount.mkdir", stageReq(volA, staging, flags("x-mount.mkdir")), codes.InvalidArgument},
		{"stage: comma smuggles bind", stageReq(volA, staging, flags("ro,bind")), codes.InvalidArgument},
		{"stage: newline in flag", stageReq(volA, staging, flags("noatime\nbind")), codes.InvalidArgument},
		{"stage: NUL in flag", stageReq(volA, staging, flags("noatime\x00bind")), codes.InvalidArgument},
		{"stage: flag names a device", stageReq(volA, staging, flags("data=/dev/sda")), codes.InvalidArgument},
		{"stage: journal on another device", stageReq(volA, staging, flags("journal_path=/dev/sdb")), codes.InvalidArgument},
		{"stage: unquoted label with comma", stageReq(volA, staging, flags("context=a,bind")), codes.InvalidArgument},
		{"stage: empty flag", stageReq(volA, staging, flags("")), codes.InvalidArgument},
		{"stage: oversized flag", stageReq(volA, staging, flags("context=\""+strings.Repeat("x", 300)+"\"")), codes.InvalidArgument},
		{"stage: 65 flags", stageReq(volA, staging, flags(strings.Split(strings.Repeat("noatime ", 65), " ")[:65]...)), codes.InvalidArgument},
		{"stage: unknown volume attribute", stageCtx(map[string]string{"device": "/dev/sda"}), codes.InvalidArgument},
		{"stage: 2 MiB request", stageCtx(map[string]string{"csi.storage.k8s.io/pad": strings.Repeat("x", 2<<20)}), codes.ResourceExhausted},
		// Publish.
		{"publish: empty ID", publishReq("", staging, target, rwo), codes.InvalidArgument},
		{"publish: traversal in ID", publishReq("../x", staging, target, rwo), codes.InvalidArgument},
		{"publish: empty target", publishReq(volA, staging, "", rwo), codes.InvalidArgument},
		{"publish: empty staging path", publishReq(volA, "", target, rwo), codes.InvalidArgument},
		{"publish: target outside the roots", publishReq(volA, staging, filepath.Join(outside, "mount"), rwo), codes.InvalidArgument},
		{"publish: unclean target", publishReq(volA, staging, pod+"/../pod-a/mount", rwo), codes.InvalidArgument},
		{"publish: target is the staging path", publishReq(volA, staging, staging, rwo), codes.InvalidArgument},
		{"publish: no capability", publishReq(volA, staging, target, nil), codes.InvalidArgument},
		{"publish: flag bind", publishReq(volA, staging, target, flags("bind")), codes.InvalidArgument},
		{"publish: not staged", publishReq(volA, staging, target, rwo), codes.FailedPrecondition},
		{"publish: block, not staged", publishReq(volA, staging, target, block), codes.FailedPrecondition},
		{"publish: unknown volume", publishReq("no-such-volume", staging, target, rwo), codes.FailedPrecondition},
		// Unpublish, unstage.
		{"unpublish: empty ID", unpublishReq("", target), codes.InvalidArgument},
		{"unpublish: traversal in ID", unpublishReq("../x", target), codes.InvalidArgument},
		{"unpublish: empty target", unpublishReq(volA, ""), codes.InvalidArgument},
		{"unpublish: target outside the roots", unpublishReq(volA, outside), codes.InvalidArgument},
		{"unpublish: symlinked target", unpublishReq(volA, fileLink), codes.OK},
		{"unstage: empty ID", unstageReq("", staging), codes.InvalidArgument},
		{"unstage: traversal in ID", unstageReq("../x", staging), codes.InvalidArgument},
		{"unstage: empty path", unstageReq(volA, ""), codes.InvalidArgument},
		{"unstage: path outside the roots", unstageReq(volA, "/etc"), codes.InvalidArgument},
		// Stats, health, expansion.
		{"stats: empty ID", statsReq("", staging), codes.InvalidArgument},
		{"stats: empty path", statsReq(volA, ""), codes.InvalidArgument},
		{"stats: traversal in ID", statsReq("../vol-a", staging), codes.NotFound},
		{"stats: not staged", statsReq(volA, staging), codes.NotFound},
		{"stats: path outside", statsReq(volA, "/etc"), codes.NotFound},
		{"health: empty ID", func() error {
			_, err := n.NodeGetVolumeHealth(ctx(t), &csi.NodeGetVolumeHealthRequest{})
			return err
		}, codes.InvalidArgument},
		{"health: traversal in ID", func() error {
			_, err := n.NodeGetVolumeHealth(ctx(t), &csi.NodeGetVolumeHealthRequest{VolumeId: "../../etc"})
			return err
		}, codes.NotFound},
		{"expand: empty ID", expandReq("", staging, 1<<20), codes.InvalidArgument},
		{"expand: traversal in ID", expandReq("../vol-a", staging, 1<<20), codes.NotFound},
		{"expand: empty path", expandReq(volA, "", 1<<20), codes.InvalidArgument},
		{"expand: path outside the roots of a volume not here", expandReq(volA, "/etc", 1<<20), codes.NotFound},
		{"expand: negative size", expandReq(volA, staging, -1), codes.InvalidArgument},
		{"expand: not staged", expandReq(volA, staging, 1<<20), codes.NotFound},
		{"expand: unknown volume", expandReq("no-such-volume", staging, 1<<20), codes.NotFound},
		{"expand: limit below required", func() error {
			_, err := n.NodeExpandVolume(ctx(t), &csi.NodeExpandVolumeRequest{VolumeId: volA, VolumePath: staging, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20, LimitBytes: 1 << 20}})
			return err
		}, codes.OutOfRange},
		{"controller expand: unknown volume", func() error {
			_, err := c.ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: "../vol-a", CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}})
			return err
		}, codes.NotFound},
		{"controller expand: 8 EiB", func() error {
			_, err := c.ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: volA, CapacityRange: &csi.CapacityRange{RequiredBytes: 1<<63 - 1}})
			return err
		}, codes.OutOfRange},
		{"controller expand: shrink below the limit", func() error {
			_, err := c.ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: volA, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20, LimitBytes: 1 << 20}})
			return err
		}, codes.OutOfRange},
		// Controller.
		{"create: empty name", createReq("", 1<<20, nil, rwo), codes.InvalidArgument},
		{"create: traversal in name", createReq("../../etc/passwd", 1<<20, nil, rwo), codes.InvalidArgument},
		{"create: 129-byte name", createReq(long, 1<<20, nil, rwo), codes.InvalidArgument},
		{"create: 8 EiB", createReq("huge", 1<<63-1, nil, rwo), codes.OutOfRange},
		{"create: negative size", createReq("neg", -1, nil, rwo), codes.InvalidArgument},
		{"create: unknown parameter", createReq("param", 1<<20, map[string]string{"backingFile": "/etc/shadow"}, rwo), codes.InvalidArgument},
		{"create: no capability", createReq("nocap", 1<<20, nil), codes.InvalidArgument},
		{"create: multi-node", createReq("multi", 1<<20, nil, mode(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)), codes.InvalidArgument},
		{"create: hostile flag", createReq("flag", 1<<20, nil, flags("bind")), codes.InvalidArgument},
		{"create: limit below required", func() error {
			_, err := c.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "lim", CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20, LimitBytes: 1 << 20}, VolumeCapabilities: []*csi.VolumeCapability{rwo}})
			return err
		}, codes.OutOfRange},
		{"delete: empty ID", func() error {
			_, err := c.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{})
			return err
		}, codes.InvalidArgument},
		{"delete: traversal in ID", func() error {
			_, err := c.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: "../state"})
			return err
		}, codes.OK},
		{"validate: unknown volume", func() error {
			_, err := c.ValidateVolumeCapabilities(ctx(t), &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "../vol-a", VolumeCapabilities: []*csi.VolumeCapability{rwo}})
			return err
		}, codes.NotFound},
		{"list: forged token", func() error {
			_, err := c.ListVolumes(ctx(t), &csi.ListVolumesRequest{StartingToken: "after:../../etc"})
			return err
		}, codes.Aborted},
		{"list: negative page size", func() error {
			_, err := c.ListVolumes(ctx(t), &csi.ListVolumesRequest{MaxEntries: -1})
			return err
		}, codes.InvalidArgument},
	}
	if len(cases) < 60 {
		t.Fatalf("the table holds %d attacks, want at least 60", len(cases))
	}
	before := tree(t, p.Dir)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if got := status.Code(err); got != tc.want {
				t.Errorf("got %s (%v), want %s", got, err, tc.want)
			}
			if left := testenv.Leftovers(p.Dir, p.DataDir); len(left) > 0 {
				t.Errorf("mounted or attached: %v", left)
			}
			if added, removed := diffTrees(before, tree(t, p.Dir)); len(added)+len(removed) > 0 {
				t.Errorf("files changed: added %v, removed %v", added, removed)
			}
		})
	}
}

// TestConflictingConcurrentStages sends two stages of one volume at two
// paths at once: exactly one wins; the other is refused, and the loser's
// path is never mounted.
func TestConflictingConcurrentStages(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	volB := create(t, p, "vol-b")
	paths := []string{mkdir(t, filepath.Join(p.Root, "s1")), mkdir(t, filepath.Join(p.Root, "s2"))}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { errs[i] = stage(t, p, volB, paths[i], rwo) })
	}
	wg.Wait()
	won := -1
	for i, err := range errs {
		switch status.Code(err) {
		case codes.OK:
			if won >= 0 {
				t.Fatalf("both stages succeeded")
			}
			won = i
		case codes.AlreadyExists, codes.Aborted:
		default:
			t.Errorf("stage at %s: got %v, want OK, ALREADY_EXISTS or ABORTED", paths[i], err)
		}
	}
	if won < 0 {
		t.Fatalf("neither stage succeeded: %v", errs)
	}
	if _, ok := mountAt(t, paths[1-won]); ok {
		t.Errorf("the losing path %s is mounted", paths[1-won])
	}
	unstage(t, p, volB, paths[won])
}

// TestRefusalsNameTheUnknown checks that unknown StorageClass parameters and
// volume attributes are refused by name, while the keys Kubernetes adds on
// its own are accepted.
func TestRefusalsNameTheUnknown(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	_, err := p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "vol-n", VolumeCapabilities: []*csi.VolumeCapability{rwo},
		Parameters: map[string]string{"csi.storage.k8s.io/fstype": "ext4", "sizeInGB": "1", "backing": "/dev/sda"}})
	wantCode(t, "create with unknown parameters", err, codes.InvalidArgument)
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "sizeInGB") || !strings.Contains(msg, "backing") || strings.Contains(msg, "fstype") {
		t.Errorf("message %q should name sizeInGB and backing, and not the csi.storage.k8s.io/ key", msg)
	}
	volN := create(t, p, "vol-n")
	staging := mkdir(t, filepath.Join(p.Root, "staging-n"))
	_, err = p.Node().NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: volN, StagingTargetPath: staging, VolumeCapability: rwo,
		VolumeContext: map[string]string{"storage.kubernetes.io/csiProvisionerIdentity": "x", "mountOptions": "bind"}})
	wantCode(t, "stage with an unknown attribute", err, codes.InvalidArgument)
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "mountOptions") || strings.Contains(msg, "csiProvisionerIdentity") {
		t.Errorf("message %q should name mountOptions only", msg)
	}
	_, err = p.Node().NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: volN, StagingTargetPath: staging, VolumeCapability: rwo,
		VolumeContext: map[string]string{"storage.kubernetes.io/csiProvisionerIdentity": "x"}})
	must(t, "stage with the provisioner's identity", err)
	unstage(t, p, volN, staging)
}
