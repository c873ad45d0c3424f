package claim

import (
	"slices"

	"github.com/converge-csi/converge/pkg/locks"
)

// Epoch is the count of claims released when it was read (Set.Epoch): an
// observation made after it has seen what every one of those did.
type Epoch uint64

// Hold is why a volume cannot be claimed, or Free.
type Hold int

const (
	// Free: no claim holds the volume, and none was released after the
	// epoch asked about.
	Free Hold = iota
	// Running: a claim holds the volume.
	Running
	// Stale: a claim of the volume was released after the epoch asked
	// about; an observation older than that must be made again.
	Stale
)

func (h Hold) String() string {
	switch h {
	case Free:
		return "free"
	case Running:
		return "running"
	case Stale:
		return "stale"
	}
	return "unknown"
}

// Set holds the volumes claimed. The zero Set is not usable: see NewSet.
type Set struct {
	// mu guards held, released and ended, and each Claim's done.
	mu   locks.Mutex
	held map[string]bool
	// released counts the claims released; ended maps a volume to that
	// count at the release of its last claim.
	released uint64
	ended    map[string]uint64
	// forgotten is the latest release Forget dropped from ended: a volume
	// ended does not name counts as released then, so that a caller
	// whose epoch is older still finds it Stale.
	forgotten uint64
}

// NewSet returns a Set that holds no volume.
func NewSet() *Set {
	return &Set{held: map[string]bool{}, ended: map[string]uint64{}}
}

// Claim is the hold on one or more volumes that Try gave.
type Claim struct {
	set  *Set
	ids  []string
	done bool
}

// Epoch returns the count of claims released so far, to be read before
// an observation and given to Try and State.
func (s *Set) Epoch() Epoch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Epoch(s.released)
}

// Try claims the volumes ids together (a group snapshot holds several),
// if none of them is held and none was released after epoch: the check
// and the claim are one step, so that of two callers deciding at once
// one only gets a volume. It returns the claim, or nil and why one of the
// volumes is not Free; then it claims none of them.
func (s *Set) Try(epoch Epoch, ids ...string) (*Claim, Hold) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if h := s.stateLocked(id, epoch); h != Free {
			return nil, h
		}
	}
	for _, id := range ids {
		s.held[id] = true
	}
	return &Claim{set: s, ids: slices.Clone(ids)}, Free
}

// Release ends the claim: its volumes may be claimed again, by callers
// that read the epoch after it (the others find them Stale). Releasing a
// claim twice is a no-op.
func (c *Claim) Release() {
	s := c.set
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.done {
		return
	}
	c.done = true
	s.released++
	for _, id := range c.ids {
		delete(s.held, id)
		s.ended[id] = s.released
	}
}

// State reports whether volume id is held now (Running), else whether a
// claim of it was released after epoch (Stale), else Free.
func (s *Set) State(id string, epoch Epoch) Hold {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stateLocked(id, epoch)
}

func (s *Set) stateLocked(id string, epoch Epoch) Hold {
	if s.held[id] {
		return Running
	}
	if s.endedLocked(id) > uint64(epoch) {
		return Stale
	}
	return Free
}

// endedLocked returns the count of releases at the last release of a
// claim of id, or, for a volume whose release was forgotten or that was
// never claimed, the latest release forgotten.
func (s *Set) endedLocked(id string) uint64 {
	if n, ok := s.ended[id]; ok {
		return n
	}
	return s.forgotten
}

// ReleasedSince reports whether a claim of volume id was released after
// epoch, whether or not another holds it now.
func (s *Set) ReleasedSince(id string, epoch Epoch) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endedLocked(id) > uint64(epoch)
}

// Idle reports whether no volume is held.
func (s *Set) Idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held) == 0
}

// Forget drops what the Set remembers of the releases of the volumes
// keep refuses, up to epoch: a release after it is kept. A caller whose
// observation is older than a release forgotten still finds the volume
// Stale (so does every volume not remembered, for such a caller: it
// looks again), since a volume's operation may have ended, and its record
// gone, while that caller observed it. A volume held now is not touched.
func (s *Set) Forget(keep func(id string) bool, epoch Epoch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, n := range s.ended {
		if !keep(id) && n <= uint64(epoch) {
			delete(s.ended, id)
			s.forgotten = max(s.forgotten, n)
		}
	}
}
