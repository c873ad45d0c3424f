package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// addNode joins a further node called name to the cluster: a kubelet of
// release kubeletVersion (kubernetesVersion or one of olderKubeletsToRun)
// of its own (root directory, ports, identity, cgroup root, pod logs) in
// namespaces of its own, a containerd of its own, and a converge plugin
// with its own state; its data directory is a filesystem of its own of
// dataDirSize bytes when that is not 0. name must resolve to 127.0.0.1,
// where its kubelet listens. On error the cluster's down takes down what
// was started.
func (c *cluster) addNode(ctx context.Context, name string, dataDirSize int64, kubeletVersion string) (*kubeNode, error) {
	dir := filepath.Join(c.dir, "nodes", name)
	n, err := c.newNode(name, dir, filepath.Join(c.logs, name), "kubelet-"+name, kubeletVersion)
	if err != nil {
		return nil, err
	}
	c.nodes = append(c.nodes, n)
	if err := c.issue(n.identity, "system:node:"+name, []string{"system:nodes"}); err != nil {
		return nil, err
	}
	if dataDirSize > 0 {
		// Mounted before the node's namespaces exist, so that they start
		// with it; the run's clean-up unmounts it and detaches its device.
		if err := smallFilesystem(filepath.Join(dir, "data.img"), n.dataDir, dataDirSize); err != nil {
			return nil, err
		}
	}
	steps := append(n.upSteps(), []struct {
		name string
		run  func(context.Context) error
	}{{"converge pod", n.waitDriver}, {"node agent pod", n.waitAgent}}...)
	for _, s := range steps {
		start := time.Now()
		if err := s.run(ctx); err != nil {
			return nil, fmt.Errorf("node %s: %s: %w", name, s.name, err)
		}
		fmt.Printf("e2e: node %s: %s %.1fs\n", name, s.name, time.Since(start).Seconds())
	}
	return n, nil
}

// smallFilesystem makes an ext4 of size bytes in the sparse file image,
// attached to a loop device, and mounts it at dir.
func smallFilesystem(image, dir string, size int64) error {
	return smallFilesystemOf(image, dir, size, "ext4", "-q", "-F", "-m0")
}

// smallFilesystemOf is smallFilesystem of type fs, made by mkfs.<fs>
// mkfsArgs.
func smallFilesystemOf(image, dir string, size int64, fs string, mkfsArgs ...string) error {
	f, err := os.Create(image)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return err
	}
	out, err := exec.Command("losetup", "--find", "--show", image).Output()
	if err != nil {
		return fmt.Errorf("losetup %s: %w", image, err)
	}
	dev := strings.TrimSpace(string(out))
	if out, err := exec.Command("mkfs."+fs, append(mkfsArgs, dev)...).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs %s: %v: %s", dev, err, out)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return syscall.Mount(dev, dir, fs, 0, "")
}

// nodeNamed is the cluster's node called name, or nil.
func (c *cluster) nodeNamed(name string) *kubeNode {
	for _, n := range c.nodes {
		if n.node == name {
			return n
		}
	}
	return nil
}
