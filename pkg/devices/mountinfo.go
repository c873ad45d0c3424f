package devices

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/converge-csi/converge/pkg/host"
	"github.com/converge-csi/converge/pkg/locks"
)

// ReadMounts parses a mountinfo file (normally /proc/self/mountinfo) once.
func ReadMounts(path string) ([]host.Mount, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseMounts(string(raw))
}

// mountTable reads a mountinfo file through a descriptor it keeps open,
// with preads from offset 0 into a buffer it keeps: the kernel generates
// the table anew for each read from the start, and on this machine kind
// the open and close, and a read a page at a time, cost as much as the
// generation itself (docs/performance.md, "Figures behind the code's
// choices"). Its parse does what mount-utils' ParseMountInfo does
// (FuzzReadMounts compares the two) straight into host.Mount, where a pass
// would otherwise pay for both.
type mountTable struct {
	path string
	// consistent is false on a kernel before Linux 5.8, whose reads of a
	// table that changes between them may skip lines: there every read
	// goes through ConsistentRead (ReadMounts' fallback below).
	consistent bool

	// mu guards fd and buf.
	mu  locks.Mutex
	fd  int
	buf []byte

	// sharedMu guards the fields below it: the reads readFresh shares.
	// Lock order: sharedMu is never held while mu is taken.
	sharedMu locks.Mutex
	shared   *sync.Cond
	// started and done count the shared reads begun and finished;
	// reading is true while one runs. last is the latest finished read's
	// result, lastErr its error.
	started, done uint64
	reading       bool
	last          []host.Mount
	lastErr       error
}

func newMountTable(path string) *mountTable {
	t := &mountTable{path: path, consistent: kernelAtLeast(5, 8), fd: -1, buf: make([]byte, 64<<10)}
	t.shared = sync.NewCond(&t.sharedMu)
	return t
}

// readFresh returns the mounts of a read of the table that began after
// readFresh was called, and shares it with every caller that called before
// it began: callers at the same moment (the requests of a burst, each
// wanting the table as it is after its own intent) pay for one read, not
// one each. Each caller gets a copy of its own.
func (t *mountTable) readFresh() ([]host.Mount, error) {
	t.sharedMu.Lock()
	defer t.sharedMu.Unlock()
	// The first read to begin from now on: the one running began before.
	want := t.started + 1
	for t.done < want {
		if t.reading {
			t.shared.Wait()
			continue
		}
		t.reading = true
		t.started++
		n := t.started
		t.sharedMu.Unlock()
		mounts, err := t.read()
		t.sharedMu.Lock()
		t.last, t.lastErr, t.done, t.reading = mounts, err, n, false
		t.shared.Broadcast()
	}
	if t.lastErr != nil {
		return nil, t.lastErr
	}
	return slices.Clone(t.last), nil
}

// read returns the mounts of the table. A failed read closes the
// descriptor; the next read opens the file anew.
func (t *mountTable) read() ([]host.Mount, error) {
	if !t.consistent {
		return readConsistent(t.path)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.fd < 0 {
		fd, err := unix.Open(t.path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: t.path, Err: err}
		}
		t.fd = fd
	}
	raw, err := preadAll(t.fd, &t.buf)
	if err != nil {
		t.closeLocked()
		return nil, &os.PathError{Op: "read", Path: t.path, Err: err}
	}
	return parseMounts(raw)
}

func (t *mountTable) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closeLocked()
}

func (t *mountTable) closeLocked() {
	if t.fd >= 0 {
		unix.Close(t.fd)
		t.fd = -1
	}
}

// readConsistent reads the table until two reads in a row agree, as
// mount-utils does on kernels with the bug.
func readConsistent(path string) ([]host.Mount, error) {
	prev, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	for range 3 {
		cur, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		if bytes.Equal(prev, cur) {
			return parseMounts(string(cur))
		}
		prev = cur
	}
	return nil, fmt.Errorf("%s changed in every one of 3 reads", path)
}

// kernelAtLeast reports whether the running kernel is at least
// major.minor; false when it cannot tell.
func kernelAtLeast(major, minor int) bool {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return false
	}
	return releaseAtLeast(unix.ByteSliceToString(u.Release[:]), major, minor)
}

// releaseAtLeast reports whether a kernel release such as "6.18.44-fc"
// or "5.8-rc1" is at least major.minor; false when it cannot tell.
func releaseAtLeast(release string, major, minor int) bool {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return false
	}
	digits := strings.IndexFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' })
	if digits >= 0 {
		parts[1] = parts[1][:digits]
	}
	maj, err1 := strconv.Atoi(parts[0])
	mnr, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return maj > major || maj == major && mnr >= minor
}

// parseMounts parses the contents of a mountinfo file (proc(5)): ID,
// parent ID, major:minor, root, mount point, mount options, optional
// fields up to "-", then fs type, source and per-superblock options. Any
// malformed line fails it.
func parseMounts(content string) ([]host.Mount, error) {
	out := make([]host.Mount, 0, strings.Count(content, "\n")+1)
	for line := range strings.SplitSeq(content, "\n") {
		if line == "" {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 10 {
			return nil, fmt.Errorf("mountinfo line has %d fields, want at least 10: %q", len(fields), line)
		}
		id, err := strconv.Atoi(fields[0])
		if err != nil {
			return nil, fmt.Errorf("mountinfo line %q: mount ID: %w", line, err)
		}
		if _, err := strconv.Atoi(fields[1]); err != nil {
			return nil, fmt.Errorf("mountinfo line %q: parent ID: %w", line, err)
		}
		dev, err := parseMountDev(fields[2])
		if err != nil {
			return nil, fmt.Errorf("mountinfo line %q: %w", line, err)
		}
		i := 6
		for i < len(fields) && fields[i] != "-" {
			i++
		}
		i++
		if len(fields)-i < 3 {
			return nil, fmt.Errorf("mountinfo line %q: want fs type, source and super options after \"-\"", line)
		}
		super := fields[i+2]
		out = append(out, host.Mount{
			ID:       id,
			Path:     unescapeOctal(fields[4]),
			Dev:      dev,
			Root:     unescapeOctal(fields[3]),
			Source:   unescapeOctal(fields[i+1]),
			FsType:   fields[i],
			ReadOnly: hasOption(fields[5], "ro"),
			// Per-superblock state: "ro" (or "emergency_ro" since Linux
			// 6.x) after errors=remount-ro fired, "shutdown" (ext4) once
			// every I/O fails.
			SuperReadOnly: hasOption(super, "ro") || hasOption(super, "emergency_ro"),
			Shutdown:      hasOption(super, "shutdown"),
		})
	}
	return out, nil
}

// parseMountDev parses mountinfo's major:minor, which mount-utils reads
// as two ints of any sign.
func parseMountDev(s string) (host.DevNum, error) {
	maj, mnr, ok := strings.Cut(s, ":")
	if !ok || strings.Contains(mnr, ":") {
		return host.DevNum{}, fmt.Errorf("malformed major:minor %q", s)
	}
	a, err := strconv.Atoi(maj)
	if err != nil {
		return host.DevNum{}, fmt.Errorf("major: %w", err)
	}
	b, err := strconv.Atoi(mnr)
	if err != nil {
		return host.DevNum{}, fmt.Errorf("minor: %w", err)
	}
	return host.DevNum{Major: uint32(a), Minor: uint32(b)}, nil
}

// hasOption reports whether the comma-separated options s hold opt; a
// comma inside double quotes (an SELinux context) separates nothing.
func hasOption(s, opt string) bool {
	start, quoted := 0, false
	for i := 0; i <= len(s); i++ {
		switch {
		case i < len(s) && s[i] == '"':
			quoted = !quoted
		case i == len(s) || s[i] == ',' && !quoted:
			if s[start:i] == opt {
				return true
			}
			start = i + 1
		}
	}
	return false
}

// unescapeOctal undoes the kernel's \ooo escaping of space, tab, newline and
// backslash in mountinfo fields.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
