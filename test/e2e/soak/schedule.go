package soak

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Kind is a kind of event the soak makes happen: a fault (csi-node
// SIGKILLed, a kubelet kept down) or an operation (a claim grown, a
// snapshot taken). Its events come at random, Every apart on average (a
// Poisson process), each on one of Targets targets (the nodes, the
// sidecars...) and, for a fault that lasts, held for a time between
// Hold[0] and Hold[1].
type Kind struct {
	Name    string
	Every   time.Duration
	Targets int
	Hold    [2]time.Duration
}

// Event is one event of a plan.
type Event struct {
	At     time.Duration // from the soak's start
	Kind   string
	Target int
	Hold   time.Duration // 0 for an event that does not last
}

func (e Event) String() string {
	s := fmt.Sprintf("%8.1fs %s #%d", e.At.Seconds(), e.Kind, e.Target)
	if e.Hold > 0 {
		s += fmt.Sprintf(" for %.1fs", e.Hold.Seconds())
	}
	return s
}

// Plan is the soak's events over length, from seed: the same seed and
// kinds give the same plan, whatever else changed, so that a failure
// replays; each kind draws from a stream of its own (the seed and its
// name), so that adding a kind leaves the others' events where they were.
// Events of different kinds overlap as they fall.
func Plan(seed uint64, length time.Duration, kinds []Kind) ([]Event, error) {
	var out []Event
	names := map[string]bool{}
	for _, k := range kinds {
		switch {
		case k.Name == "" || strings.ContainsAny(k.Name, " \t\n"):
			return nil, fmt.Errorf("kind %q: a name of one word", k.Name)
		case names[k.Name]:
			return nil, fmt.Errorf("kind %s twice", k.Name)
		case k.Every <= 0 || k.Targets < 1 || k.Hold[0] < 0 || k.Hold[1] < k.Hold[0]:
			return nil, fmt.Errorf("kind %s: every %s, %d targets, hold %v", k.Name, k.Every, k.Targets, k.Hold)
		}
		names[k.Name] = true
		h := fnv.New64a()
		h.Write([]byte(k.Name))
		r := rand.New(rand.NewPCG(seed, h.Sum64()))
		for at := time.Duration(0); ; {
			// An exponential gap, of mean Every.
			at += time.Duration(-math.Log(1-r.Float64()) * float64(k.Every))
			if at >= length {
				break
			}
			e := Event{At: at, Kind: k.Name, Target: r.IntN(k.Targets)}
			if k.Hold[1] > 0 {
				e.Hold = k.Hold[0] + time.Duration(r.Int64N(int64(k.Hold[1]-k.Hold[0])+1))
			}
			out = append(out, e)
		}
	}
	slices.SortStableFunc(out, func(a, b Event) int { return cmp.Compare(a.At, b.At) })
	return out, nil
}

// ParseSeeds reads the soaks' seeds: soaks separated by commas, run one
// after the other, each of one seed or of several joined by "+", whose
// plans it runs at once (PlanOf). A seed of 0 is replaced by a draw of
// random, so that the soak can print the seeds that replay it, and
// "full" by FullSeed.
func ParseSeeds(s string, random func() uint64) ([][]uint64, error) {
	var out [][]uint64
	for _, soak := range strings.Split(s, ",") {
		var seeds []uint64
		for _, f := range strings.Split(soak, "+") {
			if strings.TrimSpace(f) == "full" {
				seeds = append(seeds, FullSeed)
				continue
			}
			seed, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("seeds %q: %w", s, err)
			}
			if seed == 0 {
				seed = random()
			}
			seeds = append(seeds, seed)
		}
		out = append(out, seeds)
	}
	return out, nil
}

// SeedsString is seeds as ParseSeeds reads them back: joined by "+".
func SeedsString(seeds []uint64) string {
	var fs []string
	for _, s := range seeds {
		fs = append(fs, strconv.FormatUint(s, 10))
	}
	return strings.Join(fs, "+")
}

// PlanOf is the plans of seeds over length, run at once: their events
// together, in the order of their times (a seed's own in Plan's order).
func PlanOf(seeds []uint64, length time.Duration, kinds []Kind) ([]Event, error) {
	var out []Event
	for _, seed := range seeds {
		p, err := Plan(seed, length, kinds)
		if err != nil {
			return nil, err
		}
		out = append(out, p...)
	}
	slices.SortStableFunc(out, func(a, b Event) int { return cmp.Compare(a.At, b.At) })
	return out, nil
}
