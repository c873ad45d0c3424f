package invariants

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// ProbeErrors returns the kubelet log lines of a probe that errored (as
// opposed to failed) for a pod whose name starts with one of podPrefixes,
// in any namespace. The kubelet logs "Probe errored" when it cannot even
// run a probe, a named port it cannot resolve among them
// (pkg/kubelet/prober), and never counts such a probe as a failure: a
// liveness probe that errors can never restart its container.
func ProbeErrors(kubeletLog string, podPrefixes []string) []string {
	var out []string
	for _, line := range strings.Split(kubeletLog, "\n") {
		if !strings.Contains(line, `"Probe errored"`) {
			continue
		}
		_, pod, _ := strings.Cut(line, ` pod="`)
		pod, _, _ = strings.Cut(pod, `"`)
		_, name, _ := strings.Cut(pod, "/")
		if hasPrefix(name, podPrefixes) {
			out = append(out, line)
		}
	}
	return out
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// Container names one container of one pod; UID tells apart the pods a
// controller makes under new names.
type Container struct {
	Pod, UID, Name string
}

func (c Container) String() string { return c.Pod + "/" + c.Name }

// UnexpectedRestarts compares the restarts seen of each container with
// those a test caused on purpose and said so, and describes each
// container that restarted more.
func UnexpectedRestarts(seen, intended map[Container]int32) []string {
	var out []string
	for c, n := range seen {
		if n > intended[c] {
			out = append(out, fmt.Sprintf("container %s restarted %d times, %d of them on purpose", c, n, intended[c]))
		}
	}
	sort.Strings(out)
	return out
}

// Event is a Kubernetes event, flattened.
type Event struct {
	Type    string // Normal or Warning
	Reason  string
	Object  string // kind/namespace/name of the involved object
	Source  string // the reporting component (source.component or reportingController)
	Message string
	Count   int32
	// First and Last are when it was first and last reported (zero when
	// the event says neither).
	First, Last time.Time
}

func (e Event) String() string {
	when := ""
	if !e.First.IsZero() {
		when = ", first at " + e.First.UTC().Format("15:04:05")
	}
	return fmt.Sprintf("%s %s on %s from %s (x%d%s): %s", e.Type, e.Reason, e.Object, e.Source, max(e.Count, 1), when, e.Message)
}

// Expected is a Warning event a test causes on purpose, named by its
// reason and a part of its involved object's kind/namespace/name.
type Expected struct {
	Reason string
	Object string
	// Message, when set, is a part of the event's message, and Prefix,
	// when set, its beginning.
	Message, Prefix string
	// Max, when set, is how many times the test causes it: an event
	// (which the kubelet counts up when it recurs) is expected only while
	// its count is within the sum of Max of the expectations it matches,
	// unless one of them has no Max.
	Max int32
	// AnyReason expects warnings of every reason, and From and Until,
	// when set, only those first and last reported within them: a soak's
	// faults, which raise warnings of every kind while they fall, and
	// none once the cluster has settled.
	AnyReason   bool
	From, Until time.Time
	// Test is the test that causes it, for the report.
	Test string
}

// Matches says whether e is the warning x expects.
func (x Expected) Matches(e Event) bool {
	if !x.From.IsZero() && (e.First.Before(x.From) || e.Last.After(x.Until)) {
		return false
	}
	return (x.AnyReason || e.Reason == x.Reason) && strings.Contains(e.Object, x.Object) && strings.Contains(e.Message, x.Message) &&
		strings.HasPrefix(e.Message, x.Prefix)
}

// Ours says whether a converge component reported e, or e concerns one of
// converge's own pods (the kubelet's warnings about csi-node's probes or
// restarts): sources are parts of the reporting components' names
// (converge-controller; the sidecars name the driver), pods the prefixes
// of converge's pods' names.
func Ours(e Event, sources, pods []string) bool {
	for _, s := range sources {
		if strings.Contains(e.Source, s) {
			return true
		}
	}
	kind, rest, _ := strings.Cut(e.Object, "/")
	_, name, _ := strings.Cut(rest, "/")
	return kind == "Pod" && hasPrefix(name, pods)
}

// UnexpectedWarnings describes each Warning event of converge's (Ours) that
// no test expected.
func UnexpectedWarnings(events []Event, sources, pods []string, expected []Expected) []string {
	var out []string
	for _, e := range events {
		if e.Type != "Warning" || !Ours(e, sources, pods) {
			continue
		}
		if !expectedCount(e, expected) {
			out = append(out, e.String())
		}
	}
	sort.Strings(out)
	return out
}

// expectedCount says whether the expectations that e matches allow it as
// often as it occurred (Expected.Max).
func expectedCount(e Event, expected []Expected) bool {
	found, allowed := false, int32(0)
	for _, x := range expected {
		if !x.Matches(e) {
			continue
		}
		if x.Max == 0 {
			return true
		}
		found, allowed = true, allowed+x.Max
	}
	return found && max(e.Count, 1) <= allowed
}

// VolumeMounts returns the mount points, in a mount table's list of mount
// points, of a CSI volume under kubeletDir: a staging mount
// (plugins/kubernetes.io/csi/...) or a pod's volume (pods/<uid>/volumes/
// kubernetes.io~csi/...). Once every test has released its claims, none
// may remain.
func VolumeMounts(mountPoints []string, kubeletDir string) []string {
	var out []string
	for _, m := range mountPoints {
		rest, ok := strings.CutPrefix(m, kubeletDir+"/")
		if !ok {
			continue
		}
		if strings.HasPrefix(rest, "plugins/kubernetes.io/csi/") ||
			(strings.HasPrefix(rest, "pods/") && strings.Contains(rest, "/volumes/kubernetes.io~csi/")) {
			out = append(out, m)
		}
	}
	return out
}

// Environment are the warnings every whole run expects, whatever its tests.
//
// What the run's cluster says of every pod, converge's included, for what
// it lacks on purpose: no cluster DNS (the kubelets run without one, and
// the pods use the host's network or reach the API server by address).
//
// And what a pod says of itself while it starts: a csi-node is not ready
// until its start-up reconstruction is done, which is what its readiness
// probe tells, and the probe may come before it even listens. A liveness
// or startup probe that fails is converge's, and fails the run unless a
// test says it caused it.
var Environment = []Expected{
	{Reason: "MissingClusterDNS", Object: "Pod/", Test: "the run's cluster"},
	{Reason: "Unhealthy", Object: "Pod/", Message: "Readiness probe failed", Test: "a pod starting"},
	// The kubelet mounts a pod's service account token only once its
	// ConfigMap informer has synced, and says so, then retries, when that
	// takes longer than it waits (a kubelet under the run's load).
	{Reason: "FailedMount", Object: "Pod/", Message: "failed to sync configmap cache", Test: "a kubelet under load"},
	// csi-snapshotter writes a content's status with the version it read;
	// when snapshot-controller wrote the content meanwhile (its finalizer,
	// its annotations), the API server refuses it, csi-snapshotter says so
	// and retries: after checking a content, or after the driver's
	// CreateVolumeGroupSnapshot answered, which converge answers with the
	// same snapshots again on the retry. Only the status write's conflict
	// is expected: a driver's error, which the message quotes, comes after
	// another beginning ("failed to take group snapshot").
	{Reason: "SnapshotContentCheckandUpdateFailed", Object: "SnapshotContent/", Message: "the object has been modified", Test: "csi-snapshotter's retried update"},
	{Reason: "GroupSnapshotContentCheckandUpdateFailed", Object: "SnapshotContent/", Message: "the object has been modified", Test: "csi-snapshotter's retried update"},
	{Reason: "GroupSnapshotCreationFailed", Object: "SnapshotContent/", Message: "the object has been modified",
		Prefix: "Failed to create group snapshot: error updating status for volume group snapshot content ", Test: "csi-snapshotter's retried update"},
	// external-provisioner deletes a Released volume at once, while the
	// kubelet may not yet have unstaged it (it removes a pod once its
	// volumes are unpublished; the unstage comes after): csi-node refuses
	// FAILED_PRECONDITION, as the CSI spec has it for a volume in use, the
	// provisioner says so and retries with backoff. Only that refusal.
	{Reason: "VolumeFailedDelete", Object: "PersistentVolume/", Message: "is staged at",
		Prefix: "rpc error: code = FailedPrecondition desc = volume ", Test: "external-provisioner's retried DeleteVolume"},
}

// HungLiveness is the warnings a container that stops answering causes on
// pod (kind/namespace/name) through its liveness probe, of failureThreshold:
// the probe fails that many times, each failure one count of its event (a
// timeout), and the kubelet then kills the container and probes it no more
// until it runs again. Anything else said of the pod's probes is
// unexpected.
func HungLiveness(pod string, failureThreshold int32, test string) Expected {
	return Expected{Reason: "Unhealthy", Object: pod, Prefix: "Liveness probe failed: ", Max: failureThreshold, Test: test}
}

// KilledLiveness is the warning a kill of a container whose liveness probe
// is an HTTP GET on port may cause, once, on pod (kind/namespace/name): the
// kubelet probes a container while the status it last saw says running,
// and sees it end only at its next look at the runtime (about a second
// later), so a probe in that second finds nothing listening. Only a
// refused connection is expected, once a kill: a probe that times out or
// fails on its answer says the process was there and unwell, which a kill
// does not explain. (A probe already under way when the kill lands ends
// otherwise, on a reset connection; it takes a few milliseconds of the
// probes' 10 s period, and is not expected.)
func KilledLiveness(pod string, port int32, test string) Expected {
	return Expected{Reason: "Unhealthy", Object: pod, Prefix: "Liveness probe failed: Get ",
		Message: fmt.Sprintf(":%d: connect: connection refused", port), Max: 1, Test: test}
}

// KubeletLines returns the lines of a kubelet's log (klog's format:
// "I1128 23:41:07.123456 ...", in the machine's time zone, the year left
// out) that name pod ("<namespace>/<name>", as the kubelet does, so that
// pod writer-1 is not writer-10) and were written between from and to:
// what the kubelet did with a pod around a warning no test explains. A
// line whose time does not parse is left out; the year is from's or to's,
// whichever puts the line between them (a window across New Year).
func KubeletLines(kubeletLog, pod string, from, to time.Time, loc *time.Location) []string {
	var out []string
	quoted := `"` + pod + `"`
	for _, line := range strings.Split(kubeletLog, "\n") {
		if len(line) < 21 || !strings.Contains(line, quoted) {
			continue
		}
		t, err := time.ParseInLocation("0102 15:04:05.000000", line[1:21], loc)
		if err != nil {
			continue
		}
		for _, year := range []int{from.In(loc).Year(), to.In(loc).Year()} {
			if at := t.AddDate(year, 0, 0); !at.Before(from) && !at.After(to) {
				out = append(out, line)
				break
			}
		}
	}
	return out
}
