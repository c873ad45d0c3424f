package devices

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
	testingexec "k8s.io/utils/exec/testing"

	"github.com/converge-csi/converge/pkg/host"
)

// script is a fake exec that answers each command by its name, in order,
// and records the commands run.
type script struct {
	answers []answer
	ran     []string
}

// answer is what one command prints and how it exits (0: success, -1: not
// found).
type answer struct {
	cmd    string
	output string
	exit   int
}

func (s *script) exec(t *testing.T) *testingexec.FakeExec {
	fe := &testingexec.FakeExec{}
	for _, a := range s.answers {
		fe.CommandScript = append(fe.CommandScript, func(cmd string, args ...string) utilexec.Cmd {
			s.ran = append(s.ran, strings.Join(append([]string{cmd}, args...), " "))
			if cmd != a.cmd {
				t.Errorf("ran %s %v, want %s next", cmd, args, a.cmd)
			}
			var err error
			switch a.exit {
			case 0:
			case -1:
				err = utilexec.ErrExecutableNotFound
			default:
				err = testingexec.FakeExitError{Status: a.exit}
			}
			out := []byte(a.output)
			return &testingexec.FakeCmd{
				CombinedOutputScript: []testingexec.FakeAction{func() ([]byte, []byte, error) { return out, nil, err }},
			}
		})
	}
	return fe
}

// TestDiskFormatDecisions checks how blkid's answer becomes what a stage
// decides on: a filesystem type, nothing (which alone allows a format), a
// partition table (data: never formatted), or an error (fail closed).
func TestDiskFormatDecisions(t *testing.T) {
	for _, tc := range []struct {
		name        string
		blkid       answer
		want        string
		partitioned bool
		fails       bool
	}{
		{name: "empty device", blkid: answer{"blkid", "", 2}, want: ""},
		{name: "ext4", blkid: answer{"blkid", "DEVNAME=/dev/loop7\nTYPE=ext4\n", 0}, want: "ext4"},
		{name: "xfs", blkid: answer{"blkid", "TYPE=xfs\n", 0}, want: "xfs"},
		{name: "partition table", blkid: answer{"blkid", "PTTYPE=gpt\n", 0}, partitioned: true, fails: true},
		{name: "partition table and a filesystem signature", blkid: answer{"blkid", "TYPE=ext4\nPTTYPE=dos\n", 0}, partitioned: true, fails: true},
		{name: "blkid cannot read the device", blkid: answer{"blkid", "", 4}, fails: true},
		{name: "blkid missing", blkid: answer{"blkid", "", -1}, fails: true},
		{name: "output blkid never gives", blkid: answer{"blkid", "garbage\n", 0}, fails: true},
	} {
		s := &script{answers: []answer{tc.blkid}}
		m := NewMounter(mount.NewFakeMounter(nil), s.exec(t), 1, NewPaths([]string{t.TempDir()}))
		m.unfinished = func(string) (bool, error) { return false, nil } // no device to read
		got, err := m.DiskFormat(t.Context(), "/dev/loop7")
		if (err != nil) != tc.fails || errors.Is(err, ErrPartitioned) != tc.partitioned {
			t.Errorf("%s: error %v, want failure %v, partition table %v", tc.name, err, tc.fails, tc.partitioned)
		}
		if got.Type != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got.Type, tc.want)
		}
	}
}

// TestFormatAndMountDecisions checks what mount-utils makes of blkid's and
// fsck's answers on the way to a mount: mkfs only on an empty device asked
// for read-write, fsck before a read-write mount of an existing filesystem,
// and no mount after fsck found errors it could not correct. blkid runs once
// for the stage: the caller's probe (DiskFormat) is the one mount-utils
// decides from. (The fake mount is not on the real kernel, so the
// verification after it fails; only the commands and the mount call are
// checked here.)
func TestFormatAndMountDecisions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		options []string
		answers []answer
		mounted bool
		want    error // what the failure is, before the fake mount's own
	}{
		{"empty, read-write: formatted", nil,
			[]answer{{"blkid", "", 2}, {"mkfs.ext4", "", 0}}, true, nil},
		{"empty, read-only: never formatted", []string{"ro"},
			[]answer{{"blkid", "", 2}}, false, ErrNotFormattable},
		{"ext4, fsck clean", nil,
			[]answer{{"blkid", "TYPE=ext4\n", 0}, {"fsck", "", 0}}, true, nil},
		{"ext4, fsck corrected errors", nil,
			[]answer{{"blkid", "TYPE=ext4\n", 0}, {"fsck", "", 1}}, true, nil},
		{"ext4, fsck could not correct them", nil,
			[]answer{{"blkid", "TYPE=ext4\n", 0}, {"fsck", "", 4}}, false, ErrFilesystemDamaged},
		{"ext4, read-only: no fsck", []string{"ro"},
			[]answer{{"blkid", "TYPE=ext4\n", 0}}, true, nil},
	} {
		s := &script{answers: tc.answers}
		fm := mount.NewFakeMounter(nil)
		root := t.TempDir()
		m := NewMounter(fm, s.exec(t), 1, NewPaths([]string{root}))
		probe, err := m.DiskFormat(t.Context(), "/dev/loop7")
		if err != nil {
			t.Fatalf("%s: probe: %v", tc.name, err)
		}
		_, err = m.FormatAndMount(t.Context(), probe, root+"/staging", "ext4", tc.options, nil)
		if err == nil {
			t.Errorf("%s: succeeded on a fake mount", tc.name)
		}
		if tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.want)
		}
		if len(s.ran) != len(tc.answers) {
			t.Errorf("%s: ran %q, want %d commands", tc.name, s.ran, len(tc.answers))
		}
		mounted := slices.ContainsFunc(fm.GetLog(), func(a mount.FakeAction) bool { return a.Action == mount.FakeActionMount })
		if mounted != tc.mounted {
			t.Errorf("%s: mounted %v, want %v (commands %q)", tc.name, mounted, tc.mounted, s.ran)
		}
	}
}

// TestFormatAndMountProbesWhenNotGivenAProbe checks that a probe DiskFormat
// did not make (no recorded run) is not trusted: FormatAndMount runs blkid
// itself, and formats only on its answer.
func TestFormatAndMountProbesWhenNotGivenAProbe(t *testing.T) {
	s := &script{answers: []answer{{"blkid", "TYPE=ext4\n", 0}, {"fsck", "", 0}}}
	fm := mount.NewFakeMounter(nil)
	root := t.TempDir()
	m := NewMounter(fm, s.exec(t), 1, NewPaths([]string{root}))
	m.FormatAndMount(t.Context(), Probe{Device: "/dev/loop7"}, root+"/staging", "ext4", nil, nil)
	if want := []string{"blkid -p -s TYPE -s PTTYPE -o export /dev/loop7", "fsck -a /dev/loop7"}; !slices.Equal(s.ran, want) {
		t.Errorf("ran %q, want %q", s.ran, want)
	}
}

// TestGrowUnmountedCommands checks the offline growth of an ext4: a forced
// e2fsck (exit 1, errors corrected, is fine) before resize2fs, and a failed
// command reported with what ran, its exit code and its output.
func TestGrowUnmountedCommands(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answers []answer
		failed  string // the command that failed, "" for none
		code    int
	}{
		{"clean", []answer{{"e2fsck", "", 0}, {"resize2fs", "", 0}}, "", 0},
		{"e2fsck corrected errors", []answer{{"e2fsck", "", 1}, {"resize2fs", "", 0}}, "", 0},
		{"e2fsck could not", []answer{{"e2fsck", "UNEXPECTED INCONSISTENCY", 4}}, "e2fsck", 4},
		{"resize2fs fails", []answer{{"e2fsck", "", 0}, {"resize2fs", "No space left", 1}}, "resize2fs", 1},
	} {
		s := &script{answers: tc.answers}
		m := NewMounter(mount.NewFakeMounter(nil), s.exec(t), 1, NewPaths([]string{t.TempDir()}))
		err := m.GrowUnmounted(t.Context(), "/dev/loop7", host.FsExt4)
		var ce *CommandError
		switch {
		case tc.failed == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.failed != "" && !errors.As(err, &ce):
			t.Errorf("%s: error %v, want a CommandError", tc.name, err)
		case tc.failed != "" && (ce.Command[0] != tc.failed || ce.ExitCode != tc.code || ce.Output != tc.answers[len(tc.answers)-1].output):
			t.Errorf("%s: %+v, want %s exiting %d with its output", tc.name, ce, tc.failed, tc.code)
		}
		if len(s.ran) != len(tc.answers) {
			t.Errorf("%s: ran %q", tc.name, s.ran)
		}
	}
	if err := NewMounter(mount.NewFakeMounter(nil), &testingexec.FakeExec{}, 1, NewPaths([]string{t.TempDir()})).GrowUnmounted(t.Context(), "/dev/loop7", host.FsXFS); err == nil {
		t.Error("xfs grown offline")
	}
}

// TestCommandsEndWithTheirContext runs a real command that would outlive
// its context: it is killed when the context ends, and reported as a
// command that did not run to an exit.
func TestCommandsEndWithTheirContext(t *testing.T) {
	m := NewMounter(mount.NewFakeMounter(nil), utilexec.New(), 1, NewPaths([]string{t.TempDir()}))
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	err := run(ctxExec{m.exec, ctx}.Command("sleep", "600"), nil, "sleep", "600")
	var ce *CommandError
	if !errors.As(err, &ce) || ce.ExitCode != -1 || ctx.Err() == nil {
		t.Fatalf("sleep 600 under a cancelled context: %v", err)
	}
}

// TestBlankProbeFormatsWithoutBlkid checks that a device whose image held
// no data is formatted without blkid: mount-utils' own probe of the device
// is answered "nothing found", and only mkfs runs before the mount. An ext4
// is made as on a device that reads zeros when mkfs.ext4 takes the option,
// in the last -E the volume's own options give; a device blkid found empty
// may hold stale blocks, and is formatted without it.
func TestBlankProbeFormatsWithoutBlkid(t *testing.T) {
	const v147, v146 = "mke2fs 1.47.0 (5-Feb-2023)\n\tUsing EXT2FS Library version 1.47.0\n", "mke2fs 1.46.5 (30-Dec-2021)\n"
	for _, tc := range []struct {
		name    string
		blank   bool
		fsType  string
		mkfsOpt []string
		answers []answer
		want    []string // the commands run
	}{
		{"blank, mke2fs 1.47", true, host.FsExt4, nil,
			[]answer{{"mkfs.ext4", v147, 0}, {"mkfs.ext4", "", 0}},
			[]string{"mkfs.ext4 -V", "mkfs.ext4 -E assume_storage_prezeroed=1 -F -m0 /dev/loop7"}},
		{"blank, the volume's own -E", true, host.FsExt4, []string{"-E", "nodiscard", "-b", "4096", "-E", "root_owner=0:0"},
			[]answer{{"mkfs.ext4", v147, 0}, {"mkfs.ext4", "", 0}},
			[]string{"mkfs.ext4 -V", "mkfs.ext4 -E nodiscard -b 4096 -E root_owner=0:0,assume_storage_prezeroed=1 -F -m0 /dev/loop7"}},
		{"blank, mke2fs 1.46", true, host.FsExt4, nil,
			[]answer{{"mkfs.ext4", v146, 0}, {"mkfs.ext4", "", 0}},
			[]string{"mkfs.ext4 -V", "mkfs.ext4 -F -m0 /dev/loop7"}},
		{"blank, mkfs.ext4 -V fails", true, host.FsExt4, nil,
			[]answer{{"mkfs.ext4", "", 1}, {"mkfs.ext4", "", 0}},
			[]string{"mkfs.ext4 -V", "mkfs.ext4 -F -m0 /dev/loop7"}},
		{"blank xfs", true, host.FsXFS, nil,
			[]answer{{"mkfs.xfs", "", 0}},
			[]string{"mkfs.xfs -f /dev/loop7"}},
		{"found empty by blkid", false, host.FsExt4, nil,
			[]answer{{"blkid", "", 2}, {"mkfs.ext4", "", 0}},
			[]string{"blkid -p -s TYPE -s PTTYPE -o export /dev/loop7", "mkfs.ext4 -F -m0 /dev/loop7"}},
	} {
		s := &script{answers: tc.answers}
		fm := mount.NewFakeMounter(nil)
		root := t.TempDir()
		m := NewMounter(fm, s.exec(t), 1, NewPaths([]string{root}))
		probe := BlankProbe("/dev/loop7")
		if !tc.blank {
			var err error
			if probe, err = m.DiskFormat(t.Context(), "/dev/loop7"); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
		}
		m.FormatAndMount(t.Context(), probe, root+"/staging", tc.fsType, nil, tc.mkfsOpt)
		if !slices.Equal(s.ran, tc.want) {
			t.Errorf("%s: ran %q, want %q", tc.name, s.ran, tc.want)
		}
		if !slices.ContainsFunc(fm.GetLog(), func(a mount.FakeAction) bool { return a.Action == mount.FakeActionMount }) {
			t.Errorf("%s: not mounted", tc.name)
		}
	}
}

// TestMke2fsVersions checks which versions of mke2fs are taken to know
// the prezeroed option, and that an output not understood means no.
func TestMke2fsVersions(t *testing.T) {
	for out, want := range map[string]bool{
		"mke2fs 1.47.0 (5-Feb-2023)":   true,
		"mke2fs 1.47.2 (1-Jan-2025)\n": true,
		"mke2fs 1.48-WIP (x)":          true,
		"mke2fs 2.0.0":                 true,
		"mke2fs 1.46.5 (30-Dec-2021)":  false,
		"mke2fs 1.9":                   false,
		"mke2fs one.47":                false,
		"mkfs.ext4: invalid option":    false,
		"":                             false,
	} {
		if got := mke2fsPrezeroes(out); got != want {
			t.Errorf("%q: %v, want %v", out, got, want)
		}
	}
}
