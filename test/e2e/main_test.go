package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/converge-csi/converge/test/e2e/standin"
)

// c is the cluster every test runs on; TestMain brings it up once.
var c *cluster

func TestMain(m *testing.M) {
	if len(os.Args) == 4 && os.Args[0] == nodeInitName {
		runNodeInit(os.Args[1], os.Args[2], os.Args[3])
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
	c = &cluster{}
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
		}
	}
	if notes := c.down(); len(notes) > 0 {
		fmt.Printf("e2e: taking the cluster down needed force or failed:\n  %s\n", strings.Join(notes, "\n  "))
		code = 1
	}
	if left := leftovers(c.dir); len(left) > 0 {
		fmt.Printf("e2e: left behind: %v\n", left)
		code = 1
	}
	os.Exit(code)
}

// runsEveryTest says whether this run runs the whole suite: no -run or
// -skip narrows it.
func runsEveryTest() bool {
	for _, name := range []string{"test.run", "test.skip"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return false
		}
	}
	return true
}

// dumpLogs prints the end of every daemon's log, for a failed run.
func dumpLogs() {
	if c == nil || c.logs == "" {
		return
	}
	for _, n := range c.nodes {
		for _, name := range []string{"csi-node", "csi-provisioner", "csi-resizer", "csi-snapshotter", "node-driver-registrar"} {
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
