package devices

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/test/testenv/loops"
)

// churnEnv names the variable that makes this test binary another loop
// user (TestLoopChurner), in the directory it names.
const churnEnv = "CONVERGE_LOOP_CHURN"

// TestAttachWhileOthersChurn attaches and detaches 50 volumes, thin and
// thick, all at once or one after another, round after round for a few
// seconds, while another
// process attaches, detaches and removes loop devices as fast as it can
// (TestLoopChurner: what losetup and another node plugin do), leaving
// numbers with their discards stuck off, and about to go, for a moment.
// Every attach must succeed, no thin volume may get a device with discards
// stuck off, every detach must leave its device gone, and nothing of the
// volumes may stay attached.
func TestAttachWhileOthersChurn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	dir := t.TempDir()
	churnDir := filepath.Join(dir, "churn")
	if err := os.Mkdir(churnDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		sparseImage(t, filepath.Join(churnDir, fmt.Sprintf("%d.img", i)))
	}
	const n = 50
	images := make([]string, n)
	for i := range images {
		images[i] = sparseImage(t, filepath.Join(dir, fmt.Sprintf("%d.img", i)))
	}
	thin := func(i int) bool { return i%2 == 0 }

	churner := exec.Command(os.Args[0], "-test.run=^TestLoopChurner$", "-test.v")
	churner.Env = append(os.Environ(), churnEnv+"="+churnDir)
	stdin, err := churner.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := churner.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	churner.Stderr = churner.Stdout
	if err := churner.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	var output []string
	stop := sync.OnceValue(func() string {
		stdin.Close()
		for lines.Scan() {
			output = append(output, lines.Text())
		}
		churner.Wait()
		return strings.Join(output, "\n")
	})
	t.Cleanup(func() {
		stop()
		for _, d := range []string{dir, churnDir} {
			for dev := range loopsBackedIn(d) {
				loops.Release(dev, d)
			}
		}
	})
	// The churner says when it churns.
	for lines.Scan() && !strings.Contains(lines.Text(), "churning") {
		output = append(output, lines.Text())
	}

	// Rounds for a few seconds: the churner's cycles take tens of
	// milliseconds each (a removal is most of one), converge's round less.
	start, rounds := time.Now(), 0
	for round := 0; round < 2 || time.Since(start) < 3*time.Second; round++ {
		devs := make([]string, n)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var failures []string
		fail := func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			failures = append(failures, fmt.Sprintf("round %d: ", round)+fmt.Sprintf(format, args...))
		}
		// Every other round one volume after another, as a node that
		// stages now and then.
		alone := round%2 == 1
		for i := range n {
			attach := wg.Go
			if alone {
				attach = func(f func()) { f() }
			}
			attach(func() {
				dev, err := (LoopDevices{}).Attach(images[i], thin(i))
				if err != nil {
					fail("attach %d: %v", i, err)
					return
				}
				devs[i] = dev
				queue := filepath.Join("/sys/block", filepath.Base(dev), "queue")
				limit, err := readInt(filepath.Join(queue, "discard_max_bytes"))
				if err != nil || (limit > 0) != thin(i) {
					fail("%s attached for a volume with discards %v: limit %d bytes, %v", dev, thin(i), limit, err)
				}
				backing, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
				if err != nil || strings.TrimSpace(string(backing)) != images[i] {
					fail("%s is backed by %q (%v), want %s", dev, backing, err, images[i])
				}
			})
		}
		wg.Wait()
		for i, dev := range devs {
			if dev == "" {
				continue
			}
			wg.Go(func() {
				gone, err := (LoopDevices{}).Detach(dev)
				if err != nil || !gone {
					fail("detach %d (%s): gone %v, %v; want gone", i, dev, gone, err)
				}
			})
		}
		wg.Wait()
		for _, f := range failures {
			t.Error(f)
		}
		rounds++
	}
	out := stop()
	var cycles, lost int
	for _, l := range strings.Split(out, "\n") {
		fmt.Sscanf(l, "churned %d cycles, %d lost", &cycles, &lost)
	}
	t.Logf("the churner's cycles while converge attached and detached 50 volumes %d times: %d (%d lost to others)", rounds, cycles, lost)
	if cycles < 20 {
		t.Errorf("the churner ran %d cycles: not churning alongside (its output: %s)", cycles, out)
	}
	if left := loopsBackedIn(dir); len(left) > 0 {
		t.Errorf("devices of the volumes still attached: %v", left)
	}
}

// leaveStuck attaches n images in dir with discards refused and detaches
// them, leaving their numbers, most likely the lowest free ones, with their
// discards stuck off; what is left of them when the test ends is removed.
func leaveStuck(t *testing.T, dir string, n int) {
	t.Helper()
	var devs []string
	for i := range n {
		dev, err := AttachLoop(sparseImage(t, filepath.Join(dir, fmt.Sprintf("stuck-%d.img", i))), false)
		if err != nil {
			t.Fatal(err)
		}
		devs = append(devs, dev)
	}
	for _, dev := range devs {
		if err := DetachLoop(dev); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, dev := range devs {
			if _, err := os.Stat(filepath.Join("/sys/block", filepath.Base(dev), "loop")); err != nil && discardsStuck(t, dev) {
				removeLoop(dev)
			}
		}
	})
}

// TestThinAttachPastManyStuckNumbers leaves 24 loop device numbers with
// their discards stuck off, as another user's teardown of many thick
// volumes does (converge's own did, for half a second, until 2026-11-25),
// and attaches one thin volume: the kernel offers it each of those numbers
// in turn, lowest first, and it must remove them and still get a device
// that passes discards. Counting instant tries, the attach gave up after
// 16 numbers. Another process may take some of the numbers meanwhile.
func TestThinAttachPastManyStuckNumbers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices")
	}
	dir := t.TempDir()
	leaveStuck(t, dir, 24)
	dev, err := AttachLoop(sparseImage(t, filepath.Join(dir, "thin.img")), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loops.Release(dev, dir) })
	if discardsStuck(t, dev) {
		t.Errorf("the thin volume got %s with discards stuck off", dev)
	}
}

// loopsBackedIn returns the attached loop devices whose backing file is in
// dir, and those files.
func loopsBackedIn(dir string) map[string]string {
	out := map[string]string{}
	loops, _ := ListLoops("/sys/block")
	for _, l := range loops {
		if filepath.Dir(l.BackingFile) == dir {
			out[l.Device] = l.BackingFile
		}
	}
	return out
}

// TestLoopChurner is not a test of its own: TestAttachWhileOthersChurn runs
// this binary with churnEnv set to a directory of images, and it then, as
// fast as it can, attaches them all, one after another, each to the free
// loop device the kernel offers (as losetup does), refusing discards on
// every eighth (as for a thick volume) and detaching each at once, then
// removes their numbers. It stops when its standard input closes and
// prints how many devices it attached.
func TestLoopChurner(t *testing.T) {
	dir := os.Getenv(churnEnv)
	if dir == "" {
		t.Skip("run by TestAttachWhileOthersChurn")
	}
	images, err := filepath.Glob(filepath.Join(dir, "*.img"))
	if err != nil || len(images) == 0 {
		t.Fatalf("no images in %s: %v", dir, err)
	}
	ctl, err := unix.Open(loopControl, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ctl)
	stopped := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(stopped)
	}()
	cycles, lost := 0, 0
	var detached []int
	fmt.Println("churning")
	deadline := time.After(5 * time.Minute) // should the parent vanish
	for running := true; running; {
		select {
		case <-stopped:
			running = false
		case <-deadline:
			running = false
		default:
		}
		for _, n := range detached {
			unix.IoctlSetInt(ctl, unix.LOOP_CTL_REMOVE, n)
		}
		detached = detached[:0]
		if !running {
			break
		}
		for i, image := range images {
			if ok, n := churnOnce(ctl, image, i%8 == 0); ok {
				cycles++
				detached = append(detached, n)
			} else {
				lost++
			}
		}
	}
	fmt.Printf("churned %d cycles, %d lost\n", cycles, lost)
}

// churnOnce attaches image to the free loop device the kernel offers,
// refuses discards on it if thick, and detaches it; ok is false when
// another process took or removed the device first.
func churnOnce(ctl int, image string, thick bool) (ok bool, n int) {
	n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
	if err != nil {
		return false, 0
	}
	dev := fmt.Sprintf("/dev/loop%d", n)
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, n
	}
	defer unix.Close(fd)
	backing, err := unix.Open(image, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, n
	}
	defer unix.Close(backing)
	cfg := unix.LoopConfig{Fd: uint32(backing)}
	if err := unix.IoctlLoopConfigure(fd, &cfg); err != nil {
		return false, n
	}
	if thick {
		os.WriteFile(filepath.Join("/sys/block", filepath.Base(dev), "queue", "discard_max_bytes"), []byte("0"), 0)
	}
	unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
	return true, n
}
