package chart

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// privilegedContainer is the one container that may be privileged: loop
// devices, mkfs and mounts with Bidirectional propagation need it.
const privilegedContainer = "csi-node"

// socketDirSuffix ends the hostPath of the directory that holds csi-node's
// CSI socket. csi-node makes the socket root's with mode 0600
// (pkg/driver's listen), so a process that connects to it must be uid 0:
// connect(2) on a unix socket needs write permission on it, and the owner
// needs no capability for that.
const socketDirSuffix = "/plugins/converge.csi.dev"

// TestPodsHoldNoMoreThanTheyNeed checks every pod that deploy/ (in each
// variant, and with every component it ships) and the chart (in each
// variant, and with every choice on) install: only csi-node is
// privileged; every other container has allowPrivilegeEscalation: false,
// every capability dropped and none added, a read-only root filesystem,
// and a uid the manifest states: not 0, unless it mounts the directory of
// csi-node's socket, which only uid 0 may use; every pod asks for the
// RuntimeDefault seccomp profile, and no container asks for another.
func TestPodsHoldNoMoreThanTheyNeed(t *testing.T) {
	entries, err := os.ReadDir(filepath.Join(deploy, "components"))
	if err != nil {
		t.Fatal(err)
	}
	every := struct {
		name       string
		components []string
		vals       map[string]any
	}{name: "every component", vals: map[string]any{}}
	for _, e := range entries {
		if e.IsDir() {
			every.components = append(every.components, e.Name())
		}
	}
	for _, v := range variants {
		for k, val := range v.vals {
			every.vals[k] = val
		}
	}
	for _, v := range append(slices.Clone(variants), every) {
		t.Run(v.name, func(t *testing.T) {
			manifest, err := render(t, v.vals)
			if err != nil {
				t.Fatal(err)
			}
			for source, m := range map[string]string{"deploy/": kustomize(t, v.components), "the chart": manifest} {
				pods := podSpecs(t, m)
				var names []string
				for _, p := range pods {
					for _, c := range append(p.spec.InitContainers, p.spec.Containers...) {
						names = append(names, c.Name)
					}
					for _, e := range privilegeErrors(p.spec) {
						t.Errorf("%s: %s: %s", source, p.name, e)
					}
				}
				// The rule reads the containers it must: the DaemonSets' and
				// the controller's.
				for _, want := range []string{"csi-node", "node-driver-registrar", "csi-provisioner", "csi-resizer", "node-agent", "converge-controller"} {
					if !slices.Contains(names, want) {
						t.Errorf("%s: no container %s among %v: the test reads nothing of it", source, want, names)
					}
				}
			}
		})
	}
}

// TestPrivilegeRule shows the rule refusing each thing it forbids, and
// accepting a pod that keeps to it.
func TestPrivilegeRule(t *testing.T) {
	socketDir := corev1.Volume{Name: "plugin-dir", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/kubelet" + socketDirSuffix}}}
	tight := func() *corev1.SecurityContext {
		return &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
	}
	good := func() corev1.PodSpec {
		root := tight()
		root.RunAsUser = ptr.To[int64](0)
		nonRoot := tight()
		nonRoot.RunAsUser, nonRoot.RunAsNonRoot = ptr.To[int64](65534), ptr.To(true)
		return corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Volumes:         []corev1.Volume{socketDir},
			Containers: []corev1.Container{
				{Name: "csi-node", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}},
				{Name: "csi-provisioner", SecurityContext: root, VolumeMounts: []corev1.VolumeMount{{Name: "plugin-dir", MountPath: "/csi"}}},
				{Name: "helper", SecurityContext: nonRoot},
			},
		}
	}
	for _, tc := range []struct {
		name   string
		change func(p *corev1.PodSpec)
		want   string // "" for accepted
	}{
		{name: "kept to", change: func(*corev1.PodSpec) {}},
		{name: "uid from the pod", change: func(p *corev1.PodSpec) {
			p.SecurityContext.RunAsUser, p.SecurityContext.RunAsNonRoot = ptr.To[int64](65534), ptr.To(true)
			p.Containers[2].SecurityContext.RunAsUser, p.Containers[2].SecurityContext.RunAsNonRoot = nil, nil
		}},
		{name: "no seccomp profile", change: func(p *corev1.PodSpec) { p.SecurityContext = nil }, want: "seccomp"},
		{name: "a container unconfined", change: func(p *corev1.PodSpec) {
			p.Containers[2].SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
		}, want: "seccomp"},
		{name: "a sidecar privileged", change: func(p *corev1.PodSpec) { p.Containers[1].SecurityContext.Privileged = ptr.To(true) }, want: "privileged"},
		{name: "privileged init container", change: func(p *corev1.PodSpec) {
			p.InitContainers = []corev1.Container{{Name: "init", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}}
		}, want: "privileged"},
		{name: "no securityContext", change: func(p *corev1.PodSpec) { p.Containers[2].SecurityContext = nil }, want: "allowPrivilegeEscalation"},
		{name: "escalation allowed", change: func(p *corev1.PodSpec) { p.Containers[2].SecurityContext.AllowPrivilegeEscalation = nil }, want: "allowPrivilegeEscalation"},
		{name: "capabilities kept", change: func(p *corev1.PodSpec) {
			p.Containers[2].SecurityContext.Capabilities.Drop = []corev1.Capability{"NET_RAW"}
		}, want: "capabilities"},
		{name: "a capability added", change: func(p *corev1.PodSpec) {
			p.Containers[1].SecurityContext.Capabilities.Add = []corev1.Capability{"DAC_OVERRIDE"}
		}, want: "capabilities"},
		{name: "writable root filesystem", change: func(p *corev1.PodSpec) { p.Containers[2].SecurityContext.ReadOnlyRootFilesystem = ptr.To(false) }, want: "readOnlyRootFilesystem"},
		{name: "root without the socket", change: func(p *corev1.PodSpec) {
			p.Containers[2].SecurityContext.RunAsUser, p.Containers[2].SecurityContext.RunAsNonRoot = ptr.To[int64](0), nil
		}, want: "uid 0"},
		{name: "uid left to the image", change: func(p *corev1.PodSpec) { p.Containers[1].SecurityContext.RunAsUser = nil }, want: "uid"},
		{name: "non-root not enforced", change: func(p *corev1.PodSpec) { p.Containers[2].SecurityContext.RunAsNonRoot = nil }, want: "runAsNonRoot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := good()
			tc.change(&p)
			errs := privilegeErrors(p)
			switch {
			case tc.want == "" && len(errs) > 0:
				t.Errorf("got %v, want none", errs)
			case tc.want != "" && !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, tc.want) }):
				t.Errorf("got %v, want an error about %s", errs, tc.want)
			}
		})
	}
}

// privilegeErrors says where the pod p breaks the rule of
// TestPodsHoldNoMoreThanTheyNeed; each container's settings are its own
// where it has them, else the pod's, as the kubelet applies them.
func privilegeErrors(p corev1.PodSpec) []string {
	var errs []string
	psc := p.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	if psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		errs = append(errs, fmt.Sprintf("pod seccompProfile %v, want RuntimeDefault", psc.SeccompProfile))
	}
	socketDirs := map[string]bool{}
	for _, v := range p.Volumes {
		if v.HostPath != nil && strings.HasSuffix(filepath.Clean(v.HostPath.Path), socketDirSuffix) {
			socketDirs[v.Name] = true
		}
	}
	for _, c := range append(slices.Clone(p.InitContainers), p.Containers...) {
		sc := c.SecurityContext
		if sc == nil {
			sc = &corev1.SecurityContext{}
		}
		if sp := sc.SeccompProfile; sp != nil && sp.Type != corev1.SeccompProfileTypeRuntimeDefault {
			errs = append(errs, fmt.Sprintf("container %s: seccompProfile %s, want the pod's RuntimeDefault", c.Name, sp.Type))
		}
		if ptr.Deref(sc.Privileged, false) {
			if c.Name != privilegedContainer || slices.ContainsFunc(p.InitContainers, func(i corev1.Container) bool { return i.Name == c.Name }) {
				errs = append(errs, fmt.Sprintf("container %s: privileged, which only %s may be", c.Name, privilegedContainer))
			}
			continue
		}
		if !ptr.Equal(sc.AllowPrivilegeEscalation, ptr.To(false)) {
			errs = append(errs, fmt.Sprintf("container %s: allowPrivilegeEscalation not false", c.Name))
		}
		if caps := sc.Capabilities; caps == nil || !slices.Contains(caps.Drop, "ALL") || len(caps.Add) > 0 {
			errs = append(errs, fmt.Sprintf("container %s: capabilities %v, want drop [ALL] and nothing added", c.Name, caps))
		}
		if !ptr.Deref(sc.ReadOnlyRootFilesystem, false) {
			errs = append(errs, fmt.Sprintf("container %s: readOnlyRootFilesystem not true", c.Name))
		}
		uid, nonRoot := sc.RunAsUser, sc.RunAsNonRoot
		if uid == nil {
			uid = psc.RunAsUser
		}
		if nonRoot == nil {
			nonRoot = psc.RunAsNonRoot
		}
		mountsSocket := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return socketDirs[m.Name] })
		switch {
		case uid == nil:
			errs = append(errs, fmt.Sprintf("container %s: no runAsUser: the uid is left to the image", c.Name))
		case *uid == 0 && !mountsSocket:
			errs = append(errs, fmt.Sprintf("container %s: uid 0, but it does not use csi-node's socket, the one reason to stay root", c.Name))
		case *uid != 0 && !ptr.Deref(nonRoot, false):
			errs = append(errs, fmt.Sprintf("container %s: uid %d without runAsNonRoot: true", c.Name, *uid))
		}
	}
	return errs
}
