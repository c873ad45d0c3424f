package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/converge-csi/converge/pkg/devices"
	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/test/e2e/runs"
)

// A node's reboot, as after a power loss: one of the soak's faults (issue
// 71). Every process of the node dies at once, and what its machine's
// kernel held for it goes with them: its mounts, loop devices and
// cgroups, and what a machine keeps on tmpfs (/run), containerd's and
// runc's state. What its disks hold stays: the kubelet's root directory,
// csi-node's state and data directories, the pools and their
// filesystems, containerd's root with its images. Then the node starts
// again as its machine would: its namespaces, containerd, the kubelet,
// which brings its pods back.
//
// The node's pods stop first (runs.FreezeCgroups), and then
// the filesystems of the node's volumes are cut off, as a power loss cuts
// them (cutVolumes): what they held in memory and had not written, their
// log's tail among it, is lost; only what was fsync'd is theirs when they
// are mounted again. Stopped first, no writer is inside an fsync when its
// filesystem is cut: the cut (the GOINGDOWN ioctl) can let an fsync under
// way return success for what it then loses, which a power loss, ending
// the fsync with the machine, never does.

// rebootDetachTimeout bounds the wait for the node's loop devices to go
// once detached: a device that a mount of the dying namespaces still
// holds goes when that mount ends, which writes its filesystem out first.
const rebootDetachTimeout = 2 * time.Minute

// rebootFreezeTimeout bounds the wait for the node's pods to stop before
// the cut: each stops between two system calls, an fsync's within
// seconds; a write waiting on a filesystem that a snapshot froze (csi-node
// stopped before its thaw) is let go by thawing it.
const rebootFreezeTimeout = 30 * time.Second

// rebootReadyTimeout bounds the wait for the node to be Ready again once
// its kubelet runs: its first status says so within seconds.
const rebootReadyTimeout = 2 * time.Minute

// reboot takes the node down as a power loss does (its pods stopped,
// cutVolumes, killAll, then powerOff), leaves it down for down, and
// starts it again (powerOn). The node comes back even when part of taking
// it down failed (a loop device that stayed attached, say), and the error
// names every step that failed. A node whose pods do not stop within
// rebootFreezeTimeout (runs.ErrNotStopped) is not rebooted: its pods go
// on, and nothing else of it was touched; a cut then could race an
// fsync. One with a process that stays frozen once thawed has its volumes
// cut and is left running: nothing would end that process. ctx bounds
// the time down and the start; if it ends first, the node stays down,
// and the cluster's teardown still takes down what runs of it. The caller must not stop or start the node's
// kubelet meanwhile.
func (n *kubeNode) reboot(ctx context.Context, down time.Duration) error {
	thaw := func() {
		if err := n.thawVolumes(); err != nil {
			fmt.Printf("e2e: node %s: %v\n", n.node, err)
		}
	}
	if err := runs.FreezeCgroups(n.cgroupRoot, rebootFreezeTimeout, thaw); err != nil {
		return fmt.Errorf("node %s not rebooted: its pods did not stop: %w", n.node, err)
	}
	cutErr := n.cutVolumes()
	if err := n.killAll(); err != nil {
		return fmt.Errorf("node %s: power off: %w", n.node, err)
	}
	offErr := errors.Join(cutErr, n.powerOff())
	wait := time.NewTimer(down)
	defer wait.Stop()
	select {
	case <-wait.C:
	case <-ctx.Done():
		return errors.Join(offErr, fmt.Errorf("node %s stays down: %w", n.node, ctx.Err()))
	}
	if err := n.powerOn(ctx); err != nil {
		return errors.Join(offErr, fmt.Errorf("node %s: power on: %w", n.node, err))
	}
	return offErr
}

// cutVolumes shuts down, without writing out their logs, the xfs and
// ext4 filesystems of the node's volumes, each once: xfs_io's shutdown
// (the GOINGDOWN ioctl, which both take), as xfstests' power-loss tests
// do. Every later write and read of them fails; what they had not written
// is lost. The node's pods are stopped by then (reboot). Each is thawed
// first (see thawVolumes): a snapshot's freeze, which csi-node may have
// been stopped holding, would outlive the cut, and keep the writers
// blocked on it unkillable.
func (n *kubeNode) cutVolumes() error {
	mounts, err := n.volumeMounts()
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		if out, err := n.ns.run("xfs_io", "-x", "-c", "thaw", "-c", "shutdown", m.Path); err != nil {
			if rest := notFrozen(out); rest != "" {
				errs = append(errs, fmt.Errorf("shut down %s (%s): %v: %s", m.Path, m.Source, err, rest))
			}
		}
	}
	fmt.Printf("e2e: node %s: %d volume filesystems cut off\n", n.node, len(mounts))
	return errors.Join(errs...)
}

// thawVolumes thaws the filesystems of the node's volumes that are
// frozen: a snapshot under way when csi-node is killed (by a reboot, or
// the cluster's teardown) leaves its volume's filesystem frozen, since a
// freeze belongs to the filesystem, not to a process. A process writing
// to it waits, unkillable, for a thaw, and would hold the node's PID
// namespace, and with it every mount and loop device of the node, for
// good; a machine that loses its power loses the freeze with everything
// else. A filesystem that is not frozen is left as it is.
func (n *kubeNode) thawVolumes() error {
	mounts, err := n.volumeMounts()
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		if out, err := n.ns.run("xfs_io", "-x", "-c", "thaw", m.Path); err != nil {
			if rest := notFrozen(out); rest != "" {
				errs = append(errs, fmt.Errorf("thaw %s (%s): %v: %s", m.Path, m.Source, err, rest))
			}
		} else {
			fmt.Printf("e2e: node %s: thawed %s (%s), frozen by a snapshot under way\n", n.node, m.Path, m.Source)
		}
	}
	return errors.Join(errs...)
}

// notFrozen returns xfs_io's output without the line that says a thaw
// found the filesystem not frozen (FITHAW's EINVAL): what is left is a
// failure.
func notFrozen(out string) string {
	var rest []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l != "" && !(strings.Contains(l, "cannot unfreeze") && strings.Contains(l, "Invalid argument")) {
			rest = append(rest, l)
		}
	}
	return strings.Join(rest, "; ")
}

// volumeMounts returns a mount of each xfs and ext4 filesystem of the
// node's volumes (loop devices staged or published under the kubelet's
// CSI directory), in the node's mount namespace; none when the node has
// no namespaces.
func (n *kubeNode) volumeMounts() ([]host.Mount, error) {
	if n.ns == nil {
		return nil, nil
	}
	mounts, err := devices.ReadMounts(n.ns.mountinfo())
	if err != nil {
		return nil, err
	}
	var out []host.Mount
	seen := map[host.DevNum]bool{}
	for _, m := range mounts {
		if seen[m.Dev] || !strings.HasPrefix(m.Source, "/dev/loop") || (m.FsType != "xfs" && m.FsType != "ext4") ||
			!strings.HasPrefix(m.Path, nodeKubeletDir+"/plugins/kubernetes.io/csi/") {
			continue
		}
		seen[m.Dev] = true
		out = append(out, m)
	}
	return out, nil
}

// killAll kills every process of the node at once with SIGKILL: the
// kernel kills everything in a PID namespace when its init dies, the
// containers (in PID namespaces below the node's) and their shims among
// them, and the node's mount namespace, with every mount the node made,
// goes with its last process. It returns once they are all gone. A
// frozen process would outlive it: the node's cgroups are thawed first,
// and while one stays frozen nothing is killed. The links to the control
// plane close, so that the node's next namespaces can listen on their
// ports.
func (n *kubeNode) killAll() error {
	if frozen := runs.ThawCgroups(n.cgroupRoot); len(frozen) > 0 {
		return fmt.Errorf("cgroups still frozen: %s", strings.Join(frozen, ", "))
	}
	if n.ns != nil {
		n.ns.init.kill()
	}
	// Their nsenter ends with them.
	for _, p := range []*proc{n.kubelet, n.containerdProc} {
		if p != nil {
			p.kill()
		}
	}
	killShims(n.containerd)
	n.links.close()
	n.links = nil
	return nil
}

// powerOff takes away, once the node's processes are dead, what its
// machine's kernel held for it and what its machine keeps on tmpfs. It
// goes on past a step that fails, and returns every failure.
func (n *kubeNode) powerOff() error {
	var errs []error
	for _, step := range []struct {
		name string
		run  func() error
	}{
		{"detach its loop devices", n.detachLoops},
		{"empty containerd's state", n.clearRunState},
		{"remove its cgroups", n.clearCgroups},
	} {
		if err := step.run(); err != nil {
			errs = append(errs, fmt.Errorf("node %s: power off: %s: %w", n.node, step.name, err))
		}
	}
	return errors.Join(errs...)
}

// detachLoops detaches the node's loop devices, as a machine that starts
// again has none: those of its images, in its data directory and its
// pools, and the kubelet's that hold them (a raw block volume's). Its
// disks' stay: the loop devices of its pools' filesystems and of the
// second node's data directory, whose images lie outside those
// directories and are mounted on the host.
func (n *kubeNode) detachLoops() error {
	pools, _ := filepath.Glob(filepath.Join(n.poolsDir, "*"))
	loops := runs.NodeLoops(runs.NodeStorage{
		Dirs:        []string{n.dataDir, n.poolsDir},
		Roots:       append([]string{n.stateDir, n.dataDir, n.poolsDir}, pools...),
		Filesystems: n.fillablePools(),
	})
	fmt.Printf("e2e: node %s powered off: detaching %d loop devices %v\n", n.node, len(loops), loops)
	return runs.DetachLoops(loops, rebootDetachTimeout)
}

// clearRunState empties what the node's machine keeps on tmpfs (/run)
// and loses with its power: containerd's state directory and runc's (the
// tasks, their bundles, the shims' addresses) and containerd's sockets.
// containerd's root (its images and snapshots, the metadata of its
// containers and sandboxes) is on disk, and stays. Nothing may be mounted
// below containerd's directory in the test process's mount namespace,
// which removing would reach into: the node's own mounts there went with
// its namespace.
func (n *kubeNode) clearRunState() error {
	base := n.containerdDir()
	if mounts := runs.MountsIn("/proc/self/mountinfo", base); len(mounts) > 0 {
		return fmt.Errorf("mounted below %s, left as it is: %s", base, strings.Join(mounts, ", "))
	}
	for _, d := range []string{"state", "runc"} {
		if err := os.RemoveAll(filepath.Join(base, d)); err != nil {
			return err
		}
	}
	for _, sock := range []string{n.containerd, n.containerd + ".ttrpc"} {
		if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// clearCgroups removes the node's cgroups, as a machine that starts again
// has none, and makes its kubelet's cgroup root again, which the kubelet
// wants to find.
func (n *kubeNode) clearCgroups() error {
	var err error
	if notes := runs.RemoveCgroups(n.cgroupRoot); len(notes) > 0 {
		err = errors.New(strings.Join(notes, "; "))
	}
	return errors.Join(err, makeCgroupRoot(n.cgroupRoot))
}

// powerOn starts the node again as its machine would: new namespaces
// (its disks, the filesystems of its pools and data directory, still
// mounted on the host, come into them), containerd, with the images of
// its root, and the kubelet; it waits until the node is Ready again. Its
// pods, converge's among them, come back as the kubelet brings them.
func (n *kubeNode) powerOn(ctx context.Context) error {
	if err := n.startNodeNS(ctx); err != nil {
		return fmt.Errorf("node namespaces: %w", err)
	}
	if err := n.runContainerd(ctx); err != nil {
		return fmt.Errorf("containerd: %w", err)
	}
	since := time.Now()
	if err := n.runKubelet(); err != nil {
		return fmt.Errorf("kubelet: %w", err)
	}
	return n.waitReady(ctx, rebootReadyTimeout, since)
}
