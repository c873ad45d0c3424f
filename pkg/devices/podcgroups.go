package devices

import (
	"fmt"
	"strings"
)

// The kubelet names a pod's cgroup after the pod's UID
// (k8s.io/kubernetes pkg/kubelet/cm: GetPodContainerName, "pod" + UID)
// and places it under its QoS class's cgroup below
// <cgroupRoot>/kubepods, Guaranteed pods right in kubepods. The cgroup
// driver spells the path:
//
//	cgroupfs: <cgroupRoot>/kubepods/burstable/pod<uid>
//	systemd:  <cgroupRoot>/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice
//
// where uid_ is the UID with each "-" turned into "_" (ToSystemd; the
// kubelet forbids "_" in a name's components, NewCgroupName, so that the
// change can be undone). The runtime makes each container's and the
// sandbox's cgroup inside the pod's (cgroupfs: <container-id>; systemd:
// cri-containerd-<id>.scope, crio-<id>.scope).

// podCgroupUID returns the UID of the pod whose cgroup a directory of
// that name is, in either driver's spelling; "" for a name that is not a
// pod's cgroup.
func podCgroupUID(name string) string {
	if uid, ok := strings.CutPrefix(name, "pod"); ok {
		if checkPodUID(uid) == nil {
			return uid
		}
		return ""
	}
	rest, ok := strings.CutSuffix(name, ".slice")
	i := strings.LastIndex(rest, "-pod")
	if !ok || i < 0 || !strings.HasPrefix(rest, "kubepods") && !strings.Contains(rest, "-kubepods") {
		return ""
	}
	uid := strings.ReplaceAll(rest[i+len("-pod"):], "_", "-")
	if checkPodUID(uid) != nil {
		return ""
	}
	return uid
}

// maxPodUID bounds a pod UID: the API server makes RFC 4122 UUIDs, 36
// characters; a static pod's UID is a hash, 32.
const maxPodUID = 64

// checkPodUID refuses a pod UID that could not name a pod's cgroup
// unambiguously: anything but 1 to maxPodUID letters, digits and "-"
// (systemd spells "-" as "_", and "/" would leave the directory).
func checkPodUID(uid string) error {
	if uid == "" || len(uid) > maxPodUID {
		return fmt.Errorf("pod UID %q: want 1 to %d characters", uid, maxPodUID)
	}
	for _, c := range uid {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '-') {
			return fmt.Errorf("pod UID %q: %q is not a letter, digit or -", uid, c)
		}
	}
	return nil
}
