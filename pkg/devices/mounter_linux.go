package devices

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"k8s.io/klog/v2"
	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/converge-csi/converge/pkg/host"
)

// unknownData is what mount-utils' GetDiskFormat reports for a device with
// a partition table.
const unknownData = "unknown data, probably partitions"

// ErrPartitioned is returned by DiskFormat for a device with a partition
// table: it holds data and must never be formatted.
var ErrPartitioned = errors.New("device carries a partition table")

// ErrRefused wraps a mount the kernel refused as invalid (EINVAL): an
// option the filesystem does not take, a combination of attributes it does
// not allow, or a superblock it cannot read. Trying again cannot help.
var ErrRefused = errors.New("the kernel refused the mount as invalid")

// ErrNotPermitted wraps an operation the plugin lacks the privilege for,
// such as growing a mounted ext4 without CAP_SYS_RESOURCE. Trying again
// cannot help.
var ErrNotPermitted = errors.New("the plugin lacks the privilege")

// ErrFilesystemDamaged wraps a mount refused because fsck found errors in
// the filesystem that it could not correct: an operator's fsck is needed,
// and trying again cannot help.
var ErrFilesystemDamaged = errors.New("fsck found errors it could not correct")

// ErrNotFormattable wraps a mount of a device that holds no filesystem
// where none may be made (a read-only mount), or another filesystem than
// the one asked for. Trying again cannot help.
var ErrNotFormattable = errors.New("the device does not hold the filesystem asked for, and none may be made")

// CommandError is a command that failed: what ran, how it exited and what
// it printed.
type CommandError struct {
	Command  []string
	ExitCode int // -1 when it did not run to an exit
	Output   string
	Err      error
}

// Error says what ran, how it ended and what it printed.
func (e *CommandError) Error() string {
	return fmt.Sprintf("%s: %v: %s", strings.Join(e.Command, " "), e.Err, strings.TrimSpace(e.Output))
}

// Unwrap returns the error the command ended with.
func (e *CommandError) Unwrap() error { return e.Err }

// run runs cmd, made of argv, and returns a *CommandError when it fails;
// ok reports which exit codes count as success besides 0.
func run(cmd utilexec.Cmd, ok func(code int) bool, argv ...string) error {
	out, err := cmd.CombinedOutput()
	if err == nil {
		return nil
	}
	code := -1
	var ee utilexec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitStatus()
	}
	if code > 0 && ok != nil && ok(code) {
		return nil
	}
	return &CommandError{Command: argv, ExitCode: code, Output: string(out), Err: err}
}

// mountErrors maps mount-utils' classified mount errors to ours.
var mountErrors = map[mount.MountErrorType]error{
	mount.HasFilesystemErrors: ErrFilesystemDamaged,
	mount.UnformattedReadOnly: ErrNotFormattable,
	mount.FilesystemMismatch:  ErrNotFormattable,
}

// badOption is how mount(8) reports EINVAL from mount(2).
const badOption = "bad option"

// notPermitted is how resize2fs reports EPERM from the online resize ioctl.
const notPermitted = "Permission denied to resize"

// Mounter formats and mounts filesystems through k8s.io/mount-utils, and
// makes bind mounts and unmounts through file descriptors resolved beneath
// the plugin's roots (see Paths), so that no path swapped meanwhile can
// redirect them.
type Mounter struct {
	mounter mount.Interface
	exec    utilexec.Interface
	// formats bounds the format-and-mounts (mkfs among them) at once.
	formats chan struct{}
	paths   *Paths
	// unfinished reports whether a device holds an xfs whose mkfs never
	// finished: xfsUnfinished, which reads the device.
	unfinished func(dev string) (bool, error)
	// prezero is whether mkfs.ext4 takes host.Mke2fsPrezeroed, asked once.
	prezeroOnce sync.Once
	prezero     bool
}

// NewMounter returns a Mounter that mounts filesystems through mounter and
// runs blkid, fsck and mkfs through exec: in production
// mount.NewWithoutSystemd("") and exec.New(), the system's. At most
// maxFormats format-and-mounts (with their mkfs) run at once. Every mount point must lie beneath the roots
// of paths.
func NewMounter(mounter mount.Interface, exec utilexec.Interface, maxFormats int, paths *Paths) *Mounter {
	return &Mounter{mounter: mounter, exec: exec, formats: make(chan struct{}, max(maxFormats, 1)), paths: paths, unfinished: xfsUnfinished}
}

// ctxExec runs every command under ctx.
type ctxExec struct {
	utilexec.Interface
	ctx context.Context
}

func (e ctxExec) Command(cmd string, args ...string) utilexec.Cmd {
	return e.CommandContext(e.ctx, cmd, args...)
}

// Probe is what one blkid run found on a device, or the proof that the
// device holds nothing at all (BlankProbe). FormatAndMount takes it, so
// that mount-utils' format decision reads the very answer the caller
// decided on: a device is probed at most once per stage, and the two
// decisions cannot disagree.
type Probe struct {
	// Device is the device probed.
	Device string
	// Type is the filesystem type found, "" when blkid positively found
	// none and no partition table, or the device holds no data at all.
	Type string
	// Unfinished is true when Type's own header says its mkfs never
	// finished (unfinished_linux.go): the device holds the start of a
	// filesystem that no kernel mounts.
	Unfinished bool
	// blkid is the run, replayed to mount-utils; nil when the probe was
	// not made by DiskFormat (FormatAndMount then probes again).
	blkid *commandRun
	// zeroed is true when the device reads nothing but zeros (BlankProbe).
	zeroed bool
}

// blkidNothingFound is blkid's exit code when it identifies nothing on a
// device (no filesystem, no partition table), which mount-utils reads as
// an unformatted device.
const blkidNothingFound = 2

// BlankProbe returns the probe of dev when the image it is attached to
// held no data at all before it was attached (Images.Blank): no
// filesystem, no partition table, no byte but zeros, which is more than
// blkid can tell. FormatAndMount then formats dev without blkid: to
// mount-utils' blkid of dev it answers what blkid answers for such a
// device (nothing found).
//
// An ext4 is then made without zeroing its journal and inode tables, which
// the device already reads as zeros (host.Mke2fsPrezeroed).
func BlankProbe(dev string) Probe {
	return Probe{Device: dev, zeroed: true, blkid: &commandRun{
		device: dev,
		err:    utilexec.CodeExitError{Err: fmt.Errorf("%s holds no data", dev), Code: blkidNothingFound},
	}}
}

// withPrezeroed returns mke2fs options that add host.Mke2fsPrezeroed=1: to the
// last -E given, as mke2fs reads only the last, or as a new -E.
func withPrezeroed(opts []string) []string {
	out := slices.Clone(opts)
	for i := len(out) - 2; i >= 0; i-- {
		if out[i] == "-E" {
			out[i+1] += "," + host.Mke2fsPrezeroed + "=1"
			return out
		}
	}
	return append(out, "-E", host.Mke2fsPrezeroed+"=1")
}

// prezeroes reports whether this machine's mkfs.ext4 takes
// host.Mke2fsPrezeroed, asked once: `mkfs.ext4 -V` names the e2fsprogs
// version, and 1.47 brought the option.
func (m *Mounter) prezeroes() bool {
	m.prezeroOnce.Do(func() {
		out, err := m.exec.Command("mkfs."+host.FsExt4, "-V").CombinedOutput()
		m.prezero = err == nil && mke2fsPrezeroes(string(out))
		klog.Background().V(2).Info("mkfs.ext4 asked whether it takes "+host.Mke2fsPrezeroed, "takes", m.prezero, "output", strings.TrimSpace(string(out)), "err", err)
	})
	return m.prezero
}

// mke2fsPrezeroes reads the output of `mke2fs -V` ("mke2fs 1.47.0
// (5-Feb-2023)" first) and reports whether that version takes
// host.Mke2fsPrezeroed.
func mke2fsPrezeroes(out string) bool {
	fields := strings.Fields(out)
	if len(fields) < 2 || fields[0] != "mke2fs" {
		return false
	}
	parts := strings.SplitN(fields[1], ".", 3)
	if len(parts) < 2 {
		return false
	}
	// A development version's minor carries a suffix: "1.48-WIP".
	minorDigits := parts[1]
	if i := strings.IndexFunc(minorDigits, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minorDigits = minorDigits[:i]
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(minorDigits)
	if err1 != nil || err2 != nil {
		return false
	}
	return major > 1 || major == 1 && minor >= 47
}

// DiskFormat probes dev with blkid and returns what it found: a filesystem
// type, or "" when blkid positively finds no filesystem and no partition
// table, and an error otherwise (a blkid failure is an error, never
// "empty": callers fail closed). An xfs whose mkfs never finished is
// reported with Unfinished.
func (m *Mounter) DiskFormat(ctx context.Context, dev string) (Probe, error) {
	rec := &recordingExec{Interface: ctxExec{m.exec, ctx}}
	fs, err := (&mount.SafeFormatAndMount{Interface: m.mounter, Exec: rec}).GetDiskFormat(dev)
	if err != nil {
		return Probe{}, fmt.Errorf("probing %s: %w", dev, err)
	}
	if fs == unknownData {
		return Probe{}, fmt.Errorf("%s: %w", dev, ErrPartitioned)
	}
	p := Probe{Device: dev, Type: fs, blkid: rec.last}
	if fs == host.FsXFS {
		if p.Unfinished, err = m.unfinished(dev); err != nil {
			return Probe{}, fmt.Errorf("probing %s: %w", dev, err)
		}
	}
	return p, nil
}

// commandRun is one command that ran: its command line, combined output
// and error; or, with no command line, what blkid of device would answer.
type commandRun struct {
	argv   []string
	device string
	out    []byte
	err    error
}

// answers reports whether run is the answer to the command line argv.
func (r *commandRun) answers(argv []string) bool {
	if r.argv == nil {
		return len(argv) > 1 && argv[0] == "blkid" && argv[len(argv)-1] == r.device
	}
	return slices.Equal(r.argv, argv)
}

// recordingExec runs commands and records the last one's run.
type recordingExec struct {
	utilexec.Interface
	last *commandRun
}

func (e *recordingExec) Command(cmd string, args ...string) utilexec.Cmd {
	return &recordingCmd{Cmd: e.Interface.Command(cmd, args...), exec: e, argv: append([]string{cmd}, args...)}
}

type recordingCmd struct {
	utilexec.Cmd
	exec *recordingExec
	argv []string
}

func (c *recordingCmd) CombinedOutput() ([]byte, error) {
	out, err := c.Cmd.CombinedOutput()
	c.exec.last = &commandRun{argv: c.argv, out: out, err: err}
	return out, err
}

// replayExec answers the first command that is run's command line with
// run's output and error, without running it; it runs every other
// command.
type replayExec struct {
	utilexec.Interface
	run *commandRun
}

func (e *replayExec) Command(cmd string, args ...string) utilexec.Cmd {
	if r := e.run; r != nil && r.answers(append([]string{cmd}, args...)) {
		e.run = nil
		return replayedCmd{run: r}
	}
	return e.Interface.Command(cmd, args...)
}

// replayedCmd answers CombinedOutput with a recorded run; mount-utils asks
// blkid nothing else. Its other methods are a nil Cmd's.
type replayedCmd struct {
	utilexec.Cmd
	run *commandRun
}

func (c replayedCmd) CombinedOutput() ([]byte, error) { return c.run.out, c.run.err }

// FormatAndMount mounts the filesystem on the probed device at target and
// returns the new mount's unique ID. It runs fsck first for a read-write
// mount, and formats the device as fsType (with mkfsOptions) only if the
// probe found it empty. The caller decides from the same probe whether
// formatting is allowed before calling.
//
// mount(8) takes a path, so the mount is verified after it is made: target,
// resolved again beneath the roots without symlinks, must be the root of
// dev's filesystem. If it is not, a path component was swapped for a symlink
// between the check and the mount; the misplaced mount, which is the
// plugin's own, is found by its device and removed, and the call fails with
// ErrMisplacedMount.
func (m *Mounter) FormatAndMount(ctx context.Context, probe Probe, target, fsType string, options, mkfsOptions []string) (uint64, error) {
	dev := probe.Device
	select {
	case m.formats <- struct{}{}:
		defer func() { <-m.formats }()
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	if probe.zeroed && fsType == host.FsExt4 && m.prezeroes() {
		mkfsOptions = withPrezeroed(mkfsOptions)
	}
	sfm := &mount.SafeFormatAndMount{Interface: m.mounter, Exec: &replayExec{Interface: ctxExec{m.exec, ctx}, run: probe.blkid}}
	if err := sfm.FormatAndMountSensitiveWithFormatOptions(dev, target, fsType, options, nil, mkfsOptions); err != nil {
		var me mount.MountError
		if errors.As(err, &me) && mountErrors[me.Type] != nil {
			return 0, fmt.Errorf("%w: %w", mountErrors[me.Type], err)
		}
		switch msg := err.Error(); {
		case strings.Contains(msg, ErrRefused.Error()):
			// The mount API's refusal, with the kernel's reason. mount-utils
			// passes on its text only.
			return 0, fmt.Errorf("%w: %s", ErrRefused, strings.TrimPrefix(msg, ErrRefused.Error()+": "))
		case strings.Contains(msg, badOption):
			return 0, fmt.Errorf("%w (%s with options %v; the kernel log names the reason): %v", ErrRefused, fsType, options, err)
		}
		return 0, err
	}
	id, err := m.paths.CheckMountedAt(dev, target)
	if err == nil {
		return id, nil
	}
	if uerr := unmountStray(dev, m.paths); uerr != nil {
		return 0, fmt.Errorf("%w; removing it: %v", err, uerr)
	}
	return 0, err
}

// Resize grows the filesystem on dev, mounted at mountPath, to fill the
// device, online, through mount-utils (resize2fs, xfs_growfs, btrfs
// filesystem resize). A filesystem that already fills it is a no-op.
func (m *Mounter) Resize(ctx context.Context, dev, mountPath string) error {
	if _, err := mount.NewResizeFs(ctxExec{m.exec, ctx}).Resize(dev, mountPath); err != nil {
		if strings.Contains(err.Error(), notPermitted) {
			return fmt.Errorf("%w to grow the filesystem on %s while it is mounted (ext4 needs CAP_SYS_RESOURCE); it grows at its next stage: %v", ErrNotPermitted, dev, err)
		}
		return fmt.Errorf("growing the filesystem on %s: %w", dev, err)
	}
	return nil
}

// GrowUnmounted grows the unmounted ext4 filesystem on dev to fill the
// device: a forced e2fsck first (resize2fs demands it), then resize2fs.
// Other filesystems grow only online; for them it is an error.
func (m *Mounter) GrowUnmounted(ctx context.Context, dev, fsType string) error {
	if fsType != host.FsExt4 {
		return fmt.Errorf("%s grows only while mounted", fsType)
	}
	// e2fsck exits 1 when it fixed something, which is fine here.
	if err := run(m.exec.CommandContext(ctx, "e2fsck", "-f", "-p", dev), func(code int) bool { return code == 1 }, "e2fsck", "-f", "-p", dev); err != nil {
		return err
	}
	return run(m.exec.CommandContext(ctx, "resize2fs", dev), nil, "resize2fs", dev)
}

// BindMount bind mounts source at target through file descriptors (see
// Paths.BindMount) and returns the new mount's unique ID.
func (m *Mounter) BindMount(source, target string, options []string) (uint64, error) {
	return m.paths.BindMount(source, target, options)
}

// BindDevice bind mounts the device node dev on the file target (see
// Paths.BindDevice), creating the file first.
func (m *Mounter) BindDevice(dev, target string, ro bool) (uint64, error) {
	if err := m.paths.Mkfile(target); err != nil {
		return 0, err
	}
	return m.paths.BindDevice(dev, target, ro)
}

// Unmount unmounts the top mount at target through a descriptor of its
// parent (see Paths.Unmount). Unmounting a path that is not mounted is a
// no-op.
func (m *Mounter) Unmount(target string) error {
	return m.paths.Unmount(target)
}

// UnmountOwned unmounts the top mount at target only if its unique mount
// ID is id (see Paths.UnmountOwned).
func (m *Mounter) UnmountOwned(target string, id uint64) error {
	return m.paths.UnmountOwned(target, id)
}
