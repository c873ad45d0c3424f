package reconciler

// The simulation drives the reconciler over the fake device layer through
// random interleavings of kubelet requests, damage from outside, operation
// failures, requests that land while an operation runs, and crashes (some
// between an operation's effect and its record). It checks the design's
// invariants at every device call and after every step, and, once the
// faults stop, that the machine converges to the intents and that a full
// teardown leaves nothing behind.
//
// make test runs a fixed set of seeds. Run more, longer, with
//
//	CONVERGE_SIM_SEEDS=500 CONVERGE_SIM_STEPS=3000 go test -run TestSimulation ./pkg/reconciler
//
// and replay one failing seed (printed on failure) with
//
//	CONVERGE_SIM_SEED=<seed> CONVERGE_SIM_STEPS=<steps> go test -run TestSimulation ./pkg/reconciler

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/state"
)

const (
	simVolumes = 4
	simTargets = 2 // pods per volume
	// simHistory is how many recent steps a failure report shows.
	simHistory = 40
)

var errCrashed = errors.New("injected: the plugin died here")

// simEnv reads a positive integer setting of the simulation.
func simEnv(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func TestSimulation(t *testing.T) {
	steps := simEnv("CONVERGE_SIM_STEPS", 500)
	if one := os.Getenv("CONVERGE_SIM_SEED"); one != "" {
		seed, err := strconv.ParseUint(one, 10, 64)
		if err != nil {
			t.Fatalf("CONVERGE_SIM_SEED: %v", err)
		}
		runSim(t, seed, steps)
		return
	}
	for seed := range uint64(simEnv("CONVERGE_SIM_SEEDS", 20)) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runSim(t, seed, steps) })
	}
}

type sim struct {
	t     *testing.T
	seed  uint64
	rng   *rand.Rand
	path  string
	world *fakeWorld
	clock *clocktesting.FakeClock
	store *state.Store
	r     *Reconciler
	step  int
	// history holds the latest steps, for the failure report.
	history []string

	// mu guards the fields below, which the world's hooks use from
	// operation goroutines.
	mu         sync.Mutex
	faults     bool
	crashed    bool
	inflight   map[string]int
	violations []string
	// counts tallies what happened, for the summary.
	counts map[string]int
	// wiped counts the filesystems wiped from outside, per image.
	wiped map[string]int
	// nested is true while a pass made from inside an operation runs.
	nested bool
}

func runSim(t *testing.T, seed uint64, steps int) {
	dir := t.TempDir()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		// The store fsyncs every update; on tmpfs that costs nothing.
		d, err := os.MkdirTemp("/dev/shm", "converge-sim-")
		if err == nil {
			dir = d
			t.Cleanup(func() { os.RemoveAll(d) })
		}
	}
	s := &sim{
		t:        t,
		seed:     seed,
		rng:      rand.New(rand.NewPCG(seed, 0x5eed)),
		path:     filepath.Join(dir, "state.db"),
		world:    newFakeWorld(),
		clock:    clocktesting.NewFakeClock(time.Unix(1_000_000, 0)),
		inflight: map[string]int{},
		counts:   map[string]int{},
		wiped:    map[string]int{},
	}
	s.world.started = nil
	s.world.before = s.before
	s.world.after = s.after
	s.world.makeDirs("/k", "/k/staging", "/k/pods")
	for i := range simVolumes {
		s.world.makeImages(volID(i))
	}
	s.start()
	t.Cleanup(func() {
		s.r.wait()
		s.store.Close()
	})
	defer func() {
		if t.Failed() {
			t.Logf("seed %d; replay with CONVERGE_SIM_SEED=%d CONVERGE_SIM_STEPS=%d; last steps:\n%s",
				seed, seed, steps, strings.Join(s.history, "\n"))
		}
	}()

	s.setFaults(true)
	for s.step = 0; s.step < steps && !t.Failed(); s.step++ {
		s.randomStep()
		if s.rng.IntN(3) == 0 {
			s.clock.Step(time.Duration(s.rng.IntN(3000)) * time.Millisecond)
		}
		s.pass()
		s.check()
	}
	if t.Failed() {
		return
	}
	s.setFaults(false)
	s.note("faults stop")
	// The kubelet's subPath mounts go with their pods' containers. While
	// one holds a shut-down filesystem, nothing can mount that filesystem
	// afresh: the plugin leaves it alone and reports why, which the steps
	// check. Convergence is checked for what the plugin can converge.
	for i := range simVolumes {
		for k := range simTargets {
			s.world.removeSubPaths(podOf(volID(i), k))
		}
	}
	s.converge()
	s.checkConverged()
	if t.Failed() {
		return
	}
	s.teardownAll()
	s.converge()
	s.checkEmpty()
	calls := map[string]int{}
	for _, c := range s.world.Calls() {
		op, _, _ := strings.Cut(c, " ")
		calls[op]++
	}
	t.Logf("seed %d: %d steps; device calls %v; injected %v", seed, steps, calls, s.counts)
}

// volOfPath returns the volume of a staging or target path.
func (s *sim) volOfPath(p string) string {
	base := filepath.Base(p)
	if base == "mount" {
		base, _, _ = strings.Cut(filepath.Base(filepath.Dir(p)), "-")
	}
	return base
}

func volID(i int) string { return "v" + strconv.Itoa(i) }

func stagingOf(id string) string { return "/k/staging/" + id }

func podOf(id string, k int) string { return fmt.Sprintf("/k/pods/%s-%d", id, k) }

func targetOf(id string, k int) string { return podOf(id, k) + "/mount" }

// start opens the store and starts a new reconciler on it, as the plugin
// does at start-up.
func (s *sim) start() {
	store, err := state.Open(s.path)
	if err != nil {
		s.t.Fatal(err)
	}
	r, err := New(Config{
		Store: store, Observer: s.world, Loops: s.world, Filesystems: s.world, Paths: s.world, Pools: fakePools(s.world),
		Clock: s.clock, Roots: []string{"/k"},
		// Operations run inline, one after the other in the order the
		// pass starts them, so that a seed always makes the same run.
		spawn: func(f func()) { f() },
	})
	if err != nil {
		s.t.Fatal(err)
	}
	s.store, s.r = store, r
}

// restart simulates a crash: running operations end, every in-memory state
// (results, backoffs, the store's mirror) is lost, the machine keeps its
// mounts and devices.
func (s *sim) restart() {
	s.r.wait()
	if err := s.store.Close(); err != nil {
		s.t.Fatal(err)
	}
	s.start()
}

func (s *sim) note(format string, args ...any) {
	s.history = append(s.history, fmt.Sprintf("%4d ", s.step)+fmt.Sprintf(format, args...))
	if len(s.history) > simHistory {
		s.history = s.history[1:]
	}
}

func (s *sim) setFaults(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = on
}

func (s *sim) violate(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.violations = append(s.violations, fmt.Sprintf(format, args...))
}

// pass runs one reconcile pass and waits for the operations it started;
// an injected crash restarts the plugin afterwards.
func (s *sim) pass() {
	n, err := s.r.Pass(s.t.Context())
	if err != nil {
		s.t.Fatal(err)
	}
	s.r.wait()
	s.mu.Lock()
	crashed := s.crashed
	s.crashed = false
	s.mu.Unlock()
	if n > 0 {
		s.note("pass started %d operations", n)
	}
	if crashed {
		s.note("crash and restart")
		s.restart()
	}
}

// update changes a record the way the node server does for a request.
func (s *sim) update(id string, fn func(v *state.Volume)) {
	if _, err := s.store.Update(id, func(v *state.Volume) error { fn(v); return nil }); err != nil {
		s.t.Errorf("update %s: %v", id, err)
	}
}

// Kubelet requests, as the node server records them.

func (s *sim) stage(id string) {
	s.world.makeDirs(stagingOf(id)) // the kubelet creates the staging directory
	s.update(id, func(v *state.Volume) {
		if v.Stage == nil || v.Stage.Deleting {
			v.Stage = stageSpec(stagingOf(id))
			if id == blockVolume {
				v.Stage.Access = state.AccessBlock
			}
		}
	})
}

// blockVolume is staged and published as a raw block device.
var blockVolume = volID(simVolumes - 1)

func (s *sim) publish(id string, k int) {
	s.world.makeDirs(podOf(id, k)) // the kubelet creates the target's parent
	s.update(id, func(v *state.Volume) {
		if v.Stage == nil || v.Stage.Deleting {
			return // the node server answers FAILED_PRECONDITION
		}
		if p := v.Publishes[targetOf(id, k)]; p == nil || p.Deleting {
			if v.Publishes == nil {
				v.Publishes = map[string]*state.Publish{}
			}
			v.Publishes[targetOf(id, k)] = publishSpec()
			v.Publishes[targetOf(id, k)].Access = v.Stage.Access
		}
	})
}

func (s *sim) unpublish(id string, k int) {
	// The kubelet removes a pod's subPath mounts before it unpublishes.
	s.world.removeSubPaths(podOf(id, k))
	s.update(id, func(v *state.Volume) {
		if p := v.Publishes[targetOf(id, k)]; p != nil {
			p.Deleting = true
		}
	})
}

func (s *sim) unstage(id string) {
	s.update(id, func(v *state.Volume) {
		for _, p := range v.Publishes {
			if !p.Deleting {
				return // the node server answers FAILED_PRECONDITION
			}
		}
		if v.Stage != nil {
			v.Stage.Deleting = true
		}
	})
}

// request makes the kubelet request that choice selects for volume id.
func (s *sim) request(id string, choice int) string {
	k := choice / 4 % simTargets
	switch choice % 4 {
	case 0:
		s.stage(id)
		return "stage " + id
	case 1:
		s.publish(id, k)
		return "publish " + targetOf(id, k)
	case 2:
		s.unpublish(id, k)
		return "unpublish " + targetOf(id, k)
	default:
		s.unstage(id)
		return "unstage " + id
	}
}

// randomStep makes one kubelet request, one piece of outside damage, or a
// crash.
func (s *sim) randomStep() {
	id := volID(s.rng.IntN(simVolumes))
	k := s.rng.IntN(simTargets)
	w := s.world
	switch x := s.rng.IntN(100); {
	case x < 57:
		s.note("%s", s.request(id, s.rng.IntN(1<<20)))
	case x < 60:
		// The kubelet bind mounts a subPath of a published volume for a
		// container: its own mount of our filesystem inside our roots,
		// which the plugin must never touch.
		if path := fmt.Sprintf("%s/volume-subpaths/pv/c/%d", podOf(id, k), s.step); id != blockVolume && w.bindSubPath(targetOf(id, k), path) {
			s.note("kubelet: subPath bind mount at %s", path)
		}
	case x < 66:
		// Someone unmounts one of the plugin's mounts.
		if path := w.unmountOne(s.rng.IntN); path != "" {
			s.note("outside: unmount %s", path)
		}
	case x < 70:
		s.note("outside: shut down the filesystem of %s", id)
		w.damage(w.Path(id), true, false)
	case x < 74:
		s.note("outside: errors make the filesystem of %s read-only", id)
		w.damage(w.Path(id), false, true)
	case x < 78:
		s.note("outside: losetup -d the device of %s", id)
		w.detachInUse(w.Path(id))
	case x < 80:
		// The kubelet's directory is renamed under a mount: the mount
		// moves with it, to a path no record names. (Not for the block
		// volume: binds of a device node outside the records are the
		// kubelet's own block mappings, which the plugin leaves alone.)
		if id != blockVolume && w.moveMounts(targetOf(id, k), "/k/moved/"+id+"-"+strconv.Itoa(s.step)+"/mount") {
			s.note("outside: rename %s, moving its mount", podOf(id, k))
		}
	case x < 82:
		if w.goStale(targetOf(id, k)) {
			s.note("outside: the mount at %s goes stale", targetOf(id, k))
		}
	case x < 88:
		// The kubelet removes a pod directory it is done with, or that
		// it forgot to unpublish.
		if w.removePodDir(podOf(id, k), targetOf(id, k)) {
			s.note("kubelet: remove %s", podOf(id, k))
		}
	case x < 89:
		// The device loses its filesystem behind the plugin's back, wiped
		// or overwritten by a partition table; the plugin must report
		// DATA_LOSS and never format it again.
		partition := s.rng.IntN(2) == 0
		if partition {
			s.note("outside: write a partition table over the device of %s", id)
		} else {
			s.note("outside: wipe the filesystem of %s", id)
		}
		if w.wipe(w.Path(id), partition) {
			s.wiped[w.Path(id)]++
		}
	case x < 92:
		s.note("crash and restart")
		s.count("crash between operations")
		s.restart()
	case x < 95:
		// The controller grows the image, the kubelet asks the node.
		size := w.sizeOf(w.Path(id)) + 16<<20
		w.growImage(w.Path(id), size)
		s.note("expand %s to %d", id, size)
		s.update(id, func(v *state.Volume) {
			if v.Stage != nil && !v.Stage.Deleting {
				v.Expand = &state.Expand{Bytes: size}
			}
		})
	default:
		s.note("idle")
	}
}

// decide returns a number in [0, 100) fixed by the seed, the step and the
// call, so that faults injected from operation goroutines do not depend on
// the order those goroutines run in.
func (s *sim) decide(salt, name string) int {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d/%s/%s", s.seed, s.step, salt, name)
	return int(h.Sum64() % 100)
}

// idOfImage returns the volume of a backing file, "" for none.
func (s *sim) idOfImage(image string) string {
	id, _ := s.world.IDOf(image)
	return id
}

// before checks, as each device call begins, that the reconciler asks for
// nothing the invariants forbid, and may inject a failure or a request
// that lands while the operation runs.
func (s *sim) before(name, image string) error {
	id := s.idOfImage(image)
	s.mu.Lock()
	faults := s.faults
	if id != "" {
		s.inflight[id]++
		if s.inflight[id] > 1 {
			s.violations = append(s.violations, fmt.Sprintf("invariant 5: two operations at once on %s (%s)", id, name))
		}
	}
	s.mu.Unlock()
	s.checkCall(name, id)
	if !faults {
		return nil
	}
	switch d := s.decide("before", name); {
	case d < 6:
		s.done(id)
		s.count("failure")
		return fmt.Errorf("injected: %s failed", name)
	case d < 12 && id != "":
		// A request for the same volume lands mid-operation.
		s.count("request mid-operation")
		s.request(id, s.decide("request", name)*7)
	case d < 20 && !s.nested:
		// The loop runs a pass while this operation is in flight, as a
		// kick or the resync ticker makes it do: it must not start a
		// second operation on this volume (invariant 5). Operations run
		// inline, so this pass runs on the operation's goroutine.
		s.count("pass mid-operation")
		s.nested = true
		_, err := s.r.Pass(s.t.Context())
		s.nested = false
		if err != nil {
			s.violate("pass mid-operation: %v", err)
		}
	}
	return nil
}

// after may turn a call that had its effect into a crash of the plugin.
func (s *sim) after(name, image string, err error) error {
	s.done(s.idOfImage(image))
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && s.faults && s.decide("after", name) < 4 {
		s.crashed = true
		s.counts["crash after effect"]++
		return errCrashed
	}
	return err
}

func (s *sim) count(what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts[what]++
}

func (s *sim) done(id string) {
	if id == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight[id]--
}

// checkCall checks one device call against the invariants, at the moment
// it is made.
func (s *sim) checkCall(name, id string) {
	op, path, _ := strings.Cut(name, " ")
	w := s.world
	var rec *state.Volume
	if id != "" {
		rec, _ = s.store.Get(id)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	dev := w.loops[w.Path(id)].Dev
	others := func(except string) []string {
		var out []string
		for _, m := range w.mountsOfLocked(dev) {
			if m.Path != except {
				out = append(out, m.Path)
			}
		}
		return out
	}
	switch op {
	case "attach", "mount":
		if rec == nil || rec.Stage == nil {
			s.violations = append(s.violations, fmt.Sprintf("invariant 3: %s of %s without a recorded stage", name, id))
		}
		if op == "mount" && rec != nil && rec.Formatted != "" && w.fs[w.Path(id)] == "" {
			s.violations = append(s.violations, fmt.Sprintf("invariant 4: %s would format a device whose record says it was formatted %s", name, rec.Formatted))
		}
	case "bind":
		if rec == nil || rec.Publishes[path] == nil {
			s.violations = append(s.violations, fmt.Sprintf("invariant 3: %s without a recorded publish", name))
			return
		}
		src := w.imageAt(rec.Stage.Path)
		var top host.Mount
		for _, m := range w.mounts {
			if m.Path == rec.Stage.Path {
				top = m
			}
		}
		if src != w.Path(id) || top.Shutdown || top.SuperReadOnly {
			s.violations = append(s.violations, fmt.Sprintf("invariant 1: %s on top of staging mount %+v", name, top))
		}
	case "unmount":
		for i := len(w.mounts) - 1; i >= 0; i-- {
			if m := w.mounts[i]; m.Path == path {
				if w.foreign[w.unique[m.ID]] {
					s.violations = append(s.violations, fmt.Sprintf("%s: the kubelet's mount, not the plugin's", name))
				}
				break
			}
		}
		if id == "" || rec == nil {
			return
		}
		if rec.Stage != nil && path == rec.Stage.Path {
			if o := others(path); len(o) > 0 {
				s.violations = append(s.violations, fmt.Sprintf("invariant 2: %s while the volume is still mounted at %v", name, o))
			}
		}
		if !strings.HasPrefix(path, "/k/") {
			s.violations = append(s.violations, fmt.Sprintf("%s: outside the roots", name))
		}
	case "resize":
		if rec == nil || rec.Stage == nil || path != rec.Stage.Path || w.imageAt(path) != w.Path(id) {
			s.violations = append(s.violations, fmt.Sprintf("%s: not the volume's staging mount", name))
		}
	case "binddev":
		if rec == nil || rec.Publishes[path] == nil || rec.Stage == nil || rec.Stage.Access != state.AccessBlock {
			s.violations = append(s.violations, fmt.Sprintf("invariant 3: %s without a recorded block publish", name))
		}
	case "detach":
		if o := others(""); len(o) > 0 {
			s.violations = append(s.violations, fmt.Sprintf("invariant 2: detach of %s while mounted at %v", id, o))
		}
	}
}

// check verifies the invariants that hold between steps.
func (s *sim) check() {
	s.t.Helper()
	s.mu.Lock()
	v := s.violations
	s.violations = nil
	s.mu.Unlock()
	for _, msg := range v {
		s.t.Errorf("step %d: %s", s.step, msg)
	}
	w := s.world
	w.mu.Lock()
	defer w.mu.Unlock()
	for image, n := range w.mkfs {
		// A device is formatted once; again only after its filesystem
		// was wiped before the first format was recorded (a crash between
		// mkfs and the record, then the wipe).
		if n > 1+s.wiped[image] {
			s.t.Errorf("step %d: invariant 4: %s formatted %d times, wiped %d times", s.step, image, n, s.wiped[image])
		}
	}
	// Invariant 3 (write-ahead): every mount and device of a volume is
	// recorded, so no crash can leak one.
	for image, l := range w.loops {
		id := s.idOfImage(image)
		rec, _ := s.store.Get(id)
		if rec == nil || rec.Stage == nil {
			s.t.Errorf("step %d: invariant 3: %s attached with no stage recorded", s.step, image)
		}
		for _, m := range w.mountsOfLocked(l.Dev) {
			if strings.HasPrefix(m.Path, "/k/moved/") || w.foreign[w.unique[m.ID]] {
				continue // moved there from outside, or made by the kubelet
			}
			if rec == nil || (rec.Stage == nil || rec.Stage.Path != m.Path) && rec.Publishes[m.Path] == nil {
				s.t.Errorf("step %d: invariant 3: %s mounted at %s, which its record does not name", s.step, id, m.Path)
			}
		}
	}
}

// converge lets the loop run with time passing until it has nothing left
// to do, not even after a backoff, or only retries of volumes that lost
// their data.
func (s *sim) converge() {
	s.t.Helper()
	stuck := 0
	for range 500 {
		n, err := s.r.Pass(s.t.Context())
		if err != nil {
			s.t.Fatal(err)
		}
		s.r.wait()
		s.check()
		if s.onlyDataLossRetries() {
			if stuck++; stuck > 10 {
				return
			}
		} else {
			stuck = 0
		}
		if n > 0 {
			continue
		}
		if s.r.wake.IsZero() {
			return
		}
		s.clock.Step(s.r.wake.Sub(s.clock.Now()) + time.Millisecond)
	}
	s.t.Fatal("the loop did not converge in 500 passes")
}

// onlyDataLossRetries reports whether every failed operation that is
// retried is the re-stage of a volume that lost its data, which is retried
// for ever and never converges on its own, as the intents' results say
// (the last pass's). A failure stays reported until the same action (of
// the same generation) succeeds: terminal failures are not retried (their
// intent was withdrawn, or they are final), and a failure whose retry time
// has passed without a retry, after a pass, is of an action no longer
// planned.
func (s *sim) onlyDataLossRetries() bool {
	retried := 0
	for _, v := range s.store.List() {
		for _, key := range intentKeys(v) {
			r, _ := s.store.Result(v.ID, key)
			switch {
			case r.Err == nil:
			case r.Err.Kind == classified.KindDataLoss:
				retried++
			case !r.Err.Terminal && s.clock.Now().Before(r.NextRetry):
				return false
			}
		}
	}
	return retried > 0
}

// intentKeys are the keys of v's intents the simulation makes.
func intentKeys(v *state.Volume) []state.IntentKey {
	var keys []state.IntentKey
	if v.Stage != nil {
		keys = append(keys, state.StageKey)
	}
	for t := range v.Publishes {
		keys = append(keys, state.PublishKey(t))
	}
	if v.Expand != nil {
		keys = append(keys, state.ExpandKey)
	}
	return keys
}

// checkConverged checks that every intent is fulfilled and nothing else is
// on the machine. A filesystem that went read-only after errors is only
// remounted once no pod uses it: the kubelet's pods restart first.
func (s *sim) checkConverged() {
	s.t.Helper()
	for _, v := range s.store.List() {
		if c := s.store.Condition(v.ID); c.Reason == "FilesystemReadOnly" {
			s.note("kubelet: restart the pods of %s", v.ID)
			live := []int{}
			for k := range simTargets {
				if p := v.Publishes[targetOf(v.ID, k)]; p != nil && !p.Deleting {
					live = append(live, k)
					s.unpublish(v.ID, k)
				}
			}
			s.converge()
			for _, k := range live {
				s.publish(v.ID, k)
			}
			s.converge()
		}
	}
	w := s.world
	want := map[string]bool{}
	for _, v := range s.store.List() {
		if c := s.store.Condition(v.ID); c.Health == state.DataLost {
			// Reported, kept, never formatted: an operator's to resolve.
			s.note("%s lost its data: %s", v.ID, c.Message)
			if v.Stage != nil {
				want[v.Stage.Path] = true
			}
			for t := range v.Publishes {
				want[t] = true
			}
			continue
		}
		if st := v.Stage; st != nil {
			if st.Deleting {
				s.t.Errorf("%s: stage still being deleted after convergence", v.ID)
			}
			if st.Access == state.AccessMount {
				want[st.Path] = true
			}
			if r, _ := s.store.Result(v.ID, state.StageKey); !r.Ready {
				s.t.Errorf("%s: stage not ready after convergence: %+v", v.ID, r)
			}
		}
		if e := v.Expand; e != nil {
			if r, _ := s.store.Result(v.ID, state.ExpandKey); !r.Ready {
				s.t.Errorf("%s: expansion to %d not converged: %+v (fs grown to %d)", v.ID, e.Bytes, r, v.FsSize)
			}
		}
		for t, p := range v.Publishes {
			want[t] = true
			if r, _ := s.store.Result(v.ID, state.PublishKey(t)); p.Deleting || !r.Ready {
				s.t.Errorf("%s: publish %s not converged: deleting=%v result %+v", v.ID, t, p.Deleting, r)
			}
		}
		if c := s.store.Condition(v.ID); c.Abnormal {
			s.t.Errorf("%s: abnormal after convergence: %+v", v.ID, c)
		}
		w.mu.Lock()
		l, attached := w.loops[w.Path(v.ID)]
		if v.Stage != nil && (!attached || l.AutoClear) {
			s.t.Errorf("%s: staged but device %+v (attached %v)", v.ID, l, attached)
		}
		if v.Stage == nil && attached {
			s.t.Errorf("%s: not staged but device attached", v.ID)
		}
		w.mu.Unlock()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var paths []string
	for _, m := range w.mounts {
		paths = append(paths, m.Path)
		if !want[m.Path] {
			s.t.Errorf("mount at %s that no intent asks for", m.Path)
		}
		// A volume that lost its data keeps what its pods still hold.
		if lost := s.store.Condition(s.volOfPath(m.Path)).Health == state.DataLost; (m.Shutdown || m.SuperReadOnly) && !lost {
			s.t.Errorf("mount at %s still damaged: %+v", m.Path, m)
		}
	}
	for p := range want {
		if lost := s.store.Condition(s.volOfPath(p)).Health == state.DataLost; !lost && !slices.Contains(paths, p) {
			s.t.Errorf("intent for %s but nothing mounted there", p)
		}
	}
}

// teardownAll withdraws every intent, publishes first.
func (s *sim) teardownAll() {
	for i := range simVolumes {
		for k := range simTargets {
			s.unpublish(volID(i), k)
		}
		s.unstage(volID(i))
	}
}

func (s *sim) checkEmpty() {
	s.t.Helper()
	for _, v := range s.store.List() {
		if v.Stage != nil || len(v.Publishes) > 0 {
			s.t.Errorf("%s: intents left after full teardown: %+v", v.ID, v)
		}
	}
	w := s.world
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.mounts) > 0 || len(w.loops) > 0 {
		s.t.Errorf("left after full teardown: mounts %+v, loops %+v", w.mounts, w.loops)
	}
	for d := range w.dirs {
		if strings.HasSuffix(d, "/mount") {
			s.t.Errorf("target %s left after full teardown", d)
		}
	}
}
