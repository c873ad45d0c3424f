package e2e

import (
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/converge-csi/converge/test/e2e/runs"
)

// down takes the cluster apart in reverse and leaves the machine as it
// was: no process, mount, loop device, cgroup or file of the run's remains
// (the cached Kubernetes binaries aside). It returns what it failed to
// remove of the run's, and only of the run's: what earlier runs left and
// the run's start could not remove (runs.CleanStale) it prints, which
// fails none of the tests the run ran.
func (c *cluster) down() []string {
	// A test may have frozen a node's containers (TestTwoNodesNodeLoss,
	// when a signal or the binary's timeout takes the run down under it):
	// neither containerd nor the SIGKILLs below would end them. What
	// stays frozen, runs.Clean tries again, and notes.
	runs.Thaw(c.dir)
	c.runStopsAtDown()
	for i := len(c.nodes) - 1; i >= 0; i-- {
		c.nodes[i].down()
	}
	for _, p := range []*proc{c.snapshotController, c.scheduler, c.controllerManager, c.apiserver, c.etcd} {
		if p != nil {
			p.stop(20 * time.Second)
		}
	}
	if c.dir == "" {
		return nil
	}
	notes := runs.Clean(c.dir)
	if stale := runs.Stale(c.dir); len(stale) > 0 {
		fmt.Printf("e2e: earlier runs left, and this run's start could not remove (no failure of this run's):\n  %s\n", strings.Join(stale, "\n  "))
	}
	return notes
}

// stopAtDown registers stop, which ends something a test started beside
// the cluster's daemons, for down to call if the test has not stopped it
// itself by then (a signal, a timeout, a failed test): stop must be safe
// to call again.
func (c *cluster) stopAtDown(stop func()) {
	c.atDownMu.Lock()
	defer c.atDownMu.Unlock()
	c.atDown = append(c.atDown, stop)
}

// runStopsAtDown calls the stops registered with stopAtDown, the newest
// first. What they miss, the run's clean-up ends: a process that names the
// run's directory.
func (c *cluster) runStopsAtDown() {
	c.atDownMu.Lock()
	stops := c.atDown
	c.atDown = nil
	c.atDownMu.Unlock()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
}

// down stops the node's daemons: the kubelet, its containers (converge's
// pod among them) and containerd, and then everything else in its
// namespaces, whose mounts go with them.
func (n *kubeNode) down() {
	// A writer blocked on a filesystem that a killed csi-node left frozen
	// would outlive every kill below (thawVolumes); csi-node can freeze
	// one again until its container and its shim are gone, hence the
	// second thaw.
	thaw := func() {
		if err := n.thawVolumes(); err != nil {
			fmt.Printf("e2e: node %s: %v\n", n.node, err)
		}
	}
	thaw()
	if n.kubelet != nil {
		n.kubelet.stop(30 * time.Second)
	}
	defer n.links.close()
	if n.containerdProc != nil && !n.containerdProc.exited() {
		// Containers outlive containerd in their shims: end them first.
		out, _ := n.ctr("tasks", "ls", "-q")
		for _, id := range strings.Fields(out) {
			n.ctr("tasks", "kill", "-s", "SIGKILL", id)
			n.ctr("tasks", "delete", "-f", id)
		}
		out, _ = n.ctr("containers", "ls", "-q")
		for _, id := range strings.Fields(out) {
			n.ctr("containers", "delete", id)
		}
		n.containerdProc.stop(20 * time.Second)
	}
	killShims(n.containerd)
	thaw()
	if n.ns != nil {
		n.ns.init.kill()
	}
}

// killShims ends containerd-shim processes serving the run's containerd:
// with their tasks gone they exit by themselves, so one left is stuck.
func killShims(address string) {
	if address == "" {
		return
	}
	for _, pid := range runs.ProcessesMentioning(address) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// cleanStaleRuns cleans up after earlier runs that did not take themselves
// down, for TestMain's -clean-stale (runs.CleanStale).
func cleanStaleRuns() []string { return runs.CleanStale() }

// leftovers lists what of the run in dir remains on the machine, for
// TestMain's check after down (runs.Leftovers).
func leftovers(dir string) []string { return runs.Leftovers(dir) }
