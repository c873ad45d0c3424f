// Package capacity accounts for the space of a node's data directory: what
// its volumes were promised, what they hold, and what can still be
// promised to a thick or a thin volume. Everything is derived anew from the
// images and their records each time it is asked, so no counter can drift
// from the truth, across restarts and crashes alike. It owns the one rule
// for a nearly full pool (NearlyFull) and the guard that sets its
// threshold. It reads nothing from disk (its callers, the pools and the
// reconciler, hand it the free space and the images) and imports nothing
// of the plugin.
package capacity

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// Image is what the accounting knows of one volume's image.
type Image struct {
	// Size is the image's size: what the volume was promised.
	Size int64
	// Allocated is the space the data directory's filesystem gave it.
	Allocated int64
	// Shared is what of Allocated it shares with other files (reflinked
	// snapshots): a thick image owes it too, since every write there
	// takes a new block.
	Shared int64
	// Thin is true for a thin volume. Every other image (thick, made
	// before provisioning was recorded, or being created) is accounted at
	// its full size.
	Thin bool
	// Copying is the space that the snapshots of it asked for and not yet
	// taken may still claim.
	Copying int64
}

// Own is the space the image holds for itself: its allocated blocks,
// within its size, that it shares with no other file. Every write
// elsewhere in it takes a new block, into a hole or as a copy of a block
// it shares (with a snapshot, or with another volume restored from the
// same one). This is the one rule of what an image holds: a thick image
// owes its size less Own, a thin one holds Own of what it was promised,
// and a snapshot by reflink takes Own from it (its blocks are all shared
// then).
func (im Image) Own() int64 {
	return max(0, min(im.Allocated, im.Size)-im.Shared)
}

// Account is the state of the data directory.
type Account struct {
	// Free is what the filesystem can still allocate (statfs f_bavail).
	Free int64
	// Guard is the free space no promise may take (Guard.Threshold): what
	// the filesystem keeps free for everything else on it.
	Guard int64
	// ThickPromised and ThinPromised sum the sizes of the thick and of
	// the thin images.
	ThickPromised, ThinPromised int64
	// ThickOwed is the space the thick images may still claim: their
	// sizes less what they hold of their own (Image.Own), that is the
	// holes of images not (yet) fully allocated, such as those made before
	// provisioning was recorded, and the blocks they share with their
	// snapshots, which a write copies.
	ThickOwed int64
	// ThinAllocated is the space the thin images hold of their own
	// (Image.Own). A block a thin image shares is not counted: a write
	// there takes a new one, so a volume restored by reflink holds nothing
	// yet and is backed for its whole promise.
	ThinAllocated int64
	// Copying is the space the snapshots being taken may still claim:
	// promised to them from the moment they are asked for, so that two
	// snapshots, or a snapshot and a volume, asked for at once never count
	// the same free space.
	Copying int64
	// Ratio is the overprovisioning ratio of thin volumes.
	Ratio float64
}

// New accounts for images on a filesystem with free bytes left, of which
// guard bytes are never promised, promising thin volumes up to ratio times
// the space that backs them.
func New(free, guard int64, ratio float64, images []Image) Account {
	a := Account{Free: free, Guard: guard, Ratio: ratio}
	for _, im := range images {
		a.Copying += im.Copying
		if im.Thin {
			a.ThinPromised += im.Size
			a.ThinAllocated += im.Own()
			continue
		}
		a.ThickPromised += im.Size
		a.ThickOwed += im.Size - im.Own()
	}
	return a
}

// thinBacking is the space the thin volumes may still claim from the free
// space: what their promise needs at the ratio, less what they hold.
func (a Account) thinBacking() int64 {
	need := int64(math.Ceil(float64(a.ThinPromised) / a.Ratio))
	return max(0, need-a.ThinAllocated)
}

// spare is the free space that promises may take: what the guard leaves
// of it, less what is owed already to the thick images' holes and to the
// snapshots being taken. It is negative once those take the filesystem
// below its guard.
func (a Account) spare() int64 {
	return a.Free - a.Guard - a.ThickOwed - a.Copying
}

// ThickAvailable is the largest thick volume that can be promised now:
// the free space that neither the guard, a thick image's holes, a
// snapshot being taken, nor the thin volumes' promise (at the ratio) may
// still claim. Once the volume has taken all of it, the guard is still
// free.
func (a Account) ThickAvailable() int64 {
	return max(0, a.spare()-a.thinBacking())
}

// NearlyFull reports whether the free space is below the guard: no thin
// volume is created or grown then, whatever the ratio would allow.
func (a Account) NearlyFull() bool { return NearlyFull(a.Free, a.Guard) }

// NearlyFull reports whether a pool with free bytes free is below its
// guard of guard bytes (Guard.Threshold of its size): the one rule for
// "nearly full", which the promises (Account.NearlyFull) and the
// reconciler's PoolNearlyFull condition share.
func NearlyFull(free, guard int64) bool { return free < guard }

// ThinAvailable is the largest thin volume that can be promised now: the
// ratio times the space thin volumes may use (what they hold, and the free
// space neither the guard, the thick images nor the snapshots being taken
// claim), less what thin volumes were promised; none while the pool is
// nearly full. With a ratio of 1 it is ThickAvailable: nothing is promised
// that does not exist, and the guard stays free.
func (a Account) ThinAvailable() int64 {
	if a.NearlyFull() {
		return 0
	}
	backing := a.ThinAllocated + a.spare()
	if backing <= 0 {
		return 0
	}
	limit := float64(backing) * a.Ratio
	if limit >= math.MaxInt64 {
		return math.MaxInt64
	}
	return max(0, int64(limit)-a.ThinPromised)
}

// Available is what can be promised to a volume of the provisioning asked
// for.
func (a Account) Available(thin bool) int64 {
	if thin {
		return a.ThinAvailable()
	}
	return a.ThickAvailable()
}

// Guard is the free space of a pool's filesystem that no promise takes:
// no volume, thick or thin, is created or grown into it, and below it the
// pool is nearly full (Account.NearlyFull).
type Guard struct {
	// Percent of the filesystem's size, when Bytes is 0.
	Percent float64
	// Bytes, when not 0.
	Bytes int64
}

// The guards a pool that configures none starts with.
const (
	// DefaultGuard is the guard of a pool on a filesystem of its own.
	DefaultGuard = "5%"
	// KubeletGuard is the guard of a pool on the filesystem that holds
	// the kubelet's directory: the kubelet's eviction threshold there
	// (KubeletEvictionPercent) and a margin of 5 points for what else
	// fills it meanwhile (container logs, emptyDir volumes, images).
	KubeletGuard = "20%"
	// KubeletEvictionPercent is the free space, in percent of the
	// filesystem that holds its directory, below which a kubelet with its
	// default hard eviction thresholds evicts pods: nodefs.available<10%,
	// and imagefs.available<15% where the container runtime's images
	// share that filesystem, as on a node with one disk.
	KubeletEvictionPercent = 15
)

// DefaultGuardFor is the guard of a pool that configures none: KubeletGuard
// on the kubelet's filesystem, DefaultGuard elsewhere.
func DefaultGuardFor(kubeletFilesystem bool) Guard {
	if kubeletFilesystem {
		return MustParseGuard(KubeletGuard)
	}
	return MustParseGuard(DefaultGuard)
}

// BelowKubeletEviction reports whether the guard keeps less free of a
// filesystem of total bytes than the kubelet's default hard eviction
// threshold (KubeletEvictionPercent): on the kubelet's filesystem, its
// promises may then evict the node's pods.
func (g Guard) BelowKubeletEviction(total int64) bool {
	return g.Threshold(total) < int64(float64(total)*KubeletEvictionPercent/100)
}

// GuardPattern is what a guard may be: a percentage of the filesystem's
// size from 0 to below 100 ("5%", "12.5%"), or a size in bytes, plain or
// with a binary suffix ("2Gi"), below 2^63 bytes (at most 18 digits, or 15,
// 12, 9 and 6 with Ki, Mi, Gi and Ti). The chart's values.schema.json
// holds the same pattern for csiNode.poolGuard and pools[].guard, so that
// the chart accepts exactly what csi-node does.
const GuardPattern = `^([0-9]{1,2}(\.[0-9]+)?%|[0-9]{1,18}|[0-9]{1,15}Ki|[0-9]{1,12}Mi|[0-9]{1,9}Gi|[0-9]{1,6}Ti)$`

var guardRE = regexp.MustCompile(GuardPattern)

// binarySuffixes are the multipliers of GuardPattern's suffixes.
var binarySuffixes = map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}

// ParseGuard reads a guard (GuardPattern): a percentage of the pool's
// filesystem ("5%") or a size in bytes with an optional binary suffix
// ("512Mi", "2Gi"). Anything else is an error that says what is wanted.
func ParseGuard(s string) (Guard, error) {
	if !guardRE.MatchString(s) {
		return Guard{}, fmt.Errorf("%q: want a percentage from 0 to below 100 (5%%, 12.5%%) or a size in bytes with an optional Ki, Mi, Gi or Ti suffix (2Gi)", s)
	}
	if p, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		return Guard{Percent: f}, err
	}
	mult := int64(1)
	if m, ok := binarySuffixes[s[max(0, len(s)-2):]]; ok {
		s, mult = s[:len(s)-2], m
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return Guard{Bytes: n * mult}, err
}

// MustParseGuard is ParseGuard for a guard known to be valid (a constant);
// it panics on any other.
func MustParseGuard(s string) Guard {
	g, err := ParseGuard(s)
	if err != nil {
		panic(err)
	}
	return g
}

// guardBlock is the unit a guard is kept in: the 4 KiB blocks that images
// are sized in, so that what is left above the guard is a size a volume
// can be made with.
const guardBlock = 4096

// Threshold is the guard's free space in bytes on a filesystem of total
// bytes, in whole 4 KiB blocks (rounded up).
func (g Guard) Threshold(total int64) int64 {
	n := g.Bytes
	if n == 0 {
		n = int64(float64(total) * g.Percent / 100)
	}
	return (n + guardBlock - 1) / guardBlock * guardBlock
}

// String is the guard as ParseGuard reads it.
func (g Guard) String() string {
	if g.Bytes > 0 {
		return strconv.FormatInt(g.Bytes, 10)
	}
	return strconv.FormatFloat(g.Percent, 'f', -1, 64) + "%"
}

// CheckRatio refuses an overprovisioning ratio below 1 (it would promise
// thin volumes less than exists, and is surely a typo) or not a number.
func CheckRatio(r float64) error {
	if math.IsNaN(r) || math.IsInf(r, 0) || r < 1 {
		return fmt.Errorf("%v: the overprovisioning ratio must be a number of at least 1 (1 promises thin volumes no more than exists)", r)
	}
	return nil
}
