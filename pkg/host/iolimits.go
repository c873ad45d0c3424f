package host

// IOLimits are the upper limits of a volume's IO per second that the
// kernel's block throttling (cgroup v2 io.max, v1 blkio.throttle.*) holds
// its device to: read and write operations (IOPS), and bytes read and
// written (BPS). A zero field is no limit for that direction and unit, so
// the zero value limits nothing.
type IOLimits struct {
	ReadIOPS, WriteIOPS, ReadBPS, WriteBPS uint64
}

// IsZero reports whether l limits nothing: no field is set.
func (l IOLimits) IsZero() bool { return l == IOLimits{} }
