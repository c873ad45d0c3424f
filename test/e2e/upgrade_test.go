package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/converge-csi/converge/pkg/contract"
)

// The upgrade from the previous release (hack/previous-release, release.go)
// to the code under test, and the rollback, as docs/operations.md tells an
// operator to run them, with volumes in use.

const (
	// restorePayload is what the snapshot that is restored across the
	// upgrade holds besides its filesystem: random bytes, which the copy
	// must read from the disk.
	restorePayload = 96 << 20
	// restoreReadRate is how fast the previous release's csi-node may read
	// the disk while it restores (a cgroup's blkio throttle): the payload
	// then takes about 24 s to copy, so the upgrade starts while it is
	// being copied, as on a slow disk or with a large snapshot.
	restoreReadRate = 4 << 20
)

// storeRefusals are what csi-node says when it refuses a store of a schema
// it does not read (pkg/state, Open): what a rollback to a release that
// cannot read the new format must say. v0.1.0 says the first, later
// releases pkg/state's ErrNewerSchema (docs/releasing.md, Rolling back);
// this module does not build pkg/state, whose store needs bbolt.
var storeRefusals = []string{"state store has schema", "state store was written by a newer converge"}

// fsyncWriterCommand appends 0, 1, 2... to /data/count five times a
// second, each value written through (fsync) before the next.
const fsyncWriterCommand = `trap "exit 0" TERM; i=0; while true; do echo $i | dd of=` + dataDir +
	`/count oflag=append conv=notrunc,fsync 2>/dev/null && i=$((i+1)); sleep 0.2; done`

// installer is one way of installing converge: the previous release, the
// upgrade to the code under test, the rollback, and the removal of what
// is installed.
type installer struct {
	install, upgrade, rollback, remove func() error
}

// TestUpgradeAndRollback installs the previous release (its csi-node image
// built from its own commit, its deploy/ and its chart of that commit) in
// place of the run's install (put back at the end), once with kubectl
// apply -k of its deploy/ and once with helm install of its chart, and
// under thick and thin volumes that pods write to (each value fsynced), a
// snapshot, and a restore of it that is still copying, upgrades to the
// code under test (kubectl apply -k of deploy/; helm upgrade as
// docs/operations.md says) and rolls back (kubectl apply -k of the old
// deploy/; helm rollback). After each: every node's pod replaced and
// Ready, no mount redone (the staging and target mounts keep their
// mount IDs), every value the writers wrote there in order, the restore
// finished with the snapshot's data (after the upgrade: copied again by the
// new csi-node), and a new volume and a new snapshot work; after the
// rollback the snapshot the new release took restores under the old one.
// A previous release that refuses the new one's store must say so
// (storeRefusals) with nothing lost: the test then says it refused and
// checks the writers and the images.
func TestUpgradeAndRollback(t *testing.T) {
	ctx := context.Background()
	start := time.Now()
	prev, err := c.previousRelease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("previous release %s (commit %s): source and image ready, imported, in %.1fs", prev.tag, prev.commit, time.Since(start).Seconds())
	snapshotsSettled(t)
	if _, err := c.kubectl(ctx, "delete", "-k", filepath.Join(c.dir, "install"), "--wait=true"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := c.client.AppsV1().DaemonSets(daemonSetNamespace).Get(ctx, daemonSetName, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			reinstallDeploy(t)
		}
	})
	withoutDriver(t)

	oldInstall, newInstall := filepath.Join(c.dir, "install-"+prev.tag), filepath.Join(c.dir, "install")
	applyOld := func() error { return c.applyDeploy(ctx, oldInstall, filepath.Join(prev.src, "deploy"), prev.tag) }
	t.Run("kustomize", func(t *testing.T) {
		upgradeAndRollback(t, "upk", prev, installer{
			install: applyOld,
			upgrade: func() error {
				return c.applyDeploy(ctx, newInstall, filepath.Join(c.repo, "deploy"), csiNodeImageTag)
			},
			rollback: applyOld,
			remove: func() error {
				for _, dir := range []string{oldInstall, newInstall} {
					if _, err := c.kubectl(ctx, "delete", "-k", dir, "--wait=true", "--ignore-not-found"); err != nil {
						return err
					}
				}
				return nil
			},
		})
	})

	t.Run("helm", func(t *testing.T) {
		cfg := helmConfig(t)
		oldChart, err := loader.Load(filepath.Join(prev.src, "charts", "converge"))
		if err != nil {
			t.Fatal(err)
		}
		newChart, err := loader.Load(filepath.Join(c.repo, "charts", "converge"))
		if err != nil {
			t.Fatal(err)
		}
		upgradeAndRollback(t, "uph", prev, installer{
			install: func() error {
				values := helmValues(4)
				values["csiNode"].(map[string]any)["image"] = map[string]any{"repository": csiNodeImageName, "tag": prev.tag}
				// The previous chart names the sidecar releases of its
				// day: it runs the ones built here, as its deploy/
				// does (installKustomizationsOf), and the upgrade
				// reuses these values.
				for _, s := range sidecars {
					values["sidecars"].(map[string]any)[s.value] = map[string]any{"image": s.image()}
				}
				_, err := helmInstall(cfg).RunWithContext(ctx, oldChart, values)
				return err
			},
			// docs/operations.md's upgrade: helm upgrade
			// --reset-then-reuse-values --set csiNode.image.tag=<new>.
			upgrade: func() error {
				u := helmUpgrade(cfg)
				u.ResetThenReuseValues = true
				_, err := u.RunWithContext(ctx, helmRelease, newChart, map[string]any{"csiNode": map[string]any{"image": map[string]any{"tag": csiNodeImageTag}}})
				return err
			},
			// helm rollback converge: the revision before.
			rollback: func() error {
				r := action.NewRollback(cfg)
				r.WaitStrategy = kube.HookOnlyStrategy
				return r.Run(helmRelease)
			},
			remove: func() error {
				_, err := helmUninstall(cfg).Run(helmRelease)
				if err != nil && strings.Contains(err.Error(), "not found") {
					return nil
				}
				return err
			},
		})
	})
}

// writer is a pod that appends fsynced values to its volume, with what
// the test saw last: the volume's mounts and how many values it counted.
type writer struct {
	pod    *corev1.Pod
	v      volume
	claim  string
	mounts string
	values int
}

// fsyncWriter starts a writer on a new claim called name of class and
// size, on the first node: its pool is on the machine's disk, and a second
// node's (the two-node tests join one) is too small for the restore.
func fsyncWriter(t *testing.T, name, class, size string) *writer {
	t.Helper()
	claimOf(t, name, fs, rwo, size, class)
	pod := startPod(t, podSpec{name: name, claims: []string{name}, command: fsyncWriterCommand, node: c.node})
	w := &writer{pod: pod, v: boundVolume(t, name), claim: name}
	w.mounts = w.v.mounts(t, pod)
	poll(t, time.Minute, name+" writing", func() (bool, string) {
		w.values = counted(t, pod.Name)
		return w.values > 0, "no value yet"
	})
	return w
}

// check checks, after converge's pods were replaced (during what), that
// the writer's volume has the mounts it had, and that every value it wrote
// is there and it writes on.
func (w *writer) check(t *testing.T, what string) {
	t.Helper()
	if now := w.v.mounts(t, w.pod); now != w.mounts {
		t.Errorf("%s: the volume of %s was mounted again: %s before, now %s", what, w.pod.Name, w.mounts, now)
		w.mounts = now // the next step is checked against these
	}
	before := w.values
	poll(t, 30*time.Second, what+": "+w.pod.Name+" writing on", func() (bool, string) {
		w.values = counted(t, w.pod.Name)
		return w.values > before, fmt.Sprintf("%d values, %d before", w.values, before)
	})
	t.Logf("%s: %s kept its mounts (%s) and has all %d values, %d before", what, w.pod.Name, w.mounts, w.values, before)
}

// upgradeAndRollback runs the upgrade and the rollback of
// TestUpgradeAndRollback the installer's way; its objects' names start
// with p.
func upgradeAndRollback(t *testing.T, p string, prev convergeRelease, in installer) {
	storesForPrevious(t, p, prev)
	if err := in.install(); err != nil {
		t.Fatalf("installing %s: %v", prev.tag, err)
	}
	t.Cleanup(func() {
		if err := in.remove(); err != nil {
			t.Errorf("removing the install: %v", err)
		}
		withoutDriver(t)
	})
	waitDrivers(t, prev.tag)

	thick := storageClass(t, p+"-thick", map[string]string{"csi.storage.k8s.io/fstype": "ext4", "converge.csi.dev/provisioning": "thick"})
	thin := storageClass(t, p+"-thin", map[string]string{"csi.storage.k8s.io/fstype": "ext4", "converge.csi.dev/provisioning": "thin"})
	writers := []*writer{fsyncWriter(t, p+"-thick", thick, volumeSize), fsyncWriter(t, p+"-thin", thin, "256Mi")}
	src := writers[1]
	mustExec(t, src.pod.Name, fmt.Sprintf("head -c %d /dev/urandom > %s/payload && md5sum %[2]s/payload | cut -d' ' -f1 > %[2]s/payload.md5 && sync", restorePayload, dataDir))
	sum := mustExec(t, src.pod.Name, "cat "+dataDir+"/payload.md5")
	volumeSnapshot(t, p+"-snap", src.claim)

	// The restore, slowed: the snapshot read from the disk (its pages
	// dropped from the page cache) by a csi-node that may read
	// restoreReadRate bytes a second.
	n := src.v.n
	dropPageCache(t, filepath.Join(n.dataDir, "snapshots"))
	throttleReads(t, n, restoreReadRate)
	restored := claimFromSnapshot(t, p+"-restored", p+"-snap", "256Mi")
	createPod(t, podSpec{name: p + "-restored", claims: []string{p + "-restored"}, node: n.node})
	copied := waitCopying(t, n, "pvc-"+string(restored.UID))

	// The upgrade.
	olds := driverPods(t)
	t.Logf("upgrading from %s while the restore has copied %d of %d bytes", prev.tag, copied, restorePayload)
	if err := in.upgrade(); err != nil {
		t.Fatalf("the upgrade: %v", err)
	}
	news := map[string]*corev1.Pod{}
	for _, node := range c.nodes {
		news[node.node] = waitReplacedPod(t, node, olds[node.node])
		checkImage(t, news[node.node], csiNodeImageTag)
	}
	for _, w := range writers {
		w.check(t, "the upgrade")
	}
	reader := waitRunning(t, p+"-restored")
	rv := boundVolume(t, p+"-restored")
	if got := mustExec(t, reader.Name, "md5sum "+dataDir+"/payload | cut -d' ' -f1"); got != sum {
		t.Errorf("the restored volume's payload has MD5 %s, the snapshot's source %s", got, sum)
	}
	// The copy was cut by the upgrade and made again by the new csi-node,
	// not finished by the old one before it stopped.
	if !logHas(podLog(news[rv.n.node], "csi-node"), "Restored volume from snapshot", `volumeID="`+rv.handle+`"`) {
		t.Errorf("the new csi-node did not restore %s: the restore was not under way across the upgrade (or finished before it)", rv.handle)
	}
	t.Logf("the restore cut by the upgrade was copied again by the new csi-node: %s holds the snapshot's payload", rv.handle)
	deletePod(t, reader.Name)
	release(t, rv, p+"-restored")

	// Operations after the upgrade: a new volume, written to across the
	// rollback, and a snapshot of it.
	made := fsyncWriter(t, p+"-new", thin, volumeSize)
	writers = append(writers, made)
	mustExec(t, made.pod.Name, "echo "+csiNodeImageTag+" > "+dataDir+"/made-by && sync")
	volumeSnapshot(t, p+"-snap-new", made.claim)

	// The rollback.
	olds = driverPods(t)
	if err := in.rollback(); err != nil {
		t.Fatalf("the rollback: %v", err)
	}
	if refusal := waitRolledBack(t, olds, prev.tag); refusal != "" {
		// A clear refusal: nothing lost, and the upgrade, again,
		// takes the volumes over. Only a release that cannot read
		// the new store's schemas may refuse it.
		if !cannotRead(t, prev) {
			t.Errorf("%s reads every schema the code under test writes, yet refused its store: %s", prev.tag, refusal)
		}
		t.Logf("%s refuses what the new release wrote, as it must if it cannot read it: %s", prev.tag, refusal)
		for _, w := range writers {
			w.check(t, "the refused rollback")
			if _, err := os.Stat(w.v.image()); err != nil {
				t.Errorf("after the refused rollback, the image of %s: %v", w.pod.Name, err)
			}
		}
		// The refusing csi-node crashes in a loop, as may the sidecars
		// that lose it, until the upgrade deletes its pod: restarts and
		// warnings on purpose, a few more than seen so far.
		for _, node := range c.nodes {
			pod, err := node.driverPod(context.Background())
			if err != nil || pod == nil {
				t.Fatalf("the converge pod of %s: %v", node.node, err)
			}
			for _, s := range pod.Status.ContainerStatuses {
				for range s.RestartCount + 3 {
					intendRestart(pod, s.Name)
				}
			}
			expectWarning(t, "BackOff", "Pod/"+daemonSetNamespace+"/"+pod.Name)
			expectWarning(t, "Unhealthy", "Pod/"+daemonSetNamespace+"/"+pod.Name)
		}
		// The upgrade again: the refusing pod is replaced; the pods
		// the rollout never reached already run the new release.
		refused := driverPods(t)
		if err := in.upgrade(); err != nil {
			t.Fatalf("the upgrade after the refused rollback: %v", err)
		}
		for _, node := range c.nodes {
			if refused[node.node] == olds[node.node] {
				if err := node.waitDriver(context.Background()); err != nil {
					t.Fatalf("converge on %s: %v", node.node, err)
				}
				continue
			}
			waitReplacedPod(t, node, refused[node.node])
		}
	} else {
		t.Logf("rolled back to %s: every node's pod Ready", prev.tag)
		for _, w := range writers {
			w.check(t, "the rollback")
		}
		// What the new release made, the old one restores; and it makes
		// volumes and snapshots of its own.
		claimFromSnapshot(t, p+"-restored-new", p+"-snap-new", volumeSize)
		rpod := startPod(t, podSpec{name: p + "-restored-new", claims: []string{p + "-restored-new"}, node: made.v.n.node})
		if got := mustExec(t, rpod.Name, "cat "+dataDir+"/made-by"); got != csiNodeImageTag {
			t.Errorf("the new release's snapshot, restored by %s, holds %q in made-by, want %q", prev.tag, got, csiNodeImageTag)
		}
		release(t, boundVolume(t, p+"-restored-new"), p+"-restored-new", rpod.Name)
		claim(t, p+"-old-again", fs, rwo)
		opod := startPod(t, podSpec{name: p + "-old-again", claims: []string{p + "-old-again"}, node: c.node})
		ov := boundVolume(t, p+"-old-again")
		mustExec(t, opod.Name, "echo "+prev.tag+" > "+dataDir+"/made-by && sync")
		volumeSnapshot(t, p+"-snap-old", p+"-old-again")
		release(t, ov, p+"-old-again", opod.Name)
	}

	// Everything released while converge runs.
	for _, name := range []string{p + "-snap", p + "-snap-new", p + "-snap-old"} {
		deleteSnapshot(t, name)
	}
	for _, w := range writers {
		release(t, w.v, w.claim, w.pod.Name)
	}
}

// waitDrivers waits for every node's converge pod, with csi-node of tag.
func waitDrivers(t *testing.T, tag string) {
	t.Helper()
	for _, n := range c.nodes {
		if err := n.waitDriver(context.Background()); err != nil {
			t.Fatalf("converge on %s: %v", n.node, err)
		}
		p, err := n.driverPod(context.Background())
		if err != nil || p == nil {
			t.Fatalf("the converge pod of %s: %v", n.node, err)
		}
		checkImage(t, p, tag)
	}
}

// checkImage checks that the pod's csi-node runs the image of tag.
func checkImage(t *testing.T, pod *corev1.Pod, tag string) {
	t.Helper()
	for _, ctr := range pod.Spec.Containers {
		if ctr.Name == "csi-node" && ctr.Image != csiNodeImageName+":"+tag {
			t.Errorf("pod %s runs csi-node of %s, want tag %s", pod.Name, ctr.Image, tag)
		}
	}
}

// waitRolledBack waits for every node's converge pod to be replaced by one
// of the previous release (tag), Ready, and returns ""; or, once a
// replacement's csi-node refuses the store (storeRefusals), returns that
// line. The DaemonSet replaces one pod at a time (maxUnavailable 1), so a
// refusal stops the rollout there: every other node's pod must then be
// Ready, either rolled back or its pod of before (olds) untouched.
func waitRolledBack(t *testing.T, olds map[string]types.UID, tag string) string {
	t.Helper()
	refusal := ""
	poll(t, 3*time.Minute, "the rollback on every node", func() (bool, string) {
		var waiting []string
		for _, n := range c.nodes {
			p, err := n.driverPod(context.Background())
			if err != nil || p == nil || p.UID == olds[n.node] {
				waiting = append(waiting, fmt.Sprintf("%s: pod %v not replaced: %v", n.node, p, err))
				continue
			}
			for _, line := range strings.Split(podLog(p, "csi-node"), "\n") {
				if refusal == "" && slices.ContainsFunc(storeRefusals, func(r string) bool { return strings.Contains(line, r) }) {
					refusal = line
				}
			}
			if !podReady(p) || !n.driverRegistered() {
				waiting = append(waiting, n.node+": "+containerStates(p))
				continue
			}
			checkImage(t, p, tag)
		}
		return refusal != "" || len(waiting) == 0, strings.Join(waiting, "; ")
	})
	if refusal == "" {
		return ""
	}
	// The rollout stopped at the refusing pod: no other node lost its
	// driver.
	refusing := 0
	for _, n := range c.nodes {
		p, err := n.driverPod(context.Background())
		if err != nil || p == nil {
			t.Fatalf("the converge pod of %s: %v", n.node, err)
		}
		if p.UID != olds[n.node] && !podReady(p) {
			refusing++
			continue
		}
		if !podReady(p) || !n.driverRegistered() {
			t.Errorf("while %s refuses the store, the converge pod of %s is not serving: %s", tag, n.node, containerStates(p))
		}
	}
	if refusing != 1 {
		t.Errorf("%d nodes' pods refuse the store, want the one the rollout stopped at", refusing)
	}
	return refusal
}

// cannotRead says whether prev cannot read a schema that the code under
// test writes, and so may refuse a store the code under test wrote.
func cannotRead(t *testing.T, prev convergeRelease) bool {
	t.Helper()
	oldReads, newWrites := schemasRead(t, prev.src), schemasRead(t, c.repo)
	t.Logf("%s reads schemas %v; the code under test writes %v", prev.tag, oldReads, newWrites)
	return slices.ContainsFunc(newWrites, func(s string) bool { return !slices.Contains(oldReads, s) })
}

// storesForPrevious leaves each node's state store as a node that has
// only run prev would hold it, when prev cannot read what the code under
// test writes: the run's converge made and closed those stores, and prev
// would refuse them at its install (docs/releasing.md, "Rolling back",
// whose checks and order it follows), before the upgrade under test
// began. It does so only while the cluster has no converge volume and no
// node's data or pools directory holds a file, so that the store moved
// aside (named after the subtest, p) holds no volume prev could take for
// an orphan.
func storesForPrevious(t *testing.T, p string, prev convergeRelease) {
	t.Helper()
	if !cannotRead(t, prev) {
		return
	}
	pvs, err := c.client.CoreV1().PersistentVolumes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pv := range pvs.Items {
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == contract.DefaultDriverName {
			t.Fatalf("%s cannot read the stores of the code under test, which volume %s is in", prev.tag, pv.Name)
		}
	}
	for _, n := range c.nodes {
		for _, dir := range []string{n.dataDir, n.poolsDir} {
			err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					return fmt.Errorf("holds %s", path)
				}
				return err
			})
			if err != nil && !os.IsNotExist(err) {
				t.Fatalf("%s cannot read the store of %s, whose volumes' directory %s: %v", prev.tag, n.node, dir, err)
			}
		}
		// The log first: a csi-node started between the two would
		// replay it into a new store.
		for _, name := range []string{"state.db-wal", "state.db"} {
			from := filepath.Join(n.stateDir, name)
			if err := os.Rename(from, from+".before-"+p+"-"+prev.tag); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
		}
		t.Logf("the state store of %s, which %s cannot read and which holds no volume, moved aside", n.node, prev.tag)
	}
}

// schemasRead are the store schemas the pkg/state of the source tree src
// reads (its SchemaVersion and schemaLogged), read from its source: this
// module does not build pkg/state.
func schemasRead(t *testing.T, src string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(src, "pkg", "state", "store.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^\s*(?:SchemaVersion|schemaLogged)\s*=\s*"([0-9]+)"`).FindAllSubmatch(b, -1) {
		out = append(out, string(m[1]))
	}
	if len(out) == 0 {
		t.Fatalf("no schema constants in %s/pkg/state/store.go", src)
	}
	return out
}

// logHas reports whether a line of log holds every one of parts.
func logHas(log string, parts ...string) bool {
	for _, line := range strings.Split(log, "\n") {
		all := true
		for _, part := range parts {
			all = all && strings.Contains(line, part)
		}
		if all {
			return true
		}
	}
	return false
}

// claimFromSnapshot creates a claim of the converge class, of size, filled
// from the VolumeSnapshot snapshot, deleted when t ends.
func claimFromSnapshot(t *testing.T, name, snapshot, size string) *corev1.PersistentVolumeClaim {
	t.Helper()
	return makeClaim(t, name, fs, rwo, size, "converge", &corev1.TypedObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: snapshot})
}

// deleteSnapshot deletes the VolumeSnapshot name and waits for it to be
// gone, its content and the node's snapshot with it.
func deleteSnapshot(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	snaps := c.dynamic.Resource(volumeSnapshots).Namespace(ns)
	if err := snaps.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete VolumeSnapshot %s: %v", name, err)
		return
	}
	poll(t, 2*time.Minute, "VolumeSnapshot "+name+" gone", func() (bool, string) {
		_, err := snaps.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

// dropPageCache drops the cached pages of every file in dir
// (POSIX_FADV_DONTNEED), so that the next reads go to the disk.
func dropPageCache(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		err = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		f.Close()
		if err != nil {
			t.Fatalf("fadvise %s: %v", e.Name(), err)
		}
	}
}

// throttleReads limits the reads of the node's csi-node (the container of
// its converge pod) from the disk of the node's data directory to rate
// bytes a second, through its cgroup's blkio throttle, until t ends or the
// container does.
func throttleReads(t *testing.T, n *kubeNode, rate int) {
	t.Helper()
	pod, err := n.driverPod(context.Background())
	if err != nil || pod == nil {
		t.Fatalf("the converge pod of %s: %v", n.node, err)
	}
	pid := processOf(t, pod, "csi-node")
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	var blkio string
	for _, line := range strings.Split(string(cg), "\n") {
		if parts := strings.SplitN(line, ":", 3); len(parts) == 3 && strings.Contains(","+parts[1]+",", ",blkio,") {
			blkio = filepath.Join("/sys/fs/cgroup/blkio", parts[2], "blkio.throttle.read_bps_device")
		}
	}
	if blkio == "" {
		t.Fatalf("csi-node (%d) has no blkio cgroup (cgroup v1):\n%s", pid, cg)
	}
	var st unix.Stat_t
	if err := unix.Stat(n.dataDir, &st); err != nil {
		t.Fatal(err)
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	if err := os.WriteFile(blkio, []byte(dev+" "+strconv.Itoa(rate)), 0o644); err != nil {
		t.Fatalf("throttling csi-node's reads of %s: %v", dev, err)
	}
	t.Cleanup(func() { os.WriteFile(blkio, []byte(dev+" 0"), 0o644) })
}

// processOf is the PID of the pod's process whose program is named name.
func processOf(t *testing.T, pod *corev1.Pod, name string) int {
	t.Helper()
	pids := podProcesses(pod, programNamed(name))
	if len(pids) == 0 {
		t.Fatalf("no %s process of pod %s", name, pod.Name)
	}
	return pids[0]
}

// waitCopying waits for the node's csi-node to be copying a snapshot into
// the image of a volume whose ID starts with prefix (its temporary file in
// the data directory) and returns the bytes it holds so far.
func waitCopying(t *testing.T, n *kubeNode, prefix string) int64 {
	t.Helper()
	var copied int64
	poll(t, 2*time.Minute, "a restore of "+prefix+" under way", func() (bool, string) {
		entries, _ := os.ReadDir(n.dataDir)
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), ".tmp-"+prefix) {
				continue
			}
			var st unix.Stat_t
			if unix.Stat(filepath.Join(n.dataDir, e.Name()), &st) == nil {
				copied = st.Blocks * 512
				return true, ""
			}
		}
		return false, "no copy in " + n.dataDir
	})
	return copied
}
