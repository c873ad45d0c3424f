package integration

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/mount-utils"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/test/testenv"
)

// flagCase says how one allowed mount flag is tried: on which filesystem
// (made with which mkfs options), with which value for a "key=" flag, and
// which per-mount option mountinfo must then show at the staging path and
// at the target.
type flagCase struct {
	flag, fs, mkfs string
	// shows is the per-mount option the mounts must carry; "" for a
	// filesystem option, which mountinfo lists per superblock.
	shows string
	// kernel marks a flag that kernels take or refuse depending on their
	// build or version; a refusal must then be INVALID_ARGUMENT at once,
	// naming the option, with nothing left mounted.
	kernel string
	// formatFirst stages the volume once without the flag, so that it
	// has a filesystem: a read-only stage never formats.
	formatFirst bool
}

// flagCases covers every entry of the mount flag policy.
var flagCases = map[string]flagCase{
	"ro":           {fs: "ext4", shows: "ro", formatFirst: true},
	"rw":           {fs: "ext4", shows: "rw"},
	"sync":         {fs: "ext4"},
	"async":        {fs: "ext4"},
	"dirsync":      {fs: "ext4"},
	"noexec":       {fs: "ext4", shows: "noexec"},
	"exec":         {fs: "ext4"},
	"nosuid":       {fs: "ext4", shows: "nosuid"},
	"suid":         {fs: "ext4"},
	"nodev":        {fs: "ext4", shows: "nodev"},
	"dev":          {fs: "ext4"},
	"noatime":      {fs: "ext4", shows: "noatime"},
	"atime":        {fs: "ext4", shows: "relatime"},
	"relatime":     {fs: "ext4", shows: "relatime"},
	"norelatime":   {fs: "ext4"},
	"strictatime":  {fs: "ext4"},
	"nodiratime":   {fs: "ext4", shows: "nodiratime"},
	"diratime":     {fs: "ext4"},
	"lazytime":     {fs: "ext4"},
	"nolazytime":   {fs: "ext4"},
	"discard":      {fs: "xfs"},
	"nodiscard":    {fs: "xfs"},
	"acl":          {fs: "ext4"},
	"noacl":        {fs: "btrfs"},
	"user_xattr":   {fs: "ext4"},
	"nouser_xattr": {fs: "ext4", kernel: "ext4 dropped nouser_xattr in Linux 6.x"},
	"barrier":      {fs: "ext4"},
	"nobarrier":    {fs: "ext4"},
	"nouuid":       {fs: "xfs"},
	"inode64":      {fs: "xfs"},
	"largeio":      {fs: "xfs"},
	"nolargeio":    {fs: "xfs"},
	"usrquota":     {fs: "ext4"},
	"grpquota":     {fs: "ext4"},
	"prjquota":     {fs: "ext4", mkfs: "-I 256 -O quota,project", kernel: "ext4 project quota needs a kernel built with CONFIG_QUOTA"},
	"uquota":       {fs: "xfs", kernel: "XFS quota is a kernel build option"},
	"gquota":       {fs: "xfs", kernel: "XFS quota is a kernel build option"},
	"pquota":       {fs: "xfs", kernel: "XFS quota is a kernel build option"},
	"errors=":      {flag: "errors=remount-ro", fs: "ext4"},
	"data=":        {flag: "data=ordered", fs: "ext4"},
	"commit=":      {flag: "commit=5", fs: "ext4"},
	"allocsize=":   {flag: "allocsize=64k", fs: "xfs"},
	"logbufs=":     {flag: "logbufs=8", fs: "xfs"},
	// Without SELinux in the kernel, the plugin drops the context options,
	// as mount(8) does.
	"context=":     {flag: `context="system_u:object_r:container_file_t:s0:c1,c2"`, fs: "ext4"},
	"fscontext=":   {flag: "fscontext=system_u:object_r:container_file_t:s0", fs: "ext4"},
	"defcontext=":  {flag: "defcontext=system_u:object_r:container_file_t:s0", fs: "ext4"},
	"rootcontext=": {flag: "rootcontext=system_u:object_r:container_file_t:s0", fs: "ext4"},
}

// TestEveryAllowedMountFlag stages and publishes a volume with each flag
// the policy allows, on a filesystem that takes it: both the staging mount
// and the pod's bind mount must work and carry the flag. A flag the kernel
// refuses is answered INVALID_ARGUMENT at once, never retried until the
// deadline, and leaves nothing mounted.
func TestEveryAllowedMountFlag(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	for _, policy := range contract.AllowedMountFlags() {
		tc, ok := flagCases[policy]
		if !ok {
			t.Errorf("mount flag %q is allowed but has no case here", policy)
			continue
		}
		if tc.flag == "" {
			tc.flag = policy
		}
		t.Run(tc.flag, func(t *testing.T) { flagRun(t, p, tc) })
	}
	t.Run("refused by the filesystem", func(t *testing.T) {
		flagRun(t, p, flagCase{flag: "inode64", fs: "ext4", kernel: "ext4 has no inode64"})
	})
}

func flagRun(t *testing.T, p *testenv.Plugin, tc flagCase) {
	id := "flag-" + strings.NewReplacer("=", "-", `"`, "", ":", "-", ",", "-").Replace(tc.flag)
	id = id[:min(len(id), 40)]
	params := map[string]string{}
	if tc.mkfs != "" {
		params[contract.MkfsOptionsKey] = tc.mkfs
	}
	c := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: tc.fs, MountFlags: []string{tc.flag}}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	resp, err := p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 320 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{c}, Parameters: params})
	must(t, "create", err)
	id = resp.GetVolume().GetVolumeId()
	defer p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
	staging := mkdir(t, filepath.Join(p.Root, "staging-"+id))
	target := filepath.Join(mkdir(t, filepath.Join(p.Root, "pod-"+id)), "mount")
	if tc.formatFirst {
		must(t, "stage to format", stage(t, p, id, staging, mountCap(tc.fs, csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)))
		unstage(t, p, id, staging)
		_, err = p.Node().NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: c})
		wantCode(t, "the stage with ro's mount flags after a stage without", err, codes.OK)
		unstage(t, p, id, staging)
	}
	_, err = p.Node().NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: c, VolumeContext: resp.GetVolume().GetVolumeContext()})
	if err != nil && tc.kernel != "" {
		wantCode(t, "stage with a flag the kernel refuses ("+tc.kernel+")", err, codes.InvalidArgument)
		if msg := status.Convert(err).Message(); !strings.Contains(msg, tc.flag) {
			t.Errorf("refusal %q does not name %s", msg, tc.flag)
		}
		if _, mounted := mountAt(t, staging); mounted {
			t.Errorf("%s is mounted after the refused stage", staging)
		}
		t.Logf("the kernel refused %s (%s): %v", tc.flag, tc.kernel, err)
		return
	}
	must(t, "stage", err)
	defer unstage(t, p, id, staging)
	_, err = p.Node().NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: c})
	must(t, "publish", err)
	defer unpublish(t, p, id, target)
	for _, path := range []string{staging, target} {
		opts, ok := mountOptions(t, path)
		if !ok {
			t.Errorf("%s is not mounted", path)
			continue
		}
		if tc.shows != "" && !slices.Contains(opts, tc.shows) {
			t.Errorf("mount options at %s: got %s, want %s", path, strings.Join(opts, ","), tc.shows)
		}
	}
	if tc.flag != "ro" {
		must(t, "write through the target", os.WriteFile(filepath.Join(target, "f"), []byte("x"), 0o600))
	} else if err := os.WriteFile(filepath.Join(target, "f"), []byte("x"), 0o600); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write to a ro mount: got %v, want EROFS", err)
	}
}

// mountOptions returns the per-mount options of the top mount at path.
// devices.ReadMounts keeps none of them but ro: the flags are read with
// mount-utils' parser, the one FuzzReadMounts holds ReadMounts to.
func mountOptions(t *testing.T, path string) (opts []string, ok bool) {
	t.Helper()
	infos, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range infos {
		if m.MountPoint == path {
			opts, ok = m.MountOptions, true
		}
	}
	return opts, ok
}
