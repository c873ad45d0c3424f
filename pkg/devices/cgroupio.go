package devices

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/converge-csi/converge/pkg/host"
)

// The kernel's text forms of blk-throttle rules, read from and written to
// a cgroup's files (block/blk-throttle.c; the functions named below are
// from Linux 6.x, where the v1 and v2 handlers have had this form since
// io.max came in 4.5). Every rule is for one device, named as
// "major:minor" (the block device's bdi name, blkg_dev_name).
//
// cgroup v1: four files, one count each (throtl_legacy_files). Writing
// "7:3 100" sets the rule, "7:3 0" removes it (tg_set_conf: the value is
// read with %llu, and 0 becomes U64_MAX, none; "max" is refused with
// EINVAL). Reading lists "7:3 100", one line for each device whose count
// has a rule (tg_prfill_conf_u64 and tg_prfill_conf_uint skip none).
//
// cgroup v2: io.max, all four counts (throtl_files, "max"). Writing
// "7:3 riops=100" sets only the keys given; the others keep their value
// (tg_set_limit starts from the rules in force); a value is a number or
// "max" (none), and 0 is refused with ERANGE; a number of IOPS above
// UINT_MAX is taken as none. Reading lists one line per device with at
// least one rule, all four keys in the order rbps wbps riops wiops, "max"
// for none (tg_prfill_limit); a device whose counts are all "max" has no
// line. io.max is not in the root cgroup (CFTYPE_NOT_ON_ROOT).

// v1Knob is one of cgroup v1's throttle files and the count of IOLimits
// it holds.
type v1Knob struct {
	file string
	get  func(host.IOLimits) uint64
	set  func(*host.IOLimits, uint64)
}

// v1Knobs are cgroup v1's four throttle files
// (Documentation/admin-guide/cgroup-v1/blkio-controller.rst, "Throttling/
// Upper limit policy files").
var v1Knobs = [...]v1Knob{
	{"blkio.throttle.read_iops_device", func(l host.IOLimits) uint64 { return l.ReadIOPS }, func(l *host.IOLimits, v uint64) { l.ReadIOPS = v }},
	{"blkio.throttle.write_iops_device", func(l host.IOLimits) uint64 { return l.WriteIOPS }, func(l *host.IOLimits, v uint64) { l.WriteIOPS = v }},
	{"blkio.throttle.read_bps_device", func(l host.IOLimits) uint64 { return l.ReadBPS }, func(l *host.IOLimits, v uint64) { l.ReadBPS = v }},
	{"blkio.throttle.write_bps_device", func(l host.IOLimits) uint64 { return l.WriteBPS }, func(l *host.IOLimits, v uint64) { l.WriteBPS = v }},
}

// ioMaxFile is cgroup v2's file of blk-throttle rules.
const ioMaxFile = "io.max"

// parseCgroupDev reads "7:3" as the kernel prints a device in a cgroup
// file (%u:%u), naming what it refused for the operator.
func parseCgroupDev(s string) (host.DevNum, error) {
	maj, min, ok := strings.Cut(s, ":")
	ma, err1 := strconv.ParseUint(maj, 10, 32)
	mi, err2 := strconv.ParseUint(min, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return host.DevNum{}, fmt.Errorf("%q is not a device (major:minor)", s)
	}
	return host.DevNum{Major: uint32(ma), Minor: uint32(mi)}, nil
}

func formatCgroupDev(d host.DevNum) string { return fmt.Sprintf("%d:%d", d.Major, d.Minor) }

// parseV1Throttle reads the content of one of cgroup v1's throttle files:
// each device with a rule and its value. Empty content is no rules; a line
// of another form, or a device listed twice, is an error.
func parseV1Throttle(content string) (map[host.DevNum]uint64, error) {
	rules := map[host.DevNum]uint64{}
	if strings.TrimSpace(content) == "" {
		return rules, nil
	}
	for _, line := range strings.Split(strings.TrimSuffix(content, "\n"), "\n") {
		f := strings.Split(line, " ")
		if len(f) != 2 {
			return nil, fmt.Errorf("throttle line %q is not \"major:minor value\"", line)
		}
		dev, err := parseCgroupDev(f[0])
		if err != nil {
			return nil, err
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("throttle line %q: value is not a number", line)
		}
		if _, dup := rules[dev]; dup {
			return nil, fmt.Errorf("throttle lists %s twice", f[0])
		}
		rules[dev] = v
	}
	return rules, nil
}

// formatV1Throttle returns what to write to one of cgroup v1's throttle
// files for dev's rule to be v: "7:3 100"; a v of 0 removes the rule.
func formatV1Throttle(dev host.DevNum, v uint64) string {
	return formatCgroupDev(dev) + " " + strconv.FormatUint(v, 10)
}

// ioMaxKeys are io.max's keys in the order the kernel prints them.
var ioMaxKeys = [...]struct {
	key string
	get func(host.IOLimits) uint64
	set func(*host.IOLimits, uint64)
}{
	{"rbps", func(l host.IOLimits) uint64 { return l.ReadBPS }, func(l *host.IOLimits, v uint64) { l.ReadBPS = v }},
	{"wbps", func(l host.IOLimits) uint64 { return l.WriteBPS }, func(l *host.IOLimits, v uint64) { l.WriteBPS = v }},
	{"riops", func(l host.IOLimits) uint64 { return l.ReadIOPS }, func(l *host.IOLimits, v uint64) { l.ReadIOPS = v }},
	{"wiops", func(l host.IOLimits) uint64 { return l.WriteIOPS }, func(l *host.IOLimits, v uint64) { l.WriteIOPS = v }},
}

// parseIOMax reads the content of cgroup v2's io.max: each device with a
// rule and its limits, a key that is absent or "max" being 0 (none).
// Empty content is no rules; an unknown or repeated key, a value of 0
// (which the kernel never holds), or a device listed twice is an error.
func parseIOMax(content string) (map[host.DevNum]host.IOLimits, error) {
	rules := map[host.DevNum]host.IOLimits{}
	if strings.TrimSpace(content) == "" {
		return rules, nil
	}
	for _, line := range strings.Split(strings.TrimSuffix(content, "\n"), "\n") {
		f := strings.Split(line, " ")
		dev, err := parseCgroupDev(f[0])
		if err != nil {
			return nil, fmt.Errorf("io.max line %q: %w", line, err)
		}
		l, err := parseIOMaxKeys(f[1:])
		if err != nil {
			return nil, fmt.Errorf("io.max line %q: %w", line, err)
		}
		if _, dup := rules[dev]; dup {
			return nil, fmt.Errorf("io.max lists %s twice", f[0])
		}
		rules[dev] = l
	}
	return rules, nil
}

// parseIOMaxKeys reads the "key=value" fields of one line of io.max.
func parseIOMaxKeys(fields []string) (host.IOLimits, error) {
	var l host.IOLimits
	seen := map[string]bool{}
	for _, kv := range fields {
		k, v, _ := strings.Cut(kv, "=")
		i := ioMaxKeyIndex(k)
		if i < 0 || seen[k] {
			return host.IOLimits{}, fmt.Errorf("%q is not a known key given once", kv)
		}
		seen[k] = true
		if v == "max" {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 {
			return host.IOLimits{}, fmt.Errorf("%q: value is neither max nor a number above 0", kv)
		}
		ioMaxKeys[i].set(&l, n)
	}
	return l, nil
}

func ioMaxKeyIndex(k string) int {
	for i, m := range ioMaxKeys {
		if m.key == k {
			return i
		}
	}
	return -1
}

// formatIOMax returns what to write to io.max for dev's rules to be l,
// every key given so that none keeps an older value: "7:3 rbps=max
// wbps=max riops=200 wiops=max". The zero l removes dev's line.
func formatIOMax(dev host.DevNum, l host.IOLimits) string {
	var b strings.Builder
	b.WriteString(formatCgroupDev(dev))
	for _, m := range ioMaxKeys {
		b.WriteString(" " + m.key + "=")
		if v := m.get(l); v == 0 {
			b.WriteString("max")
		} else {
			b.WriteString(strconv.FormatUint(v, 10))
		}
	}
	return b.String()
}
