package devices

import (
	"fmt"
	"strings"
)

// The kubelet names a pod's cgroup after the pod's UID
// (k8s.io/kubernetes pkg/kubelet/cm: GetPodContainerName, "pod" + UID)
// and places it under its QoS class's cgroup below
// <cgroupRoot>/kubepods, Guaranteed pods right in kubepods
// (qos_container_manager_linux.go: "burstable", "besteffort"). The cgroup
// driver spells the path:
//
//	cgroupfs: <cgroupRoot>/kubepods/burstable/pod<uid>
//	systemd:  <cgroupRoot>/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice
//
// where uid_ is the UID with each "-" turned into "_" (ToSystemd; the
// kubelet forbids "_" in a name's components, NewCgroupName, so that the
// change can be undone). The systemd driver joins the cgroupRoot's
// components into the slices' names too (ToSystemd, ExpandSlice): with
// cgroupRoot /node the kubepods slice is node.slice/node-kubepods.slice
// and a pod node-kubepods-burstable-pod<uid_>.slice in
// node-kubepods-burstable.slice. The runtime makes each container's and
// the sandbox's cgroup inside the pod's (cgroupfs: <container-id>;
// systemd: cri-containerd-<id>.scope, crio-<id>.scope).
//
// A pod's cgroup is looked for in these shapes alone, below a kubepods
// cgroup: a directory of the right name elsewhere may be anyone's (an
// unprivileged user makes any directory below its
// user.slice/user-N.slice/user@N.service), and the limits written there
// would bind nothing of the pod.

// qosCgroups are the kubelet's QoS classes that have a cgroup of their
// own in kubepods, spelled as the kubelet's cgroup names spell them.
var qosCgroups = []string{"burstable", "besteffort"}

// kubepodsCgroup reports whether a directory named name, in a directory
// named parent, is the kubelet's kubepods cgroup, and returns how the
// cgroups below it are named: slice is "" for the cgroupfs driver's
// "kubepods", and for the systemd driver the name of its slice without
// ".slice" ("kubepods", or "<root>-kubepods" in "<root>.slice").
func kubepodsCgroup(parent, name string) (slice string, ok bool) {
	switch {
	case name == "kubepods":
		return "", true
	case name == "kubepods.slice":
		return "kubepods", true
	}
	prefix, ok := strings.CutSuffix(parent, ".slice")
	if ok && prefix != "" && name == prefix+"-kubepods.slice" {
		return prefix + "-kubepods", true
	}
	return "", false
}

// qosCgroup is the name of the cgroup of QoS class qos in a kubepods
// cgroup whose slice is slice (kubepodsCgroup).
func qosCgroup(slice, qos string) string {
	if slice == "" {
		return qos
	}
	return slice + "-" + qos + ".slice"
}

// podCgroupUID returns the UID of the pod whose cgroup a directory named
// name is, in the kubepods cgroup whose slice is slice (kubepodsCgroup)
// when qos is "", or in that of QoS class qos in it; "" for a name that
// is not a pod's cgroup there.
func podCgroupUID(slice, qos, name string) string {
	if slice == "" {
		uid, ok := strings.CutPrefix(name, "pod")
		if !ok || checkPodUID(uid) != nil {
			return ""
		}
		return uid
	}
	prefix := slice + "-pod"
	if qos != "" {
		prefix = slice + "-" + qos + "-pod"
	}
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return ""
	}
	uid_, ok := strings.CutSuffix(rest, ".slice")
	// The kubelet writes every "-" of the UID as "_": a "-" is no name
	// of its.
	if !ok || strings.Contains(uid_, "-") {
		return ""
	}
	uid := strings.ReplaceAll(uid_, "_", "-")
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
