package host

import (
	"fmt"
	"math"
	"strconv"
)

// IOLimits are the most IO per second that the users of a volume may do
// on its device: reads and writes, counted in operations (IOPS) and in
// bytes (BPS). A field of 0 is no limit on that count; the zero IOLimits
// limits nothing. The device layer applies them as the kernel's
// blk-throttle rules for the volume's device in the cgroups of the pods
// that use it (devices.CgroupIO).
type IOLimits struct {
	ReadIOPS, WriteIOPS uint64
	ReadBPS, WriteBPS   uint64
}

// MaxIOPS is the largest IOPS limit the kernel can hold. blk-throttle
// keeps an IOPS limit in an unsigned int whose UINT_MAX means none
// (block/blk-throttle.c, throtl_grp.iops, tg_prfill_conf_uint); cgroup
// v2's io.max takes anything larger as none (tg_set_limit: min_t(u64,
// val, UINT_MAX)), and cgroup v1's files store the low 32 bits of what
// is written (tg_set_conf: *(unsigned int *) = v), so 2^32 would become
// a limit of 0 operations.
const MaxIOPS = math.MaxUint32 - 1

// MaxBPS is the largest bytes-per-second limit the kernel can hold: its
// U64_MAX means none (tg_prfill_conf_u64, tg_prfill_limit).
const MaxBPS = math.MaxUint64 - 1

// IsZero reports whether l limits nothing.
func (l IOLimits) IsZero() bool { return l == IOLimits{} }

// Check returns an error naming the first limit the kernel cannot hold
// (an IOPS limit above MaxIOPS, a BPS limit above MaxBPS); nil for the
// zero IOLimits.
func (l IOLimits) Check() error {
	for _, f := range []struct {
		name    string
		v, most uint64
	}{
		{"read IOPS", l.ReadIOPS, MaxIOPS},
		{"write IOPS", l.WriteIOPS, MaxIOPS},
		{"read bytes per second", l.ReadBPS, MaxBPS},
		{"write bytes per second", l.WriteBPS, MaxBPS},
	} {
		if f.v > f.most {
			return fmt.Errorf("%s limit %d is more than the kernel holds (%d)", f.name, f.v, f.most)
		}
	}
	return nil
}

// String returns the limits as cgroup v2 writes them, "max" for none:
// "riops=200 wiops=max rbps=max wbps=1048576".
func (l IOLimits) String() string {
	v := func(n uint64) string {
		if n == 0 {
			return "max"
		}
		return strconv.FormatUint(n, 10)
	}
	return "riops=" + v(l.ReadIOPS) + " wiops=" + v(l.WriteIOPS) + " rbps=" + v(l.ReadBPS) + " wbps=" + v(l.WriteBPS)
}
