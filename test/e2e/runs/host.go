package runs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
)

// What a run changes on the host outside its directory, and puts back:
// the kernel tunables the kubelet sets, the host paths its daemons make,
// and the kubelet's log links.

// kernelTunables are the sysctls the kubelet sets at start.
var kernelTunables = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

// saveSysctls records the kernel tunables in the run's directory before
// the kubelet changes them, so that Clean, or the next run's CleanStale
// after a crash, puts them back.
func saveSysctls(dir string) error {
	var b strings.Builder
	for _, s := range kernelTunables {
		if v, err := os.ReadFile(filepath.Join("/proc/sys", s)); err == nil {
			fmt.Fprintf(&b, "%s=%s\n", s, strings.TrimSpace(string(v)))
		}
	}
	return os.WriteFile(filepath.Join(dir, "sysctls"), []byte(b.String()), 0o644)
}

// restoreSysctls puts back the kernel tunables saveSysctls recorded in dir.
// A run that recorded none is a no-op.
func restoreSysctls(dir string, note func(string, ...any)) {
	b, err := os.ReadFile(filepath.Join(dir, "sysctls"))
	if err != nil {
		return
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		s, v, ok := strings.Cut(line, "=")
		if !ok || !slices.Contains(kernelTunables, s) || strings.Trim(v, "0123456789") != "" {
			continue // not a tunable the kubelet sets, or not a number
		}
		if err := os.WriteFile(filepath.Join("/proc/sys", s), []byte(v), 0o644); err != nil {
			note("restore sysctl %s=%s: %v", s, v, err)
		}
	}
}

// hostPaths are directories outside the run's own that the daemons make
// at fixed paths whatever they are told: the kubelet's device-plugin socket
// and container log links, containerd's shim sockets and runc state, and
// the flex-volume directory of the controller-manager's probe; and the
// mount points of the nodes' kubelet and state directories (../nodens.go).
var hostPaths = []string{"/var/lib/kubelet", "/var/lib/converge", "/var/log/containers", "/run/containerd", "/opt/containerd", "/usr/libexec/kubernetes"}

// recordHostPaths notes which of hostPaths do not exist before the run, so
// that Clean removes what the run made of them.
func recordHostPaths(dir string) error {
	var absent []string
	for _, p := range hostPaths {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			absent = append(absent, p)
		}
	}
	return os.WriteFile(filepath.Join(dir, "host-paths-absent"), []byte(strings.Join(absent, "\n")), 0o644)
}

// removeHostPaths removes, of the host paths that did not exist before the
// run, the empty directories and the sockets: nothing that holds data. A
// run that recorded none is a no-op.
func removeHostPaths(dir string, note func(string, ...any)) {
	b, err := os.ReadFile(filepath.Join(dir, "host-paths-absent"))
	if err != nil {
		return
	}
	for _, root := range strings.Fields(string(b)) {
		if !slices.Contains(hostPaths, root) {
			continue
		}
		removeDeepestFirst(root, func(d os.DirEntry) bool { return d.IsDir() || d.Type()&os.ModeSocket != 0 }, note)
	}
}

// removeDeepestFirst removes the entries under root (root included) that
// match, children before their parents. A directory that still holds
// something it does not match stays, and is noted. It stays on root's
// filesystem: a filesystem mounted beneath (a container's root under
// /run/containerd) is another's, and left whole.
func removeDeepestFirst(root string, match func(os.DirEntry) bool, note func(string, ...any)) {
	var paths []string
	rootDev, ok := deviceOf(root)
	if !ok {
		return
	}
	filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() {
			if dev, ok := deviceOf(path); !ok || dev != rootDev {
				return filepath.SkipDir
			}
		}
		if match(d) {
			paths = append(paths, path)
		}
		return nil
	})
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			note("remove %s (made by the run): %v", p, err)
		}
	}
}

// removeLogLinks removes the links the kubelet makes in /var/log/containers
// (a fixed path) to the run's container logs.
func removeLogLinks(dir string) {
	links, _ := filepath.Glob("/var/log/containers/*.log")
	for _, l := range links {
		if target, err := os.Readlink(l); err == nil && strings.HasPrefix(target, dir+"/") {
			os.Remove(l)
		}
	}
}

// deviceOf is the device of the filesystem that holds path (not followed).
func deviceOf(path string) (uint64, bool) {
	fi, err := os.Lstat(path)
	if err != nil {
		return 0, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return uint64(st.Dev), true
}
