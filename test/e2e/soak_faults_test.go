package e2e

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/converge-csi/converge/test/e2e/runs"
	"github.com/converge-csi/converge/test/e2e/soak"
)

// The soak's faults that take more than a signal: a node rebooted, a pool
// filled to ENOSPC, a failpoint of the failpoint build armed.

// rebootNode reboots node i (nodereboot.go) as a power loss does, down for
// hold: every process of the node dies, its mounts and loop devices go;
// the kubelet, its pods and csi-node start again on what the disks kept.
func (s *soakRun) rebootNode(i int, hold time.Duration) error {
	n := s.nodes[i]
	s.nodeMu[i].Lock()
	defer s.nodeMu[i].Unlock()
	s.intendNodeRestarts(n)
	err := n.reboot(s.ctx, hold)
	if errors.Is(err, runs.ErrNotStopped) {
		// Not a fault that fell under the others, but one that did not
		// fall at all: a soak that passed without it would claim a power
		// loss it never had.
		s.fail(&s.broken, "reboot of node %s: %v", n.node, err)
		return nil
	}
	return err
}

// intendNodeRestarts marks every container of converge's pods on n as
// restarted on purpose.
func (s *soakRun) intendNodeRestarts(n *kubeNode) {
	pods, err := c.client.CoreV1().Pods("").List(s.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.node})
	if err != nil {
		s.fail(&s.failures, "listing the pods of %s: %v", n.node, err)
		return
	}
	for _, p := range pods.Items {
		if hasPrefix(p.Name, convergePods) {
			intendDriverRestart(&p)
		}
	}
}

// fillPool fills pool i of those that can be (each a filesystem of its
// own), for hold, then frees it, once the alert it must raise is seen.
func (s *soakRun) fillPool(i int, hold time.Duration) error {
	pools := s.fillable()
	if len(pools) == 0 {
		return nil
	}
	p := pools[i%len(pools)]
	since := time.Now()
	// While it is full on purpose, the soak makes no room there: it must
	// stay full for the alert, and the volumes in it must ride it out.
	s.mu.Lock()
	s.filling[p.node+"/"+p.name] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.filling, p.node+"/"+p.name)
		s.mu.Unlock()
	}()
	free, err := fillPool(p.dir)
	if err != nil {
		return err
	}
	time.Sleep(hold)
	// Full, the pool is below its guard: ConvergePoolNearlyFull is pending
	// (its for: is 5 minutes) within a scrape and an evaluation, unless
	// csi-node is down meanwhile; the pool stays full a while longer for
	// it.
	match := map[string]string{"node": p.node, "pool": p.name}
	if !s.alertWhile("ConvergePoolNearlyFull", match, since, 90*time.Second) {
		// Fine while csi-node was down (a reboot, a kill, a failpoint):
		// there was nothing to scrape.
		full := time.Since(since)
		if free := freeShare(p.dir); free > poolGuardShare {
			s.fail(&s.failures, "pool %s of %s was full, and no alert: something freed %.1f%% of it meanwhile", p.name, p.node, 100*free)
		} else if up, err := s.prometheus.scraped(s.ctx, p.node, full); err != nil || !up {
			s.fail(&s.failures, "pool %s of %s was full for %s, and no alert: csi-node there was not scraped all along (%v)", p.name, p.node, full.Round(time.Second), err)
		} else {
			s.fail(&s.broken, "pool %s of %s was full for %s, csi-node there scraped all along, and ConvergePoolNearlyFull%v never pending", p.name, p.node, full.Round(time.Second), match)
		}
	}
	return free()
}

// soakPool is a pool the soak may fill: its node, name, and directory as
// the test process sees it.
type soakPool struct {
	node, name, dir string
}

// fillable lists the pools of the soak's nodes that are filesystems of
// their own (never the machine's disk).
func (s *soakRun) fillable() []soakPool {
	var out []soakPool
	for _, n := range s.nodes {
		for _, dir := range n.fillablePools() {
			name := filepath.Base(dir)
			if dir == n.dataDir {
				name = "default"
			}
			out = append(out, soakPool{node: n.node, name: name, dir: dir})
		}
	}
	return out
}

// armFailpoint arms a failpoint of the failpoint build in a node's
// csi-node, chosen by draw (soak.PickFailpoint), for hold, then disarms
// it: a panic wherever csi-node next passes it (which fails that
// operation mid-step, or csi-node), a delay there, or a kill there: a
// long sleep, and SIGKILL once csi-node has reached it.
func (s *soakRun) armFailpoint(draw int, hold time.Duration) error {
	if len(s.failpoints) == 0 {
		return nil
	}
	n := s.nodes[draw%len(s.nodes)]
	name, term := soak.PickFailpoint(s.failpoints, draw/len(s.nodes))
	s.logf("failpoint %s on %s: %s", name, n.node, term)
	if err := n.armFailpoint(name, term); err != nil {
		return err
	}
	// csi-node may have crashed or been killed there: a refused disarm is
	// no fault.
	defer n.disarmFailpoint(name)
	if term != soak.KillTerm {
		time.Sleep(hold)
		return nil
	}
	err := waitFor(s.ctx, hold, nil, func() error {
		if k, err := n.failpointCount(name); err != nil || k < 1 {
			return fmt.Errorf("failpoint %s not reached (%v)", name, err)
		}
		return nil
	})
	if err != nil {
		return nil // not reached meanwhile: nothing to kill
	}
	s.logf("failpoint %s reached on %s: killing csi-node there", name, n.node)
	_, err = n.killContainer(s.ctx, s.t, "csi-node")
	return err
}

// poolGuardShare is the share of a pool the e2e's csi-node keeps free
// (its guard, testPoolGuard): below it, a pool is nearly full.
var poolGuardShare = func() float64 {
	pct, err := strconv.ParseFloat(strings.TrimSuffix(testPoolGuard, "%"), 64)
	if err != nil {
		panic(fmt.Sprintf("testPoolGuard %q: %v", testPoolGuard, err))
	}
	return pct / 100
}()

// freeShare is the share of the filesystem at dir that is free (to an
// unprivileged writer, as csi-node counts it); 0 when it cannot say.
func freeShare(dir string) float64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil || st.Blocks == 0 {
		return 0
	}
	return float64(st.Bavail) / float64(st.Blocks)
}
