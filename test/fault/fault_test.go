// Package fault kills the real csi-node binary with SIGKILL at random
// moments of a concurrent workload on real loop devices, restarts it,
// replays the outstanding requests the way the kubelet would, and checks
// that the data survived, that every desired mount exists, and that a full
// teardown leaves nothing behind.
//
// The base seed is printed; rerun one with CONVERGE_FAULT_SEED=<seed>, and
// run longer with CONVERGE_FAULT_TRIALS=<n>.
package fault

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	report "github.com/converge-csi/converge/pkg/volstatus"
	"github.com/converge-csi/converge/test/testenv"
	"github.com/converge-csi/converge/test/testenv/poll"
)

const (
	volumes    = 3
	volumeSize = 32 << 20
)

var rwo = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// level is how far a volume is set up; each step moves it one level.
type level int

const (
	absent level = iota
	created
	staged
	published
)

// vol is the kubelet's view of one volume: what it last asked for, and the
// files it wrote and saw synced while the volume was published.
type vol struct {
	// name is the volume's name in CreateVolume, id its ID (vid).
	name, id, staging, target string
	want                      level
	files                     map[string]string
	// fsType is the filesystem its capability asks for; "" for the
	// plugin's default (ext4).
	fsType string
	// pool is the storage pool it is made in; "" for the default.
	pool string
	// block asks for a raw block volume: attached at the stage, its
	// device bound at the target file.
	block bool
}

// params are the parameters of v's CreateVolume.
func (v *vol) params() map[string]string {
	if v.pool == "" {
		return nil
	}
	return map[string]string{"converge.csi.dev/pool": v.pool}
}

// xfsSize is the size of an xfs volume: mkfs.xfs makes none under 300 MiB.
const xfsSize = 300 << 20

// capability is what v's requests ask for.
func (v *vol) capability() *csi.VolumeCapability {
	if v.block {
		return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}, AccessMode: rwo.GetAccessMode()}
	}
	if v.fsType == "" {
		return rwo
	}
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: v.fsType}},
		AccessMode: rwo.GetAccessMode(),
	}
}

// size is the capacity v is created with.
func (v *vol) size() int64 {
	if v.fsType == "xfs" {
		return xfsSize
	}
	return volumeSize
}

type env struct {
	t *testing.T
	p *testenv.Plugin
	// pools maps the plugin's storage pools besides the default one to
	// their directories.
	pools map[string]string
}

// vid is the ID of the volume that CreateVolume made under name on the test
// plugin's node: the name and the node's.
func vid(name string) string { return name + "_" + testenv.NodeID }

func envInt(name string, def int64) int64 {
	if v, err := strconv.ParseInt(os.Getenv(name), 10, 64); err == nil {
		return v
	}
	return def
}

// retryable reports whether the kubelet would retry a request that failed
// with err, rather than treat the failure as final.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.Canceled, codes.ResourceExhausted:
		return true
	}
	return false
}

// step moves v one level toward to and returns the RPC's error.
func (e *env) step(ctx context.Context, v *vol, from, to level) error {
	c, n := e.p.Controller(), e.p.Node()
	var err error
	switch {
	case from == absent && to > absent:
		_, err = c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: v.name, Parameters: v.params(), CapacityRange: &csi.CapacityRange{RequiredBytes: v.size()},
			VolumeCapabilities: []*csi.VolumeCapability{v.capability()}})
	case from == created && to > created:
		_, err = n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging, VolumeCapability: v.capability()})
	case from == staged && to > staged:
		_, err = n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging, TargetPath: v.target, VolumeCapability: v.capability()})
	case from == published && to < published:
		_, err = n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.target})
	case from == staged && to < staged:
		_, err = n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging})
	case from == created && to < created:
		_, err = c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.id})
	}
	return err
}

// drive runs the steps from level from to v.want, stopping at the first
// error.
func (e *env) drive(ctx context.Context, v *vol, from level) error {
	for from != v.want {
		next := from + 1
		if v.want < from {
			next = from - 1
		}
		if err := e.step(ctx, v, from, next); err != nil {
			return err
		}
		from = next
	}
	return nil
}

// replay makes the restarted plugin reach every volume's wanted level the
// way the kubelet does after a crash: it walks every level down to the
// wanted one and up again, idempotently, retrying what it would retry.
func (e *env) replay(v *vol) {
	e.t.Helper()
	// The kubelet would retry for ever; a bound keeps a stuck plugin from
	// eating the test binary's whole timeout (which would hide its log).
	poll.Until(e.t, 90*time.Second, 100*time.Millisecond, fmt.Sprintf("replaying %s to level %d", v.id, v.want), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := e.replayOnce(ctx, v)
		if err != nil && !retryable(err) {
			return poll.Stop(err)
		}
		return err
	})
}

func (e *env) replayOnce(ctx context.Context, v *vol) error {
	// Tear down whatever may be above the wanted level, top first...
	for l := published; l > v.want; l-- {
		if err := e.step(ctx, v, l, l-1); err != nil {
			return err
		}
	}
	// ...then set up to it, bottom first. Every step is idempotent.
	for l := absent; l < v.want; l++ {
		if err := e.step(ctx, v, l, l+1); err != nil {
			return err
		}
	}
	return nil
}

func writeSynced(path, content string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// mounted reports whether anything is mounted at path.
func mounted(path string) bool { return mountsAt(path) > 0 }

// check verifies v against the machine after a replay.
func (e *env) check(trial int, v *vol) {
	e.t.Helper()
	if got, want := mounted(v.staging), v.want >= staged && !v.block; got != want {
		e.t.Fatalf("trial %d %s: staging mounted %v, want %v", trial, v.id, got, want)
	}
	if got, want := mounted(v.target), v.want == published; got != want {
		e.t.Fatalf("trial %d %s: target mounted %v, want %v", trial, v.id, got, want)
	}
	if v.want != published {
		return
	}
	for name, content := range v.files {
		b, err := os.ReadFile(filepath.Join(v.target, name))
		if err != nil || string(b) != content {
			e.t.Fatalf("trial %d %s: file %s read %q, %v; want %q (data lost)", trial, v.id, name, b, err, content)
		}
	}
}

// checkSpace checks that a kill left no partial reservation, in every
// storage pool: each pool's directory holds exactly the images of its
// volumes that exist, each allocated whole (thick, the default), no
// temporary file of a create that was cut short, and the plugin's account
// of each pool owes nothing and promises exactly those volumes.
func (e *env) checkSpace(trial int, vols []*vol) {
	e.t.Helper()
	want := map[string]map[string]bool{"default": {}}
	for name := range e.pools {
		want[name] = map[string]bool{}
	}
	for _, v := range vols {
		if v.want >= created {
			want[cmp.Or(v.pool, "default")][v.id+".img"] = true
		}
	}
	code, body := e.p.StatusGet("/status/pools")
	var pools []report.PoolStatus
	if err := json.Unmarshal([]byte(body), &pools); code != 200 || err != nil {
		e.t.Fatalf("trial %d: /status/pools answered %d %q: %v", trial, code, body, err)
	}
	for _, pool := range pools {
		images := want[pool.Name]
		n := int64(len(images))
		dir := e.p.DataDir
		if pool.Name != "default" {
			dir = e.pools[pool.Name]
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			e.t.Fatal(err)
		}
		for _, en := range entries {
			if !images[en.Name()] {
				e.t.Fatalf("trial %d: pool %s holds %s, which no volume of it owns", trial, pool.Name, en.Name())
			}
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(dir, en.Name()), &st); err != nil {
				e.t.Fatal(err)
			}
			if st.Blocks*512 < volumeSize {
				e.t.Fatalf("trial %d: %s has %d of its %d bytes allocated", trial, en.Name(), st.Blocks*512, volumeSize)
			}
			delete(images, en.Name())
		}
		if len(images) > 0 {
			e.t.Fatalf("trial %d: images missing from pool %s: %v", trial, pool.Name, images)
		}
		if pool.ThickOwedBytes != 0 || pool.ThickPromisedBytes != n*volumeSize || pool.ThinPromisedBytes != 0 {
			e.t.Fatalf("trial %d: pool %+v, want %d volumes of %d bytes promised thick and nothing owed", trial, pool, n, volumeSize)
		}
	}
	if len(pools) != len(want) {
		e.t.Fatalf("trial %d: /status/pools reports %d pools, want %d", trial, len(pools), len(want))
	}
}

func TestKillAnywhere(t *testing.T) {
	trials := int(envInt("CONVERGE_FAULT_TRIALS", 30))
	seed := uint64(envInt("CONVERGE_FAULT_SEED", time.Now().UnixNano()))
	t.Logf("fault injection: %d trials, seed %d (rerun with CONVERGE_FAULT_SEED=%d)", trials, seed, seed)

	p := testenv.New(t)
	// One volume lives in a pool of its own filesystem: a kill leaves
	// every pool's images accounted for.
	fast := testenv.PoolFilesystem(t, p, "fast", 512<<20, "xfs", "-q", "-f")
	p.Args = append(p.Args, "--pool", "fast="+fast)
	e := &env{t: t, p: p, pools: map[string]string{"fast": fast}}
	vols := make([]*vol, volumes)
	for i := range vols {
		name := fmt.Sprintf("fault-%d", i)
		id := vid(name)
		vols[i] = &vol{
			name:    name,
			id:      id,
			staging: filepath.Join(p.Root, "staging", id),
			target:  filepath.Join(p.Root, "pods", id, "mount"),
			files:   map[string]string{},
		}
		if i == 1 {
			vols[i].pool = "fast"
		}
		for _, d := range []string{vols[i].staging, filepath.Dir(vols[i].target)} {
			if err := os.MkdirAll(d, 0o750); err != nil {
				t.Fatal(err)
			}
		}
	}
	p.Start()
	var walks, interrupted int
	for trial := range trials {
		rng := rand.New(rand.NewPCG(seed, uint64(trial)))
		// Each volume walks to a random other level concurrently; the
		// plugin is killed at a random moment of the walk.
		var wg sync.WaitGroup
		var mu sync.Mutex // guards the files maps and the counters while the walks run
		for _, v := range vols {
			from := v.want
			for v.want == from {
				v.want = level(rng.IntN(4))
			}
			if v.want == absent {
				clear(v.files)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				err := e.drive(ctx, v, from)
				mu.Lock()
				walks++
				if err != nil {
					interrupted++
				}
				mu.Unlock()
				if err == nil && v.want == published {
					name := fmt.Sprintf("trial-%d", trial)
					content := fmt.Sprintf("%s written in trial %d", v.id, trial)
					if writeSynced(filepath.Join(v.target, name), content) == nil {
						mu.Lock()
						v.files[name] = content
						mu.Unlock()
					}
				}
			}()
		}
		time.Sleep(time.Duration(rng.IntN(80)) * time.Millisecond)
		p.Kill()
		wg.Wait()
		p.Start()
		for _, v := range vols {
			e.replay(v)
		}
		for _, v := range vols {
			e.check(trial, v)
		}
		e.checkSpace(trial, vols)
	}

	t.Logf("%d of %d walks were cut short by the kill", interrupted, walks)
	if trials >= 10 && interrupted == 0 {
		t.Error("no kill interrupted a walk: the suite tests nothing")
	}

	// Full teardown: nothing of ours may remain.
	for _, v := range vols {
		v.want = absent
		e.replay(v)
	}
	left := slices.DeleteFunc(append(testenv.Leftovers(p.Dir, p.DataDir), testenv.Leftovers(p.Dir, fast)...),
		func(l string) bool { return l == "mount "+fast }) // the pool's own filesystem
	if len(left) > 0 {
		t.Fatalf("after full teardown: %v", left)
	}
	for _, dir := range []string{p.DataDir, fast} {
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			var names []string
			for _, en := range entries {
				names = append(names, en.Name())
			}
			t.Fatalf("pool directory %s after full teardown holds %v", dir, names)
		}
	}
}

// TestOrphanReleasedBeforeReady attaches a loop device to a volume image
// behind the plugin's back, as a crash between attach and record would leave
// it, and checks that the restarted plugin releases it before Probe is ready.
func TestOrphanReleasedBeforeReady(t *testing.T) {
	p := testenv.New(t)
	p.Start()
	_, err := p.Controller().CreateVolume(context.Background(), &csi.CreateVolumeRequest{
		Name: "orphan", CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20}, VolumeCapabilities: []*csi.VolumeCapability{rwo},
	})
	if err != nil {
		t.Fatal(err)
	}
	p.Kill()
	out, err := exec.Command("losetup", "-f", "--show", filepath.Join(p.DataDir, vid("orphan")+".img")).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v %s", err, out)
	}
	if len(testenv.Leftovers(p.Dir, p.DataDir)) != 1 {
		t.Fatal("setup: the orphan is not attached")
	}
	p.Start()
	if left := testenv.Leftovers(p.Dir, p.DataDir); len(left) > 0 {
		t.Errorf("ready while orphans remain: %v", left)
	}
}
