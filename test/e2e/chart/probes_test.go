package chart

import (
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// TestProbesNameTheirOwnPorts checks every probe of every container that
// deploy/ and the chart install, in each variant: the kubelet resolves a
// probe's port (pkg/probe's ResolveContainerPort) among the ports of the
// container it probes alone. A name another container declares makes the
// probe error, and an errored liveness probe never counts as a failure, so
// a hung container would never be restarted. A number must be declared by
// the probed container too, so that the manifest says which port each
// probe reaches.
func TestProbesNameTheirOwnPorts(t *testing.T) {
	everyPod(t, func(t *testing.T, source string, pods []namedPodSpec) {
		probed := 0
		for _, p := range pods {
			for _, c := range append(p.spec.InitContainers, p.spec.Containers...) {
				for kind, pr := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
					if pr == nil {
						continue
					}
					probed++
					if err := probePortResolves(pr, c); err != nil {
						t.Errorf("%s: %s container %s: %s probe: %v", source, p.name, c.Name, kind, err)
					}
				}
			}
		}
		if probed == 0 {
			t.Errorf("%s: no probe found: the test reads nothing", source)
		}
	})
}

// everyPod calls check with the pod templates of deploy/ and of the
// chart, in each variant (a subtest each).
func everyPod(t *testing.T, check func(t *testing.T, source string, pods []namedPodSpec)) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			manifest, err := render(t, v.vals)
			if err != nil {
				t.Fatal(err)
			}
			for source, m := range map[string]string{"deploy/": kustomize(t, v.components), "the chart": manifest} {
				check(t, source, podSpecs(t, m))
			}
		})
	}
}

// TestProbePortRule shows the rule refusing what the kubelet cannot
// resolve, and accepting what it can.
func TestProbePortRule(t *testing.T) {
	c := corev1.Container{Name: "csi-node", Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9810}}}
	for _, tc := range []struct {
		name string
		port intstr.IntOrString
		ok   bool
	}{
		{name: "own name", port: intstr.FromString("metrics"), ok: true},
		{name: "own number", port: intstr.FromInt32(9810), ok: true},
		{name: "another container's name", port: intstr.FromString("healthz")},
		{name: "an undeclared number", port: intstr.FromInt32(9808)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: tc.port}}}
			if err := probePortResolves(pr, c); (err == nil) != tc.ok {
				t.Errorf("got %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// probePortResolves says whether pr's port is one c declares.
func probePortResolves(pr *corev1.Probe, c corev1.Container) error {
	var port intstr.IntOrString
	switch {
	case pr.HTTPGet != nil:
		port = pr.HTTPGet.Port
	case pr.TCPSocket != nil:
		port = pr.TCPSocket.Port
	case pr.GRPC != nil:
		port = intstr.FromInt32(pr.GRPC.Port)
	default:
		return nil // an exec probe has no port
	}
	for _, p := range c.Ports {
		if (port.Type == intstr.String && p.Name == port.StrVal) || (port.Type == intstr.Int && p.ContainerPort == port.IntVal) {
			return nil
		}
	}
	return fmt.Errorf("port %s is not among the container's own ports %v", port.String(), c.Ports)
}

type namedPodSpec struct {
	name string
	spec corev1.PodSpec
}

// podSpecs returns the pod templates of the DaemonSets and Deployments of
// a multi-document manifest.
func podSpecs(t *testing.T, manifest string) []namedPodSpec {
	t.Helper()
	var out []namedPodSpec
	for _, doc := range strings.Split(manifest, "\n---") {
		var head struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatalf("%v in:\n%s", err, doc)
		}
		switch head.Kind {
		case "DaemonSet":
			var ds appsv1.DaemonSet
			if err := yaml.UnmarshalStrict([]byte(doc), &ds); err != nil {
				t.Fatal(err)
			}
			out = append(out, namedPodSpec{"DaemonSet " + ds.Name, ds.Spec.Template.Spec})
		case "Deployment":
			var d appsv1.Deployment
			if err := yaml.UnmarshalStrict([]byte(doc), &d); err != nil {
				t.Fatal(err)
			}
			out = append(out, namedPodSpec{"Deployment " + d.Name, d.Spec.Template.Spec})
		}
	}
	return out
}

// minLivenessDelay is the least initialDelaySeconds of a liveness probe:
// the kubelet probes a container as soon as it sees it run, and a process
// starved of CPU on a busy node (converge's containers ask for 5-20m) may
// not listen yet; each refused probe is a Warning on the pod.
const minLivenessDelay = 10

// TestLivenessWaitsForStart checks every liveness probe of every container
// deploy/ and the chart install, in each variant, against livenessErrors.
func TestLivenessWaitsForStart(t *testing.T) { everyProbeHolds(t, livenessErrors) }

// everyProbeHolds fails t with what rule finds in every pod of deploy/ and
// the chart, in each variant, and where no node-driver-registrar with a
// liveness probe is found: the rules that name it would check nothing.
func everyProbeHolds(t *testing.T, rule func(corev1.PodSpec) []string) {
	everyPod(t, func(t *testing.T, source string, pods []namedPodSpec) {
		registrar := false
		for _, p := range pods {
			for _, e := range rule(p.spec) {
				t.Errorf("%s: %s: %s", source, p.name, e)
			}
			for _, c := range p.spec.Containers {
				registrar = registrar || c.Name == "node-driver-registrar" && c.LivenessProbe != nil
			}
		}
		if !registrar {
			t.Errorf("%s: no node-driver-registrar with a liveness probe: its rules check nothing", source)
		}
	})
}

// TestLivenessRule shows livenessErrors refusing a probe that may come
// before its process listens, and a registrar's probe that may come while
// the registrar still waits for csi-node.
func TestLivenessRule(t *testing.T) {
	probe := func(delay, period, failures int32) *corev1.Probe {
		return &corev1.Probe{InitialDelaySeconds: delay, PeriodSeconds: period, FailureThreshold: failures}
	}
	for _, tc := range []struct {
		name      string
		driver    *corev1.Probe
		registrar *corev1.Probe
		args      []string
		want      int
	}{
		{"both wait, the registrar past its give-up", probe(10, 10, 5), probe(36, 10, 3), []string{"--timeout=5s"}, 0},
		{"no delay", probe(0, 10, 5), probe(36, 0, 4), []string{"--timeout=5s"}, 1},
		{"the registrar's 5 s", probe(10, 10, 5), probe(5, 0, 0), nil, 2},
		{"the registrar probed while it waits", probe(10, 10, 5), probe(10, 10, 4), nil, 1},
		{"the registrar probed as its wait ends", probe(10, 10, 5), probe(35, 10, 4), []string{"--timeout=5s"}, 1},
		{"the release's default --timeout", probe(10, 10, 5), probe(32, 10, 4), nil, 0},
		{"an unreadable --timeout", probe(10, 10, 5), probe(40, 10, 4), []string{"--timeout=5"}, 1},
	} {
		spec := corev1.PodSpec{Containers: []corev1.Container{
			{Name: "csi-node", LivenessProbe: tc.driver},
			{Name: "node-driver-registrar", LivenessProbe: tc.registrar, Args: tc.args},
			{Name: "csi-provisioner"},
		}}
		if got := livenessErrors(spec); len(got) != tc.want {
			t.Errorf("%s: got %q, want %d errors", tc.name, got, tc.want)
		}
	}
}

// registrarConnectWait is how long node-driver-registrar waits for
// csi-node's socket to take a connection (csi-lib-utils' Connect,
// WithTimeout(30 s)); it then waits up to its --timeout for the driver's
// name, and serves /healthz only after.
const registrarConnectWait = 30 * time.Second

// registrarTimeout is node-driver-registrar's --timeout among args: the
// release's default, 1 s, where it is not given.
func registrarTimeout(args []string) (time.Duration, error) {
	timeout := time.Second
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--timeout="); ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				return 0, fmt.Errorf("its --timeout: %w", err)
			}
			timeout = d
		}
	}
	return timeout, nil
}

// livenessErrors says which liveness probes of a pod may fail before their
// container can serve: any probed in its first minLivenessDelay seconds,
// and node-driver-registrar's if it may be probed while the registrar
// still waits for csi-node (registrarConnectWait, then its --timeout): a slow csi-node start then
// ends the registrar by its own give-up, which says why, and no refused
// probe warns on the pod meanwhile. The kubelet probes nothing before
// initialDelaySeconds.
func livenessErrors(p corev1.PodSpec) []string {
	var out []string
	for _, c := range append(p.InitContainers, p.Containers...) {
		pr := c.LivenessProbe
		if pr == nil {
			continue
		}
		if pr.InitialDelaySeconds < minLivenessDelay {
			out = append(out, fmt.Sprintf("container %s: its liveness probe's initialDelaySeconds %d, want %d at least", c.Name, pr.InitialDelaySeconds, minLivenessDelay))
		}
		if c.Name != "node-driver-registrar" {
			continue
		}
		timeout, err := registrarTimeout(c.Args)
		if err != nil {
			out = append(out, "node-driver-registrar: "+err.Error())
			continue
		}
		if giveUp := registrarConnectWait + timeout; time.Duration(pr.InitialDelaySeconds)*time.Second <= giveUp {
			out = append(out, fmt.Sprintf("node-driver-registrar: its liveness probe may come %d s into a start, while its own %s wait for csi-node goes on", pr.InitialDelaySeconds, giveUp))
		}
	}
	return out
}

// minProbeTimeout is the least timeoutSeconds of a probe: on a node whose
// two cores and disk a make test loaded, probes of converge-controller and
// of the registrar took longer than the default 1 s, and each timed-out
// probe is a Warning on the pod (a readiness probe's too, and a NotReady
// flap).
const minProbeTimeout = 5

// TestProbesBearALoadedNode checks every probe of every container deploy/
// and the chart install, in each variant, against timeoutErrors.
func TestProbesBearALoadedNode(t *testing.T) { everyProbeHolds(t, timeoutErrors) }

// TestProbeTimeoutRule shows timeoutErrors refusing a probe with the
// default timeout, and a registrar's probe that ends before the
// registrar's own answer.
func TestProbeTimeoutRule(t *testing.T) {
	probe := func(timeout int32) *corev1.Probe { return &corev1.Probe{TimeoutSeconds: timeout} }
	for _, tc := range []struct {
		name                string
		liveness, readiness *corev1.Probe
		registrar           *corev1.Probe
		args                []string
		want                int
	}{
		{"each waits, the registrar's past its --timeout", probe(5), probe(5), probe(6), []string{"--timeout=5s"}, 0},
		{"a readiness probe's default", probe(5), probe(0), probe(6), []string{"--timeout=5s"}, 1},
		{"a liveness probe's 1 s", probe(1), probe(5), probe(6), []string{"--timeout=5s"}, 1},
		{"the registrar's as long as its --timeout", probe(5), probe(5), probe(5), []string{"--timeout=5s"}, 1},
		{"the registrar's past the release's default", probe(5), probe(5), probe(5), nil, 0},
		{"no probes", nil, nil, nil, nil, 0},
	} {
		spec := corev1.PodSpec{Containers: []corev1.Container{
			{Name: "csi-node", LivenessProbe: tc.liveness, ReadinessProbe: tc.readiness},
			{Name: "node-driver-registrar", LivenessProbe: tc.registrar, Args: tc.args},
		}}
		if got := timeoutErrors(spec); len(got) != tc.want {
			t.Errorf("%s: got %q, want %d errors", tc.name, got, tc.want)
		}
	}
}

// timeoutErrors says which probes of a pod may time out on a loaded node
// (any that waits less than minProbeTimeout; the API defaults 0 to 1 s),
// and node-driver-registrar's if it may end before the registrar's own
// answer, bounded by its --timeout: a 500 that says why beats a probe
// that timed out.
func timeoutErrors(p corev1.PodSpec) []string {
	var out []string
	for _, c := range append(p.InitContainers, p.Containers...) {
		for _, pr := range []struct {
			kind  string
			probe *corev1.Probe
		}{{"liveness", c.LivenessProbe}, {"readiness", c.ReadinessProbe}, {"startup", c.StartupProbe}} {
			if pr.probe == nil {
				continue
			}
			if pr.probe.TimeoutSeconds < minProbeTimeout {
				out = append(out, fmt.Sprintf("container %s: its %s probe's timeoutSeconds %d, want %d at least", c.Name, pr.kind, pr.probe.TimeoutSeconds, minProbeTimeout))
			}
			if c.Name != "node-driver-registrar" || pr.kind != "liveness" {
				continue
			}
			timeout, err := registrarTimeout(c.Args)
			if err != nil {
				out = append(out, "node-driver-registrar: "+err.Error())
			} else if time.Duration(pr.probe.TimeoutSeconds)*time.Second <= timeout {
				out = append(out, fmt.Sprintf("node-driver-registrar: its liveness probe's timeoutSeconds %d ends before its own --timeout %s does", pr.probe.TimeoutSeconds, timeout))
			}
		}
	}
	return out
}
