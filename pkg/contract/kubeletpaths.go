package contract

import (
	"path/filepath"
	"strings"
)

// The kubelet's layout of the paths it asks a CSI plugin to publish a
// volume at (k8s.io/kubernetes pkg/volume/csi: csiMountMgr.GetPath for a
// filesystem, NewBlockVolumeMapper's GetPodDeviceMapPath and
// getPublishDir for a raw block volume), below its root directory
// (--kubelet-dir):
//
//	filesystem: <kubelet-dir>/pods/<pod uid>/volumes/kubernetes.io~csi/<pv>/mount
//	block:      <kubelet-dir>/plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<pod uid>
//
// and the path it asks a raw block volume's stats at, which stands for
// that publish:
//
//	<kubelet-dir>/plugins/kubernetes.io/csi/volumeDevices/<pv>/dev/<pod uid>
const (
	kubeletCSIVolumes   = "kubernetes.io~csi"
	kubeletBlockDevices = "plugins/kubernetes.io/csi/volumeDevices"
)

// maxPodUID bounds a pod UID: the API server makes RFC 4122 UUIDs, 36
// characters; a static pod's UID is a hash, 32.
const maxPodUID = 64

// PodOfTarget returns the UID of the pod a publish target path belongs
// to, as the kubelet lays the paths out below kubeletDir (a filesystem's
// or a raw block volume's); false for a path of any other shape, or whose
// UID is not 1 to 64 letters, digits and "-": that path names no pod,
// and none is guessed.
func PodOfTarget(kubeletDir, target string) (string, bool) {
	rel, ok := strings.CutPrefix(target, filepath.Clean(kubeletDir)+"/")
	if !ok || filepath.Clean(target) != target {
		return "", false
	}
	f := strings.Split(rel, "/")
	var uid string
	switch {
	case len(f) == 6 && f[0] == "pods" && f[2] == "volumes" && f[3] == kubeletCSIVolumes && f[5] == "mount" && validName(f[4]):
		uid = f[1]
	case len(f) == 7 && strings.Join(f[:4], "/") == kubeletBlockDevices && f[4] == "publish" && validName(f[5]):
		uid = f[6]
	default:
		return "", false
	}
	if !validPodUID(uid) {
		return "", false
	}
	return uid, true
}

// BlockStatsTarget returns the publish target that a raw block volume's
// stats path stands for: the kubelet publishes a pod's block volume at
// <kubelet-dir>/plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<pod uid>
// and asks its stats at the device map path it made for the pod,
// <kubelet-dir>/plugins/kubernetes.io/csi/volumeDevices/<pv>/dev/<pod uid>.
// A path of any other shape stands for nothing.
func BlockStatsTarget(path string) (string, bool) {
	devDir, uid := filepath.Split(path)
	devDir = filepath.Clean(devDir)
	pvDir := filepath.Dir(devDir)
	base, pv := filepath.Split(pvDir)
	base = filepath.Clean(base)
	if uid == "" || filepath.Base(devDir) != "dev" || filepath.Base(base) != "volumeDevices" || pv == "publish" || pv == "staging" {
		return "", false
	}
	return filepath.Join(base, "publish", pv, uid), true
}

// BlockDeviceMapPath returns the path at which the kubelet binds a raw
// block volume for the pod whose publish target is target, below
// kubeletDir: <kubelet-dir>/plugins/kubernetes.io/csi/volumeDevices/<pv>/dev/<pod uid>,
// which it keeps while it has the device mapped into the pod and removes
// before its NodeUnpublishVolume (BlockStatsTarget's inverse). A target of
// another shape has none.
func BlockDeviceMapPath(kubeletDir, target string) (string, bool) {
	uid, ok := PodOfTarget(kubeletDir, target)
	if !ok {
		return "", false
	}
	rel := strings.TrimPrefix(target, filepath.Clean(kubeletDir)+"/")
	f := strings.Split(rel, "/")
	if len(f) != 7 || f[4] != "publish" {
		return "", false
	}
	return filepath.Join(filepath.Clean(kubeletDir), kubeletBlockDevices, f[5], "dev", uid), true
}

// validName reports whether a path component names something: not
// empty, "." nor "..".
func validName(s string) bool { return s != "" && s != "." && s != ".." }

// validPodUID reports whether uid can name a pod's cgroup unambiguously:
// 1 to maxPodUID letters, digits and "-" (the kubelet's systemd driver
// spells "-" as "_", and "/" would leave the directory).
func validPodUID(uid string) bool {
	if uid == "" || len(uid) > maxPodUID {
		return false
	}
	for _, c := range uid {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '-') {
			return false
		}
	}
	return true
}
