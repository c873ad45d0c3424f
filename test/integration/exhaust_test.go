package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/converge-csi/converge/test/testenv"
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

// TestRequestFlood sends 3000 concurrent requests over one connection, as
// a kubelet gone wild would: each is answered OK or RESOURCE_EXHAUSTED (past
// --max-requests), and the plugin's descriptors and memory stay bounded.
func TestRequestFlood(t *testing.T) {
	p := testenv.New(t, "--max-requests", "64")
	p.Start()
	volFlood := create(t, p, "vol-flood")
	staging := mkdir(t, filepath.Join(p.Root, "staging-flood"))
	fdsBefore := openFDs(t, p.PID())

	const n = 3000
	codesSeen := map[codes.Code]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			var err error
			if i%2 == 0 {
				err = stage(t, p, volFlood, staging, rwo)
			} else {
				_, err = p.Node().NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: volFlood, VolumePath: staging})
			}
			mu.Lock()
			codesSeen[status.Code(err)]++
			mu.Unlock()
		})
	}
	wg.Wait()
	t.Logf("answers: %v", codesSeen)
	for c := range codesSeen {
		switch c {
		case codes.OK, codes.ResourceExhausted, codes.NotFound, codes.Unavailable:
			// NotFound/Unavailable: stats before the stage is recorded or mounted.
		default:
			t.Errorf("unexpected answer %s", c)
		}
	}
	if codesSeen[codes.OK] == 0 {
		t.Error("no request succeeded")
	}
	if fds := openFDs(t, p.PID()); fds > fdsBefore+16 {
		t.Errorf("descriptors: %d after the flood, %d before", fds, fdsBefore)
	}
	if rss := residentKiB(t, p.PID()); rss > 200<<10 {
		t.Errorf("resident memory %d KiB after the flood", rss)
	}
	unstage(t, p, volFlood, staging)
}
