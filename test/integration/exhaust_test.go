package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-csi/converge/pkg/contract"
	"github.com/converge-csi/converge/test/testenv"
	"github.com/converge-csi/converge/test/testenv/poll"
)

// TestFullDataDirectory runs the plugin on a small tmpfs and fills it:
// CreateVolume answers RESOURCE_EXHAUSTED and creates nothing, GetCapacity
// agrees, and once space is back volumes are created again.
func TestFullDataDirectory(t *testing.T) {
	p := testenv.New(t)
	must(t, "mkdir", os.MkdirAll(p.StateDir, 0o700))
	must(t, "tmpfs", syscall.Mount("tmpfs", p.StateDir, "tmpfs", 0, "size=48m,mode=0700"))
	t.Cleanup(func() {
		p.Stop()
		syscall.Unmount(p.StateDir, syscall.MNT_DETACH)
	})
	p.Start()
	filler := filepath.Join(p.StateDir, "filler")
	f, err := os.Create(filler)
	must(t, "filler", err)
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	f.Close()

	_, err = p.Controller().CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "vol-full", CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20}, VolumeCapabilities: []*csi.VolumeCapability{rwo}})
	wantCode(t, "create on a full data directory", err, codes.ResourceExhausted)
	if _, err := os.Stat(filepath.Join(p.DataDir, vid("vol-full")+".img")); !os.IsNotExist(err) {
		t.Errorf("the refused volume left an image: %v", err)
	}
	if entries, _ := os.ReadDir(p.DataDir); len(entries) > 0 {
		t.Errorf("data directory after the refusal: %v", entries)
	}
	capResp, err := p.Controller().GetCapacity(ctx(t), &csi.GetCapacityRequest{})
	must(t, "capacity", err)
	if capResp.GetAvailableCapacity() >= 16<<20 {
		t.Errorf("capacity %d on a full directory, want less than the refused 16 MiB", capResp.GetAvailableCapacity())
	}
	must(t, "free", os.Remove(filler))
	volFull := createSized(t, p, "vol-full", 16<<20)
	_, err = p.Controller().DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: volFull})
	must(t, "delete", err)
}

// openFDs counts the file descriptors of a process.
func openFDs(t *testing.T, pid int) int {
	entries, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// residentKiB reads a process's resident memory.
func residentKiB(t *testing.T, pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// gauge reads a gauge without labels from the plugin's /metrics.
func gauge(t *testing.T, p *testenv.Plugin, name string) float64 {
	t.Helper()
	code, text := p.StatusGet("/metrics")
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok && code == http.StatusOK {
			f, err := strconv.ParseFloat(v, 64)
			must(t, "parsing "+line, err)
			return f
		}
	}
	t.Fatalf("/metrics (%d) has no %s", code, name)
	return 0
}

// TestRequestFlood sends 3000 concurrent requests over one connection, as
// a kubelet gone wild would. Half are stages of a static volume whose disk
// is not there yet, which wait for it: each holds one of the
// --max-requests slots meanwhile, so exactly 64 wait and every other stage
// is refused at once with RESOURCE_EXHAUSTED; once every stage is either
// waiting (the plugin's converge_node_requests_waiting) or refused, the
// waiting stages are cancelled. The other half ask for the volume's stats,
// which take no slot. The plugin's descriptors and memory stay bounded,
// and once the flood has ended its slots are free. However slow or busy
// the machine, no answer and no count depends on a deadline: the test
// waits for the plugin's own count, and gives up only when nothing has
// moved for a minute.
func TestRequestFlood(t *testing.T) {
	const maxRequests, n = 64, 3000
	p := testenv.New(t)
	byID := mkdir(t, filepath.Join(p.Dir, "by-id"))
	p.Args = append(p.Args, "--max-requests", strconv.Itoa(maxRequests), "--allowed-device-prefix", byID)
	p.Start()
	staging := mkdir(t, filepath.Join(p.Root, "staging-flood"))
	req := &csi.NodeStageVolumeRequest{VolumeId: "vol-flood", StagingTargetPath: staging, VolumeCapability: rwo,
		VolumeContext: map[string]string{contract.DeviceKey: filepath.Join(byID, "not-attached-yet")}}
	fdsBefore := openFDs(t, p.PID())

	// No deadline on the flood: on a busy machine 3000 calls may take
	// longer than ctx's minute, and a deadline would change their codes.
	flood, cancel := context.WithCancel(context.Background())
	defer cancel()
	stages, stats := map[codes.Code]int{}, map[codes.Code]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			seen := stages
			var err error
			if i%2 == 0 {
				_, err = p.Node().NodeStageVolume(flood, req)
			} else {
				seen = stats
				_, err = p.Node().NodeGetVolumeStats(flood, &csi.NodeGetVolumeStatsRequest{VolumeId: req.VolumeId, VolumePath: staging})
			}
			mu.Lock()
			seen[status.Code(err)]++
			mu.Unlock()
		})
	}
	// Every stage ends up either holding a slot until cancelled or
	// refused; wait until the plugin's count of the one and ours of the
	// other cover every stage. Without the limit, all of them wait and
	// none is refused.
	refused := func() int {
		mu.Lock()
		defer mu.Unlock()
		return stages[codes.ResourceExhausted]
	}
	waiting := func() int { return int(gauge(t, p, "converge_node_requests_waiting")) }
	last, moved := -1, time.Now()
	for {
		r, w := refused(), waiting()
		if r+w == n/2 {
			break
		}
		if r+w != last {
			last, moved = r+w, time.Now()
		} else if time.Since(moved) > time.Minute {
			t.Fatalf("the flood stalled: %d stages refused and %d waiting for a minute, of %d", r, w, n/2)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if w := waiting(); w != maxRequests {
		t.Errorf("stages waiting: got %d, want %d (--max-requests)", w, maxRequests)
	}
	cancel()
	wg.Wait()
	t.Logf("stages: %v; stats: %v", stages, stats)
	if stages[codes.Canceled] != maxRequests || stages[codes.ResourceExhausted] != n/2-maxRequests {
		t.Errorf("stages: got %v; want %d waiting until cancelled and every other one RESOURCE_EXHAUSTED", stages, maxRequests)
	}
	// A call's client sees its cancellation before the plugin's handler
	// does: the slots are free once the plugin says so.
	for last, moved = waiting(), time.Now(); last > 0; {
		time.Sleep(10 * time.Millisecond)
		if w := waiting(); w != last {
			last, moved = w, time.Now()
		} else if time.Since(moved) > time.Minute {
			t.Fatalf("%d stages still hold a slot a minute after they were cancelled", w)
		}
	}
	for c := range stats {
		if c != codes.NotFound && c != codes.Unavailable && c != codes.Canceled {
			// NotFound before the stage is recorded, Unavailable after:
			// the volume is never mounted; Canceled if it came late.
			t.Errorf("stats: got %s, want NOT_FOUND or UNAVAILABLE", c)
		}
	}
	// The flood's connections close as their clients' do, a moment after
	// the last answer: what stays open a few seconds on is a leak.
	if err := poll.Wait(ctx(t), 10*time.Second, 50*time.Millisecond, func() error {
		if fds := openFDs(t, p.PID()); fds > fdsBefore+16 {
			return fmt.Errorf("descriptors: %d after the flood, %d before", fds, fdsBefore)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	if rss := residentKiB(t, p.PID()); rss > 200<<10 {
		t.Errorf("resident memory %d KiB after the flood", rss)
	}
	after, cancelAfter := context.WithTimeout(ctx(t), 100*time.Millisecond)
	defer cancelAfter()
	if _, err := p.Node().NodeStageVolume(after, req); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("a stage after the flood: got %v, want it to wait for the disk (DEADLINE_EXCEEDED): the slots are free", err)
	}
	unstage(t, p, req.VolumeId, staging)
}
