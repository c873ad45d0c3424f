package contract

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
	"slices"
	"strings"
	"unicode"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/host"
)

// The bounds of an IO limit: what the kernel holds as asked, so that a
// class it would refuse, or silently change, is refused when it is given
// (CSI: INVALID_ARGUMENT, with nothing applied), not by every pass of the
// reconciler later.
const (
	// MinIOPSLimit and MinBPSLimit are the least limits of the IOPS and
	// the BPS keys. The kernel takes anything from 2 (cgroup v2's io.max
	// refuses 0, ERANGE, and in the kernels whose blk-throttle still
	// checks "val > 1", tg_set_limit, 1 too; v1's blkio.throttle files
	// read 0 as no rule at all), but on v2 io.max also throttles the
	// writeback of the pod's buffered writes: at a few bytes or
	// operations per second, the syncfs and FIFREEZE of csi-node's
	// snapshot of the volume would wait for hours on that writeback,
	// holding a worker that other volumes' snapshots share. These floors
	// keep such a wait to seconds for any sane amount of dirty data.
	MinIOPSLimit = 10
	MinBPSLimit  = 1 << 20
	// MaxIOPSLimit is the greatest IOPS limit: the host's (host.MaxIOPS,
	// UINT_MAX - 1, since the kernel's UINT_MAX means none), so that
	// every limit accepted here is one SetThrottle applies.
	MaxIOPSLimit = host.MaxIOPS
	// MaxBPSLimit is the greatest bytes-per-second limit: the range of a
	// Kubernetes quantity (int64), which every class's value is written
	// as. The kernel's own bound, U64_MAX, means no limit.
	MaxBPSLimit = math.MaxInt64
	// maxIOLimitLength bounds a value's text, far above the longest
	// valid one (19 digits, a fraction, a suffix), so that the parse of
	// a hostile class stays cheap.
	maxIOLimitLength = 64
)

// IOLimitParams is what a VolumeAttributesClass's parameters say of a
// volume's IO limits: the keys given, and the limit each sets (none for
// NoLimit). The zero value gives no key: applied, it changes nothing.
type IOLimitParams struct {
	// limits holds the limit of each key given; 0 for NoLimit and for a
	// key not given.
	limits host.IOLimits
	// given holds the keys given.
	given []string
}

// ParseIOLimits reads the IO limits of a class's parameters (CreateVolume's
// and ControllerModifyVolume's mutable parameters): the keys
// MutableParameters lists, each a whole number from MinIOPSLimit to
// MaxIOPSLimit for the IOPS keys and from MinBPSLimit to MaxBPSLimit for
// the BPS keys, or
// NoLimit; a BPS key also as a Kubernetes quantity with a binary (Ki, Mi,
// Gi, Ti, Pi, Ei) or decimal (k, M, G, T, P, E) suffix and an optional
// fraction ("100Mi", "50M", "1.5Gi") whose value is a whole number of
// bytes. Keys under Kubernetes' own prefixes are ignored (CheckKeys), as
// the resizer's --extra-modify-metadata adds them. An unknown key, an
// empty value, whitespace, or any other value is INVALID_ARGUMENT naming
// the key. No parameters give no key.
func ParseIOLimits(params map[string]string) (IOLimitParams, error) {
	if err := CheckKeys("mutable parameters", params, mutableParameters...); err != nil {
		return IOLimitParams{}, err
	}
	var p IOLimitParams
	for _, key := range mutableParameters {
		value, ok := params[key]
		if !ok {
			continue
		}
		n, err := parseIOLimit(key, value)
		if err != nil {
			return IOLimitParams{}, classified.Errorf(classified.KindInvalidArgument, "mutable parameter %s: %w", key, err)
		}
		*ioLimitField(&p.limits, key) = n
		p.given = append(p.given, key)
	}
	// What the host would refuse to apply is refused here, with nothing
	// recorded: accepted, it would hold up every publish of the volume.
	if err := p.limits.Check(); err != nil {
		return IOLimitParams{}, classified.Errorf(classified.KindInvalidArgument, "mutable parameters: %w", err)
	}
	return p, nil
}

// Apply returns l with the limit of every key p gives set as p sets it,
// and every other limit as it was: CSI forbids changing a volume for a
// key that is absent, and a limit is removed by NoLimit alone.
func (p IOLimitParams) Apply(l host.IOLimits) host.IOLimits {
	for _, key := range p.given {
		*ioLimitField(&l, key) = *ioLimitField(&p.limits, key)
	}
	return l
}

// Keys returns the IO limit keys p gives, in MutableParameters' order.
func (p IOLimitParams) Keys() []string { return slices.Clone(p.given) }

// ioLimitField is the field of l that key sets.
func ioLimitField(l *host.IOLimits, key string) *uint64 {
	switch key {
	case MaxReadIOPSKey:
		return &l.ReadIOPS
	case MaxWriteIOPSKey:
		return &l.WriteIOPS
	case MaxReadBPSKey:
		return &l.ReadBPS
	case MaxWriteBPSKey:
		return &l.WriteBPS
	}
	panic(fmt.Sprintf("contract: %q is no IO limit key", key))
}

// quantityRE is a Kubernetes quantity of bytes as a class writes one: a
// whole number or a decimal fraction, and an optional binary or decimal
// suffix. Quantity's other forms (exponents, signs, m/u/n) are no use for
// a rate of bytes.
var quantityRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$`)

// quantitySuffixes are the multipliers of quantityRE's suffixes.
var quantitySuffixes = map[string]int64{
	"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60,
	"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
}

// parseIOLimit reads the value of IO limit key: its limit, 0 for NoLimit.
func parseIOLimit(key, value string) (uint64, error) {
	bps := key == MaxReadBPSKey || key == MaxWriteBPSKey
	// The length comes first: every later case quotes the value, and a
	// hostile class's long value must be neither echoed into the
	// resizer's event and csi-node's log nor scanned.
	switch {
	case len(value) > maxIOLimitLength:
		return 0, fmt.Errorf("value of %d bytes is too long", len(value))
	case value == "":
		return 0, fmt.Errorf("empty value: want a number or %q", NoLimit)
	case strings.IndexFunc(value, unicode.IsSpace) >= 0:
		return 0, fmt.Errorf("%q holds whitespace", value)
	case value == NoLimit:
		return 0, nil
	}
	lower, upper, unit, want, bound := uint64(MinIOPSLimit), uint64(MaxIOPSLimit), "operations", "a whole number", "the most the kernel holds as an IOPS limit"
	if bps {
		lower, upper, unit, want, bound = MinBPSLimit, MaxBPSLimit, "bytes", "a whole number or a quantity (100Mi, 50M)", "the greatest Kubernetes quantity"
	}
	m := quantityRE.FindStringSubmatch(value)
	if m == nil || !bps && (m[2] != "" || strings.Contains(m[1], ".")) {
		return 0, fmt.Errorf("%q: want %s of %s per second, or %q for no limit", value, want, unit, NoLimit)
	}
	n, ok := new(big.Rat).SetString(m[1])
	if !ok {
		return 0, fmt.Errorf("%q: want %s of %s per second, or %q for no limit", value, want, unit, NoLimit)
	}
	if mult, ok := quantitySuffixes[m[2]]; ok {
		n.Mul(n, new(big.Rat).SetInt64(mult))
	}
	switch {
	case !n.IsInt():
		return 0, fmt.Errorf("%q is not a whole number of %s", value, unit)
	case n.Cmp(new(big.Rat).SetUint64(lower)) < 0:
		return 0, fmt.Errorf("%q is below %d %s per second, the least limit converge sets (less would stall the volume's writeback and snapshots); %q removes the limit", value, lower, unit, NoLimit)
	case n.Cmp(new(big.Rat).SetUint64(upper)) > 0:
		return 0, fmt.Errorf("%q is above %d, %s", value, upper, bound)
	}
	return n.Num().Uint64(), nil
}
