package devices

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
	testingexec "k8s.io/utils/exec/testing"
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
		got, err := m.DiskFormat("/dev/loop7")
		if (err != nil) != tc.fails || errors.Is(err, ErrPartitioned) != tc.partitioned {
			t.Errorf("%s: error %v, want failure %v, partition table %v", tc.name, err, tc.fails, tc.partitioned)
		}
		if got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestFormatAndMountDecisions checks what mount-utils makes of blkid's and
// fsck's answers on the way to a mount: mkfs only on an empty device asked
// for read-write, fsck before a read-write mount of an existing filesystem,
// and no mount after fsck found errors it could not correct. (The fake
// mount is not on the real kernel, so the verification after it fails;
// only the commands and the mount call are checked here.)
func TestFormatAndMountDecisions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		options []string
		answers []answer
		mounted bool
	}{
		{"empty, read-write: formatted", nil,
			[]answer{{"blkid", "", 2}, {"mkfs.ext4", "", 0}}, true},
		{"empty, read-only: never formatted", []string{"ro"},
			[]answer{{"blkid", "", 2}}, false},
		{"ext4, fsck clean", nil,
			[]answer{{"blkid", "TYPE=ext4\n", 0}, {"fsck", "", 0}}, true},
		{"ext4, fsck corrected errors", nil,
			[]answer{{"blkid", "TYPE=ext4\n", 0}, {"fsck", "", 1}}, true},
		{"ext4, fsck could not correct them", nil,
			[]answer{{"blkid", "TYPE=ext4\n", 0}, {"fsck", "", 4}}, false},
		{"ext4, read-only: no fsck", []string{"ro"},
			[]answer{{"blkid", "TYPE=ext4\n", 0}}, true},
		{"blkid fails: nothing done", nil,
			[]answer{{"blkid", "", 4}}, false},
	} {
		s := &script{answers: tc.answers}
		fm := mount.NewFakeMounter(nil)
		root := t.TempDir()
		m := NewMounter(fm, s.exec(t), 1, NewPaths([]string{root}))
		_, err := m.FormatAndMount("/dev/loop7", root+"/staging", "ext4", tc.options, nil)
		if err == nil {
			t.Errorf("%s: succeeded on a fake mount", tc.name)
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
