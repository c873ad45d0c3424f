// Package capacity accounts for the space of a node's data directory: what
// its volumes were promised, what they hold, and what can still be
// promised to a thick or a thin volume. Everything is derived anew from the
// images and their records each time it is asked, so no counter can drift
// from the truth, across restarts and crashes alike. It imports nothing of
// the plugin.
package capacity

import (
	"fmt"
	"math"
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

// Account is the state of the data directory.
type Account struct {
	// Free is what the filesystem can still allocate (statfs f_bavail).
	Free int64
	// ThickPromised and ThinPromised sum the sizes of the thick and of
	// the thin images.
	ThickPromised, ThinPromised int64
	// ThickOwed is the space the thick images may still claim: the holes
	// of images not (yet) fully allocated, such as those made before
	// provisioning was recorded, and the blocks they share with their
	// snapshots, which a write copies.
	ThickOwed int64
	// ThinAllocated is the space the thin images hold.
	ThinAllocated int64
	// Copying is the space the snapshots being taken may still claim:
	// promised to them from the moment they are asked for, so that two
	// snapshots, or a snapshot and a volume, asked for at once never count
	// the same free space.
	Copying int64
	// Ratio is the overprovisioning ratio of thin volumes.
	Ratio float64
}

// New accounts for images on a filesystem with free bytes left, promising
// thin volumes up to ratio times the space that backs them.
func New(free int64, ratio float64, images []Image) Account {
	a := Account{Free: free, Ratio: ratio}
	for _, im := range images {
		a.Copying += im.Copying
		if im.Thin {
			a.ThinPromised += im.Size
			a.ThinAllocated += min(im.Allocated, im.Size)
			continue
		}
		a.ThickPromised += im.Size
		a.ThickOwed += max(0, im.Size-im.Allocated) + min(im.Shared, im.Allocated)
	}
	return a
}

// thinBacking is the space the thin volumes may still claim from the free
// space: what their promise needs at the ratio, less what they hold.
func (a Account) thinBacking() int64 {
	need := int64(math.Ceil(float64(a.ThinPromised) / a.Ratio))
	return max(0, need-a.ThinAllocated)
}

// ThickAvailable is the largest thick volume that can be promised now:
// the free space that neither a thick image's holes, a snapshot being
// taken, nor the thin volumes' promise (at the ratio) may still claim.
func (a Account) ThickAvailable() int64 {
	return max(0, a.Free-a.ThickOwed-a.Copying-a.thinBacking())
}

// ThinAvailable is the largest thin volume that can be promised now: the
// ratio times the space thin volumes may use (what they hold, and the free
// space neither the thick images nor the snapshots being taken owe), less
// what thin volumes were promised. With a ratio of 1 it is ThickAvailable: nothing is promised
// that does not exist.
func (a Account) ThinAvailable() int64 {
	backing := a.ThinAllocated + a.Free - a.ThickOwed - a.Copying
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

// Guard is the free space of the data directory below which the pool is
// nearly full: thin volumes are reported and not created nor grown.
type Guard struct {
	// Percent of the filesystem's size, when Bytes is 0.
	Percent float64
	// Bytes, when not 0.
	Bytes int64
}

// DefaultGuard is the guard the plugin starts with.
const DefaultGuard = "5%"

// ParseGuard reads a guard: a percentage of the data directory's filesystem
// ("5%") or a size in bytes with an optional binary suffix ("512Mi",
// "2Gi").
func ParseGuard(s string) (Guard, error) {
	s = strings.TrimSpace(s)
	if p, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || math.IsNaN(f) || f < 0 || f >= 100 {
			return Guard{}, fmt.Errorf("%q: want a percentage from 0 to below 100, such as 5%%", s)
		}
		return Guard{Percent: f}, nil
	}
	mult := int64(1)
	for suffix, m := range map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40} {
		if n, ok := strings.CutSuffix(s, suffix); ok {
			s, mult = n, m
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return Guard{}, fmt.Errorf("%q: want a percentage (5%%) or a size in bytes with an optional Ki, Mi, Gi or Ti suffix", s)
	}
	return Guard{Bytes: n * mult}, nil
}

// Threshold is the guard's free space in bytes on a filesystem of total
// bytes.
func (g Guard) Threshold(total int64) int64 {
	if g.Bytes > 0 {
		return g.Bytes
	}
	return int64(float64(total) * g.Percent / 100)
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
