package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/converge-csi/converge/test/e2e/soak"
	"github.com/converge-csi/converge/test/e2e/standin"
)

// c is the cluster every test runs on; TestMain brings it up once.
var c *cluster

func TestMain(m *testing.M) {
	if len(os.Args) == 4 && os.Args[0] == nodeInitName {
		runNodeInit(os.Args[1], os.Args[2], os.Args[3])
	}
	if filepath.Base(os.Args[0]) == soak.WriterName {
		os.Exit(soak.PodMain(os.Args[1:], os.Stdout, os.Stderr))
	}
	if standin.Is(filepath.Base(os.Args[0])) {
		os.Exit(standin.Run(filepath.Base(os.Args[0]), os.Args[1:]))
	}
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Println("e2e: skipped: a kubelet, containerd and mounts need root")
		os.Exit(0)
	}
	if testing.Short() {
		fmt.Println("e2e: skipped in -short mode")
		os.Exit(0)
	}
	if *buildOnly {
		if err := buildAll(context.Background(), *buildSummary, !*buildKubeletsApart); err != nil {
			fmt.Printf("e2e build: %v\n", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if *buildKubeletsOnly {
		if err := buildKubelets(context.Background()); err != nil {
			fmt.Printf("e2e build: %v\n", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if *cleanStale {
		for _, note := range cleanStaleRuns() {
			fmt.Printf("e2e: an earlier run did not take itself down: %s\n", note)
		}
		os.Exit(0)
	}
	c = &cluster{}
	takeDownOnExit()
	// Cold, the Kubernetes build takes minutes; warm, the cluster is up in
	// seconds.
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	start := time.Now()
	err := c.up(ctx)
	cancel()
	code := 1
	if err != nil {
		fmt.Printf("e2e: bringing the cluster up failed: %v\n", err)
		dumpLogs()
	} else {
		fmt.Printf("e2e: cluster up in %.1fs (%s); kubelet %s, node %s, run directory %s\n",
			time.Since(start).Seconds(), strings.Join(c.upPhases, ", "), kubernetesVersion, c.node, c.dir)
		restarts := c.watchRestarts()
		code = m.Run()
		// Only a whole run gives every invariant its meaning: a run of a
		// few tests (-run) may stop before what another test cleans up.
		if code == 0 && runsEveryTest() {
			if broken := c.checkInvariants(restarts); len(broken) > 0 {
				fmt.Printf("e2e: the run broke an invariant:\n  %s\n", strings.Join(broken, "\n  "))
				code = 1
			}
		}
		if code != 0 {
			dumpLogs()
			keepLogs()
		}
	}
	if !takeDown() {
		code = 1
	}
	os.Exit(code)
}

var (
	checkInvariants    = flag.Bool("invariants", false, "check the run's invariants (unexpected restarts and warnings, what is left) even when -test.run or -test.skip picks the tests: a soak run alone (make soak)")
	buildOnly          = flag.Bool("build-only", false, "build, or find built in the cache, everything the cluster runs, then exit (make test's e2e build step)")
	buildSummary       = flag.String("build-summary", "", "with -build-only, a file to hold a line per item: built or cached, and its seconds")
	buildKubeletsApart = flag.Bool("build-kubelets-apart", false, "with -build-only, leave out the older kubelets, which -build-kubelets builds")
	buildKubeletsOnly  = flag.Bool("build-kubelets", false, "build, or find built, the older kubelets, then exit (make test's kubelets step)")
	cleanStale         = flag.Bool("clean-stale", false, "end and remove what earlier runs that did not take themselves down left on the machine, then exit")
)

// takingDown makes takeDown run once: at the end of TestMain, or earlier on
// a signal or the binary's timeout.
var (
	takingDown sync.Once
	tookDown   bool
)

// takeDown takes the cluster down and checks that nothing of the run is
// left; it reports whether all went well. Only its first call does it;
// any other waits for it.
func takeDown() bool {
	takingDown.Do(func() {
		tookDown = true
		if notes := c.down(); len(notes) > 0 {
			fmt.Printf("e2e: taking the cluster down needed force or failed:\n  %s\n", strings.Join(notes, "\n  "))
			tookDown = false
		}
		if left := leftovers(c.dir); len(left) > 0 {
			fmt.Printf("e2e: left behind: %v\n", left)
			tookDown = false
		}
	})
	return tookDown
}

// takeDownOnExit takes the cluster down, thawing what a test froze and
// ending what the run started, before the process ends on SIGINT or
// SIGTERM (make test's bound on its e2e step), or when the binary's own
// timeout (-test.timeout) is a minute away: that timeout ends the process
// with a panic, in which nothing is taken down. What a SIGKILL or a
// test's panic leaves, the next run, or make test's clean-up after its e2e
// step (-clean-stale), ends and removes.
func takeDownOnExit() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	var alarm <-chan time.Time
	if f := flag.Lookup("test.timeout"); f != nil {
		if d, err := time.ParseDuration(f.Value.String()); err == nil && d > 2*time.Minute {
			alarm = time.After(d - time.Minute)
		}
	}
	go func() {
		var why string
		select {
		case s := <-signals:
			why = "ended by " + s.String()
		case <-alarm:
			why = "a minute before the binary's -test.timeout"
		}
		fmt.Printf("e2e: %s: taking the cluster down before the process ends\n", why)
		dumpLogs()
		takeDown()
		os.Exit(1)
	}()
}

// runsEveryTest says whether this run runs the whole suite (no -run or
// -skip narrows it), or is to be held to the run's invariants as if it
// did (-invariants).
func runsEveryTest() bool {
	if *checkInvariants {
		return true
	}
	for _, name := range []string{"test.run", "test.skip"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return false
		}
	}
	return true
}

// keepLogs copies a failed run's daemons' logs (the kubelets', the
// control plane's) out of the run's directory, which the take-down
// removes, for a reading past the ends dumpLogs prints: into a new
// directory of root's alone (os.MkdirTemp), which it prints. Each failed
// run keeps its own; nothing removes them.
func keepLogs() {
	if c == nil || c.logs == "" {
		return
	}
	kept, err := os.MkdirTemp("", "converge-e2e-failed-logs-")
	if err != nil {
		fmt.Printf("e2e: keeping the run's logs: %v\n", err)
		return
	}
	// Into a directory in kept (root's, 0700, as MkdirTemp made it), to
	// which cp -a gives the source's mode: kept's never changes.
	logs := filepath.Join(kept, "logs")
	if out, err := exec.Command("cp", "-a", c.logs, logs).CombinedOutput(); err != nil {
		fmt.Printf("e2e: keeping the run's logs in %s: %v: %s\n", logs, err, out)
		return
	}
	fmt.Printf("e2e: the run's logs are kept in %s\n", logs)
}

// dumpLogs prints the end of every daemon's log, for a failed run.
func dumpLogs() {
	if c == nil || c.logs == "" {
		return
	}
	for _, n := range c.nodes {
		for _, name := range []string{"csi-node", "csi-provisioner", "csi-resizer", "csi-snapshotter", "node-driver-registrar", nodeAgentContainer} {
			logs := n.containerLogs(name)
			if len(logs) == 0 {
				fmt.Printf("---- %s container %s: no log\n", n.node, name)
				continue
			}
			// A container that exits at start says why first.
			fmt.Printf("---- %s container %s, run %d (first 5 and last 40 lines)\n%s\n...\n%s\n", n.node, name, len(logs)-1,
				firstLines(readFile(logs[len(logs)-1]), 5), tailFile(logs[len(logs)-1], 40))
		}
		for _, name := range []string{"kubelet", "containerd"} {
			fmt.Printf("---- %s %s.log (last 40 lines)\n%s\n", n.node, name, tailFile(filepath.Join(n.logs, name+".log"), 40))
		}
	}
	for _, name := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"} {
		fmt.Printf("---- %s.log (last 40 lines)\n%s\n", name, tailFile(c.logs+"/"+name+".log", 40))
	}
}

// firstLines is the first n lines of s.
func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}
