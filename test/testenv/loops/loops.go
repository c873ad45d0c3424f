// Package loops releases the loop devices a test attached without touching
// another process's: the loop devices and their numbers are the machine's,
// go test runs packages side by side, and a node has other loop users too,
// so no test may assume it is alone with them.
package loops

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Release detaches a test's loop device and gives its number back to the
// kernel (LOOP_CTL_REMOVE), only while a file in dir backs it: a number the
// test detached itself may serve another process by now, and must be left
// alone. The kernel keeps a detached device's node otherwise, and every
// loop listing on the machine visits every node: 300 left behind made each
// observation about 1 ms slower in every later test. A device held open
// goes at its last close, and its number stays.
func Release(dev, dir string) {
	sys := filepath.Join("/sys/block", filepath.Base(dev))
	b, err := os.ReadFile(filepath.Join(sys, "loop", "backing_file"))
	backing := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
	if err != nil || filepath.Dir(backing) != filepath.Clean(dir) {
		return
	}
	if f, err := os.OpenFile(dev, os.O_RDONLY, 0); err == nil {
		unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
		f.Close()
	}
	removeNumber(dev)
}

// removeNumber removes an unattached loop device (LOOP_CTL_REMOVE); one
// that is attached or open stays (EBUSY).
func removeNumber(dev string) {
	n, err := strconv.Atoi(strings.TrimPrefix(dev, "/dev/loop"))
	if err != nil {
		return
	}
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return
	}
	defer ctl.Close()
	unix.IoctlSetInt(int(ctl.Fd()), unix.LOOP_CTL_REMOVE, n)
}
