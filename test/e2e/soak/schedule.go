package soak

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
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
