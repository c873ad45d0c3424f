package runs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/converge-csi/converge/test/testenv/poll"
)

// killTimeout bounds the wait for killed processes to go: SIGKILL ends a
// thawed process at once, so one still there after it is stuck in the
// kernel (uninterruptible I/O) and will not go by waiting longer.
const killTimeout = 20 * time.Second

// processIdentity is "<pid> <start time>" of a running process, or "" when
// none has that PID.
func processIdentity(pid int) string {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// The fields after the command name, which is in parentheses; the
	// start time is the 22nd field of the line, the 20th after it.
	rest := string(stat[strings.LastIndexByte(string(stat), ')')+2:])
	fields := strings.Fields(rest)
	if len(fields) < 20 {
		return ""
	}
	return fmt.Sprintf("%d %s", pid, fields[19])
}

// running reports whether the process pid exists and has not exited: a
// zombie has, and waits only for its parent to reap it.
func running(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 || i+2 >= len(stat) {
		return false
	}
	state := stat[i+2]
	return state != 'Z' && state != 'X'
}

// ProcessesMentioning lists the processes, this one aside, whose command
// line names s: holds it, neither preceded nor followed by a character
// that would make it part of a longer name (a letter, a digit, '.', '_',
// '-'), so that a run's directory is not found in another's whose name
// begins with it. None is an empty list.
func ProcessesMentioning(s string) []int {
	var out []int
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range cmdlines {
		b, err := os.ReadFile(p)
		if err != nil || !mentions(string(b), s) {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(p, "/proc/%d/cmdline", &pid); err == nil && pid != os.Getpid() {
			out = append(out, pid)
		}
	}
	return out
}

// mentions reports whether cmdline holds s as a whole name (see
// ProcessesMentioning).
func mentions(cmdline, s string) bool {
	if s == "" {
		return false
	}
	for i := 0; ; {
		j := strings.Index(cmdline[i:], s)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(s)
		if (start == 0 || !nameChar(cmdline[start-1])) && (end == len(cmdline) || !nameChar(cmdline[end])) {
			return true
		}
		i = start + 1
	}
}

// nameChar reports whether c may continue a name in a path.
func nameChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// killAll sends SIGKILL to every process find lists, and again to those it
// lists later (a process thawed a moment ago may have forked), until find
// lists none that runs or killTimeout passes. It returns the processes
// that still run then, each described. This process and PID 1 are never
// sent a signal.
func killAll(find func() []int) []string {
	var left []int
	poll.Wait(context.Background(), killTimeout, 100*time.Millisecond, func() error {
		left = nil
		for _, pid := range find() {
			if pid <= 1 || pid == os.Getpid() || slices.Contains(left, pid) || !running(pid) {
				continue
			}
			syscall.Kill(pid, syscall.SIGKILL)
			left = append(left, pid)
		}
		if len(left) > 0 {
			return fmt.Errorf("%d processes still run", len(left))
		}
		return nil
	})
	sort.Ints(left)
	var out []string
	for _, pid := range left {
		if running(pid) {
			out = append(out, describeProcess(pid))
		}
	}
	return out
}

// describeProcess is "process <pid>: <command line>".
func describeProcess(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return fmt.Sprintf("process %d: %s", pid, strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " ")))
}
