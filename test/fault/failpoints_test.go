package fault

// The failpoint walk: the crash trials' harness (vol, replay, check), with
// the kill placed at each named failpoint in turn instead of at a random
// moment. See docs/testing.md.

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/test/testenv"
	"github.com/converge-csi/converge/test/testenv/poll"
)

// trigger is how a failpoint is reached from the state a trial sets up.
type trigger int

const (
	// toLevel: the kubelet walks the volume to the trial's want level.
	toLevel trigger = iota
	// expand: the resizer and the kubelet grow the published volume.
	expand
	// expandStaged: they grow the volume staged and not published, whose
	// ext4 then grows unmounted.
	expandStaged
	// snapshot: the snapshotter takes a snapshot of the published volume.
	snapshot
	// groupSnapshot: the snapshotter takes a group snapshot of the
	// published volume and a second volume, created only (mate): a crash
	// after one member's copy leaves the other to make.
	groupSnapshot
	// restore: the provisioner makes a second volume from a snapshot of
	// the published one.
	restore
	// collect: an operator's csi-node gc deletes the unreferenced volume.
	collect
	// shutdown: the plugin is sent SIGTERM with the volume published, and
	// checkpoints its log on the way out.
	shutdown
)

// walkStep says, for one failpoint, where its trial starts, what reaches
// the failpoint, and what the kubelet then wants.
type walkStep struct {
	from, want level
	how        trigger
	// block makes the trial's volume a raw block volume.
	block bool
	// first is a failpoint to crash at first: what is left then leads
	// the restarted plugin (armed from its start) to this one.
	first string
}

// walkSteps has an entry for every failpoint of the source: the walk fails
// on one without an entry, and on an entry without a failpoint.
var walkSteps = map[string]walkStep{
	// The store: the log's record of a stage request, and its checkpoint.
	"stateLogBeforeWrite":         {from: created, want: staged},
	"stateLogAfterWrite":          {from: created, want: staged},
	"stateLogAfterSync":           {from: created, want: staged},
	"stateCheckpointBeforeCommit": {from: published, want: published, how: shutdown},
	"stateCheckpointAfterCommit":  {from: published, want: published, how: shutdown},
	// CreateVolume and DeleteVolume.
	"controllerCreateAfterRecord": {from: absent, want: created},
	"devicesImageBeforeRename":    {from: absent, want: created},
	"devicesImageAfterRename":     {from: absent, want: created},
	"controllerCreateAfterImage":  {from: absent, want: created},
	"controllerDeleteAfterMark":   {from: created, want: absent},
	"poolDeleteAfterImage":        {from: created, want: absent},
	"devicesFileAfterRemove":      {from: created, want: absent},
	// The reconciler: every action, and the steps of stage (attach,
	// mkfs, mount), publish (bind), unpublish and unstage (unmount,
	// detach).
	"reconcilerBeforeAction":           {from: created, want: staged},
	"reconcilerAfterAction":            {from: created, want: staged},
	"reconcilerStageAfterAttach":       {from: created, want: staged},
	"devicesBeforeMountFilesystem":     {from: created, want: staged},
	"reconcilerStageAfterMount":        {from: created, want: staged},
	"reconcilerPublishAfterMkdir":      {from: staged, want: published},
	"reconcilerPublishAfterBind":       {from: staged, want: published},
	"reconcilerPublishAfterBindDevice": {from: staged, want: published, block: true},
	"reconcilerUnpublishAfterUnmount":  {from: published, want: staged},
	"reconcilerUnpublishAfterRemove":   {from: published, want: staged},
	"reconcilerUnstageAfterUnmount":    {from: staged, want: created},
	"reconcilerUnstageAfterDetach":     {from: staged, want: created},
	// Expansion: image, device, filesystem (online, or unmounted).
	"devicesImageAfterGrow":           {from: published, want: published, how: expand},
	"reconcilerExpandAfterGrowDevice": {from: published, want: published, how: expand},
	"reconcilerExpandAfterGrowFs":     {from: published, want: published, how: expand},
	"reconcilerExpandAfterUnmount":    {from: staged, want: staged, how: expandStaged},
	"reconcilerStageAfterGrow":        {from: staged, want: staged, how: expandStaged},
	// Snapshots: recorded frozen, frozen, copied, thawed, taken; and the
	// thaw of a filesystem that a crash left frozen.
	"reconcilerSnapshotBeforeFreeze": {from: published, want: published, how: snapshot},
	"reconcilerSnapshotAfterFreeze":  {from: published, want: published, how: snapshot},
	"devicesCopyBeforeRename":        {from: published, want: published, how: snapshot},
	"devicesCopyAfterRename":         {from: published, want: published, how: snapshot},
	"reconcilerSnapshotAfterCopy":    {from: published, want: published, how: snapshot},
	"reconcilerSnapshotAfterThaw":    {from: published, want: published, how: snapshot},
	"reconcilerSnapshotAfterTake":    {from: published, want: published, how: snapshot},
	"reconcilerThawAfterThaw":        {from: published, want: published, how: snapshot, first: "reconcilerSnapshotAfterFreeze"},
	// Group snapshots: every member frozen, each copied, all thawed.
	"reconcilerGroupAfterFreeze": {from: published, want: published, how: groupSnapshot},
	"reconcilerGroupAfterCopy":   {from: published, want: published, how: groupSnapshot},
	"reconcilerGroupAfterTake":   {from: published, want: published, how: groupSnapshot},
	// Restore and csi-node gc.
	"poolRestoreAfterCopy":     {from: published, want: published, how: restore},
	"controllerGCBeforeDelete": {from: created, want: created, how: collect},
}

// TestFailpointTable fails when a failpoint of the source has no step in
// the walk, or a step names no failpoint: a new step of an operation must
// come with its trial.
func TestFailpointTable(t *testing.T) {
	var names []string
	for _, fp := range testenv.Failpoints(t) {
		names = append(names, fp.Name)
		if _, ok := walkSteps[fp.Name]; !ok {
			t.Errorf("failpoint %s (%s) is not walked: give it an entry in walkSteps", fp.Name, fp.File)
		}
	}
	for name := range walkSteps {
		if !slices.Contains(names, name) {
			t.Errorf("walkSteps names %s, which no source file holds", name)
		}
	}
	if len(names) == 0 {
		t.Error("the source holds no failpoint")
	}
	// The operators' table in docs/testing.md lists the same ones.
	doc, err := os.ReadFile(filepath.Join(testenv.Root(), "docs", "testing.md"))
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(\\w+)` \\|").FindAllSubmatch(doc, -1) {
		documented = append(documented, string(m[1]))
	}
	for _, name := range names {
		if !slices.Contains(documented, name) {
			t.Errorf("failpoint %s has no row in the table of docs/testing.md#failpoints", name)
		}
	}
	for _, name := range documented {
		if !slices.Contains(names, name) {
			t.Errorf("docs/testing.md#failpoints lists %s, which no source file holds", name)
		}
	}
}

// TestShippedBinaryHasNoFailpoints checks that the binary make builds holds
// no gofail runtime, and that the walk's binary does (so that the check
// can tell).
func TestShippedBinaryHasNoFailpoints(t *testing.T) {
	testenv.RequireRoot(t)
	fpBin, _ := testenv.FailpointBinary(t)
	for _, c := range []struct {
		name, bin string
		want      bool
	}{{"csi-node as built", testenv.Binary(t), false}, {"csi-node with failpoints", fpBin, true}} {
		out, err := exec.Command("go", "version", "-m", c.bin).CombinedOutput()
		if err != nil {
			t.Fatalf("go version -m %s: %v\n%s", c.bin, err, out)
		}
		if got := strings.Contains(string(out), "go.etcd.io/gofail"); got != c.want {
			t.Errorf("%s links go.etcd.io/gofail: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestFailpointBinaryIsStatic checks that the walk's binary needs no
// dynamic loader and no shared library: the e2e soak runs the same build
// (package failpoints caches one) in the csi-node image's node pods, whose
// C library is not this machine's.
func TestFailpointBinaryIsStatic(t *testing.T) {
	bin, _ := testenv.FailpointBinary(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has a dynamic loader (PT_INTERP): it was built with cgo", bin)
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	if len(libs) > 0 {
		t.Errorf("%s needs shared libraries %v, want none", bin, libs)
	}
}

// walker runs the trials on one plugin built with failpoints.
type walker struct {
	e *env
	// fail is the address of gofail's HTTP endpoint.
	fail string
}

// freePort returns a TCP address on the loopback that nothing listens on.
func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// failpoint calls gofail's endpoint: method on /name, with body.
func (w *walker) failpoint(method, name, body string) (string, error) {
	req, err := http.NewRequest(method, "http://"+w.fail+"/"+name, strings.NewReader(body))
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("%s /%s: %s %s", method, name, resp.Status, b)
	}
	return string(b), nil
}

// TestFailpointWalk crashes the real csi-node at every failpoint of the
// source in turn (CONVERGE_FAILPOINTS=<regexp> walks those it matches): it arms the failpoint to hold whatever reaches it, does
// what reaches it, kills the plugin there with SIGKILL, restarts it
// without failpoints, lets the kubelet (or resizer, snapshotter,
// provisioner, operator) retry, and checks that nothing is lost, nothing
// is half mounted, nothing is formatted twice, the operation finished, and
// a full teardown leaves nothing behind.
func TestFailpointWalk(t *testing.T) {
	bin, fps := testenv.FailpointBinary(t)
	p := testenv.New(t)
	p.Binary = bin
	w := &walker{e: &env{t: t, p: p}, fail: freePort(t)}
	p.Env = []string{"GOFAIL_HTTP=" + w.fail}
	// The machine's other tests share its disk: a guard of the default
	// (a share of the filesystem) could refuse the trials' volumes.
	p.Args = append(p.Args, "--pool-guard=1Gi")
	// A trial that fails may leave a filesystem frozen, which would hold
	// its mount and loop device past testenv's clean-up: thaw first.
	t.Cleanup(func() {
		for _, l := range testenv.Leftovers(p.Dir, p.DataDir) {
			if m, ok := strings.CutPrefix(l, "mount "); ok {
				exec.Command("fsfreeze", "-u", m).Run()
			}
		}
	})
	only, err := regexp.Compile(os.Getenv("CONVERGE_FAILPOINTS"))
	if err != nil {
		t.Fatalf("CONVERGE_FAILPOINTS: %v", err)
	}
	p.Start()
	begin := time.Now()
	walked := 0
	for i, fp := range fps {
		if !only.MatchString(fp.Name) {
			continue
		}
		step, ok := walkSteps[fp.Name]
		if !ok {
			t.Errorf("failpoint %s is not walked (TestFailpointTable says more)", fp.Name)
			continue
		}
		start := time.Now()
		w.trial(i, fp.Name, step)
		if t.Failed() {
			return
		}
		walked++
		t.Logf("%-34s %s (%v)", fp.Name, fp.File, time.Since(start).Round(time.Millisecond))
	}
	if walked == 0 {
		t.Fatalf("CONVERGE_FAILPOINTS=%s matches no failpoint", only)
	}
	t.Logf("walked %d failpoints in %v", walked, time.Since(begin).Round(time.Millisecond))
}

// trial walks failpoint name.
func (w *walker) trial(i int, name string, step walkStep) {
	t, p := w.e.t, w.e.p
	t.Helper()
	v := w.volume(fmt.Sprintf("fp-%d", i))
	v.block = step.block
	if step.how == expand {
		// xfs grows mounted without CAP_SYS_RESOURCE, which the plugin
		// does not hold (ext4 grows at the next stage instead).
		v.fsType = "xfs"
	}
	v.want = step.from
	w.e.replay(v)
	// Data written and synced before the crash, in the filesystem of a
	// staged volume (a publish is a view of the same filesystem).
	before := ""
	if step.from >= staged && !v.block {
		before = "written before the crash at " + name
		if err := writeSynced(filepath.Join(v.staging, "before"), before); err != nil {
			t.Fatal(err)
		}
		if step.from == published {
			v.files["before"] = before
		}
	}
	armed := name
	if step.first != "" {
		armed = step.first
	}
	if _, err := w.failpoint("PUT", armed, hold); err != nil {
		t.Fatalf("arming %s: %v", armed, err)
	}

	// Reach the failpoint in the background: what reaches it hangs there.
	v.want = step.want
	reached := make(chan struct{})
	go func() {
		defer close(reached)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		w.reach(ctx, v, step)
	}()
	w.waitReached(armed, step)
	// What the crash leaves: the filesystem its image holds, if any.
	uuid := w.fsUUID(v)
	p.Kill()
	<-reached
	if step.first != "" {
		// The restarted plugin, armed from its start, goes on from what
		// the first crash left until it reaches this failpoint.
		base := p.Env
		p.Env = append(slices.Clip(base), "GOFAIL_FAILPOINTS="+name+"="+hold)
		p.Launch()
		w.waitReached(name, step)
		p.Kill()
		p.Env = base
	}
	p.Start()

	// The kubelet retries until the volume is where it wants it; the
	// operation the failpoint cut short is finished.
	w.e.replay(v)
	w.finish(v, step, name)
	w.e.check(i, v)
	for _, path := range []string{v.staging, v.target} {
		if n := mountsAt(path); n > 1 {
			t.Fatalf("%s: %s holds %d mounts, want at most one", name, path, n)
		}
	}
	image := filepath.Join(p.DataDir, v.id+".img")
	loops := 0
	for _, l := range testenv.Leftovers(p.Dir, p.DataDir) {
		if strings.HasPrefix(l, "loop ") && strings.HasSuffix(l, " -> "+image) {
			loops++
		}
	}
	if want := map[bool]int{true: 1, false: 0}[v.want >= staged]; loops != want {
		t.Fatalf("%s: %d loop devices on the image of %s at level %d, want %d", name, loops, v.id, v.want, want)
	}
	if uuid != "" && v.want >= staged {
		if got := w.fsUUID(v); got != uuid {
			t.Fatalf("%s: the filesystem of %s was %s before the crash and is %q after: formatted twice", name, v.id, uuid, got)
		}
	}
	if before != "" && v.want >= created {
		if v.want == created {
			// Unstaged: the data is in the image; a new stage shows it.
			v.want = staged
			w.e.replay(v)
		}
		if b, err := os.ReadFile(filepath.Join(v.staging, "before")); err != nil || string(b) != before {
			t.Fatalf("%s: %s read %q, %v after the crash; want %q (data lost)", name, v.id, b, err, before)
		}
	}

	// Full teardown: nothing of the trial's may remain.
	w.clean(v, name)
}

// hold is what an armed failpoint does: hold whatever reaches it (for ten
// minutes, far longer than a trial) until the test kills the plugin.
const hold = "sleep(600000)"

// waitReached waits until failpoint name is reached.
func (w *walker) waitReached(name string, step walkStep) {
	t := w.e.t
	t.Helper()
	what := fmt.Sprintf("failpoint %s reached from level %d (the plugin's log holds what happened)", name, step.from)
	poll.Until(t, 20*time.Second, 10*time.Millisecond, what, func() error {
		if n, err := w.failpoint("GET", name+"/count", ""); err != nil {
			return err
		} else if n == "0" {
			return errors.New("its count is 0")
		}
		return nil
	})
}

// volume returns a volume, absent, with its kubelet directories.
func (w *walker) volume(name string) *vol {
	p := w.e.p
	v := &vol{name: name, id: vid(name), staging: filepath.Join(p.Root, "staging", name), target: filepath.Join(p.Root, "pods", name, "mount"), files: map[string]string{}}
	for _, d := range []string{v.staging, filepath.Dir(v.target)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			w.e.t.Fatal(err)
		}
	}
	return v
}

// grown is the size an expansion trial asks for: twice the volume's.
func grown(v *vol) int64 { return 2 * v.size() }

// reach does what reaches the failpoint of step; its errors are the
// crash's (the kubelet retries).
func (w *walker) reach(ctx context.Context, v *vol, step walkStep) {
	p := w.e.p
	switch step.how {
	case toLevel:
		w.e.drive(ctx, v, step.from)
	case expand:
		w.grow(ctx, v, v.target)
	case expandStaged:
		w.grow(ctx, v, v.staging)
	case snapshot:
		p.Controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-" + v.name, SourceVolumeId: v.id})
	case restore:
		if _, err := p.Controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-" + v.name, SourceVolumeId: v.id}); err != nil {
			return
		}
		w.restore(ctx, v)
	case groupSnapshot:
		w.takeGroup(ctx, v)
	case collect:
		w.gc(ctx)
	case shutdown:
		p.Terminate()
	}
}

// grow expands v as the resizer and the kubelet do, through path.
func (w *walker) grow(ctx context.Context, v *vol, path string) error {
	p := w.e.p
	rng := &csi.CapacityRange{RequiredBytes: grown(v)}
	if _, err := p.Controller().ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v.id, CapacityRange: rng}); err != nil {
		return err
	}
	_, err := p.Node().NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: v.id, VolumePath: path, CapacityRange: rng})
	return err
}

// mate is the second member of v's group snapshot trial.
func mate(v *vol) string { return "mate-" + v.name }

// takeGroup takes the group snapshot of v and its mate that a
// groupSnapshot trial asks for, and checks that it is whole and ready.
func (w *walker) takeGroup(ctx context.Context, v *vol) error {
	p := w.e.p
	if _, err := p.Controller().CreateVolume(ctx, &csi.CreateVolumeRequest{Name: mate(v), CapacityRange: &csi.CapacityRange{RequiredBytes: volumeSize},
		VolumeCapabilities: []*csi.VolumeCapability{rwo}}); err != nil {
		return err
	}
	resp, err := p.Groups().CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "group-" + v.name, SourceVolumeIds: []string{v.id, vid(mate(v))}})
	if err != nil {
		return err
	}
	g := resp.GetGroupSnapshot()
	if !g.GetReadyToUse() || len(g.GetSnapshots()) != 2 {
		return fmt.Errorf("group snapshot not whole and ready: %v", g)
	}
	for _, s := range g.GetSnapshots() {
		if s.GetGroupSnapshotId() != g.GetGroupSnapshotId() || s.GetSizeBytes() != volumeSize {
			return fmt.Errorf("group snapshot member not whole: %v", s)
		}
	}
	return nil
}

// restored is the volume a restore trial makes from v's snapshot.
func restored(v *vol) string { return "restored-" + v.name }

func (w *walker) restore(ctx context.Context, v *vol) error {
	p := w.e.p
	snap := vid("snap-" + v.name)
	_, err := p.Controller().CreateVolume(ctx, &csi.CreateVolumeRequest{Name: restored(v), CapacityRange: &csi.CapacityRange{RequiredBytes: volumeSize},
		VolumeCapabilities:  []*csi.VolumeCapability{rwo},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap}}}})
	return err
}

// gc asks csi-node gc's question with no volume referenced.
func (w *walker) gc(ctx context.Context) error {
	p := w.e.p
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", filepath.Join(p.StateDir, "status.sock"))
	}}}
	req, err := http.NewRequestWithContext(ctx, "POST", "http://converge/gc", strings.NewReader(`{"referenced": [], "volumes": true, "nodeUnlisted": true, "minAge": 0, "delete": true}`))
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST /gc: %s %s", resp.Status, b)
	}
	return nil
}

// retry calls f until it succeeds, as the kubelet and the sidecars do.
func (w *walker) retry(what string, f func(ctx context.Context) error) {
	t := w.e.t
	t.Helper()
	poll.Until(t, 90*time.Second, 100*time.Millisecond, what+" after the restart", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return f(ctx)
	})
}

// finish retries the operation the crash cut short, besides the level
// walk replay did, and checks that it is whole.
func (w *walker) finish(v *vol, step walkStep, name string) {
	t, p := w.e.t, w.e.p
	t.Helper()
	switch step.how {
	case expand, expandStaged:
		path := v.target
		if step.how == expandStaged {
			path = v.staging
		}
		w.retry("expanding "+v.id, func(ctx context.Context) error { return w.grow(ctx, v, path) })
		var st syscall.Statfs_t
		if err := syscall.Statfs(path, &st); err != nil {
			t.Fatal(err)
		}
		if got := int64(st.Blocks) * st.Bsize; got <= v.size() {
			t.Fatalf("%s: the filesystem of %s holds %d bytes after the expansion to %d", name, v.id, got, grown(v))
		}
	case snapshot, restore:
		w.retry("taking snapshot of "+v.id, func(ctx context.Context) error {
			resp, err := p.Controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-" + v.name, SourceVolumeId: v.id})
			if err == nil && !resp.GetSnapshot().GetReadyToUse() {
				err = fmt.Errorf("snapshot not ready")
			}
			return err
		})
		writeWithin(t, v.target, 10*time.Second)
		noTemps(t, name, filepath.Join(p.DataDir, "snapshots"))
		if step.how == restore {
			r := w.volume(restored(v))
			w.retry("restoring "+r.id, func(ctx context.Context) error { return w.restore(ctx, v) })
			// The restore holds what the snapshot did.
			r.want = published
			w.e.replay(r)
			r.files["before"] = v.files["before"]
			w.e.check(0, r)
			r.want = absent
			w.e.replay(r)
		}
	case groupSnapshot:
		w.retry("taking a group snapshot of "+v.id, func(ctx context.Context) error { return w.takeGroup(ctx, v) })
		writeWithin(t, v.target, 10*time.Second)
		noTemps(t, name, filepath.Join(p.DataDir, "snapshots"))
	case collect:
		w.retry("csi-node gc", w.gc)
		if _, err := os.Stat(filepath.Join(p.DataDir, v.id+".img")); !os.IsNotExist(err) {
			t.Fatalf("%s: the orphan %s is still there after gc ran again: %v", name, v.id, err)
		}
		v.want = absent
	}
}

// fsUUID returns the UUID of the filesystem in v's image, "" when none.
func (w *walker) fsUUID(v *vol) string {
	out, _ := exec.Command("blkid", "-p", "-o", "value", "-s", "UUID", filepath.Join(w.e.p.DataDir, v.id+".img")).Output()
	return strings.TrimSpace(string(out))
}

// clean tears v down as the kubelet and the provisioner do, with its
// snapshot, and checks that nothing of it is left.
func (w *walker) clean(v *vol, name string) {
	t, p := w.e.t, w.e.p
	t.Helper()
	v.want = absent
	w.e.replay(v)
	w.retry("deleting the snapshot", func(ctx context.Context) error {
		_, err := p.Controller().DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: vid("snap-" + v.name)})
		return err
	})
	w.retry("deleting the group snapshot", func(ctx context.Context) error {
		_, err := p.Groups().DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: vid("group-" + v.name)})
		return err
	})
	w.retry("deleting the group's mate", func(ctx context.Context) error {
		_, err := p.Controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vid(mate(v))})
		return err
	})
	if left := testenv.Leftovers(p.Dir, p.DataDir); len(left) > 0 {
		t.Fatalf("%s: after full teardown: %v", name, left)
	}
	entries, _ := os.ReadDir(p.DataDir)
	for _, e := range entries {
		if e.Name() == "snapshots" {
			if s, _ := os.ReadDir(filepath.Join(p.DataDir, e.Name())); len(s) == 0 {
				continue
			}
		}
		t.Fatalf("%s: after full teardown the data directory holds %s", name, e.Name())
	}
}

// mountsAt counts the mounts at path.
func mountsAt(path string) int {
	ms, err := devices.ReadMounts("/proc/self/mountinfo")
	if err != nil {
		return 0
	}
	n := 0
	for _, m := range ms {
		if m.Path == path {
			n++
		}
	}
	return n
}
