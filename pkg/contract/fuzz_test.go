package contract

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/host"
)

// FuzzCheckMountFlags checks the mount flag policy: an accepted flag is on
// the allow-list, holds no separator a mount command would split it at
// (outside a quoted SELinux label), and names no path.
func FuzzCheckMountFlags(f *testing.F) {
	for _, s := range []string{"ro", "noatime", "bind", "ro,bind", "data=/dev/sda", "errors=remount-ro", `context="a:b:c:s0:c1,c2"`,
		`context="a"b"`, "context=a,b", "noatime\nbind", "x-mount.mkdir", "loop", "helper=x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, flag string) {
		if CheckMountFlags([]string{flag}) != nil {
			return
		}
		key, value, _ := strings.Cut(flag, "=")
		if strings.ContainsAny(flag, "\x00\n\r\t ") {
			t.Fatalf("accepted %q with a control character or space", flag)
		}
		if strings.HasSuffix(key, "context") {
			if strings.Contains(value, ",") && !(strings.HasPrefix(value, `"`) && strings.HasSuffix(value, `"`) && strings.Count(value, `"`) == 2) {
				t.Fatalf("accepted %q: comma outside a quoted label", flag)
			}
			return
		}
		if strings.ContainsAny(flag, ",/\"") {
			t.Fatalf("accepted %q: separator or path", flag)
		}
		for _, bad := range []string{"bind", "rbind", "remount", "move", "loop", "helper", "x-"} {
			if key == bad || strings.HasPrefix(key, "x-") {
				t.Fatalf("accepted %q", flag)
			}
		}
	})
}

// FuzzCheckMkfsOptions checks the mkfs option policy: whatever it accepts
// is pairs of an allowed flag and a value that names no path and holds no
// shell or separator character.
func FuzzCheckMkfsOptions(f *testing.F) {
	f.Add("ext4", "-b 4096 -i 8192")
	f.Add("xfs", "-m reflink=1")
	f.Add("ext4", "-J device=/dev/sda")
	f.Add("btrfs", "-n 16384 -F x")
	f.Fuzz(func(t *testing.T, fsType, value string) {
		args, err := CheckMkfsOptions(fsType, value)
		if err != nil {
			return
		}
		if len(args)%2 != 0 {
			t.Fatalf("%q: odd arguments %q", value, args)
		}
		if fsType == "" {
			fsType = "ext4"
		}
		for i := 0; i < len(args); i += 2 {
			if !mkfsPolicy[fsType][args[i]] {
				t.Fatalf("%q: flag %q accepted for %s", value, args[i], fsType)
			}
			if strings.ContainsAny(args[i+1], "/ ;$`|&<>\\\"'\x00\n") || strings.HasPrefix(args[i+1], "-") {
				t.Fatalf("%q: value %q accepted", value, args[i+1])
			}
		}
	})
}

// FuzzValidID checks that an accepted ID can only name a plain file in the
// data directory.
func FuzzValidID(f *testing.F) {
	for _, s := range []string{"vol-1", "", ".", "..", "../x", "a/b", "a\x00", strings.Repeat("a", 129), "pvc-1234.img", "-x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if ValidID(id) != nil {
			return
		}
		if len(id) == 0 || len(id) > MaxIDLength || strings.ContainsAny(id, "/\x00") || id[0] == '.' {
			t.Fatalf("accepted %q", id)
		}
		if p := filepath.Join("/data", id+".img"); filepath.Dir(p) != "/data" {
			t.Fatalf("ID %q leaves the data directory: %s", id, p)
		}
	})
}

// FuzzParseIOLimits checks the IO limit parameters: an accepted value is
// NoLimit (no limit) or a limit within what the kernel holds as asked,
// with no whitespace; an IOPS limit is its own decimal digits; a key given
// is the only limit Apply changes.
func FuzzParseIOLimits(f *testing.F) {
	for _, s := range []string{"max", "2", "1", "0", "9", "10", "1048575", "1Mi", "1M", "100Mi", "50M", "1.5Gi", "2.5", "8Ei", "4294967295", "4294967296", " 1", "1e3", "-1", "", "Max", "0.5k", "007"} {
		f.Add(uint8(0), s)
		f.Add(uint8(3), s)
	}
	f.Fuzz(func(t *testing.T, which uint8, value string) {
		key := mutableParameters[int(which)%len(mutableParameters)]
		p, err := ParseIOLimits(map[string]string{key: value})
		if err != nil {
			if e := classified.AsError(err); e == nil || e.Kind != classified.KindInvalidArgument || !strings.Contains(e.Message, key) {
				t.Fatalf("%s=%q: got %v, want INVALID_ARGUMENT naming the key", key, value, err)
			}
			return
		}
		if strings.ContainsFunc(value, unicode.IsSpace) || value == "" {
			t.Fatalf("%s=%q accepted with whitespace or empty", key, value)
		}
		if err := p.Apply(host.IOLimits{}).Check(); err != nil {
			t.Fatalf("%s=%q accepted, but the host refuses it: %v", key, value, err)
		}
		before := host.IOLimits{ReadIOPS: 11, WriteIOPS: 12, ReadBPS: 13, WriteBPS: 14}
		after := p.Apply(before)
		n := *ioLimitField(&after, key)
		*ioLimitField(&after, key) = *ioLimitField(&before, key)
		if after != before {
			t.Fatalf("%s=%q changed another limit: %+v", key, value, p.Apply(before))
		}
		lower, upper := uint64(MinIOPSLimit), uint64(MaxIOPSLimit)
		if key == MaxReadBPSKey || key == MaxWriteBPSKey {
			lower, upper = MinBPSLimit, MaxBPSLimit
		} else if value != NoLimit && strings.TrimLeft(value, "0") != strconv.FormatUint(n, 10) {
			t.Fatalf("%s=%q read as %d", key, value, n)
		}
		switch {
		case value == NoLimit && n != 0:
			t.Fatalf("%s=%q: got limit %d, want none", key, value, n)
		case value != NoLimit && (n < lower || n > upper):
			t.Fatalf("%s=%q: limit %d outside [%d, %d]", key, value, n, lower, upper)
		}
	})
}

// FuzzPodOfTarget checks that a pod UID is only ever taken from one of
// the kubelet's two layouts, below the kubelet directory, and is a name
// a cgroup can carry: no separator, no dot, no underscore.
func FuzzPodOfTarget(f *testing.F) {
	const k = "/var/lib/kubelet"
	for _, s := range []string{
		k + "/pods/u-1/volumes/kubernetes.io~csi/pv/mount",
		k + "/plugins/kubernetes.io/csi/volumeDevices/publish/pv/u-1",
		k + "/pods/../volumes/kubernetes.io~csi/pv/mount", "/tmp/x", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, target string) {
		uid, ok := PodOfTarget(k, target)
		if !ok {
			if uid != "" {
				t.Fatalf("PodOfTarget(%q) refused it and still returned %q", target, uid)
			}
			return
		}
		if !strings.HasPrefix(target, k+"/") || filepath.Clean(target) != target {
			t.Fatalf("PodOfTarget(%q) = %q for a path outside %s or not clean", target, uid, k)
		}
		if uid == "" || len(uid) > maxPodUID || strings.ContainsAny(uid, "/._\x00") {
			t.Fatalf("PodOfTarget(%q) = %q, not a pod UID", target, uid)
		}
		fs := k + "/pods/" + uid + "/volumes/kubernetes.io~csi/"
		block := k + "/plugins/kubernetes.io/csi/volumeDevices/publish/"
		if !(strings.HasPrefix(target, fs) && strings.HasSuffix(target, "/mount")) && !(strings.HasPrefix(target, block) && strings.HasSuffix(target, "/"+uid)) {
			t.Fatalf("PodOfTarget(%q) = %q from neither layout", target, uid)
		}
	})
}
