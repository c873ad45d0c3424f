package devices

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/converge-csi/converge/pkg/locks"
)

// ErrPodCgroupNotFound is returned for a pod that has no cgroup within
// podSearchDepth of the hierarchy's root: the pod is not (or no longer)
// running on this node, or the kubelet's cgroups lie deeper.
var ErrPodCgroupNotFound = errors.New("no cgroup of the pod")

// podSearchDepth is how deep below the hierarchy's root a pod's cgroup is
// looked for. The kubelet puts one at depth 3 (kubepods/burstable/pod<uid>,
// or the systemd slices) below its cgroupRoot; 5 leaves room for a
// cgroupRoot of two components (the e2e kubelets run with
// cgroupRoot /<run>-<node>: depth 4) without walking every container of
// every service on the node.
const podSearchDepth = 5

// containerSearchDepth bounds the walk below a pod's cgroup on v1: the
// runtime makes the containers' cgroups right inside it; a container
// that made cgroups of its own has them one or two levels further.
const containerSearchDepth = 3

// podCgroups finds pods' cgroups below a hierarchy's root and remembers
// where, so that a pass over many volumes does not walk the hierarchy for
// each.
type podCgroups struct {
	root string

	// mu guards dirs: each pod UID's cgroup as last found.
	mu   locks.Mutex
	dirs map[string]string
}

func newPodCgroups(root string) *podCgroups {
	return &podCgroups{root: root, dirs: map[string]string{}}
}

// find returns the cgroup of the pod: where it was last found while that
// directory is still there, otherwise from a new walk of the hierarchy,
// which remembers every pod it passes. ErrPodCgroupNotFound when none is
// found.
func (p *podCgroups) find(uid string) (string, error) {
	if err := checkPodUID(uid); err != nil {
		return "", err
	}
	p.mu.Lock()
	dir, ok := p.dirs[uid]
	p.mu.Unlock()
	if ok && isDir(dir) {
		return dir, nil
	}
	found, err := walkPodCgroups(p.root)
	if err != nil {
		return "", err
	}
	p.mu.Lock()
	p.dirs = found
	p.mu.Unlock()
	if dir, ok := found[uid]; ok {
		return dir, nil
	}
	return "", fmt.Errorf("%w %s within %d levels of %s", ErrPodCgroupNotFound, uid, podSearchDepth, p.root)
}

func isDir(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.IsDir()
}

// walkPodCgroups returns every pod cgroup within podSearchDepth of root,
// by pod UID. It does not descend into a pod's cgroup (no pod is inside
// another), and passes over a cgroup removed while it walks.
func walkPodCgroups(root string) (map[string]string, error) {
	found := map[string]string{}
	err := walkDirs(root, podSearchDepth, func(path, name string) bool {
		if uid := podCgroupUID(name); uid != "" {
			found[uid] = path
			return false
		}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("looking for pods' cgroups below %s: %w", root, err)
	}
	return found, nil
}

// walkDirs calls visit for each directory below root, at most depth
// levels down, and descends into it when visit returns true. A directory
// that vanishes while it walks (a container that stopped) is passed over;
// a symlink is never followed (cgroup file systems have none).
func walkDirs(root string, depth int, visit func(path, name string) bool) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && path != root {
				return nil
			}
			return err
		}
		if !d.IsDir() || path == root {
			return nil
		}
		level := strings.Count(path[len(root):], string(filepath.Separator))
		if !visit(path, d.Name()) || level >= depth {
			return filepath.SkipDir
		}
		return nil
	})
}

// cgroupsBelow returns dir and every directory below it, at most
// containerSearchDepth levels down: the cgroups of a pod that may hold
// tasks.
func cgroupsBelow(dir string) ([]string, error) {
	dirs := []string{dir}
	err := walkDirs(dir, containerSearchDepth, func(path, _ string) bool {
		dirs = append(dirs, path)
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("listing the cgroups of %s: %w", dir, err)
	}
	return dirs, nil
}
