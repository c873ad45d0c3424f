package devices

import (
	"maps"
	"strings"
	"testing"

	"github.com/converge-csi/converge/pkg/host"
)

var (
	loop3 = host.DevNum{Major: 7, Minor: 3}
	loop4 = host.DevNum{Major: 7, Minor: 4}
	sda   = host.DevNum{Major: 8, Minor: 0}
)

// TestCgroupParseV1Throttle reads cgroup v1 throttle files as the kernel
// prints them (tg_prfill_conf_u64: "major:minor value" per device with a
// rule) and refuses any other form.
func TestCgroupParseV1Throttle(t *testing.T) {
	for _, c := range []struct {
		name    string
		content string
		want    map[host.DevNum]uint64
		bad     bool
	}{
		{name: "empty", content: "", want: map[host.DevNum]uint64{}},
		{name: "one", content: "7:3 200\n", want: map[host.DevNum]uint64{loop3: 200}},
		{name: "several", content: "8:0 1048576\n7:3 200\n7:4 1\n", want: map[host.DevNum]uint64{sda: 1 << 20, loop3: 200, loop4: 1}},
		{name: "largest", content: "7:3 18446744073709551614\n", want: map[host.DevNum]uint64{loop3: 1<<64 - 2}},
		{name: "no newline", content: "7:3 200", want: map[host.DevNum]uint64{loop3: 200}},
		{name: "twice", content: "7:3 200\n7:3 300\n", bad: true},
		{name: "max", content: "7:3 max\n", bad: true},
		{name: "no value", content: "7:3\n", bad: true},
		{name: "extra field", content: "7:3 200 1\n", bad: true},
		{name: "no minor", content: "7 200\n", bad: true},
		{name: "negative", content: "7:3 -1\n", bad: true},
		{name: "blank line", content: "7:3 200\n\n7:4 1\n", bad: true},
		{name: "v2 line", content: "7:3 rbps=max wbps=max riops=200 wiops=max\n", bad: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseV1Throttle(c.content)
			if c.bad {
				if err == nil {
					t.Fatalf("got %v, want an error", got)
				}
				return
			}
			if err != nil || !maps.Equal(got, c.want) {
				t.Fatalf("got %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

// TestCgroupParseIOMax reads cgroup v2's io.max as the kernel prints it
// (tg_prfill_limit: all four keys, "max" for none) and as a reader may
// meet it (keys absent mean max), and refuses values the kernel never
// holds.
func TestCgroupParseIOMax(t *testing.T) {
	for _, c := range []struct {
		name    string
		content string
		want    map[host.DevNum]host.IOLimits
		bad     bool
	}{
		{name: "empty", content: "", want: map[host.DevNum]host.IOLimits{}},
		{name: "kernel's", content: "7:3 rbps=max wbps=1048576 riops=200 wiops=max\n",
			want: map[host.DevNum]host.IOLimits{loop3: {ReadIOPS: 200, WriteBPS: 1 << 20}}},
		{name: "several", content: "8:0 rbps=2 wbps=max riops=max wiops=max\n7:4 rbps=max wbps=max riops=max wiops=5\n",
			want: map[host.DevNum]host.IOLimits{sda: {ReadBPS: 2}, loop4: {WriteIOPS: 5}}},
		{name: "keys absent", content: "7:3 riops=200\n", want: map[host.DevNum]host.IOLimits{loop3: {ReadIOPS: 200}}},
		{name: "other order", content: "7:3 wiops=1 rbps=3\n", want: map[host.DevNum]host.IOLimits{loop3: {WriteIOPS: 1, ReadBPS: 3}}},
		{name: "all max", content: "7:3 rbps=max wbps=max riops=max wiops=max\n", want: map[host.DevNum]host.IOLimits{loop3: {}}},
		{name: "zero", content: "7:3 riops=0\n", bad: true},
		{name: "unknown key", content: "7:3 riops=200 idle=5\n", bad: true},
		{name: "key twice", content: "7:3 riops=200 riops=300\n", bad: true},
		{name: "no value", content: "7:3 riops\n", bad: true},
		{name: "device twice", content: "7:3 riops=2\n7:3 wiops=2\n", bad: true},
		{name: "bad device", content: "loop3 riops=2\n", bad: true},
		{name: "double space", content: "7:3  riops=2\n", bad: true},
		{name: "v1 line", content: "7:3 200\n", bad: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseIOMax(c.content)
			if c.bad {
				if err == nil {
					t.Fatalf("got %v, want an error", got)
				}
				return
			}
			if err != nil || !maps.Equal(got, c.want) {
				t.Fatalf("got %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

// TestCgroupFormatThrottle checks the lines written to set and remove
// rules: v1's "major:minor value" (0 removes, tg_set_conf) and v2's one
// line giving every key, so that none keeps an older value (tg_set_limit
// keeps the keys not given).
func TestCgroupFormatThrottle(t *testing.T) {
	for _, c := range []struct {
		name string
		got  string
		want string
	}{
		{name: "v1 set", got: formatV1Throttle(loop3, 200), want: "7:3 200"},
		{name: "v1 remove", got: formatV1Throttle(host.DevNum{Major: 7, Minor: 1048575}, 0), want: "7:1048575 0"},
		{name: "v2 set", got: formatIOMax(loop3, host.IOLimits{ReadIOPS: 200, WriteBPS: 1 << 20}), want: "7:3 rbps=max wbps=1048576 riops=200 wiops=max"},
		{name: "v2 all", got: formatIOMax(loop4, host.IOLimits{ReadIOPS: 1, WriteIOPS: 2, ReadBPS: 3, WriteBPS: 4}), want: "7:4 rbps=3 wbps=4 riops=1 wiops=2"},
		{name: "v2 remove", got: formatIOMax(loop3, host.IOLimits{}), want: "7:3 rbps=max wbps=max riops=max wiops=max"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.got != c.want {
				t.Errorf("got %q, want %q", c.got, c.want)
			}
		})
	}
}

// TestCgroupPodUID reads pod UIDs from the names of the kubelet's pod
// cgroups, in both drivers' spellings and in each QoS class's cgroup, and
// nothing from other names.
func TestCgroupPodUID(t *testing.T) {
	const uid = "0b5c8f1e-32c4-4b7a-9d1e-8a2f6c3d4e5f"
	const uid_ = "0b5c8f1e_32c4_4b7a_9d1e_8a2f6c3d4e5f"
	for _, c := range []struct {
		name, slice, qos, dir, want string
	}{
		{name: "cgroupfs", dir: "pod" + uid, want: uid},
		{name: "cgroupfs burstable", qos: "burstable", dir: "pod" + uid, want: uid},
		{name: "systemd burstable", slice: "kubepods", qos: "burstable", dir: "kubepods-burstable-pod" + uid_ + ".slice", want: uid},
		{name: "systemd guaranteed", slice: "kubepods", dir: "kubepods-pod" + uid_ + ".slice", want: uid},
		{name: "systemd under a root slice", slice: "node-kubepods", qos: "besteffort", dir: "node-kubepods-besteffort-pod" + uid_ + ".slice", want: uid},
		{name: "systemd other qos", slice: "kubepods", qos: "burstable", dir: "kubepods-besteffort-pod" + uid_ + ".slice"},
		{name: "systemd qos missing", slice: "kubepods", dir: "kubepods-burstable-pod" + uid_ + ".slice"},
		{name: "systemd other root", slice: "node-kubepods", dir: "kubepods-pod" + uid_ + ".slice"},
		{name: "systemd unescaped", slice: "kubepods", dir: "kubepods-pod" + uid + ".slice"},
		{name: "systemd no suffix", slice: "kubepods", dir: "kubepods-pod" + uid_},
		{name: "cgroupfs in systemd", slice: "kubepods", dir: "pod" + uid},
		{name: "systemd in cgroupfs", dir: "kubepods-pod" + uid_ + ".slice"},
		{name: "container", dir: "cri-containerd-" + strings.Repeat("ab", 32) + ".scope"},
		{name: "qos", slice: "kubepods", dir: "kubepods-burstable.slice"},
		{name: "not kubelet's", slice: "kubepods", dir: "user-pod" + uid_ + ".slice"},
		{name: "pod alone", dir: "pod"},
		{name: "podman", dir: "podman.service"},
		{name: "too long", dir: "pod" + strings.Repeat("a", maxPodUID+1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := podCgroupUID(c.slice, c.qos, c.dir); got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

// TestCgroupKubepods tells the kubelet's kubepods cgroup, in either
// driver's spelling, from other directories.
func TestCgroupKubepods(t *testing.T) {
	for _, c := range []struct {
		parent, name, slice string
		ok                  bool
	}{
		{name: "kubepods", ok: true},
		{parent: "run1-node1", name: "kubepods", ok: true},
		{name: "kubepods.slice", slice: "kubepods", ok: true},
		{parent: "node.slice", name: "node-kubepods.slice", slice: "node-kubepods", ok: true},
		{parent: "a-b.slice", name: "a-b-kubepods.slice", slice: "a-b-kubepods", ok: true},
		{parent: "other.slice", name: "node-kubepods.slice"},
		{name: "node-kubepods.slice"},
		{parent: ".slice", name: "-kubepods.slice"},
		{name: "kubepods-burstable.slice"},
		{name: "Kubepods"},
	} {
		t.Run(c.parent+"/"+c.name, func(t *testing.T) {
			if slice, ok := kubepodsCgroup(c.parent, c.name); slice != c.slice || ok != c.ok {
				t.Errorf("got %q, %v; want %q, %v", slice, ok, c.slice, c.ok)
			}
		})
	}
}
