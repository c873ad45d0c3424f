package invariants

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Each check is shown catching a planted violation and passing what is
// allowed.

func TestProbeErrors(t *testing.T) {
	log := `I1126 00:01:02.000000    1234 prober.go:106] "Probe errored" probeType="Liveness" pod="kube-system/converge-node-abcde" podUID="u1" containerName="csi-node" probeResult="unknown" err="strconv.Atoi: parsing \"healthz\": invalid syntax"
I1126 00:01:03.000000    1234 prober.go:122] "Probe failed" probeType="Liveness" pod="kube-system/converge-node-abcde" podUID="u1" containerName="csi-node" probeResult="failure" output="HTTP probe failed with statuscode: 500"
I1126 00:01:04.000000    1234 prober.go:106] "Probe errored" probeType="Readiness" pod="default/someone-else" podUID="u2" containerName="app" probeResult="unknown" err="boom"`
	got := ProbeErrors(log, []string{"converge-node-", "converge-controller-"})
	if len(got) != 1 || got[0][len(got[0])-len(`invalid syntax"`):] != `invalid syntax"` {
		t.Errorf("got %q, want the one errored probe of converge's pod", got)
	}
	if got := ProbeErrors(log, []string{"converge-controller-"}); len(got) != 0 {
		t.Errorf("got %q for another pod's prefix, want none", got)
	}
}

func TestUnexpectedRestarts(t *testing.T) {
	node := Container{Pod: "converge-node-a", UID: "1", Name: "csi-node"}
	reg := Container{Pod: "converge-node-a", UID: "1", Name: "node-driver-registrar"}
	seen := map[Container]int32{node: 2, reg: 1}
	if got := UnexpectedRestarts(seen, map[Container]int32{node: 2, reg: 1}); len(got) != 0 {
		t.Errorf("every restart intended: got %q", got)
	}
	got := UnexpectedRestarts(seen, map[Container]int32{node: 1})
	want := []string{"container converge-node-a/csi-node restarted 2 times, 1 of them on purpose",
		"container converge-node-a/node-driver-registrar restarted 1 times, 0 of them on purpose"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestUnexpectedWarnings(t *testing.T) {
	sources := []string{"converge-controller", "converge.csi.dev"}
	pods := []string{"converge-node-"}
	events := []Event{
		{Type: "Warning", Reason: "NodeLost", Object: "PersistentVolumeClaim/default/data-web-0", Source: "converge-controller"},
		{Type: "Warning", Reason: "ProvisioningFailed", Object: "PersistentVolumeClaim/default/bad", Source: "converge.csi.dev_node-a_1234"},
		{Type: "Warning", Reason: "Unhealthy", Object: "Pod/kube-system/converge-node-abcde", Source: "kubelet", Message: "Liveness probe failed: HTTP probe failed with statuscode: 503"},
		{Type: "Normal", Reason: "Provisioning", Object: "PersistentVolumeClaim/default/bad", Source: "converge.csi.dev_node-a_1234"},
		{Type: "Warning", Reason: "FailedScheduling", Object: "Pod/default/app", Source: "default-scheduler"},
	}
	expected := []Expected{{Reason: "NodeLost", Object: "/data-web-0", Test: "TestTwoNodesNodeLoss"}}
	got := UnexpectedWarnings(events, sources, pods, expected)
	want := []string{
		"Warning ProvisioningFailed on PersistentVolumeClaim/default/bad from converge.csi.dev_node-a_1234 (x1): ",
		"Warning Unhealthy on Pod/kube-system/converge-node-abcde from kubelet (x1): Liveness probe failed: HTTP probe failed with statuscode: 503",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := UnexpectedWarnings(events, sources, pods, append(expected, Expected{Reason: "Unhealthy", Object: "converge-node-", Message: "Readiness probe failed"})); len(got) != 2 {
		t.Errorf("a liveness failure expected as a readiness one: got %q, want both warnings still unexpected", got)
	}
	expected = append(expected, Expected{Reason: "ProvisioningFailed", Object: "/bad"}, Expected{Reason: "Unhealthy", Object: "converge-node-", Message: "Liveness probe failed"})
	if got := UnexpectedWarnings(events, sources, pods, expected); len(got) != 0 {
		t.Errorf("every warning expected: got %q", got)
	}
}

// Warnings of local-path-provisioner, which a test runs beside converge,
// are not converge's: its provisioner reports under its own name
// (sig-storage-lib-external-provisioner's "<provisioner>_<pod>_<id>"), and
// its pods, the provisioner's and the helper pods it makes, have names of
// their own.
func TestLocalPathWarningsAreNotOurs(t *testing.T) {
	sources := []string{"converge-controller", "converge.csi.dev"}
	pods := []string{"converge-node-", "converge-controller-"}
	events := []Event{
		{Type: "Warning", Reason: "ProvisioningFailed", Object: "PersistentVolumeClaim/default/local-path",
			Source: "rancher.io/local-path_local-path-provisioner-7d4f8b9c5-x2x9z_0b1c"},
		{Type: "Warning", Reason: "BackOff", Object: "Pod/local-path-storage/local-path-provisioner-7d4f8b9c5-x2x9z", Source: "kubelet"},
		{Type: "Warning", Reason: "Failed", Object: "Pod/local-path-storage/helper-pod-create-pvc-5e0c", Source: "kubelet"},
	}
	if got := UnexpectedWarnings(events, sources, pods, nil); len(got) != 0 {
		t.Errorf("got %q, want none of local-path's warnings counted as converge's", got)
	}
}

func TestVolumeMounts(t *testing.T) {
	k := "/var/lib/kubelet"
	points := []string{
		k,
		k + "/pods/u1/volumes/kubernetes.io~projected/kube-api-access-x",
		k + "/pods/u1/volumes/kubernetes.io~csi/pvc-1/mount",
		k + "/plugins/kubernetes.io/csi/converge.csi.dev/0123/globalmount",
		k + "/plugins/converge.csi.dev",
		"/var/lib/kubelet-other/plugins/kubernetes.io/csi/x/globalmount",
	}
	got := VolumeMounts(points, k)
	want := []string{points[2], points[3]}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestEnvironmentExpectsRetriedConflictsOnly: csi-snapshotter's warning
// for a group content's status write that lost a race, as a run printed
// it, is expected; the same reason for a failure of the driver's is not,
// even when the driver's message names a conflict.
func TestEnvironmentExpectsRetriedConflictsOnly(t *testing.T) {
	const content = "groupsnapcontent-f5c5d6da"
	conflict := fmt.Sprintf(`Operation cannot be fulfilled on volumegroupsnapshotcontents.groupsnapshot.storage.k8s.io %q: the object has been modified; please apply your changes to the latest version and try again`, content)
	event := func(message string) []Event {
		return []Event{{Type: "Warning", Reason: "GroupSnapshotCreationFailed", Object: "VolumeGroupSnapshotContent//" + content,
			Source: "csi-snapshotter converge.csi.dev", Message: message}}
	}
	sources := []string{"converge.csi.dev"}
	retried := event("Failed to create group snapshot: error updating status for volume group snapshot content " + content +
		": snapshot controller failed to update " + content + " on API server: " + conflict)
	if got := UnexpectedWarnings(retried, sources, nil, Environment); len(got) != 0 {
		t.Errorf("a retried status write unexpected: %q", got)
	}
	for _, driver := range []string{
		`rpc error: code = ResourceExhausted desc = pool default is full`,
		`rpc error: code = Internal desc = ` + conflict,
	} {
		failed := event(`Failed to create group snapshot: failed to take group snapshot of the volumes [a b]: "` + driver + `"`)
		if got := UnexpectedWarnings(failed, sources, nil, Environment); len(got) != 1 {
			t.Errorf("a driver's failure (%s) expected", driver)
		}
	}
}

// TestKilledLivenessExpectsTheRefusedProbeOnly: the warning a run saw
// after a test's kill of csi-node (the kubelet's liveness probe in the
// second before it saw the container end) is expected on that pod and
// port, as many times as the pod was killed, and a liveness probe that
// timed out or failed on its answer is not.
func TestKilledLivenessExpectsTheRefusedProbeOnly(t *testing.T) {
	pods := []string{"converge-node-"}
	killed := "Pod/kube-system/converge-node-p7xsf"
	refused := `Liveness probe failed: Get "http://169.254.145.205:9810/livez": dial tcp 169.254.145.205:9810: connect: connection refused`
	once := []Expected{KilledLiveness(killed, 9810, "TestPluginKilled")}
	seen := Event{Type: "Warning", Reason: "Unhealthy", Object: killed, Source: "kubelet", Message: refused, Count: 1}
	if got := UnexpectedWarnings([]Event{seen}, nil, pods, once); len(got) != 0 {
		t.Errorf("the killed pod's refused probe: got %q, want it expected", got)
	}
	twice := seen
	twice.Count = 2
	if got := UnexpectedWarnings([]Event{twice}, nil, pods, once); len(got) != 1 {
		t.Errorf("two refused probes after one kill: got %q, want the event unexpected", got)
	}
	if got := UnexpectedWarnings([]Event{twice}, nil, pods, append(once, once...)); len(got) != 0 {
		t.Errorf("two refused probes after two kills: got %q, want them expected", got)
	}
	for _, c := range []struct{ name, object, message string }{
		{"another pod", "Pod/kube-system/converge-node-other", refused},
		{"another port", killed, strings.ReplaceAll(refused, "9810", "9809")},
		{"a timeout", killed, `Liveness probe failed: Get "http://169.254.145.205:9810/livez": context deadline exceeded (Client.Timeout exceeded while awaiting headers)`},
		{"an answer", killed, "Liveness probe failed: HTTP probe failed with statuscode: 503"},
		{"a startup probe", killed, "Startup probe failed: " + strings.TrimPrefix(refused, "Liveness probe failed: ")},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := Event{Type: "Warning", Reason: "Unhealthy", Object: c.object, Source: "kubelet", Message: c.message, Count: 1}
			if got := UnexpectedWarnings([]Event{e}, nil, pods, once); len(got) != 1 {
				t.Errorf("%s: got %q, want it unexpected", e, got)
			}
		})
	}
}

// TestHungLivenessExpectsItsThresholdOnly: a hung container's liveness
// failures are expected up to the probe's threshold, and nothing else of
// its probes.
func TestHungLivenessExpectsItsThresholdOnly(t *testing.T) {
	pods := []string{"converge-node-"}
	hung := "Pod/kube-system/converge-node-h4ng5"
	expected := []Expected{HungLiveness(hung, 5, "TestDriverHungRestarted")}
	timeout := Event{Type: "Warning", Reason: "Unhealthy", Object: hung, Source: "kubelet", Count: 5,
		Message: `Liveness probe failed: Get "http://169.254.1.2:9810/livez": context deadline exceeded (Client.Timeout exceeded while awaiting headers)`}
	if got := UnexpectedWarnings([]Event{timeout}, nil, pods, expected); len(got) != 0 {
		t.Errorf("the threshold's failures: got %q, want them expected", got)
	}
	more := timeout
	more.Count = 6
	if got := UnexpectedWarnings([]Event{more}, nil, pods, expected); len(got) != 1 {
		t.Errorf("a failure past the threshold: got %q, want it unexpected", got)
	}
	startup := Event{Type: "Warning", Reason: "Unhealthy", Object: hung, Source: "kubelet", Count: 1, Message: "Startup probe failed: HTTP probe failed with statuscode: 500"}
	if got := UnexpectedWarnings([]Event{startup}, nil, pods, expected); len(got) != 1 {
		t.Errorf("another probe's failure: got %q, want it unexpected", got)
	}
}

// TestWarningsExpectedWithinAWindow checks an expectation of every
// reason within a window (a soak's faults): a warning first and last
// reported within it is expected, one that began before it or recurred
// after it is not.
func TestWarningsExpectedWithinAWindow(t *testing.T) {
	sources := []string{"converge.csi.dev"}
	from := time.Date(2026, 11, 28, 21, 0, 0, 0, time.UTC)
	until := from.Add(5 * time.Minute)
	at := func(a, b time.Duration) Event {
		return Event{Type: "Warning", Reason: "ProvisioningFailed", Object: "PersistentVolumeClaim/default/soak-3",
			Source: "converge.csi.dev_node-a_1", First: from.Add(a), Last: from.Add(b)}
	}
	within, before, recurred := at(time.Minute, 2*time.Minute), at(-time.Minute, time.Minute), at(time.Minute, 6*time.Minute)
	expected := []Expected{{AnyReason: true, From: from, Until: until, Test: "TestSoak"}}
	got := UnexpectedWarnings([]Event{within, before, recurred}, sources, nil, expected)
	if len(got) != 2 {
		t.Fatalf("got %q, want the warnings that began before or recurred after the window", got)
	}
	if got := UnexpectedWarnings([]Event{within}, sources, nil, nil); len(got) != 1 {
		t.Errorf("without the expectation: got %q, want the warning unexpected", got)
	}
}

// TestKubeletLines: a pod's lines of a kubelet's log in a window of time,
// read in the log's time zone, and none of another pod's (one whose name
// extends it among them) or from outside the window; a window across New
// Year takes the lines of both years.
func TestKubeletLines(t *testing.T) {
	log := `I1128 23:40:59.000001    1 prober.go:120] "Probe failed" pod="kube-system/converge-node-agent-24gxv"
I1128 23:41:07.123456    1 prober.go:120] "Probe failed" probeType="Liveness" pod="kube-system/converge-node-agent-24gxv"
I1128 23:41:07.200000    1 prober.go:120] "Probe failed" pod="kube-system/converge-node-x9z2k"
I1128 23:41:07.300000    1 prober.go:120] "Probe failed" pod="kube-system/converge-node-agent-24gxv2"
I1128 23:41:08.000000    1 kubelet.go:2500] "SyncLoop DELETE" pods=["kube-system/converge-node-agent-24gxv"]
not a klog line "kube-system/converge-node-agent-24gxv"
I1128 23:42:08.000000    1 kubelet.go:2500] "SyncLoop ADD" pods=["kube-system/converge-node-agent-24gxv"]`
	lines := strings.Split(log, "\n")
	pod := "kube-system/converge-node-agent-24gxv"
	from := time.Date(2026, 11, 28, 23, 41, 0, 0, time.UTC)
	if got, want := KubeletLines(log, pod, from, from.Add(time.Minute), time.UTC), []string{lines[1], lines[4]}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	// The same lines, written by a kubelet two hours east of UTC: the
	// window is two hours earlier in UTC.
	east := time.FixedZone("UTC+2", 2*60*60)
	if got, want := KubeletLines(log, pod, from.Add(-2*time.Hour), from.Add(-2*time.Hour+time.Minute), east), []string{lines[1], lines[4]}; !reflect.DeepEqual(got, want) {
		t.Errorf("in UTC+2: got %q, want %q", got, want)
	}
	newYear := `I1231 23:59:50.000000    1 prober.go:120] "Probe failed" pod="ns/p"
I0101 00:00:05.000000    1 prober.go:120] "Probe failed" pod="ns/p"`
	eve := time.Date(2026, 12, 31, 23, 59, 40, 0, time.UTC)
	if got := KubeletLines(newYear, "ns/p", eve, eve.Add(time.Minute), time.UTC); len(got) != 2 {
		t.Errorf("across New Year: got %q, want both lines", got)
	}
}
