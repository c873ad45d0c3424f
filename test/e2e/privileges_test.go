package e2e

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
)

// TestDriverPodsRunWithWhatTheyDeclare reads, from the kernel, what every
// process of every container of converge's pods (the DaemonSet's and the
// node agent's on each node, and converge-controller's) runs with, against its container's
// securityContext as deploy/ installs it (../chart's
// TestPodsHoldNoMoreThanTheyNeed checks the manifests keep the rule):
//   - a container that is not privileged runs as the uid it states, with no
//     capability in any set (bounding set included), no_new_privs, the
//     runtime's seccomp filter (the pod's RuntimeDefault), its root
//     filesystem mounted read-only and each volume its manifest mounts
//     read-only so (the node agent's directory of csi-node's socket); so
//     the sidecars and the agent do their work (every other test) under
//     those rules;
//   - csi-node, privileged, runs with no seccomp filter at all: the pod's
//     RuntimeDefault does not reach a privileged container (containerd's
//     CRI sets no profile for one), so its mounts, loop devices and mkfs
//     are not filtered.
func TestDriverPodsRunWithWhatTheyDeclare(t *testing.T) {
	ctx := context.Background()
	var pods []corev1.Pod
	for _, sel := range []string{daemonSetLabel, nodeAgentLabel, "app.kubernetes.io/name=" + controllerName} {
		list, err := c.client.CoreV1().Pods(daemonSetNamespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) == 0 {
			t.Fatalf("no pod of %s", sel)
		}
		pods = append(pods, list.Items...)
	}
	checked := map[string]bool{}
	for _, pod := range pods {
		if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, s := range pod.Status.ContainerStatuses {
			if s.State.Running == nil {
				continue
			}
			var ctr corev1.Container
			for _, sc := range pod.Spec.Containers {
				if sc.Name == s.Name {
					ctr = sc
				}
			}
			id := strings.TrimPrefix(s.ContainerID, "containerd://")
			pids := processesOf(id)
			if len(pids) == 0 {
				t.Errorf("%s/%s: no process of container %s found", pod.Name, s.Name, id)
				continue
			}
			for _, pid := range pids {
				for _, e := range privilegeMismatches(pid, pod.Spec, ctr) {
					t.Errorf("%s/%s, process %d: %s", pod.Name, s.Name, pid, e)
				}
			}
			checked[s.Name] = true
		}
	}
	for _, want := range []string{"csi-node", "node-driver-registrar", "csi-provisioner", "csi-resizer", "csi-snapshotter", nodeAgentContainer, controllerName} {
		if !checked[want] {
			t.Errorf("no running %s container was checked (checked %v)", want, checked)
		}
	}
}

// processesOf returns the host's process IDs of the container whose
// containerd ID is id: those whose cgroup names it, under either cgroup
// driver (…/<id> for cgroupfs, cri-containerd-<id>.scope for systemd).
func processesOf(id string) []int {
	if id == "" {
		return nil
	}
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid)); err == nil && strings.Contains(string(cg), id) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// privilegeMismatches says where the process pid of container ctr of a
// pod of spec p runs otherwise than ctr's securityContext (over the pod's)
// says.
func privilegeMismatches(pid int, p corev1.PodSpec, ctr corev1.Container) []string {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return []string{err.Error()}
	}
	field := map[string]string{}
	for _, line := range strings.Split(string(status), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			field[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	var errs []string
	want := func(k, v string) {
		if field[k] != v {
			errs = append(errs, fmt.Sprintf("%s %q, want %q", k, field[k], v))
		}
	}
	sc := ptr.Deref(ctr.SecurityContext, corev1.SecurityContext{})
	if ptr.Deref(sc.Privileged, false) {
		// Seccomp 0: no filter (2 would be one).
		want("Seccomp", "0")
		return errs
	}
	psc := ptr.Deref(p.SecurityContext, corev1.PodSecurityContext{})
	if uid := sc.RunAsUser; uid != nil || psc.RunAsUser != nil {
		if uid == nil {
			uid = psc.RunAsUser
		}
		u := strconv.FormatInt(*uid, 10)
		want("Uid", strings.Join([]string{u, u, u, u}, " "))
	}
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		want(k, "0000000000000000")
	}
	want("NoNewPrivs", "1")
	want("Seccomp", "2")
	mounts, err := devices.ReadMounts(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return append(errs, err.Error())
	}
	var root *host.Mount
	for _, m := range mounts {
		if m.Path == "/" {
			root = &m // the last mount on / is the one seen
		}
	}
	switch {
	case root == nil:
		errs = append(errs, "no root filesystem mounted, want a read-only one")
	case !root.ReadOnly:
		errs = append(errs, fmt.Sprintf("root filesystem %s (%s) mounted read-write, want read-only", root.Source, root.FsType))
	}
	// A volume the manifest mounts read-only (the node agent's directory
	// of csi-node's socket) is read-only in the process's view: the last
	// mount on its path is the one seen.
	for _, vm := range ctr.VolumeMounts {
		if !vm.ReadOnly {
			continue
		}
		// The runtime resolves the path in the image: /var/run is a link
		// to /run in Debian's (the service account token's volume).
		paths := []string{vm.MountPath}
		if rest, ok := strings.CutPrefix(vm.MountPath, "/var/run/"); ok {
			paths = append(paths, "/run/"+rest)
		}
		var seen *host.Mount
		for _, m := range mounts {
			if slices.Contains(paths, m.Path) {
				seen = &m
			}
		}
		switch {
		case seen == nil:
			errs = append(errs, fmt.Sprintf("volume %s not mounted at %s", vm.Name, vm.MountPath))
		case !seen.ReadOnly:
			errs = append(errs, fmt.Sprintf("volume %s at %s mounted read-write, want read-only as its manifest says", vm.Name, vm.MountPath))
		}
	}
	return errs
}

// TestDriverPodSecurityLevels asks the API server's Pod Security admission
// which level each of converge's pods, as deploy/ installed them, needs:
// a pod of each pod template is created (dry run) in a namespace that
// enforces each level. The DaemonSet's pod passes only privileged:
// baseline refuses it for csi-node's privilege and the hostPath volumes
// alone, and restricted adds only the uid 0 of the sidecars and what
// csi-node, privileged, does not set (every other container keeps the
// restricted level's rules). The node agent's passes only privileged too,
// for the hostPath of csi-node's socket alone at baseline, and its uid 0
// besides at restricted. converge-controller's passes restricted.
func TestDriverPodSecurityLevels(t *testing.T) {
	ctx := context.Background()
	ds, err := c.client.AppsV1().DaemonSets(daemonSetNamespace).Get(ctx, daemonSetName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	agent, err := c.client.AppsV1().DaemonSets(daemonSetNamespace).Get(ctx, nodeAgentName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := c.client.AppsV1().Deployments(daemonSetNamespace).Get(ctx, controllerName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	refusals := map[string]string{} // by "<pod> at <level>"; "" for accepted
	for _, level := range []string{"privileged", "baseline", "restricted"} {
		name := "converge-pss-" + level
		nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pod-security.kubernetes.io/enforce": level}}}
		if _, err := c.client.CoreV1().Namespaces().Create(ctx, nsObj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.client.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		// Admission looks the pod's service account up, the namespace's
		// default, which the controller-manager makes.
		poll(t, time.Minute, "the service account default of "+name, func() (bool, string) {
			_, err := c.client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
			return err == nil, fmt.Sprint(err)
		})
		for pod, spec := range map[string]corev1.PodSpec{daemonSetName: ds.Spec.Template.Spec, nodeAgentName: agent.Spec.Template.Spec, controllerName: ctrl.Spec.Template.Spec} {
			// What another namespace lacks, and Pod Security does not judge:
			// the service account (the namespace's default instead, its
			// token not mounted) and the node-critical priority.
			spec.ServiceAccountName, spec.DeprecatedServiceAccount, spec.PriorityClassName, spec.Priority = "", "", "", nil
			spec.AutomountServiceAccountToken = ptr.To(false)
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod}, Spec: spec}
			_, err := c.client.CoreV1().Pods(name).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			switch {
			case err == nil:
				refusals[pod+" at "+level] = ""
			case strings.Contains(err.Error(), "violates PodSecurity"):
				refusals[pod+" at "+level] = err.Error()
			default:
				t.Fatalf("%s in %s: %v", pod, name, err)
			}
		}
	}
	for _, tc := range []struct {
		at      string
		refused []string // the reasons of the refusal, every one; nil for accepted
	}{
		{at: daemonSetName + " at privileged"},
		{at: daemonSetName + " at baseline", refused: []string{"privileged", "hostPath volumes"}},
		{at: daemonSetName + " at restricted", refused: []string{"privileged", "allowPrivilegeEscalation != false", "unrestricted capabilities",
			"restricted volume types", "runAsNonRoot != true", "runAsUser=0"}},
		{at: nodeAgentName + " at privileged"},
		{at: nodeAgentName + " at baseline", refused: []string{"hostPath volumes"}},
		{at: nodeAgentName + " at restricted", refused: []string{"restricted volume types", "runAsNonRoot != true", "runAsUser=0"}},
		{at: controllerName + " at restricted"},
	} {
		msg := refusals[tc.at]
		if tc.refused == nil {
			if msg != "" {
				t.Errorf("%s: refused, want accepted: %s", tc.at, msg)
			}
			continue
		}
		if msg == "" {
			t.Errorf("%s: accepted, want refused for %v", tc.at, tc.refused)
			continue
		}
		got := podSecurityReasons(msg)
		var reasons []string
		for r, subject := range got {
			reasons = append(reasons, r)
			// Only csi-node may break a rule of a container, but for the
			// uid of the sidecars. (A volume's rule names volumes.)
			if !strings.Contains(subject, "container") || r == "runAsNonRoot != true" || r == "runAsUser=0" {
				continue
			}
			if ctrs := quotedRE.FindAllStringSubmatch(subject, -1); slices.ContainsFunc(ctrs, func(q []string) bool { return q[1] != "csi-node" }) {
				t.Errorf("%s: %s names %s; only csi-node may break it", tc.at, r, subject)
			}
		}
		slices.Sort(reasons)
		want := slices.Sorted(slices.Values(tc.refused))
		if !slices.Equal(reasons, want) {
			t.Errorf("%s: refused for %q, want %q:\n%s", tc.at, reasons, want, msg)
		}
	}
}

// podSecurityReasons splits Pod Security admission's refusal into its
// reasons, each with what it says before "must" (which containers or
// volumes): `violates PodSecurity "baseline:latest": privileged (container
// "csi-node" must not set ...), hostPath volumes (volumes "dev", "sys")`.
func podSecurityReasons(msg string) map[string]string {
	_, list, _ := strings.Cut(msg, `": `)
	out := map[string]string{}
	for _, m := range reasonRE.FindAllStringSubmatch(list, -1) {
		subject, _, _ := strings.Cut(m[2], " must ")
		out[m[1]] = subject
	}
	return out
}

var (
	reasonRE = regexp.MustCompile(`(?:^|, )([^(),]+) \(((?:[^()]|\([^()]*\))*)\)`)
	quotedRE = regexp.MustCompile(`"([^"]*)"`)
)
