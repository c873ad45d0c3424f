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

// ErrPodCgroupNotFound is returned for a pod that has no cgroup below
// the kubelet's kubepods cgroups: the pod is not (or no longer) running on
// this node, or the kubelet's cgroups lie deeper than kubepodsSearchDepth.
var ErrPodCgroupNotFound = errors.New("no cgroup of the pod")

// kubepodsSearchDepth is how deep below the hierarchy's root the
// kubelet's kubepods cgroups are looked for: at depth 1 with no
// cgroupRoot, 2 with a cgroupRoot of one component (the e2e kubelets run
// with cgroupRoot /<run>-<node>), 3 with two (or the systemd driver's
// node.slice/node-kubepods.slice). Deeper lie the directories that
// systemd hands to unprivileged users (user.slice/user-N.slice/
// user@N.service/ is at depth 3, what its user makes in it at 4), where
// a "kubepods" is none of the kubelet's.
const kubepodsSearchDepth = 3

// containerSearchDepth bounds the walk below a pod's cgroup on v1: the
// runtime makes the containers' cgroups right inside it; a container
// that made cgroups of its own has them one or two levels further.
const containerSearchDepth = 3

// podCgroups finds pods' cgroups below a hierarchy's root and remembers
// where, so that a pass over many volumes does not walk the hierarchy for
// each.
type podCgroups struct {
	root string

	// mu guards dirs: each pod UID's cgroups as last found, more than
	// one for a UID found at several places.
	mu   locks.Mutex
	dirs map[string][]string
}

func newPodCgroups(root string) *podCgroups {
	return &podCgroups{root: root, dirs: map[string][]string{}}
}

// find returns the cgroup of the pod: where it was last found while that
// directory is still there, otherwise from a new walk of the hierarchy,
// which remembers every pod it passes. ErrPodCgroupNotFound when none is
// found; an error naming both places when the pod's UID names cgroups at
// two, since the limits would bind the pod in one of them only.
func (p *podCgroups) find(uid string) (string, error) {
	if err := checkPodUID(uid); err != nil {
		return "", err
	}
	p.mu.Lock()
	dirs := p.dirs[uid]
	p.mu.Unlock()
	if len(dirs) == 1 && isDir(dirs[0]) {
		return dirs[0], nil
	}
	found, err := walkPodCgroups(p.root)
	if err != nil {
		return "", err
	}
	p.mu.Lock()
	p.dirs = found
	p.mu.Unlock()
	switch dirs := found[uid]; len(dirs) {
	case 0:
		return "", fmt.Errorf("%w %s below the kubelet's kubepods cgroups within %d levels of %s", ErrPodCgroupNotFound, uid, kubepodsSearchDepth, p.root)
	case 1:
		return dirs[0], nil
	default:
		return "", fmt.Errorf("pod %s has cgroups at both %s and %s: refusing to guess which one binds it", uid, dirs[0], dirs[1])
	}
}

func isDir(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.IsDir()
}

// walkPodCgroups returns every pod cgroup below the kubelet's kubepods
// cgroups within kubepodsSearchDepth of root, in the shapes the kubelet
// makes them (podCgroupUID), by pod UID: each place a UID was found. It
// does not descend into a kubepods cgroup further than its QoS classes'
// cgroups, and passes over a cgroup removed while it walks.
func walkPodCgroups(root string) (map[string][]string, error) {
	found := map[string][]string{}
	var errs []error
	err := walkDirs(root, kubepodsSearchDepth, func(path, name string) bool {
		parent := ""
		if dir := filepath.Dir(path); dir != root {
			parent = filepath.Base(dir)
		}
		slice, ok := kubepodsCgroup(parent, name)
		if !ok {
			return true
		}
		if err := kubepodsPods(path, slice, found); err != nil {
			errs = append(errs, err)
		}
		return false
	})
	if err == nil {
		err = errors.Join(errs...)
	}
	if err != nil {
		return nil, fmt.Errorf("looking for pods' cgroups below %s: %w", root, err)
	}
	return found, nil
}

// kubepodsPods adds to found the pods' cgroups in the kubepods cgroup
// kube, whose slice is slice (kubepodsCgroup): right in it, and in its
// QoS classes' cgroups.
func kubepodsPods(kube, slice string, found map[string][]string) error {
	add := func(dir, qos string) error {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		for _, e := range entries {
			// A symlink is never followed: its DirEntry is no directory.
			if !e.IsDir() {
				continue
			}
			if uid := podCgroupUID(slice, qos, e.Name()); uid != "" {
				found[uid] = append(found[uid], filepath.Join(dir, e.Name()))
			}
		}
		return err
	}
	if err := add(kube, ""); err != nil {
		return err
	}
	for _, qos := range qosCgroups {
		dir := filepath.Join(kube, qosCgroup(slice, qos))
		if !isDir(dir) {
			continue
		}
		if err := add(dir, qos); err != nil {
			return err
		}
	}
	return nil
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
