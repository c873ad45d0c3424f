package soak

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// History is what the soak knows, outside every node, of each volume's
// data: the records each writer acknowledged, and each volume's lineage
// (for a restore or a clone, its source's lineage as it stood when the
// snapshot or clone was asked for). It is what Check holds a volume's log
// to.
type History struct {
	mu sync.Mutex
	// The maps are guarded by mu.
	acked   map[string]uint64   // owner: its records 0 to acked-1 acknowledged
	lineage map[string][]Expect // owner: its ancestors, frozen, without itself
}

// NewHistory is an empty history.
func NewHistory() *History {
	return &History{acked: map[string]uint64{}, lineage: map[string][]Expect{}}
}

// Ack notes that owner acknowledged its record seq: every record before
// it was acknowledged before it, as a writer appends in order.
func (h *History) Ack(owner string, seq uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.acked[owner] = max(h.acked[owner], seq+1)
}

// Open notes that owner's writer, starting, found n of its records in its
// log. Fewer than were acknowledged before is a loss that no later scan
// would see: the writer goes on from what it found, and writes the lost
// seqs again.
func (h *History) Open(owner string, n uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if a := h.acked[owner]; n < a {
		return fmt.Errorf("its writer began again on %d of its records, but %d were acknowledged: %d lost", n, a, a-n)
	}
	return nil
}

// New notes a volume made empty, written by owner.
func (h *History) New(owner string) error {
	return h.add(owner, nil)
}

func (h *History) add(owner string, ancestors []Expect) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.lineage[owner]; ok {
		return fmt.Errorf("volume %s noted twice", owner)
	}
	h.lineage[owner] = ancestors
	return nil
}

// Lineage is owner's lineage now, itself last with what it acknowledged
// so far: what its volume must hold, and, taken before a snapshot or a
// clone of it is asked for, what that must hold (only what was
// acknowledged before).
func (h *History) Lineage(owner string) ([]Expect, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	anc, ok := h.lineage[owner]
	if !ok {
		return nil, fmt.Errorf("volume %s not noted", owner)
	}
	return append(slices.Clone(anc), Expect{owner, h.acked[owner]}), nil
}

// Restore notes a volume made from a lineage taken earlier (a restore of
// a snapshot, or a clone), written by owner.
func (h *History) Restore(owner string, from []Expect) error {
	if len(from) == 0 {
		return fmt.Errorf("volume %s restored from nothing", owner)
	}
	return h.add(owner, slices.Clone(from))
}

// Order puts the lines of several writers' logs, each read in the order it
// was written, in the order they were printed: by the kubelet's time, but
// a file's lines never before an earlier line of that file, whatever the
// clock did meanwhile. A restarted writer's open comes after its last
// run's acks, which may lie in a log read after its own.
func Order(files [][]Line) []Line {
	type keyed struct {
		Line
		key time.Time
	}
	var all []keyed
	for _, f := range files {
		var key time.Time
		for _, l := range f {
			if l.At.After(key) {
				key = l.At
			}
			all = append(all, keyed{l, key})
		}
	}
	slices.SortStableFunc(all, func(a, b keyed) int { return a.key.Compare(b.key) })
	out := make([]Line, len(all))
	for i, k := range all {
		out[i] = k.Line
	}
	return out
}

// Read notes lines in their order (Order's): each ack, and each open held
// to what was acknowledged before it. It returns what each open found
// lost.
func (h *History) Read(lines []Line) []string {
	var lost []string
	for _, l := range lines {
		switch l.Kind {
		case LineAck:
			h.Ack(l.Owner, l.N)
		case LineOpen:
			if err := h.Open(l.Owner, l.N); err != nil {
				lost = append(lost, fmt.Sprintf("volume %s: %v", l.Owner, err))
			}
		}
	}
	return lost
}
