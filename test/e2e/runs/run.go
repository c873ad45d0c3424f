package runs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// prefix begins the name of a run's directory in the temporary directory,
// which random digits complete (os.MkdirTemp's), and of every cgroup the
// run makes: the digits tell a run's objects from another's, and from the
// cgroups of runs from before the names carried them
// (converge-e2e-<node>), which no live run makes any more.
const prefix = "converge-e2e-"

// ownerFile is the file in a run's directory that names its owner.
const ownerFile = "owner"

// New makes the directory of a new run, owned by this process, and records
// in it what Clean needs to put the machine back: which of the host paths
// do not exist yet and the kernel tunables the kubelet changes. On error
// nothing of the run is left.
func New() (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	for _, record := range []func(string) error{writeOwner, recordHostPaths, saveSysctls} {
		if err := record(dir); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
	}
	return dir, nil
}

// CgroupRoot is the cgroup root of the kubelet of the node called node in
// the run in dir, relative to each hierarchy's root: named after the run,
// so that no other run's kubelet, nor any other kubelet on the machine
// (which uses /kubepods), shares it, and Clean finds it.
func CgroupRoot(dir, node string) string {
	return "/" + filepath.Base(dir) + "-" + node
}

// Live lists the runs whose owner still runs, each as "<directory>,
// process <pid>".
func Live() []string {
	var out []string
	for _, dir := range runDirs() {
		if ownerAlive(dir) {
			b, _ := os.ReadFile(filepath.Join(dir, ownerFile))
			pid, _, _ := strings.Cut(string(b), " ")
			out = append(out, fmt.Sprintf("%s, process %s", dir, pid))
		}
	}
	return out
}

// runDirs lists the run directories in the temporary directory: the
// directories named prefix and digits that are this user's and closed to
// everyone else, as os.MkdirTemp makes them. Anyone may make a directory
// of that name in /tmp, and what Clean reads there decides what it
// writes, kills and removes as root: a directory of another user's, or
// open to others, is not a run's (untrustedRunDirs lists those).
func runDirs() []string {
	trusted, _ := listRunDirs()
	return trusted
}

// untrustedRunDirs lists the directories named as runs' that runDirs
// leaves out, with why.
func untrustedRunDirs() []string {
	_, untrusted := listRunDirs()
	return untrusted
}

func listRunDirs() (trusted, untrusted []string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, dir := range dirs {
		fi, err := os.Lstat(dir)
		if err != nil || !fi.IsDir() || !isRunName(filepath.Base(dir)) {
			continue
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		switch {
		case !ok || int(st.Uid) != os.Geteuid():
			untrusted = append(untrusted, dir+": not this user's: left alone")
		case fi.Mode().Perm()&0o077 != 0:
			untrusted = append(untrusted, fmt.Sprintf("%s: mode %v, open to others: left alone", dir, fi.Mode().Perm()))
		default:
			trusted = append(trusted, dir)
		}
	}
	return trusted, untrusted
}

// isRunName reports whether name is a run directory's: prefix and digits.
func isRunName(name string) bool {
	id, ok := strings.CutPrefix(name, prefix)
	return ok && id != "" && strings.Trim(id, "0123456789") == ""
}

// runOf names the run a cgroup called name belongs to: the directory
// prefix<id>, id being the digits after the prefix up to the next '-'.
// ok is false for a name without such digits, as the cgroups of runs from
// before the names carried them (converge-e2e-<node>).
func runOf(name string) (dir string, ok bool) {
	rest, found := strings.CutPrefix(name, prefix)
	if !found {
		return "", false
	}
	id, _, _ := strings.Cut(rest, "-")
	if !isRunName(prefix + id) {
		return "", false
	}
	return filepath.Join(os.TempDir(), prefix+id), true
}

// isRunDir reports whether dir is a run's directory by its path: an
// absolute path whose last element is a run directory's name. Clean
// refuses any other, as its clean-up would reach beyond the run.
func isRunDir(dir string) bool {
	return filepath.IsAbs(dir) && filepath.Clean(dir) == dir && isRunName(filepath.Base(dir))
}

// writeOwner records in the run's directory which process runs it: its
// PID and the start time that makes the PID unambiguous.
func writeOwner(dir string) error {
	id := processIdentity(os.Getpid())
	if id == "" {
		return errors.New("cannot read this process's start time from /proc")
	}
	return os.WriteFile(filepath.Join(dir, ownerFile), []byte(id), 0o644)
}

// ownerAlive reports whether the process that made the run directory still
// runs. A directory without an owner file was made before the suite wrote
// one, or by a run killed before it could: stale.
func ownerAlive(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, ownerFile))
	if err != nil {
		return false
	}
	var pid int
	if _, err := fmt.Sscanf(string(b), "%d", &pid); err != nil {
		return false
	}
	return processIdentity(pid) == string(b)
}
